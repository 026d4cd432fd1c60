"""Tests for specdec_jax.verify_multipath: the multi-path verifiers are exactly lossless.

Three layers, each with negative controls (plausible bugs) that must fail the same check:
1. Rational oracle (tests/multipath_oracle.py): the algorithms in Fractions over every K-tuple of
   paths reproduce the exact values of docs/method.md section 9 and are exactly lossless.
2. Kernel math: the kernels' own selection, skewed law, acceptance probabilities and residuals,
   evaluated on every K-tuple of a tiny context-dependent toy (V = 3 or 4, G = 2) and summed in
   float64, give the target's law up to float32 rounding (TV < 1e-5; the controls give > 1e-3).
3. Sampling: NUM_ROWS jitted rows per case; (accepted prefix + Y) continued by the target is
   compared with the target's joint of G+1 tokens by chi-square at SIGNIFICANCE.
"""

import functools
import itertools
from collections import defaultdict
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import verifiers, verify
from specdec_jax import verify_multipath as vm
from tests import helpers
from tests import multipath_oracle as mo
from tests import verify_oracle as oracle
from tests.chisquare import SIGNIFICANCE

EXACT_TOLERANCE = 1e-5  # float32 kernel math vs the exact law, in total variation
GAMMA = 2


# ----------------------------------------------------------------------------------------------
# Toy models.


def _markov(start, transitions, vocab, max_context):
  """An order-1 Markov model (each row depends on the last token only) as a prefix-keyed
  oracle.Model."""
  model = {}
  for length in range(max_context + 1):
    for prefix in itertools.product(range(vocab), repeat=length):
      row = start if not prefix else transitions[prefix[-1]]
      model[prefix] = tuple(Fraction(x) for x in row)
  return model


@functools.cache
def _spec_markov_pair() -> helpers.ToyPair:
  """The V = 3 Markov toy of docs/method.md section 9: capped-ratio ties at 1 are common."""
  f = Fraction
  target = _markov(
    [f(1, 2), f(3, 10), f(1, 5)],
    [[f(1, 2), f(1, 4), f(1, 4)], [f(1, 5), f(3, 5), f(1, 5)], [f(1, 3), f(1, 3), f(1, 3)]],
    3,
    GAMMA,
  )
  drafter = _markov(
    [f(1, 5), f(3, 10), f(1, 2)],
    [[f(1, 4), f(1, 4), f(1, 2)], [f(1, 2), f(1, 4), f(1, 4)], [f(1, 6), f(1, 2), f(1, 3)]],
    3,
    GAMMA,
  )
  return helpers.ToyPair(target, drafter, GAMMA)


def _target_joint(pair):
  return oracle.sequence_distribution(pair.target, pair.gamma + 1, pair.vocab)


# ----------------------------------------------------------------------------------------------
# 1. Rational oracle.


def test_oracle_reproduces_reference_numbers():
  """docs/method.md section 9's exact values (of the rational reference written with the GBV
  specification): Sun et al.'s toy, and the V = 3 Markov toy."""
  sun = helpers.sun_toy_pair()
  expected = {1: Fraction(11, 9), 2: Fraction(131, 81), 3: Fraction(1289, 729)}
  for k, value in expected.items():
    dist = mo.gbv_distribution(sun.target, sun.drafter, 2, k, order='capped')
    assert oracle.expected_accepted(dist) == value
  pair = _spec_markov_pair()
  expected = {
    ('capped', 2): Fraction(19651, 14400),
    ('capped', 3): Fraction(51379, 43200),
    ('ratio', 2): Fraction(301, 192),
    ('ratio', 3): Fraction(63341, 38400),
  }
  for (order, k), value in expected.items():
    dist = mo.gbv_distribution(pair.target, pair.drafter, GAMMA, k, order=order)
    assert oracle.expected_accepted(dist) == value
    continued = oracle.continue_with_target(dist, pair.target, GAMMA + 1)
    assert continued == _target_joint(pair)
  # The reference code's mixed tie rule: TV 0.041 (K = 2) and 0.079 (K = 3).
  for k, tv in [(2, 0.0410), (3, 0.0787)]:
    dist = mo.gbv_distribution(pair.target, pair.drafter, GAMMA, k, 'capped', tie_rule='code')
    continued = oracle.continue_with_target(dist, pair.target, GAMMA + 1)
    assert abs(mo.total_variation(continued, _target_joint(pair)) - tv) < 1e-4


