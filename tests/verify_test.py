"""Tests for specdec_jax.verify.

Distribution tests compare the jitted kernels, run on helpers.TOY_ROWS independent rows, with
the exact distribution enumerated by tests/verify_oracle.py, by a chi-square goodness-of-fit test
at significance SIGNIFICANCE: a correct kernel must give p > SIGNIFICANCE, and each negative
control (a plausible bug) must give p < SIGNIFICANCE on the same rows. Every row drafts its own
block from a context-dependent toy drafter, so p_i and q_i depend on the sampled prefix. Seeds are
fixed.
"""

from fractions import Fraction

import hypothesis
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import strategies as st

from specdec_jax import sampling, verifiers, verify
from tests import verify_oracle as oracle
from tests.chisquare import SIGNIFICANCE
from tests.helpers import (
  DEGENERATE_KINDS,
  ToyPair,
  codes_pvalue,
  continue_with_target,
  degenerate_probs,
  emitted_sequences,
  random_toy_pair,
  sequence_codes,
  sun_toy_pair,
  toy_drafts,
)

METHODS = ('token', 'block')


# ----------------------------------------------------------------------------------------------
# Simulation: toy models as lookup tables, drafting and target continuation in numpy
# (tests/helpers.py), one iteration of a kernel on their rows.


def _run(verify_fn, pair: ToyPair, seed: int):
  """One iteration on each of TOY_ROWS rows; returns (draft tokens [N, G], tau [N], Y [N])."""
  tokens, draft_probs, target_probs = toy_drafts(pair, seed)
  result = verify_fn(
    jax.random.key(seed), jnp.asarray(tokens, jnp.int32), draft_probs, target_probs
  )
  return tokens, np.asarray(result.num_accepted), np.asarray(result.next_token)


def _iteration_pvalue(verify_fn, pair: ToyPair, method: str, seed: int) -> float:
  tokens, tau, next_token = _run(verify_fn, pair, seed)
  codes = sequence_codes(emitted_sequences(tokens, tau, next_token), tau + 1, pair.vocab)
  exact = oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
  return codes_pvalue(codes, exact, pair.vocab, pair.gamma + 1)


# ----------------------------------------------------------------------------------------------
# Negative controls: plausible bugs, built from verify's pieces with one piece swapped.


def _next_from_target(rng, tau, weight, draft_probs, target_probs):
  """Bug: on rejection sample Y from p_{tau+1} instead of the residual."""
  del weight, draft_probs
  return sampling.sample(rng, jnp.take_along_axis(target_probs, tau[:, None, None], axis=1)[:, 0])


def _next_unnormalized(rng, tau, weight, draft_probs, target_probs):
  """Bug: inverse-CDF draw from the residual without renormalizing it (the missing mass lands
  on the last token)."""
  gamma = draft_probs.shape[1]
  p = jnp.take_along_axis(target_probs, tau[:, None, None], axis=1)[:, 0]
  q = jnp.take_along_axis(draft_probs, jnp.minimum(tau, gamma - 1)[:, None, None], axis=1)[:, 0]
  q = jnp.where((tau < gamma)[:, None], q, 0.0)
  residual = jnp.maximum(jnp.where(tau < gamma, weight, 1.0)[:, None] * p - q, 0.0)
  u = jax.random.uniform(rng, tau.shape)
  index = jnp.sum(jnp.cumsum(residual, axis=-1) <= u[:, None], axis=-1)
  return jnp.minimum(index, p.shape[-1] - 1).astype(jnp.int32)


def _inverted_token_acceptance(p_x, q_x, *unused):
  """Bug: the ratio upside down, min(1, q/p)."""
  del unused
  return verify.token_acceptance(q_x, p_x)


def _token_acceptance_in_block(p_x, q_x, *unused):
  """Bug: block selection with the token-verification h_i = min(1, p_i(X_i)/q_i(X_i))."""
  del unused
  return verify.token_acceptance(p_x, q_x)


def _unnormalized_block_acceptance(p_x, q_x, weights, draft_probs, target_probs):
  """Bug: h_i = r_i, the residual mass not divided by r_i + 1 - w_i."""
  del p_x, q_x
  w_inner = weights[:, 1:-1]
  residual = jnp.maximum(w_inner[..., None] * target_probs[:, 1:-1] - draft_probs[:, 1:], 0.0)
  return jnp.concatenate([jnp.sum(residual, axis=-1), weights[:, -1:]], axis=1)


