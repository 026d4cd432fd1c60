"""Tests for specdec_jax.verify_greedy: greedy block verification is exactly lossless over whole
sequences and reaches the per-block optimum each iteration (docs/method.md section 11).

Two layers, deterministic (the decode loop's chi-square tests are tests/decode_greedy_block_test.py):
1. Rational oracle (tests/greedy_block_oracle.py, independent of the kernel): the numbers of the
   specification's reference script (shared/research/gbv_reference.py), exactly.
2. Distribution mode: the kernel's own h~ values, corrections and carried levels
   (`verify_greedy.iteration_law`, float32) enumerated over every block and iteration give the
   target's law of the first N tokens (TV < EXACT_TOLERANCE), the oracle's E[accepted] per
   iteration and E[tokens] after T iterations, and the oracle's deepest stack. Each negative
   control (one piece of verify_greedy swapped for a plausible bug) is evaluated the same way and
   must miss the target's law by more than CONTROL_TV.
"""

import functools
import types
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import verifiers, verify, verify_greedy
from tests import chisquare, helpers, verify_oracle
from tests import greedy_block_oracle as go

EXACT_TOLERANCE = 1e-5  # float32 kernel vs the exact law, total variation / expectations
FLOAT64_TOLERANCE = 1e-12  # the same kernel in float64 (measured ~1e-16; float32's ~3e-8)
CONTROL_TV = 1e-3  # a negative control must miss the target's law by more than this

# name: (models, gamma, tokens compared, iterations T of E[tokens after T])
MODELS = {
  'toy': (go.TOY, 2, 6, 4),  # Sun et al. §3
  'markov3': (go.MARKOV3, 3, 5, 3),  # nested levels (depth 2)
  'zeros': (go.ZEROS, 2, 5, 3),  # zero probabilities in both models (w = inf, L(X) = 0)
}


@functools.cache
def _rational(model: str) -> go.RationalChain:
  models, gamma, _, _ = MODELS[model]
  return go.RationalChain(*models, gamma)