@pytest.mark.parametrize('seed', range(3))
def test_oracle_is_lossless(seed):
  pair = helpers.random_toy_pair(300 + seed, vocab=3, gamma=GAMMA)
  joint = _target_joint(pair)
  for k in (1, 2, 3):
    for order in mo.ORDERS:
      dist = mo.gbv_distribution(pair.target, pair.drafter, GAMMA, k, order)
      assert oracle.continue_with_target(dist, pair.target, GAMMA + 1) == joint, (k, order)
    dist = mo.rrs_distribution(pair.target, pair.drafter, GAMMA, k)
    assert oracle.continue_with_target(dist, pair.target, GAMMA + 1) == joint, k


def test_oracle_rrs_at_one_path_is_token_verification():
  pair = helpers.random_toy_pair(310, vocab=3, gamma=GAMMA)
  assert mo.rrs_distribution(pair.target, pair.drafter, GAMMA, 1) == oracle.iteration_distribution(
    pair.target, pair.drafter, GAMMA, 'token'
  )
  assert mo.gbv_distribution(pair.target, pair.drafter, GAMMA, 1) == oracle.iteration_distribution(
    pair.target, pair.drafter, GAMMA, 'block'
  )


def test_oracle_skipping_repeated_children_is_lossy():
  """Trying each DISTINCT child once (instead of one trial per path) is not lossless."""
  pair = _token_pair()
  dist = mo.rrs_distribution(pair.target, pair.drafter, GAMMA, 3, skip_repeats=True)
  continued = oracle.continue_with_target(dist, pair.target, GAMMA + 1)
  assert mo.total_variation(continued, _target_joint(pair)) > 0.01


def test_order_efficiency():
  """The measurement behind the kernel's ratio order: exact E[tau] per order.

  Measured (G = 2; 20 random context-dependent models, seeds 400-419, no shared rows):
  V = 3, K = 2: capped 1.0946, ratio 1.0985 (ratio better on 2 models, equal on 18);
  V = 3, K = 3: capped 1.1258, ratio 1.1300 (better on 2, equal on 17, worse on 1);
  V = 4, K = 2: capped 0.9785, ratio 0.9937 (better on 5, equal on 15);
  V = 4, K = 3: capped 1.0133, ratio 1.0395 (better on 4, equal on 16).
  The V = 3 Markov toy: K = 2 capped 1.3647, ratio 1.5677; K = 3 capped 1.1893 (below K = 1's
  1.245), ratio 1.6495. Checked here on that toy and 10 of the V = 3 models."""
  pairs = [_spec_markov_pair()] + [
    helpers.random_toy_pair(400 + s, vocab=3, gamma=GAMMA, shared=0.0) for s in range(10)
  ]
  capped, ratio = defaultdict(list), defaultdict(list)
  for pair in pairs:
    for k in (2, 3):
      for order, results in [('capped', capped), ('ratio', ratio)]:
        dist = mo.gbv_distribution(pair.target, pair.drafter, GAMMA, k, order)
        results[k].append(float(oracle.expected_accepted(dist)))
  for k in (2, 3):
    gains = np.array(ratio[k]) - np.array(capped[k])
    assert gains.mean() > 0 and np.sum(gains > 1e-12) > np.sum(gains < -1e-12), (k, gains)
  assert ratio[3][0] > ratio[2][0] > 1.245 > capped[3][0]  # the V = 3 Markov toy


