"""Multi-draft decoding (`speculative_generate(..., num_drafts=K)`) through the jitted loop:
lossless end to end (chi-square of the first three tokens against the exact law, with negative
controls that must fail the same test), greedy output equal to the target's, every drafter kind,
ragged batches, one program per shape."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, decode_steps, drafters, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing
from tests import fakes, helpers
from tests.chisquare import SIGNIFICANCE, rows_pvalue
from tests.fakes import DRAFTER, GREEDY_TARGET, PREFIX_LENGTH, TARGET, speculative_prefixes
from tests.helpers import (
  GREEDY,
  ONE_HOT,
  eagle_drafter,
  ngram_drafter,
  ragged_source,
  shared_encoder_drafter,
)

SAMPLING = sampling_lib.SamplingConfig(temperature=1.0)


def _prefixes(verifier, num_drafts, *, drafter=DRAFTER, sampling=SAMPLING, seed=11):
  return speculative_prefixes(
    drafter, verifier, sampling, gamma=2, seed=seed, num_drafts=num_drafts
  )


def _pvalue(tokens, sampling=SAMPLING):
  exact = fakes.exact_prefix_distribution(TARGET, PREFIX_LENGTH, sampling)
  if set(map(tuple, tokens.tolist())) - set(exact):
    return 0.0  # an output the target cannot produce
  return rows_pvalue(tokens, exact)


@pytest.mark.parametrize(
  'verifier, num_drafts, sampling',
  [
    ('block', 2, SAMPLING),
    ('token', 2, SAMPLING),
    pytest.param(
      'block', 3, sampling_lib.SamplingConfig(temperature=0.8, top_k=3), marks=pytest.mark.slow
    ),
    pytest.param('token', 3, SAMPLING, marks=pytest.mark.slow),
    pytest.param('block', 4, SAMPLING, marks=pytest.mark.slow),
  ],
  ids=str,
)
def test_multidraft_loop_is_lossless(verifier, num_drafts, sampling):
  """The joint of the first 3 tokens over 100k rows matches the target's exact distribution."""
  tokens, stats = _prefixes(verifier, num_drafts, sampling=sampling)
  assert _pvalue(tokens, sampling) > SIGNIFICANCE
  assert 0 < int(stats.accepted.sum()) < int(stats.drafted.sum())


@pytest.mark.many_rows
def test_lossless_with_trigram_drafter():
  """A trigram's cache holds the tokens fed: every copy of a row must follow the kept path."""
  sampling = sampling_lib.SamplingConfig(temperature=1.4, top_p=0.8)
  tokens, stats = _prefixes('token', 2, drafter=ngram_drafter(3), sampling=sampling, seed=9)
  assert _pvalue(tokens, sampling) > SIGNIFICANCE
  assert 0 < int(stats.accepted.sum()) < int(stats.drafted.sum())


def test_more_paths_accept_more():
  """Not vacuous: the loop uses the extra paths (K = 2 accepts more drafts per iteration)."""
  rate = lambda stats: int(stats.accepted.sum()) / int(stats.drafted.sum())
  one, two = (rate(_prefixes('block', k)[1]) for k in (1, 2))
  assert two > one + 0.03, (one, two)


@jax.jit
def _gbv_select_by_p(rng, tokens, q, p):
  """Bug: select the child the target likes most, while the law assumes the ratio order
  (tests/verify_multipath_test.py's control, run through the loop)."""
  return helpers.gbv_run(rng, tokens, q, p, 'block/select_by_p')


_FOLLOW = decode_steps.follow


def _follow_path_zero_caches(path, drafts, target_cache, draft_cache, states, num_drafts):
  """Bug: emit the kept path's drafts but leave every row on path 0's caches."""
  kept, *_ = _FOLLOW(path, drafts, target_cache, draft_cache, states, num_drafts)
  zero = jnp.zeros_like(path)
  _, target_cache, draft_cache, states = _FOLLOW(
    zero, drafts, target_cache, draft_cache, states, num_drafts
  )
  return kept, target_cache, draft_cache, states


@pytest.mark.parametrize('bug', ['select_by_p', 'caches_of_path_zero'])
def test_negative_controls_fail_through_the_loop(monkeypatch, bug):
  if bug == 'select_by_p':
    buggy = dataclasses.replace(verifiers.get('block'), multipath=_gbv_select_by_p)
    monkeypatch.setitem(verifiers.REGISTRY, 'block', buggy)
  else:
    monkeypatch.setattr(decode_steps, 'follow', _follow_path_zero_caches)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _prefixes('block', 3)
  monkeypatch.undo()
  jax.clear_caches()
  assert _pvalue(tokens) < SIGNIFICANCE


# ---------------------------------------------------------------------------------------------
# Greedy: K paths still give the target's greedy output, for every drafter kind.


def _greedy_matches(target, drafter, ids, mask, *, num_drafts, gamma=3, verifier='block', m=12):
  kw = dict(sampling=GREEDY, max_new_tokens=m, rng=jax.random.key(0))
  expected = decode.generate(target, ids, mask, **kw)
  assert np.all(np.asarray(expected.lengths) > 3)  # more than one iteration's tokens
  got = decode.speculative_generate(
    target, drafter, ids, mask, gamma=gamma, verifier=verifier, num_drafts=num_drafts, **kw
  )
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expected.tokens))
  np.testing.assert_array_equal(np.asarray(got.lengths), np.asarray(expected.lengths))
  return got


