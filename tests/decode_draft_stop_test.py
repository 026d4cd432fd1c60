"""Adaptive draft length (`speculative_generate(..., draft_stop=...)`) through the jitted loop:
lossless (chi-square of the first three tokens against the exact law, and a negative control
that must fail the same test), greedy output equal to the target's, stats counting only the
drafts verified, the target pass narrowed to the longest row's drafts (and a pass one position
too narrow caught by the greedy test), bad values refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, decode_steps, step_models
from specdec_jax import sampling as sampling_lib
from tests import fakes
from tests.chisquare import SIGNIFICANCE, rows_pvalue
from tests.fakes import DRAFTER, GREEDY_TARGET, PREFIX_LENGTH, TARGET, speculative_prefixes
from tests.helpers import GREEDY, ragged_source

STOP = 0.4  # the random Markov drafter is below it at about a third of its drafts


def _prefixes(verifier, sampling):
  return speculative_prefixes(DRAFTER, verifier, sampling, gamma=3, seed=13, draft_stop=STOP)


def _pvalue(tokens, sampling):
  exact = fakes.exact_prefix_distribution(TARGET, PREFIX_LENGTH, sampling)
  if set(map(tuple, tokens.tolist())) - set(exact):
    return 0.0  # an output the target cannot produce
  return rows_pvalue(tokens, exact)


def _stopped_early(stats) -> bool:
  gamma = stats.accepted_per_position.shape[-1]
  return int(stats.drafted.sum()) < gamma * int(stats.target_calls.sum())


@pytest.mark.parametrize(
  'verifier, sampling',
  [
    ('token', sampling_lib.SamplingConfig(temperature=1.0)),
    ('block', sampling_lib.SamplingConfig(temperature=1.0)),
    ('block', sampling_lib.SamplingConfig(temperature=0.7, top_p=0.9)),
  ],
  ids=str,
)
def test_draft_stop_is_lossless(verifier, sampling):
  tokens, stats = _prefixes(verifier, sampling)
  assert _pvalue(tokens, sampling) > SIGNIFICANCE
  assert _stopped_early(stats)
  assert 0 < int(stats.accepted.sum()) < int(stats.drafted.sum())


_VERIFY = decode_steps.verify_drafts


def _drop_the_unsure_draft(rng, drafts, q, logits, spec, lengths=None, state=None):
  """Bug: stop BEFORE the unsure draft (verify one draft fewer where drafting stopped)."""
  lengths = jnp.where(lengths < spec.gamma, lengths - 1, lengths)
  return _VERIFY(rng, drafts, q, logits, spec, lengths, state)


def test_negative_control_dropping_the_unsure_draft_fails(monkeypatch):
  sampling = sampling_lib.SamplingConfig(temperature=1.0)
  monkeypatch.setattr(decode_steps, 'verify_drafts', _drop_the_unsure_draft)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _prefixes('block', sampling)
  monkeypatch.undo()
  jax.clear_caches()
  assert _pvalue(tokens, sampling) < SIGNIFICANCE


@pytest.mark.parametrize('verifier', ['token', 'block'])
@pytest.mark.parametrize('stop', [0.6, 0.9])
def test_greedy_equals_generate_markov(verifier, stop):
  ids, mask = ragged_source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=jax.random.key(0))
  expected = decode.generate(GREEDY_TARGET, ids, mask, **kw)
  assert np.all(np.asarray(expected.lengths) == 12)
  out = decode.speculative_generate(
    GREEDY_TARGET, DRAFTER, ids, mask, gamma=4, verifier=verifier, draft_stop=stop, **kw
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
  assert _stopped_early(out.stats)


def test_greedy_equals_generate_t5(tiny_pair):
  target, drafter = tiny_pair
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=10, rng=jax.random.key(0))
  expected = decode.generate(target, ids, mask, **kw)
  # A random tiny T5 (128 ids) is unsure everywhere: its argmax often holds under 10%.
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, draft_stop=0.1, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
  assert _stopped_early(out.stats)


def _off_by_one(steps, params, tokens, cache, num_drafted, *, with_states):
  """Bug: size the pass for the drafts only, leaving out the position after the last draft."""
  return _NARROW(steps, params, tokens, cache, num_drafted - 1, with_states=with_states)


_NARROW = decode_steps.narrow_target_pass


def test_negative_control_pass_one_position_too_narrow_fails_greedy(monkeypatch):
  ids, mask = ragged_source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=jax.random.key(0))
  expected = decode.generate(GREEDY_TARGET, ids, mask, **kw)
  monkeypatch.setattr(decode_steps, 'narrow_target_pass', _off_by_one)
  jax.clear_caches()
  # The target as its own drafter: every draft is kept, so the position after the last one is read.
  out = decode.speculative_generate(
    GREEDY_TARGET, GREEDY_TARGET, ids, mask, gamma=4, draft_stop=0.5, **kw
  )
  monkeypatch.undo()
  jax.clear_caches()
  assert not np.array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))


@pytest.mark.parametrize(
  'gamma, widths', [(1, (2,)), (3, (2, 3, 4)), (4, (2, 3, 5)), (5, (2, 3, 5, 6)), (8, (2, 3, 5, 9))]
)
def test_pass_widths(gamma, widths):
  assert decode_steps.pass_widths(gamma) == widths


@pytest.mark.parametrize('num_drafted, width', [((1, 1), 2), ((1, 2), 3), ((3, 1), 5), ((5, 4), 6)])
def test_narrow_pass_scores_as_the_full_pass(tiny_pair, num_drafted, width):
  """The narrowed pass (gamma 5: widths 2, 3, 5, 6) gives the full pass's logits on its first
  `width` positions, zeros after them, and advances the cache by `width`."""
  steps, params = step_models.as_step_model(tiny_pair[0])
  ids, mask = ragged_source(batch=2, vocab=tiny_pair[0].config.vocab_size)
  cache, _ = decode_steps.init_caches(steps, params, None, None, ids, mask, 16)
  cache = cache.replace(end_index=jnp.asarray([1, 3], jnp.int32))
  tokens = jnp.asarray([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]], jnp.int32)
  full, _, full_cache = decode_steps.target_pass(steps, params, tokens, cache, with_states=False)
  narrow, _, narrow_cache = jax.jit(
    lambda t, c, d: decode_steps.target_pass(steps, params, t, c, d, with_states=False)
  )(tokens, cache, jnp.asarray(num_drafted, jnp.int32))
  np.testing.assert_allclose(narrow[:, :width], full[:, :width], rtol=1e-5, atol=1e-5)
  assert not np.any(np.asarray(narrow[:, width:]))
  np.testing.assert_array_equal(narrow_cache.end_index, cache.end_index + width)
  np.testing.assert_array_equal(full_cache.end_index, cache.end_index + 6)


def test_stop_counts_only_verified_drafts():
  """Each iteration counts its own drafts: drafted is at most gamma per call, and accepted at
  most drafted; without a stop every call counts gamma."""
  ids, mask = ragged_source(vocab=4)
  kw = dict(gamma=3, sampling=sampling_lib.SamplingConfig(temperature=1.0), max_new_tokens=12)
  plain = decode.speculative_generate(TARGET, DRAFTER, ids, mask, rng=jax.random.key(2), **kw)
  np.testing.assert_array_equal(plain.stats.drafted, 3 * plain.stats.target_calls)
  out = decode.speculative_generate(
    TARGET, DRAFTER, ids, mask, rng=jax.random.key(2), draft_stop=STOP, **kw
  )
  assert np.all(out.stats.drafted >= out.stats.target_calls)  # at least one draft per call
  assert np.all(out.stats.accepted <= out.stats.drafted)
  assert _stopped_early(out.stats)


@pytest.mark.parametrize(
  'kw, match',
  [
    (dict(draft_stop=0.0), r'draft_stop must be a number in \(0, 1\)'),
    (dict(draft_stop=1.0), r'draft_stop must be a number in \(0, 1\)'),
    (dict(draft_stop='0.3'), r'draft_stop must be a number in \(0, 1\)'),
    (dict(draft_stop=True), r'draft_stop must be a number in \(0, 1\)'),
    (dict(draft_stop=0.3, num_drafts=2), 'draft_stop needs num_drafts=1'),
  ],
)
def test_bad_draft_stop_is_one_clear_error(kw, match):
  ids, mask = ragged_source(vocab=4)
  with pytest.raises(ValueError, match=match):
    decode.speculative_generate(
      TARGET, DRAFTER, ids, mask, gamma=2, sampling=GREEDY, max_new_tokens=4,
      rng=jax.random.key(0), **kw,
    )  # fmt: skip