def _kernel(model: str, dtype=np.float32) -> go.KernelChain:
  (target, drafter), gamma, _, _ = MODELS[model]
  target_row, context = go.markov_rows(target)
  drafter_row, _ = go.markov_rows(drafter)
  return go.KernelChain(target_row, drafter_row, context, len(target[None]), gamma, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# 1. The rational oracle.


def test_oracle_reproduces_the_reference_numbers():
  """gbv_reference.py's values (the specification's section 7.2), exactly."""
  toy = _rational('toy')
  assert [toy.first_accepted(m) for m in ('token', 'block', 'greedy')] == [
    Fraction(10, 9),
    Fraction(11, 9),
    Fraction(12, 9),
  ]
  assert toy.block_bound() == Fraction(4, 3)
  after = {m: [toy.tokens_after(m, t) for t in (1, 2, 3, 4)] for m in ('token', 'block', 'greedy')}
  assert after['token'] == [Fraction(19 * t, 9) for t in (1, 2, 3, 4)]
  assert after['block'] == [Fraction(20 * t, 9) for t in (1, 2, 3, 4)]
  # Greedy leads at T = 1, ties at 2 and falls behind block verification from 3 on.
  assert after['greedy'] == [Fraction(21, 9), Fraction(40, 9), Fraction(59, 9), Fraction(78, 9)]
  markov = _rational('markov3')
  assert [markov.first_accepted(m) for m in ('token', 'block', 'greedy')] == [
    Fraction(2291, 1440),
    Fraction(1371, 800),
    Fraction(11161, 6000),
  ]
  assert markov.block_bound() == Fraction(11161, 6000)
  assert _rational('zeros').first_accepted('greedy') == _rational('zeros').block_bound()


@pytest.mark.parametrize('model', sorted(MODELS))
def test_oracle_is_lossless(model):
  chain, (_, gamma, tokens, _) = _rational(model), MODELS[model]
  target = chain.target_joint(tokens)
  for method in ('token', 'block', 'greedy'):
    assert chain.joint(method, tokens) == target, method
  assert chain.max_depth('greedy', tokens) == gamma - 1  # the full stack is reached


@pytest.mark.slow  # ~1 s here, ~15 s for the kernel below
def test_binary_stress_model_gamma_4():
  """The reference script's --stress case: nested levels three deep, lossless over 8 tokens."""
  chain = go.RationalChain(*go.BINARY, 4)
  assert chain.first_accepted('greedy') == Fraction(22169, 10000) == chain.block_bound()
  assert chain.joint('greedy', 8) == chain.target_joint(8)
  assert chain.max_depth('greedy', 8) == 3
  target_row, context = go.markov_rows(go.BINARY[0])
  drafter_row, _ = go.markov_rows(go.BINARY[1])
  kernel = go.KernelChain(target_row, drafter_row, context, 2, 4)
  exact = {k: float(v) for k, v in chain.target_joint(8).items()}
  assert go.total_variation(kernel.joint(8), exact) < EXACT_TOLERANCE
  assert kernel.first_accepted() == pytest.approx(2.2169, abs=EXACT_TOLERANCE)
  assert kernel.max_depth() == 3


# ----------------------------------------------------------------------------------------------
# 2. The kernel in distribution mode.


@pytest.mark.parametrize('model', sorted(MODELS))
def test_kernel_is_lossless_and_optimal(model):
  """The kernel's own law of the first N tokens is the target's; per iteration it keeps the
  oracle's E[accepted] (the first iteration: the per-block optimum, above block verification);
  E[tokens] after T iterations and the deepest stack are the oracle's."""
  chain, kernel = _rational(model), _kernel(model)
  _, gamma, tokens, iterations = MODELS[model]
  exact = {k: float(v) for k, v in chain.target_joint(tokens).items()}
  assert go.total_variation(kernel.joint(tokens), exact) < EXACT_TOLERANCE
  assert kernel.first_accepted() == pytest.approx(float(chain.block_bound()), abs=EXACT_TOLERANCE)
  assert kernel.first_accepted() >= float(chain.first_accepted('block')) - EXACT_TOLERANCE
  for t in range(1, iterations + 1):
    expected = float(chain.tokens_after('greedy', t))
    assert kernel.tokens_after(t) == pytest.approx(expected, abs=EXACT_TOLERANCE), t
  assert kernel.max_depth() == chain.max_depth('greedy', tokens) == gamma - 1


@pytest.mark.parametrize('model', sorted(MODELS))
def test_kernel_in_float64_is_the_exact_law(model):
  """The same kernel in float64 (x64 on) meets the rational oracle to FLOAT64_TOLERANCE: what
  EXACT_TOLERANCE allows the float32 kernel is its rounding, not a slack a bug could hide in
  (each negative control misses by more than CONTROL_TV)."""
  chain = _rational(model)
  _, gamma, tokens, iterations = MODELS[model]
  exact = {k: float(v) for k, v in chain.target_joint(tokens).items()}
  with jax.enable_x64(True):
    kernel = _kernel(model, np.float64)
    assert go.total_variation(kernel.joint(tokens), exact) < FLOAT64_TOLERANCE
    assert abs(kernel.first_accepted() - float(chain.block_bound())) < FLOAT64_TOLERANCE
    for t in range(1, iterations + 1):
      assert (
        abs(kernel.tokens_after(t) - float(chain.tokens_after('greedy', t))) < FLOAT64_TOLERANCE
      )


def test_toy_falls_behind_block_verification_after_three_iterations():
  """G3 on the toy: E[tokens] after 3 iterations, greedy 59/9 < block 60/9 (exactly: oracle)."""
  assert _kernel('toy').tokens_after(3) == pytest.approx(59 / 9, abs=EXACT_TOLERANCE)
  assert _rational('toy').tokens_after('block', 3) == Fraction(60, 9)


@pytest.mark.parametrize(
  'control, model',
  [('state_dropped', 'toy'), ('w_clipped', 'toy'), ('block_residual', 'markov3')],
)
def test_negative_controls_miss_the_target_law(control, model):
  """Each plausible bug gives a law of the first N tokens off the target's (TV: 0.160 and 0.158
  on the toy; the block residual 0.0031 on markov3, where tau < G with w_tau > 1 occurs; it never
  does on the toy at G = 2)."""
  chain = _rational(model)
  tokens = MODELS[model][2]
  exact = {k: float(v) for k, v in chain.target_joint(tokens).items()}
  with helpers.patched_verify_greedy(control):
    tv = go.total_variation(_kernel(model).joint(tokens), exact)
  assert tv > CONTROL_TV, f'{control}: TV {tv:.2e}'


@pytest.mark.parametrize('seed', range(4))
def test_first_iteration_reaches_the_block_bound_on_random_models(seed):
  """On context-dependent random models (V = 3, G = 3, zero probabilities included), the
  kernel's first-iteration E[tau] is sum_i sum_{x^i} min(Mb(x^i), Ms(x^i)), at least block
  verification's, which is at least token verification's (verify_oracle, exact)."""
  pair = helpers.random_toy_pair(200 + seed, vocab=3, gamma=3)
  rows = lambda model: lambda prefix: np.array([float(x) for x in model[prefix]])
  kernel = go.KernelChain(rows(pair.target), rows(pair.drafter), lambda p: p, 3, 3)
  bound = Fraction(0)
  for length in range(1, 4):
    target = verify_oracle.sequence_distribution(pair.target, length, 3)
    drafter = verify_oracle.sequence_distribution(pair.drafter, length, 3)
    bound += sum(min(p, drafter.get(x, 0)) for x, p in target.items())
  expected = {
    m: sum(p * (len(x) - 1) for x, p in verify_oracle.iteration_distribution(pair.target, pair.drafter, 3, m).items())
    for m in ('token', 'block')
  }  # fmt: skip
  assert kernel.first_accepted() == pytest.approx(float(bound), abs=EXACT_TOLERANCE)
  assert bound >= expected['block'] >= expected['token']


# ----------------------------------------------------------------------------------------------
# The sampler and its inputs.


def test_sampler_follows_the_distribution_mode():
  """greedy_block_verify's draws (tau, Y) and levels agree with iteration_law's, row by row in
  law: 200k rows of one toy block from a nested state."""
  rows, gamma, vocab = 200_000, 3, 3
  rng = np.random.default_rng(0)
  q = rng.dirichlet(np.ones(vocab), size=(1, gamma)).astype(np.float32)
  p = rng.dirichlet(np.ones(vocab), size=(1, gamma + 1)).astype(np.float32)
  tokens = jnp.asarray([[0, 2, 1]], jnp.int32)
  levels = jnp.asarray([[0.7, 1.3]], jnp.float32)  # two active levels: w = e^0.7, e^1.3
  tau_probs, y_probs, after = map(np.asarray, verify_greedy.iteration_law(tokens, q, p, levels))
  tile = lambda x: jnp.repeat(jnp.asarray(x), rows, axis=0)
  out = verify_greedy.greedy_block_verify(
    jax.random.key(3), tile(tokens), tile(q), tile(p), tile(levels)
  )
  tau, y, new = map(np.asarray, out)
  observed = np.bincount(tau * vocab + y, minlength=(gamma + 1) * vocab)
  expected = (tau_probs[0][:, None] * y_probs[0]).ravel()
  assert chisquare.pvalue(observed, expected) > chisquare.SIGNIFICANCE
  np.testing.assert_allclose(new, after[0, tau, y], rtol=1e-6)


def test_temperature_zero_is_greedy_verification():
  """One-hot p and q (temperature 0): tau = the longest prefix equal to the target's argmax,
  Y = the argmax after it (verify.greedy_verify), and no level is ever pushed (Y is not the
  draft, so q(Y) = 0: w = inf)."""
  batch, gamma, vocab = 512, 4, 3
  rng = np.random.default_rng(1)
  target_ids = rng.integers(0, vocab, (batch, gamma + 1))
  drafts = np.where(
    rng.random((batch, gamma)) < 0.7, target_ids[:, :-1], rng.integers(0, vocab, (batch, gamma))
  )
  expected = verify.greedy_verify(
    jnp.asarray(drafts, jnp.int32), jnp.asarray(target_ids, jnp.int32)
  )
  levels = verify_greedy.empty_levels(batch, gamma)
  for seed in range(3):
    out = verify_greedy.greedy_block_verify(
      jax.random.key(seed), jnp.asarray(drafts, jnp.int32), jax.nn.one_hot(drafts, vocab),
      jax.nn.one_hot(target_ids, vocab), levels,
    )  # fmt: skip
    np.testing.assert_array_equal(out.num_accepted, expected.num_accepted)
    np.testing.assert_array_equal(out.next_token, expected.next_token)
    assert np.all(np.asarray(out.levels) == np.inf)


@functools.partial(jax.jit, static_argnames='with_kernel')
def _pieces(tokens, q, p, levels, with_kernel=False):
  """(law_rows, path_log_weights, acceptance, the law's / drafter's probabilities of the drafts),
  and the kernel's result (key 0) with `with_kernel`: one program."""
  law, level_log_w = verify_greedy.law_rows(tokens, q, p, levels)
  log_w = verify_greedy.path_log_weights(tokens, q, law)
  h = verify_greedy.acceptance(log_w, q, law)
  pieces = (law, level_log_w, log_w, h, *verify.probs_of_drafts(tokens, q, law))
  if not with_kernel:
    return pieces
  return pieces, verify_greedy.greedy_block_verify(jax.random.key(0), tokens, q, p, levels)


def test_degenerate_inputs_stay_in_range():
  """Zeros, one-hot rows, p == q, tiny values and random carried levels: tau in 0..G, Y a token
  the law gives positive probability, finite or +inf levels, law rows that are distributions."""
  batch, gamma, vocab = 64, 3, 5
  rng = np.random.default_rng(2)
  kinds = list(helpers.DEGENERATE_KINDS)
  q = helpers.degenerate_probs(rng, rng.choice(kinds, batch * gamma), (batch, gamma, vocab))
  p = helpers.degenerate_probs(
    rng, rng.choice(kinds, batch * (gamma + 1)), (batch, gamma + 1, vocab), like=q
  )
  tokens = np.argmax(np.log(q + 1e-45) + rng.gumbel(size=q.shape), axis=-1).astype(np.int32)
  levels = np.where(
    rng.random((batch, gamma - 1)) < 0.5, rng.exponential(2.0, (batch, gamma - 1)), np.inf
  )
  args = (jnp.asarray(tokens), jnp.asarray(q), jnp.asarray(p), jnp.asarray(levels, jnp.float32))
  law = _pieces(*args)[0]
  np.testing.assert_allclose(np.asarray(law).sum(-1), 1.0, rtol=1e-5)
  for seed in range(5):
    tau, y, new = map(np.asarray, verify_greedy.greedy_block_verify(jax.random.key(seed), *args))
    assert np.all((tau >= 0) & (tau <= gamma)) and np.all((y >= 0) & (y < vocab))
    assert np.all(np.asarray(law)[np.arange(batch), tau, y] > 0)
    assert not np.isnan(new).any()


def test_large_vocabulary_numerics():
  """V = 32k, G = 8, random logits and random levels, float32: law rows sum to 1, h~ in [0, 1],
  log-domain weights equal the direct product where it does not underflow, nothing NaN."""
  batch, gamma, vocab = 4, 8, 32_000
  rng = np.random.default_rng(4)
  softmax = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(
    x - x.max(-1, keepdims=True)
  ).sum(-1, keepdims=True)
  p = softmax(2 * rng.normal(size=(batch, gamma + 1, vocab))).astype(np.float32)
  q = softmax(2 * rng.normal(size=(batch, gamma, vocab))).astype(np.float32)
  tokens = np.argmax(np.log(q) + rng.gumbel(size=q.shape), -1).astype(np.int32)
  levels = np.where(rng.random((batch, gamma - 1)) < 0.5, 1.5, np.inf).astype(np.float32)
  pieces, out = _pieces(tokens, q, p, levels, with_kernel=True)
  law, level_log_w, log_w, h, l_x, q_x = map(np.asarray, pieces)
  np.testing.assert_allclose(law.sum(-1), 1.0, rtol=1e-4)
  assert np.all((h >= 0) & (h <= 1))
  direct = np.cumprod(l_x.astype(np.float64) / q_x, axis=1)
  np.testing.assert_allclose(np.exp(log_w[:, 1:]), direct, rtol=1e-4)
  assert not np.isnan(np.asarray(out.levels)).any() and not np.isnan(level_log_w).any()


def test_bad_shapes_and_loop_options_are_one_clear_error():
  tokens, q, p = jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3, 4)) / 4, jnp.ones((2, 4, 4)) / 4
  with pytest.raises(ValueError, match=r'levels must be \[B, G - 1\]'):
    verify_greedy.greedy_block_verify(jax.random.key(0), tokens, q, p, jnp.zeros((2, 3)))
  with pytest.raises(ValueError, match='target_probs'):
    verify_greedy.greedy_block_verify(jax.random.key(0), tokens, q, q, jnp.zeros((2, 2)))
  greedy_block = verifiers.get('greedy_block')
  with pytest.raises(ValueError, match='needs num_drafts=1, got 2'):
    greedy_block.check(num_drafts=2)
  with pytest.raises(ValueError, match='needs draft_stop=None, got 0.5'):
    greedy_block.check(draft_stop=0.5)
  eagle = types.SimpleNamespace(reads_target_states=True)
  with pytest.raises(ValueError, match="reading the target's states"):
    greedy_block.check_drafter(eagle)
  with pytest.raises(ValueError, match='a block drafter'):
    greedy_block.check_drafter(types.SimpleNamespace(reads_target_states=True, block_size=4))
  verifiers.get('block').check(num_drafts=2)  # not its business
  verifiers.get('block').check_drafter(eagle)
  assert verifiers.check_verifier('greedy_block') == 'greedy_block'
  assert 'greedy_block' not in verify.VERIFIERS  # not a one-iteration kernel of that signature