# ----------------------------------------------------------------------------------------------
# 2. Kernel math on every K-tuple.


# A negative control plants one bug in a public kernel: pieces of verify_multipath swapped while
# the kernel is traced (`helpers.swapped_multipath`), or Y drawn by block verification assembled
# from verify's public pieces with another residual (`helpers.GBV_VARIANTS`, `helpers.gbv_run`).
# With nothing swapped, the runs below are the public kernels bit for bit
# (test_unswapped_runs_are_the_public_kernels), so each control differs from a public kernel by
# its planted bug alone.

_NODE_TRIALS = vm.node_trials  # the original, for the swapped pieces


def _skip_repeats_trials(p_node, q_paths, children, alive):
  """Bug: try each distinct child once (a repeat of an earlier child is not tried)."""
  earlier = jnp.tril(jnp.ones((children.shape[1],) * 2, bool), -1)
  seen = jnp.any((children[:, :, None] == children[:, None, :]) & earlier & alive[:, None], -1)
  return _NODE_TRIALS(p_node, q_paths, children, alive & ~seen)


def _no_update_trials(p_node, q_paths, children, alive):
  """Bug: every trial compares with the target's row p_v, not with the updated residual."""
  p_x = jnp.take_along_axis(p_node, children, axis=1)
  q_x = jnp.take_along_axis(q_paths, children[..., None], axis=2)[..., 0]
  acceptance = jnp.where(alive, verify.token_acceptance(p_x, q_x), 0.0)
  _, single_draft_residual = _NODE_TRIALS(p_node, q_paths[:, :1], children[:, :1], alive[:, :1])
  return acceptance, single_draft_residual


TOKEN_VARIANTS = {
  'token': _NODE_TRIALS,
  'token/skip_repeats': _skip_repeats_trials,
  'token/no_residual_update': _no_update_trials,
}


_JITTED_TRIALS = {name: jax.jit(fn) for name, fn in TOKEN_VARIANTS.items()}


@functools.partial(jax.jit, static_argnames=('variant',))
def _token_run(rng, tokens, q, p, variant):
  """`multipath_token_verify` traced here (not its own jit's cached trace) with the variant's
  node trials."""
  with helpers.swapped_multipath({'node_trials': TOKEN_VARIANTS[variant]}):
    return vm.multipath_token_verify.__wrapped__(rng, tokens, q, p)


PUBLIC_KERNELS = {'block': vm.multipath_block_verify, 'token': vm.multipath_token_verify}


def _run_variant(variant, rng, tokens, q, p):
  """The public kernel for 'block' / 'token'; the kernel with the variant's bug otherwise."""
  if variant in PUBLIC_KERNELS:
    return PUBLIC_KERNELS[variant](rng, tokens, q, p)
  if variant.startswith('token'):
    return _token_run(rng, tokens, q, p, variant)
  return helpers.gbv_run(rng, tokens, q, p, variant)


def _next_row(tau, weight, p_selected, residual_q, gamma):
  """Y's law as verify._sample_next defines it, in float64."""
  if tau == gamma:
    row = p_selected[gamma]
  else:
    row = np.maximum(weight * p_selected[tau] - residual_q[tau], 0.0)
    row = row if row.sum() > 0 else p_selected[tau]
  return row / row.sum()


def _gbv_kernel_law(pair, num_drafts, variant):
  """The law of (X*^tau, Y) from the kernel's own selection, q_hat, h and residual."""
  tokens, q, p, probs = mo.all_tuples(pair.target, pair.drafter, pair.gamma, num_drafts)
  plan = [np.asarray(x, np.float64) for x in helpers.gbv_plan(tokens, q, p, variant)]
  _, selected, _, p_selected, residual_q, weights, acceptance = plan
  selected = selected.astype(int)
  law = defaultdict(float)
  for n, prob in enumerate(probs):
    h = acceptance[n]
    for tau in range(pair.gamma + 1):
      tau_prob = (1.0 if tau == 0 else h[tau - 1]) * np.prod(1.0 - h[tau:])
      if tau_prob == 0:
        continue
      row = _next_row(tau, weights[n, tau], p_selected[n], residual_q[n], pair.gamma)
      for y in np.flatnonzero(row):
        law[tuple(selected[n, :tau]) + (int(y),)] += prob * tau_prob * row[y]
  return dict(law)