@pytest.mark.parametrize('num_drafts', [2, 3])
@pytest.mark.parametrize('verifier', ['token', 'block'])
def test_greedy_equals_generate_markov(num_drafts, verifier):
  ids, mask = ragged_source(vocab=4)
  _greedy_matches(GREEDY_TARGET, DRAFTER, ids, mask, num_drafts=num_drafts, verifier=verifier)


def test_greedy_general_path_equals_generate():
  """The general (probability) path on greedy's one-hot vectors (`ONE_HOT`) with K paths, not only
  the id fast path."""
  ids, mask = ragged_source(vocab=4)
  spec = decode.LoopSpec(
    sampling=ONE_HOT, max_new_tokens=12, gamma=3, verifier='block', num_drafts=2,
  )  # fmt: skip
  got = decode.speculative_loop(
    GREEDY_TARGET.steps, GREEDY_TARGET.params, DRAFTER.steps, DRAFTER.params, ids, mask,
    jax.random.key(0), spec=spec,
  )  # fmt: skip
  expected = decode.generate(
    GREEDY_TARGET, ids, mask, sampling=GREEDY, max_new_tokens=12, rng=jax.random.key(0)
  )
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(expected.tokens))


@pytest.mark.parametrize('order', [2, 3])
def test_greedy_equals_generate_ngram(order):
  ids, mask = ragged_source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=jax.random.key(0))
  corpus = np.asarray(decode.generate(GREEDY_TARGET, ids, mask, **kw).tokens)
  drafter = drafters.NGramDrafter.fit(corpus, vocab_size=4, order=order)
  _greedy_matches(GREEDY_TARGET, drafter, ids, mask, num_drafts=2)


@pytest.mark.parametrize(
  'kind',
  [
    'eagle',  # reads the target's states: they must follow the kept path too
    pytest.param('t5', marks=pytest.mark.slow),
    pytest.param('shared_encoder', marks=pytest.mark.slow),
  ],
)
def test_greedy_equals_generate_t5_drafters(kind, tiny_pair):
  target, drafter = tiny_pair
  if kind == 'shared_encoder':
    drafter = shared_encoder_drafter(target)
  elif kind == 'eagle':
    drafter = eagle_drafter(target)
  ids, mask = ragged_source(vocab=target.config.vocab_size)  # ragged rows
  _greedy_matches(target, drafter, ids, mask, num_drafts=2, m=10)


def test_sampled_t5_rows_emit_their_kept_paths(tiny_pair):
  """Ragged rows at temperature 1 with K = 2: each row's output is, iteration by iteration, the
  kept path's first tau drafts then Y (as the trace records them), cut at the token limit."""
  target, drafter = tiny_pair
  ids, mask = ragged_source(batch=3, vocab=target.config.vocab_size)
  out = decode.speculative_generate(
    target, drafter, ids, mask, gamma=3, verifier='block', sampling=SAMPLING, max_new_tokens=9,
    rng=jax.random.key(5), num_drafts=2, trace=True,
  )  # fmt: skip
  trace = jax.tree.map(np.asarray, out.trace)
  for b in range(ids.shape[0]):
    rebuilt = []
    for i in np.flatnonzero(trace.emitted[b]):
      tau = trace.num_accepted[b, i]
      block = [*trace.drafts[b, i, :tau], trace.next_token[b, i]]
      rebuilt += block[: trace.emitted[b, i]]
    length = int(out.lengths[b])
    assert len(rebuilt) == length
    np.testing.assert_array_equal(np.asarray(out.tokens)[b, :length], rebuilt)
  assert 0 < int(out.stats.accepted.sum()) < int(out.stats.drafted.sum())


# ---------------------------------------------------------------------------------------------
# The spec and its programs.


def test_one_draft_is_todays_program():
  base = decode.LoopSpec(sampling=SAMPLING, max_new_tokens=4, gamma=2, verifier='block')
  assert decode.LoopSpec(**{**vars(base), 'num_drafts': 1}) == base


def test_compiles_once_per_shape():
  ids, mask = ragged_source(vocab=4)
  kw = dict(gamma=2, verifier='block', sampling=SAMPLING, max_new_tokens=6, num_drafts=2)
  decode.speculative_generate(TARGET, DRAFTER, ids, mask, rng=jax.random.key(0), **kw)
  with timing.compiles() as compiled:
    for seed in range(1, 4):
      decode.speculative_generate(TARGET, DRAFTER, ids, mask, rng=jax.random.key(seed), **kw)
  assert not [name for name in compiled if 'speculative_loop' in name], compiled


@pytest.mark.parametrize('bad', [0, -1, 1.5, 'two'])
def test_bad_num_drafts_is_one_clear_error(bad):
  ids, mask = ragged_source(vocab=4)
  with pytest.raises((ValueError, TypeError), match='num_drafts'):
    decode.speculative_generate(
      TARGET, DRAFTER, ids, mask, gamma=2, sampling=SAMPLING, max_new_tokens=4,
      rng=jax.random.key(0), num_drafts=bad,
    )  # fmt: skip