def _token_acceptance(p_x, q_x, *unused):
  del unused
  return verify.token_acceptance(p_x, q_x)


def _block_acceptance(p_x, q_x, weights, draft_probs, target_probs):
  del p_x, q_x
  return verify.block_acceptance(weights, draft_probs, target_probs)


def _make_verifier(method, acceptance=None, sample_next=verify.sample_next):
  """A token or block verifier assembled from verify's pieces, with the acceptance probabilities
  `acceptance(p_x, q_x, weights, draft_probs, target_probs) -> h [B, G]` and the draw of Y
  replaceable."""
  default_acceptance = {'token': _token_acceptance, 'block': _block_acceptance}[method]
  acceptance = acceptance or default_acceptance

  @jax.jit
  def verify_fn(rng, draft_tokens, draft_probs, target_probs):
    p_x, q_x = verify.probs_of_drafts(draft_tokens, draft_probs, target_probs)
    weights = verify.block_weights(p_x, q_x)
    eta_rng, next_rng = jax.random.split(rng)
    accepted = jax.random.uniform(eta_rng, p_x.shape, jnp.float32) < acceptance(
      p_x, q_x, weights, draft_probs, target_probs
    )
    if method == 'token':
      num_accepted = verify.accepted_prefix_length(accepted)
      weight = jnp.ones(num_accepted.shape)
    else:
      num_accepted = verify.longest_accepted_block(accepted)
      weight = jnp.take_along_axis(weights, num_accepted[:, None], axis=1)[:, 0]
    next_token = sample_next(next_rng, num_accepted, weight, draft_probs, target_probs)
    return verify.VerifyResult(num_accepted, next_token)

  return verify_fn


NEGATIVE_CONTROLS = {
  'token/residual=p': ('token', _make_verifier('token', sample_next=_next_from_target)),
  'token/no_renormalization': ('token', _make_verifier('token', sample_next=_next_unnormalized)),
  'token/ratio_q_over_p': ('token', _make_verifier('token', _inverted_token_acceptance)),
  'block/residual=p': ('block', _make_verifier('block', sample_next=_next_from_target)),
  'block/no_renormalization': ('block', _make_verifier('block', sample_next=_next_unnormalized)),
  'block/h_not_normalized': ('block', _make_verifier('block', _unnormalized_block_acceptance)),
  'block/token_h': ('block', _make_verifier('block', _token_acceptance_in_block)),
}


# ----------------------------------------------------------------------------------------------
# Exact distribution tests.


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('seed', [0, 1])
def test_matches_exact_oracle(method, seed):
  pair = random_toy_pair(seed, vocab=4, gamma=3)  # One shape throughout: one compilation.
  pvalue = _iteration_pvalue(verify.VERIFIERS[method], pair, method, seed)
  assert pvalue > SIGNIFICANCE, f'{method}: chi-square p = {pvalue:.2e} at significance 1e-3'


def test_reimplementation_matches_oracle():
  """The assembly used by the negative controls is itself correct when nothing is swapped."""
  pair = random_toy_pair(0, 4, 3)
  tokens, draft_probs, target_probs = toy_drafts(pair, 0)
  for method in METHODS:
    args = (jax.random.key(0), jnp.asarray(tokens, jnp.int32), draft_probs, target_probs)
    expected, actual = verify.VERIFIERS[method](*args), _make_verifier(method)(*args)
    np.testing.assert_array_equal(actual.num_accepted, expected.num_accepted)
    np.testing.assert_array_equal(actual.next_token, expected.next_token)


@pytest.mark.parametrize('name', sorted(NEGATIVE_CONTROLS))
def test_negative_controls_fail(name):
  method, buggy_verify = NEGATIVE_CONTROLS[name]
  pair = random_toy_pair(0, 4, 3)
  pvalue = _iteration_pvalue(buggy_verify, pair, method, seed=0)
  assert pvalue < SIGNIFICANCE, f'{name} passed the chi-square test (p = {pvalue:.3g})'