def _token_kernel_law(pair, num_drafts, variant):
  """The law of (X^tau, Y) from the kernel's node trials, branching on every accepted child."""
  tokens, q, p, probs = mo.all_tuples(pair.target, pair.drafter, pair.gamma, num_drafts)
  trials = _JITTED_TRIALS[variant]
  rows = np.arange(len(probs))
  law = defaultdict(float)

  def descend(alive, weight, prefix):
    depth = len(prefix)
    first = np.argmax(alive, axis=1)
    p_node = p[rows, first, depth]
    if depth == pair.gamma:
      for y in range(pair.vocab):
        law[prefix + (y,)] += float(np.sum(weight * p_node[:, y] / p_node.sum(-1)))
      return
    h, draw_from = (
      np.asarray(x, np.float64) for x in trials(p_node, q[:, :, depth], tokens[:, :, depth], alive)
    )
    reach = np.cumprod(np.pad(1.0 - h, ((0, 0), (1, 0)), constant_values=1.0), axis=1)
    stop = weight * reach[:, -1]
    for y in range(pair.vocab):
      law[prefix + (y,)] += float(np.sum(stop * draw_from[:, y] / draw_from.sum(-1)))
    accept = reach[:, :-1] * h
    for x in range(pair.vocab):
      goes = tokens[:, :, depth] == x
      branch = weight * np.sum(accept * goes, axis=1)
      if np.any(branch > 0):
        descend(alive & goes, branch, prefix + (x,))

  descend(np.ones(tokens.shape[:2], bool), probs, ())
  return {seq: prob for seq, prob in law.items() if prob > 0}


def _kernel_law(pair, num_drafts, variant):
  if variant.startswith('token'):
    return _token_kernel_law(pair, num_drafts, variant)
  return _gbv_kernel_law(pair, num_drafts, variant)


def _kernel_tv(pair, num_drafts, variant):
  law = _kernel_law(pair, num_drafts, variant)
  assert abs(sum(law.values()) - 1) < 1e-5
  continued = oracle.continue_with_target(law, pair.target, pair.gamma + 1)
  return mo.total_variation(continued, _target_joint(pair))


@functools.cache
def _token_pair() -> helpers.ToyPair:
  """V = 4: skipping repeated children is lossy here (at V = 3 the toys hide it)."""
  return helpers.random_toy_pair(0, vocab=4, gamma=GAMMA)


def _pair_for(variant):
  return _token_pair() if variant.startswith('token') else _spec_markov_pair()


