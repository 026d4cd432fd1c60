"""Adaptive draft length (`speculative_generate(..., draft_stop=...)`) through the jitted loop:
lossless (chi-square of the first three tokens against the exact law, and a negative control
that must fail the same test), greedy output equal to the target's, stats counting only the
drafts verified, bad values refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, decode_steps
from specdec_jax import sampling as sampling_lib
from tests import fakes
from tests.decode_test import (
  DRAFTER,
  GREEDY,
  PREFIX_LENGTH,
  SIGNIFICANCE,
  TARGET,
  _chi_square_pvalue,
  _source,
  _speculative_prefixes,
)

STOP = 0.4  # the random Markov drafter is below it at about a third of its drafts


def _prefixes(verifier, sampling):
  return _speculative_prefixes(DRAFTER, verifier, sampling, gamma=3, seed=13, draft_stop=STOP)


def _pvalue(tokens, sampling):
  exact = fakes.exact_prefix_distribution(TARGET, PREFIX_LENGTH, sampling)
  if set(map(tuple, tokens.tolist())) - set(exact):
    return 0.0  # an output the target cannot produce
  return _chi_square_pvalue(tokens, exact)


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


_VERIFY = decode_steps.verify_block


def _drop_the_unsure_draft(rng, drafts, q, logits, spec, lengths=None):
  """Bug: stop BEFORE the unsure draft (verify one draft fewer where drafting stopped)."""
  lengths = jnp.where(lengths < spec.gamma, lengths - 1, lengths)
  return _VERIFY(rng, drafts, q, logits, spec, lengths)


def test_negative_control_dropping_the_unsure_draft_fails(monkeypatch):
  sampling = sampling_lib.SamplingConfig(temperature=1.0)
  monkeypatch.setattr(decode_steps, 'verify_block', _drop_the_unsure_draft)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _prefixes('block', sampling)
  monkeypatch.undo()
  jax.clear_caches()
  assert _pvalue(tokens, sampling) < SIGNIFICANCE


@pytest.mark.parametrize('verifier', ['token', 'block'])
@pytest.mark.parametrize('stop', [0.6, 0.9])
def test_greedy_equals_generate_markov(verifier, stop):
  ids, mask = _source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=jax.random.key(0))
  expected = decode.generate(TARGET, ids, mask, **kw)
  out = decode.speculative_generate(
    TARGET, DRAFTER, ids, mask, gamma=4, verifier=verifier, draft_stop=stop, **kw
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
  assert _stopped_early(out.stats)


def test_greedy_equals_generate_t5(tiny_pair):
  target, drafter = tiny_pair
  ids, mask = _source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=10, rng=jax.random.key(0))
  expected = decode.generate(target, ids, mask, **kw)
  # A random tiny T5 (128 ids) is unsure everywhere: its argmax often holds under 10%.
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, draft_stop=0.1, **kw)
  np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(expected.tokens))
  assert _stopped_early(out.stats)


def test_stop_counts_only_verified_drafts():
  """Each iteration counts its own drafts: drafted is at most gamma per call, and accepted at
  most drafted; without a stop every call counts gamma."""
  ids, mask = _source(vocab=4)
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
  ids, mask = _source(vocab=4)
  with pytest.raises(ValueError, match=match):
    decode.speculative_generate(
      TARGET, DRAFTER, ids, mask, gamma=2, sampling=GREEDY, max_new_tokens=4,
      rng=jax.random.key(0), **kw,
    )  # fmt: skip