@pytest.mark.parametrize('method', METHODS)
def test_lossless_with_target_continuation(method):
  """X^tau, Y, then target sampling up to G+1 tokens ~ Mb^(G+1), exactly (oracle) and by
  chi-square (kernel)."""
  pair = random_toy_pair(3, vocab=4, gamma=3)
  length = pair.gamma + 1
  target_joint = oracle.sequence_distribution(pair.target, length, pair.vocab)
  exact = oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
  assert oracle.continue_with_target(exact, pair.target, length) == target_joint

  tokens, tau, next_token = _run(verify.VERIFIERS[method], pair, seed=4)
  rng = np.random.default_rng(1004)  # Not the drafting seed: the continuation must be independent.
  seqs = continue_with_target(pair, emitted_sequences(tokens, tau, next_token), tau + 1, rng)
  codes = sequence_codes(seqs, length, pair.vocab)
  pvalue = codes_pvalue(codes, target_joint, pair.vocab, length)
  assert pvalue > SIGNIFICANCE, f'chi-square p = {pvalue:.2e} at significance 1e-3'


@pytest.mark.parametrize('seed', range(6))
def test_oracle_is_lossless(seed):
  pair = random_toy_pair(100 + seed, vocab=3, gamma=3)
  target_joint = oracle.sequence_distribution(pair.target, pair.gamma + 1, pair.vocab)
  for method in METHODS:
    exact = oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
    assert oracle.continue_with_target(exact, pair.target, pair.gamma + 1) == target_joint


# ----------------------------------------------------------------------------------------------
# Adaptive draft length: drafting stops after the first draft with q_i(X_i) < STOP_BELOW (kept),
# and the row is verified as a block of that length (`lengths`).

STOP_BELOW = Fraction(2, 5)


def _dropping_unsure_drafts(pair, method, stop_below):
  """Bug: stop BEFORE the first unsure draft (drop it) and verify the rest with q as drafted. The
  kept drafts are then conditioned on a draw the verifier never sees."""
  out = {}
  for block, block_prob in oracle.sequence_distribution(
    pair.drafter, pair.gamma, pair.vocab
  ).items():
    p = [pair.target[block[:i]] for i in range(pair.gamma + 1)]
    q = [pair.drafter[block[:i]] for i in range(pair.gamma)]
    length = next((i for i in range(pair.gamma) if q[i][block[i]] < stop_below), pair.gamma)
    for emitted, prob in oracle._verify_block(block[:length], p, q, length, method).items():
      out[emitted] = out.get(emitted, 0) + block_prob * prob
  return out


def _total_variation(a, b) -> float:
  return float(sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b)) / 2)


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('seed', [3, 9])
def test_oracle_adaptive_length_is_lossless(method, seed):
  """Exact: a stop that reads only the drafted prefix is lossless; dropping the unsure draft is
  not (total variation > 0.1 on these pairs)."""
  pair = random_toy_pair(seed, vocab=4, gamma=3)
  length = pair.gamma + 1
  joint = oracle.sequence_distribution(pair.target, length, pair.vocab)
  for stop_below in (Fraction(1, 4), STOP_BELOW):
    exact = oracle.iteration_distribution(
      pair.target, pair.drafter, pair.gamma, method, stop_below=stop_below
    )
    assert exact != oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
    assert oracle.continue_with_target(exact, pair.target, length) == joint
    bug = _dropping_unsure_drafts(pair, method, stop_below)
    assert _total_variation(oracle.continue_with_target(bug, pair.target, length), joint) > 0.1


def _stop_lengths(pair, tokens, draft_probs, drop_unsure=False) -> np.ndarray:
  """Drafts per row under the stop rule (the first unsure draft kept, or dropped: the bug)."""
  q_x = np.take_along_axis(draft_probs, tokens[..., None], axis=-1)[..., 0]
  unsure = q_x < float(STOP_BELOW)
  first = np.where(unsure.any(1), np.argmax(unsure, axis=1) + 1, pair.gamma)
  return first - (drop_unsure & unsure.any(1))