@pytest.mark.parametrize('num_drafts', [2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize('variant', ['block', 'block/capped', 'token'])
def test_kernel_math_is_exact(variant, num_drafts):
  for pair in (_pair_for(variant), helpers.random_toy_pair(320, vocab=3, gamma=GAMMA)):
    tv = _kernel_tv(pair, num_drafts, variant)
    assert tv < EXACT_TOLERANCE, f'{variant} K={num_drafts}: TV {tv:.2e}'


@pytest.mark.parametrize('num_drafts', [2, 3])
def test_kernel_gbv_matches_rational_oracle(num_drafts):
  """Cell by cell against tests/multipath_oracle.py (capped order: its float ties at 1 are
  exact, so the kernel and the oracle rank tokens alike)."""
  pair = _spec_markov_pair()
  law = _kernel_law(pair, num_drafts, 'block/capped')
  exact = mo.gbv_distribution(pair.target, pair.drafter, GAMMA, num_drafts, 'capped')
  assert set(law) == set(exact)
  assert max(abs(law[k] - float(v)) for k, v in exact.items()) < 1e-6


@pytest.mark.parametrize('variant', ['block', 'block/capped'])
def test_kernel_skew_is_the_law_of_the_selected_path(variant):
  """q_hat at every node of the selected path equals the brute-force conditional law of the
  kernel's own selection over all K-tuples."""
  pair, num_drafts = _spec_markov_pair(), 3
  tokens, q, p, probs = mo.all_tuples(pair.target, pair.drafter, GAMMA, num_drafts)
  _, selected, q_hat, *_ = (np.asarray(x) for x in helpers.gbv_plan(tokens, q, p, variant))
  for depth in range(GAMMA):
    for node in {tuple(s[:depth]) for s in selected}:
      through = np.all(selected[:, :depth] == node, axis=1)
      brute = (
        np.bincount(selected[through, depth], probs[through], pair.vocab) / probs[through].sum()
      )
      np.testing.assert_allclose(
        q_hat[through, depth], np.broadcast_to(brute, (through.sum(), pair.vocab)), atol=1e-6
      )


NEGATIVE_CONTROLS = {
  'block/code_tie_rule': 2,
  'block/residual_from_q': 2,
  'block/select_by_p': 2,
  'token/skip_repeats': 3,
  'token/no_residual_update': 2,
}


@pytest.mark.parametrize('variant', sorted(NEGATIVE_CONTROLS))
def test_negative_controls_fail_kernel_math(variant):
  tv = _kernel_tv(_pair_for(variant), NEGATIVE_CONTROLS[variant], variant)
  assert tv > 1e-3, f'{variant}: TV {tv:.2e} is not detectably lossy'


# ----------------------------------------------------------------------------------------------
# 3. Sampling: chi-square over NUM_ROWS jitted rows.


def _draft_paths(pair, num_drafts, seed):
  """K independent paths per row: [N, K, G] tokens, [N, K, G, V] q, [N, K, G+1, V] p."""
  drafts = [helpers.toy_drafts(pair, seed * 10 + k) for k in range(num_drafts)]
  return tuple(np.stack(x, axis=1) for x in zip(*drafts))


def _chi_square(variant, pair, num_drafts, seed):
  tokens, q, p = _draft_paths(pair, num_drafts, seed)
  result = _run_variant(variant, jax.random.key(seed), jnp.asarray(tokens), q, p)
  path, tau, y = (np.asarray(x) for x in result)
  selected = tokens[np.arange(len(path)), path]
  rng = np.random.default_rng(seed + 1000)  # independent of the drafting seeds
  length = pair.gamma + 1
  seqs = helpers.continue_with_target(
    pair, helpers.emitted_sequences(selected, tau, y), tau + 1, rng
  )
  codes = helpers.sequence_codes(seqs, length, pair.vocab)
  return helpers.codes_pvalue(codes, _target_joint(pair), pair.vocab, length)


@pytest.mark.parametrize(
  'variant, num_drafts',
  [
    ('block', 2),
    ('token', 2),
    pytest.param('block', 3, marks=pytest.mark.slow),
    pytest.param('token', 3, marks=pytest.mark.slow),
  ],
)
def test_chi_square_lossless(variant, num_drafts):
  pvalue = _chi_square(variant, _pair_for(variant), num_drafts, seed=1)
  assert pvalue > SIGNIFICANCE, f'{variant} K={num_drafts}: chi-square p = {pvalue:.2e}'


def test_unswapped_runs_are_the_public_kernels():
  """With nothing swapped, the runs the negative controls plant their bugs in are the public
  kernels, bit for bit, on the chi-square tests' rows."""
  key = jax.random.key(3)
  for variant, run in [('block', helpers.gbv_run), ('token', _token_run)]:
    tokens, q, p = _draft_paths(_pair_for(variant), 2, seed=1)  # the chi-square test's shapes
    expected = PUBLIC_KERNELS[variant](key, tokens, q, p)
    for e, a in zip(expected, run(key, jnp.asarray(tokens), q, p, variant), strict=True):
      np.testing.assert_array_equal(e, a)


@pytest.mark.parametrize(
  'variant',
  [
    'block/code_tie_rule',
    'token/skip_repeats',
    pytest.param('block/residual_from_q', marks=pytest.mark.slow),
    pytest.param('block/select_by_p', marks=pytest.mark.slow),
    pytest.param('token/no_residual_update', marks=pytest.mark.slow),
  ],
)
def test_negative_controls_fail_chi_square(variant):
  pvalue = _chi_square(variant, _pair_for(variant), NEGATIVE_CONTROLS[variant], seed=1)
  assert pvalue < SIGNIFICANCE, f'{variant} passed the chi-square test (p = {pvalue:.3g})'


# ----------------------------------------------------------------------------------------------
# K = 1, temperature 0, numerics, shapes.


@pytest.mark.parametrize(
  'gamma, vocab',
  [pytest.param(1, 2, marks=pytest.mark.slow), (3, 5), pytest.param(4, 40, marks=pytest.mark.slow)],
)
def test_one_path_is_single_path_verification(gamma, vocab):
  """Same key, same outputs as verify.block_verify / verify.token_verify, on random and
  degenerate rows (one-hot, uniform, sparse, tiny entries, p == q)."""
  batch = 600
  rng = np.random.default_rng(gamma * 100 + vocab)
  kinds = helpers.DEGENERATE_KINDS
  q = helpers.degenerate_probs(rng, rng.choice(kinds, batch * gamma), (batch, gamma, vocab))
  p = helpers.degenerate_probs(
    rng, rng.choice(kinds, batch * (gamma + 1)), (batch, gamma + 1, vocab), q
  )
  tokens = np.argmax(np.log(q + 1e-45) + rng.gumbel(size=q.shape), axis=-1).astype(np.int32)
  for seed in range(3):
    key = jax.random.key(seed)
    for single, multi in [
      (verify.block_verify, vm.multipath_block_verify),
      (verify.token_verify, vm.multipath_token_verify),
    ]:
      expected = single(key, tokens, q, p)
      got = multi(key, tokens[:, None], q[:, None], p[:, None])
      np.testing.assert_array_equal(got.num_accepted, expected.num_accepted)
      np.testing.assert_array_equal(got.next_token, expected.next_token)
      np.testing.assert_array_equal(got.path, 0)


@pytest.mark.parametrize(
  'num_drafts',
  [pytest.param(1, marks=pytest.mark.slow), 3, pytest.param(5, marks=pytest.mark.slow)],
)
def test_temperature_zero_accepts_longest_argmax_prefix(num_drafts):
  """One-hot p = onehot(target argmax) and q = onehot(each path's own draft): both verifiers
  accept the longest prefix any path shares with the argmax chain and emit the argmax after it,
  which is multipath_greedy_verify on ids."""
  batch, gamma, vocab = 512, 3, 3
  rng = np.random.default_rng(num_drafts)
  argmax = rng.integers(0, vocab, (batch, num_drafts, gamma + 1))
  argmax[:, :, 0] = argmax[:, :1, 0]  # the root is one node
  drafts = np.where(
    rng.random((batch, num_drafts, gamma)) < 0.7,
    argmax[..., :-1],
    rng.integers(0, vocab, (batch, num_drafts, gamma)),
  )
  # A node's argmax is a function of the node: paths sharing a prefix share it.
  for b, k, i in itertools.product(range(batch), range(1, num_drafts), range(1, gamma + 1)):
    for j in range(k):
      if np.array_equal(drafts[b, j, :i], drafts[b, k, :i]):
        argmax[b, k, i] = argmax[b, j, i]
        break
  p = jax.nn.one_hot(argmax, vocab)
  q = jax.nn.one_hot(drafts, vocab)
  drafts, argmax = jnp.asarray(drafts, jnp.int32), jnp.asarray(argmax, jnp.int32)
  expected = vm.multipath_greedy_verify(drafts, argmax)
  assert {1, gamma} <= set(np.asarray(expected.num_accepted).tolist())
  rows = np.arange(batch)
  for verify_fn in vm.VERIFIERS.values():
    for seed in range(2):
      got = verify_fn(jax.random.key(seed), drafts, q, p)
      np.testing.assert_array_equal(got.num_accepted, expected.num_accepted)
      np.testing.assert_array_equal(got.next_token, expected.next_token)
      # The returned path holds the accepted prefix.
      chosen = np.asarray(drafts)[rows, np.asarray(got.path)]
      best = np.asarray(drafts)[rows, np.asarray(expected.path)]
      for i in range(gamma):
        mask = np.asarray(got.num_accepted) > i
        np.testing.assert_array_equal(chosen[mask, i], best[mask, i])
  np.testing.assert_array_equal(
    vm.multipath_token_verify(jax.random.key(0), drafts, q, p).path, expected.path
  )


def _skew_float64(q_row, keys, mass_below, mass, num_drafts):
  """docs/method.md section 6's law in float64 with the unnormalized A = mass_below and
  Q = mass, as `Q q(t) sum_j hi^j lo^(K-1-j)` normalized (the factored `hi^K - lo^K`: the direct difference
  cancels catastrophically, even in float64, once Q q(t) << A)."""
  order = np.lexsort((np.arange(len(keys)), keys))
  below = np.zeros_like(q_row)
  below[order] = np.concatenate([[0.0], np.cumsum(q_row[order])[:-1]])
  lo = mass_below + mass * below
  hi = lo + mass * q_row
  powers = sum(hi**j * lo ** (num_drafts - 1 - j) for j in range(num_drafts))
  law = mass * q_row * powers
  return law / law.sum()


# The kernel's ratio key, and the reference code's capped key (the law under its many ties).
KEYS = {'ratio': ('block', vm.order_key), 'capped': ('block/capped', helpers.capped_key)}


@pytest.mark.parametrize(
  'num_drafts, orders',
  [
    pytest.param(2, tuple(KEYS), marks=pytest.mark.slow),
    pytest.param(4, tuple(KEYS), marks=pytest.mark.slow),
    pytest.param(8, ('capped',), marks=pytest.mark.slow),
    (8, ('ratio',)),
  ],
)
def test_large_vocabulary_is_stable(num_drafts, orders):
  """V = 32000 random logits, K up to 8: finite, in range; q_hat rows are distributions that
  match the float64 closed form (where the reference code divides by A and is unstable), under
  the kernel's key and the capped one."""
  batch, gamma, vocab = 2, 2, 32000
  rng = np.random.default_rng(num_drafts)
  target_logits = rng.normal(size=(batch, num_drafts, gamma + 1, vocab)).astype(np.float32) * 3
  draft_logits = target_logits[:, :, :gamma] + rng.normal(
    size=(batch, num_drafts, gamma, vocab)
  ).astype(np.float32)
  target_logits[:, :, 0] = target_logits[:, :1, 0]
  draft_logits[:, :, 0] = draft_logits[:, :1, 0]
  q = np.array(jax.nn.softmax(draft_logits, axis=-1))
  p = np.array(jax.nn.softmax(target_logits, axis=-1))
  # Paths share the root; a shared first token then needs shared rows below it too.
  tokens = np.argmax(np.log(q) + rng.gumbel(size=q.shape), axis=-1).astype(np.int32)
  tokens[:, :, 0] = np.where(
    rng.random((batch, num_drafts)) < 0.5, tokens[:, :1, 0], tokens[:, :, 0]
  )
  for b, k in itertools.product(range(batch), range(1, num_drafts)):
    same = [j for j in range(k) if tokens[b, j, 0] == tokens[b, k, 0]]
    if same:
      tokens[b, k, 1:] = tokens[b, same[0], 1:]
      q[b, k], p[b, k] = q[b, same[0]], p[b, same[0]]
  for verify_fn in vm.VERIFIERS.values():
    for seed in range(len(orders)):
      path, tau, y = (np.asarray(x) for x in verify_fn(jax.random.key(seed), tokens, q, p))
      assert np.all((path >= 0) & (path < num_drafts)) and np.all((tau >= 0) & (tau <= gamma))
      assert np.all((y >= 0) & (y < vocab))
  for order in orders:
    variant, key = KEYS[order]
    select = jax.jit(functools.partial(helpers.gbv_select_path, variant=variant))
    _, selected, q_hat, _ = (np.asarray(x) for x in select(tokens, q, p))
    assert np.all(np.isfinite(q_hat)) and np.all(q_hat >= 0)
    np.testing.assert_allclose(q_hat.sum(-1), 1.0, atol=1e-5)
    for b in range(batch):
      below, mass, alive = 0.0, 1.0, np.ones(num_drafts, bool)
      for i in range(gamma):
        first = np.argmax(alive)
        q_row = q[b, first, i].astype(np.float64)
        keys = np.asarray(key(p[b, first, i], q[b, first, i]))
        expected = _skew_float64(q_row, keys, below, mass, num_drafts)
        np.testing.assert_allclose(q_hat[b, i], expected, rtol=1e-3, atol=1e-9)
        x = selected[b, i]
        below += (
          mass * q_row[keys < keys[x]].sum()
          + mass * q_row[(keys == keys[x]) & (np.arange(vocab) < x)].sum()
        )
        mass *= q_row[x]
        alive &= tokens[b, :, i] == x


@pytest.mark.parametrize(
  'tokens_shape, q_shape, p_shape, message',
  [
    ((2, 3), (2, 3, 4), (2, 4, 4), 'draft_tokens'),
    ((2, 1, 0), (2, 1, 0, 4), (2, 1, 1, 4), 'G >= 1'),
    ((2, 2, 3), (2, 1, 3, 4), (2, 2, 4, 4), 'draft_probs'),
    ((2, 2, 3), (2, 2, 3, 4), (2, 2, 3, 4), 'target_probs'),
  ],
)
def test_bad_shapes(tokens_shape, q_shape, p_shape, message):
  for verify_fn in vm.VERIFIERS.values():
    with pytest.raises(ValueError, match=message):
      verify_fn(
        jax.random.key(0), jnp.zeros(tokens_shape, jnp.int32), jnp.ones(q_shape), jnp.ones(p_shape)
      )


def test_every_multipath_kernel_is_a_registered_verifiers():
  """The registry's multipath kernels are this module's, one per verifier of one iteration."""
  kernels = {v.name: v.multipath for v in verifiers.REGISTRY.values() if v.multipath}
  assert kernels == vm.VERIFIERS and set(vm.VERIFIERS) == set(verify.VERIFIERS)


def test_bonus_token_comes_from_the_leaf():
  """Identical models accept every draft (tau = G); Y is then drawn from the leaf's target row."""
  shape = (512, 3, 3)  # test_temperature_zero_accepts_longest_argmax_prefix's: compiled once
  tokens = jnp.zeros(shape, jnp.int32)
  q = jnp.full(shape + (3,), 1 / 3)
  p = jnp.concatenate(
    [jnp.full(shape + (3,), 1 / 3), jax.nn.one_hot(jnp.full(shape[:2] + (1,), 2), 3)], 2
  )
  for verify_fn in vm.VERIFIERS.values():
    path, tau, y = verify_fn(jax.random.key(0), tokens, q, p)
    np.testing.assert_array_equal(tau, shape[2])
    np.testing.assert_array_equal(y, 2)
    np.testing.assert_array_equal(path, 0)