@pytest.mark.parametrize('method', METHODS)
def test_adaptive_length_kernels_match_oracle(method):
  """200k jitted rows verified with per-row `lengths`: chi-square of X^tau, Y against the exact
  law of the stopping drafter; the dropped-draft bug fails the same test."""
  pair = random_toy_pair(9, vocab=4, gamma=3)
  tokens, draft_probs, target_probs = toy_drafts(pair, 9)
  exact = oracle.iteration_distribution(
    pair.target, pair.drafter, pair.gamma, method, stop_below=STOP_BELOW
  )
  pvalues = {}
  for drop_unsure in (False, True):
    lengths = _stop_lengths(pair, tokens, draft_probs, drop_unsure)
    assert 0 < (lengths < pair.gamma).mean() < 1
    result = verify.VERIFIERS[method](
      jax.random.key(9), jnp.asarray(tokens, jnp.int32), draft_probs, target_probs,
      jnp.asarray(lengths, jnp.int32),
    )  # fmt: skip
    tau, y = np.asarray(result.num_accepted), np.asarray(result.next_token)
    assert np.all(tau <= lengths)
    codes = sequence_codes(emitted_sequences(tokens, tau, y), tau + 1, pair.vocab)
    pvalues[drop_unsure] = codes_pvalue(codes, exact, pair.vocab, pair.gamma + 1)
  assert pvalues[False] > SIGNIFICANCE, f'chi-square p = {pvalues[False]:.2e}'
  assert pvalues[True] < SIGNIFICANCE, f'the dropped-draft bug passed (p = {pvalues[True]:.2e})'


@pytest.mark.parametrize('method', METHODS)
def test_full_lengths_are_the_plain_verifier(method):
  pair = random_toy_pair(3, vocab=4, gamma=3)
  tokens, q, p = (jnp.asarray(x) for x in toy_drafts(pair, 3))
  tokens = tokens.astype(jnp.int32)
  full = jnp.full(tokens.shape[:1], pair.gamma, jnp.int32)
  plain = verify.VERIFIERS[method](jax.random.key(1), tokens, q, p)
  with_lengths = verify.VERIFIERS[method](jax.random.key(1), tokens, q, p, full)
  for a, b in zip(plain, with_lengths):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
  ('method', 'expected'), [('token', Fraction(10, 9)), ('block', Fraction(11, 9))]
)
def test_sun_toy_model(method, expected):
  pair = sun_toy_pair()
  exact = oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
  assert oracle.expected_accepted(exact) == expected

  _, tau, _ = _run(verify.VERIFIERS[method], pair, seed=5)
  second_moment = sum((len(seq) - 1) ** 2 * prob for seq, prob in exact.items())
  sigma = np.sqrt(float(second_moment - expected**2) / len(tau))
  assert abs(tau.mean() - float(expected)) < 4 * sigma


def test_block_never_worse_than_token():
  gains = []
  for seed in range(20):
    pair = random_toy_pair(200 + seed, vocab=3, gamma=3, shared=0.0)
    token, block = (
      oracle.expected_accepted(oracle.iteration_distribution(pair.target, pair.drafter, 3, m))
      for m in METHODS
    )
    assert block >= token, seed
    gains.append(block - token)
  assert max(gains) > 0


def test_block_equals_token_at_gamma_one():
  pair = random_toy_pair(7, vocab=4, gamma=1)
  token, block = (oracle.iteration_distribution(pair.target, pair.drafter, 1, m) for m in METHODS)
  assert token == block


# ----------------------------------------------------------------------------------------------
# Temperature 0, degenerate inputs, shapes.


@pytest.mark.parametrize('method', METHODS)
def test_temperature_zero_accepts_longest_argmax_prefix(method):
  batch, gamma, vocab = 256, 4, 6
  rng = np.random.default_rng(6)
  # Small integer logits: many ties, which the lowest-id argmax rule must break consistently.
  target_logits = rng.integers(0, 4, size=(batch, gamma + 1, vocab)).astype(np.float32)
  draft_logits = target_logits[:, :gamma].copy()
  mismatch_at = rng.integers(0, gamma + 1, size=batch)  # gamma: no mismatch.
  for b, i in enumerate(mismatch_at):
    if i < gamma:
      draft_logits[b, i, (np.argmax(target_logits[b, i]) + 1 + rng.integers(vocab - 1)) % vocab] = 9
  greedy = sampling.SamplingConfig(temperature=0.0)
  target_probs = sampling.logits_to_probs(target_logits, greedy)
  draft_probs = sampling.logits_to_probs(draft_logits, greedy)
  draft_tokens = jnp.argmax(draft_logits, axis=-1)
  target_argmax = np.argmax(target_logits, axis=-1)
  for key in range(3):
    result = verify.VERIFIERS[method](jax.random.key(key), draft_tokens, draft_probs, target_probs)
    np.testing.assert_array_equal(result.num_accepted, mismatch_at)
    np.testing.assert_array_equal(result.next_token, target_argmax[np.arange(batch), mismatch_at])


@pytest.mark.parametrize('method', METHODS)
def test_identical_models_accept_everything(method):
  pair = random_toy_pair(8, vocab=4, gamma=3, shared=1.0)
  _, tau, _ = _run(verify.VERIFIERS[method], pair, seed=8)
  assert np.all(tau == pair.gamma)


@pytest.mark.parametrize('gamma, vocab', [(1, 2), (3, 5)])
@hypothesis.settings(max_examples=40, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_degenerate_inputs(gamma, vocab, data):
  batch = 6
  seed = data.draw(st.integers(0, 2**31 - 1))
  q_kinds = data.draw(
    st.lists(st.sampled_from(DEGENERATE_KINDS), min_size=batch * gamma, max_size=batch * gamma)
  )
  p_kinds = data.draw(
    st.lists(
      st.sampled_from(DEGENERATE_KINDS), min_size=batch * (gamma + 1), max_size=batch * (gamma + 1)
    )
  )
  rng = np.random.default_rng(seed)
  q = degenerate_probs(rng, q_kinds, (batch, gamma, vocab))
  p = degenerate_probs(rng, p_kinds, (batch, gamma + 1, vocab), like=q)
  # Mostly drafts the drafter could make, sometimes impossible ones (q(X) = 0).
  tokens = np.where(
    rng.random((batch, gamma)) < 0.8,
    np.argmax(np.log(q + 1e-45) + rng.gumbel(size=q.shape), axis=-1),
    rng.integers(vocab, size=(batch, gamma)),
  )
  rows = np.arange(batch)
  q_x = np.take_along_axis(q, tokens[..., None], axis=-1)[..., 0]
  # XLA on CPU flushes subnormals to zero, so a draft needs a normal q(X) to count as possible.
  possible = q_x >= np.finfo(np.float32).tiny
  same_as_drafter = np.all(p[:, :-1] == q, axis=(1, 2)) & np.all(possible, axis=1)
  for method, verify_fn in verify.VERIFIERS.items():
    result = verify_fn(jax.random.key(seed), jnp.asarray(tokens, jnp.int32), q, p)
    tau, y = np.asarray(result.num_accepted), np.asarray(result.next_token)
    assert result.num_accepted.dtype == jnp.int32 and result.next_token.dtype == jnp.int32
    assert np.all((tau >= 0) & (tau <= gamma)) and np.all((y >= 0) & (y < vocab)), method
    assert np.all(p[rows, tau, y] > 0), f'{method}: emitted a token the target gives probability 0'
    for i in range(gamma):
      assert np.all(p[rows, i, tokens[:, i]][tau > i] > 0), f'{method}: accepted X with p(X) = 0'
    assert np.all(tau[same_as_drafter] == gamma), f'{method}: p == q but a draft was rejected'

  for name, h in _acceptance_probabilities(tokens, q, p).items():
    h = np.asarray(h)
    assert np.all((h >= 0) & (h <= 1)), f'{name} outside [0, 1] or NaN: {h}'


@jax.jit
def _acceptance_probabilities(draft_tokens, draft_probs, target_probs):
  p_x, q_x = verify.probs_of_drafts(draft_tokens, draft_probs, target_probs)
  weights = verify.block_weights(p_x, q_x)
  return {
    'token h': verify.token_acceptance(p_x, q_x),
    'block w': weights,
    'block h': verify.block_acceptance(weights, draft_probs, target_probs),
  }


@pytest.mark.parametrize(
  'tokens_shape, q_shape, p_shape, message',
  [
    ((2, 3, 1), (2, 3, 4), (2, 4, 4), 'draft_tokens'),
    ((2, 0), (2, 0, 4), (2, 1, 4), 'G >= 1'),
    ((2, 3), (2, 2, 4), (2, 4, 4), 'draft_probs'),
    ((2, 3), (2, 3, 4), (2, 3, 4), 'target_probs'),
    ((2, 3), (2, 3, 4), (2, 4, 5), 'target_probs'),
  ],
)
def test_bad_shapes(tokens_shape, q_shape, p_shape, message):
  for verify_fn in verify.VERIFIERS.values():
    with pytest.raises(ValueError, match=message):
      verify_fn(
        jax.random.key(0), jnp.zeros(tokens_shape, jnp.int32), jnp.ones(q_shape), jnp.ones(p_shape)
      )


@pytest.mark.parametrize('bad', ['nope', 'Token', '', None, 1])
def test_check_verifier_is_one_clear_error(bad):
  assert [verifiers.check_verifier(name) for name in METHODS] == list(METHODS)
  with pytest.raises(
    ValueError, match=r"Unknown verifier .*; choose one of \['block', 'greedy_block', 'token'\]"
  ):
    verifiers.check_verifier(bad)


def test_verifiers_registry():
  """VERIFIERS names the two kernels; each returns a VerifyResult with the outcome its rules fix
  on rows where no draw is random: p == q (h = 1: the draft is kept, then Y from a one-hot
  p_{G+1}), and p(X) = 0 (h = 0: Y from the residual (p - q)+ = onehot(2), where p alone could
  give token 1)."""
  assert verify.VERIFIERS == {'token': verify.token_verify, 'block': verify.block_verify}
  rows, third = 64, 1 / 3
  q = np.repeat([[[third] * 3], [[0.5, 0.5, 0.0]]], rows, axis=0)
  p = np.repeat([[[third] * 3, [0.0, 0.0, 1.0]], [[0.0, 0.5, 0.5], [third] * 3]], rows, axis=0)
  tokens = jnp.zeros((2 * rows, 1), jnp.int32)
  for name, verify_fn in verify.VERIFIERS.items():
    result = verify_fn(jax.random.key(0), tokens, q, p)
    assert isinstance(result, verify.VerifyResult), name
    np.testing.assert_array_equal(result.num_accepted, [1] * rows + [0] * rows, err_msg=name)
    np.testing.assert_array_equal(result.next_token, [2] * (2 * rows), err_msg=name)


@pytest.mark.parametrize('gamma', [1, 3, 6])
def test_greedy_verify_equals_both_verifiers_on_one_hot(gamma):
  """At temperature 0 (one-hot p and q) token and block verification reduce to greedy_verify."""
  batch, vocab = 512, 3  # a small vocabulary: long matching prefixes and mismatches both occur
  rng = np.random.default_rng(gamma)
  target_ids = rng.integers(0, vocab, (batch, gamma + 1))
  drafts = np.where(
    rng.random((batch, gamma)) < 0.7, target_ids[:, :-1], rng.integers(0, vocab, (batch, gamma))
  )
  p = jax.nn.one_hot(target_ids, vocab)
  q = jax.nn.one_hot(drafts, vocab)
  drafts, target_ids = jnp.asarray(drafts, jnp.int32), jnp.asarray(target_ids, jnp.int32)
  expected = verify.greedy_verify(drafts, target_ids)
  assert len(set(np.asarray(expected.num_accepted).tolist())) == gamma + 1  # every tau occurs
  for fn in (verify.token_verify, verify.block_verify):
    for seed in range(3):
      got = fn(jax.random.key(seed), drafts, q, p)
      np.testing.assert_array_equal(got.num_accepted, expected.num_accepted)
      np.testing.assert_array_equal(got.next_token, expected.next_token)


# ----------------------------------------------------------------------------------------------
# Non-finite inputs: a NaN or inf in p or q is never a silent wrong answer.


def test_nan_draft_probs_reject_every_draft():
  """The reported bug: all-NaN q was read as q = 0 and every draft was accepted."""
  tokens = jnp.zeros((1, 3), jnp.int32)
  q, p = jnp.full((1, 3, 4), jnp.nan), jnp.full((1, 4, 4), 0.25)
  for method, verify_fn in verify.VERIFIERS.items():
    for seed in range(5):
      tau, y = verify_fn(jax.random.key(seed), tokens, q, p)
      assert int(tau[0]) == 0, method
      assert 0 <= int(y[0]) < 4, method  # the bonus draw from the finite p_1
  np.testing.assert_array_equal(verify.nonfinite_rows(q, p), [True])
  np.testing.assert_array_equal(verify.nonfinite_rows(jnp.full((1, 3, 4), 0.25), p), [False])


@pytest.mark.parametrize('method', METHODS)
def test_inf_at_the_draft_is_rejected(method):
  """p_2(X_2) = inf would give h_2 = min(1, inf / q) = 1. p_1 = q_1 makes X_1 certain, so tau = 1
  exactly, and Y, which would be drawn from the non-finite p_2, is token 0."""
  tokens = jnp.array([[1, 2, 3]], jnp.int32)
  q = jnp.full((1, 3, 4), 0.25)
  p = jnp.full((1, 4, 4), 0.25).at[0, 1, 2].set(jnp.inf)
  for seed in range(5):
    tau, y = verify.VERIFIERS[method](jax.random.key(seed), tokens, q, p)
    assert (int(tau[0]), int(y[0])) == (1, 0)


@pytest.mark.parametrize('method', METHODS)
def test_nan_target_probs_give_token_zero(method):
  q = jnp.full((2, 2, 5), 0.2)
  p = jnp.full((2, 3, 5), jnp.nan).at[1, 2].set(0.2)  # row 1: only p_3 finite
  tau, y = verify.VERIFIERS[method](jax.random.key(0), jnp.ones((2, 2), jnp.int32), q, p)
  np.testing.assert_array_equal(tau, [0, 0])
  np.testing.assert_array_equal(y, [0, 0])
  np.testing.assert_array_equal(verify.nonfinite_rows(q, p), [True, True])


def test_nonfinite_rows_bad_shapes():
  with pytest.raises(ValueError, match='nonfinite_rows needs'):
    verify.nonfinite_rows(jnp.ones((2, 3, 4)), jnp.ones((2, 3, 4)))


@pytest.mark.parametrize('method', METHODS)
@pytest.mark.parametrize('corruption', ['nan_q', 'inf_entry_q'])
def test_broken_last_draft_is_verified_as_a_shorter_block(method, corruption):
  """Rows drafted with gamma = 2, then given a third draft whose q_3 is NaN (or holds one inf):
  verified as G = 3 blocks, (X^tau, Y) must be distributed exactly as gamma = 2 verification
  (the oracle), since the broken position is dropped and Y at tau = 2 is the bonus draw ~ p_3.
  p_4 is NaN too: a position after the broken one is never read."""
  pair = random_toy_pair(9, vocab=4, gamma=2)
  tokens, draft_probs, target_probs = toy_drafts(pair, 9)
  rows = len(tokens)
  broken_q = np.full((rows, 1, pair.vocab), np.nan, np.float32)
  if corruption == 'inf_entry_q':
    broken_q = np.full((rows, 1, pair.vocab), 0.1, np.float32)
    broken_q[:, 0, 1] = np.inf
  draft_probs = np.concatenate([draft_probs, broken_q], axis=1)
  target_probs = np.concatenate(
    [target_probs, np.full((rows, 1, pair.vocab), np.nan, np.float32)], axis=1
  )
  padded_tokens = np.pad(tokens, ((0, 0), (0, 1)))
  result = verify.VERIFIERS[method](
    jax.random.key(9), jnp.asarray(padded_tokens, jnp.int32), draft_probs, target_probs
  )
  tau, next_token = np.asarray(result.num_accepted), np.asarray(result.next_token)
  assert tau.max() == pair.gamma  # the truncated block's last sub-block is accepted, too
  codes = sequence_codes(emitted_sequences(tokens, tau, next_token), tau + 1, pair.vocab)
  exact = oracle.iteration_distribution(pair.target, pair.drafter, pair.gamma, method)
  pvalue = codes_pvalue(codes, exact, pair.vocab, pair.gamma + 1)
  assert pvalue > SIGNIFICANCE, f'chi-square p = {pvalue:.2e} at significance 1e-3'
  assert np.all(np.asarray(verify.nonfinite_rows(draft_probs, target_probs)))


_NONFINITE = (np.nan, np.inf, -np.inf)


@pytest.mark.parametrize('gamma, vocab', [(1, 2), (3, 5)])
@hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
@hypothesis.given(data=st.data())
def test_fuzz_with_nonfinite_vectors(gamma, vocab, data):
  """Random and degenerate vectors (one-hot, uniform, zeros, 1e-38 .. 1e-44 entries, p == q),
  then NaN / +inf / -inf planted in some: at X_i, at another entry, or in the whole vector."""
  batch = 6
  seed = data.draw(st.integers(0, 2**31 - 1))
  q_kinds = data.draw(
    st.lists(st.sampled_from(DEGENERATE_KINDS), min_size=batch * gamma, max_size=batch * gamma)
  )
  p_kinds = data.draw(
    st.lists(
      st.sampled_from(DEGENERATE_KINDS), min_size=batch * (gamma + 1), max_size=batch * (gamma + 1)
    )
  )
  corruptions = data.draw(
    st.lists(
      st.tuples(
        st.integers(0, batch - 1),
        st.sampled_from(['p', 'q']),
        st.integers(0, gamma),
        st.sampled_from(range(len(_NONFINITE))),
        st.sampled_from(['at_draft', 'other_entry', 'whole_vector']),
      ),
      max_size=batch,
    )
  )
  rng = np.random.default_rng(seed)
  q = degenerate_probs(rng, q_kinds, (batch, gamma, vocab))
  p = degenerate_probs(rng, p_kinds, (batch, gamma + 1, vocab), like=q)
  tokens = np.where(
    rng.random((batch, gamma)) < 0.8,
    np.argmax(np.log(q + 1e-45) + rng.gumbel(size=q.shape), axis=-1),
    rng.integers(vocab, size=(batch, gamma)),
  )
  clean_q, clean_p = q.copy(), p.copy()
  for row, which, position, value, where in corruptions:
    probs = q if which == 'q' else p
    position = min(position, probs.shape[1] - 1)
    if where == 'whole_vector':
      probs[row, position] = _NONFINITE[value]
    else:
      at_draft = where == 'at_draft' and position < gamma
      probs[row, position, tokens[row, position] if at_draft else rng.integers(vocab)] = _NONFINITE[
        value
      ]

  finite = np.isfinite(p).all(-1) & np.pad(
    np.isfinite(q).all(-1), ((0, 0), (0, 1)), constant_values=True
  )
  # The number of drafts before the first non-finite position: no later draft may be accepted.
  usable = np.minimum(np.cumprod(finite, axis=1).sum(axis=1), gamma)
  flagged = ~finite.all(axis=1)
  np.testing.assert_array_equal(verify.nonfinite_rows(q, p), flagged)
  rows = np.arange(batch)
  tokens = jnp.asarray(tokens, jnp.int32)
  for method, verify_fn in verify.VERIFIERS.items():
    result = verify_fn(jax.random.key(seed), tokens, q, p)
    tau, y = np.asarray(result.num_accepted), np.asarray(result.next_token)
    assert result.num_accepted.dtype == jnp.int32 and result.next_token.dtype == jnp.int32
    assert np.all((tau >= 0) & (tau <= usable)), f'{method}: accepted a draft at/after a NaN/inf'
    assert np.all((y >= 0) & (y < vocab)), method
    y_finite = np.isfinite(p[rows, tau]).all(-1)
    assert np.all(p[rows, tau, y][y_finite] > 0), f'{method}: Y has target probability 0'
    assert np.all(y[~y_finite] == 0), f'{method}: Y drawn from a non-finite p'
    for i in range(gamma):
      p_x = p[rows, i, np.asarray(tokens)[:, i]]
      assert np.all(p_x[tau > i] > 0), f'{method}: accepted X with p(X) = 0'
    # Rows are independent: corrupting some rows changes nothing in the others.
    clean = verify_fn(jax.random.key(seed), tokens, clean_q, clean_p)
    np.testing.assert_array_equal(np.asarray(clean.num_accepted)[~flagged], tau[~flagged])
    np.testing.assert_array_equal(np.asarray(clean.next_token)[~flagged], y[~flagged])
