"""Tests for specdec_jax.drafters: `NGramDrafter.load` refuses files that `save` did not write;
the trigram's counts, its context across rewinds, and alpha 1 when it drafts for itself (its greedy
parity and losslessness in the loops are tested with the other n-grams in decode_test.py).

Unigram / bigram fitting and stepping are tested with the decode loops (decode_test.py).
"""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, drafters
from specdec_jax import sampling as sampling_lib
from tests import fakes

VOCAB = 6


def _saved_arrays(tmp_path: Path, order: int) -> dict[str, np.ndarray]:
  """The arrays `save` writes for a small fitted drafter, read back as a dict."""
  drafter = drafters.NGramDrafter.fit(
    [np.array([3, 4, 1]), np.array([2, 5, 5, 1])],
    vocab_size=VOCAB,
    order=order,
    top_k=2,
    min_count=1,
  )
  drafter.save(tmp_path / 'good.npz')
  with np.load(tmp_path / 'good.npz') as f:
    return {k: f[k] for k in f.files}


def _load_edited(tmp_path: Path, order: int, edit) -> None:
  arrays = _saved_arrays(tmp_path, order)
  edit(arrays)
  np.savez(tmp_path / 'edited.npz', **arrays)
  drafters.NGramDrafter.load(tmp_path / 'edited.npz')


@pytest.mark.parametrize('order', [1, 2, 3])
def test_load_round_trip(tmp_path, order):
  drafter = drafters.NGramDrafter.fit([np.array([3, 4, 1])], vocab_size=VOCAB, order=order)
  drafter.save(tmp_path / 'ngram.npz')
  loaded = drafters.NGramDrafter.load(str(tmp_path / 'ngram.npz'))
  assert loaded.steps == drafter.steps
  jax.tree.map(np.testing.assert_array_equal, loaded.params, drafter.params)


def _pop(*names):
  return lambda arrays: [arrays.pop(name) for name in names]


def _set(name, value):
  return lambda arrays: arrays.update({name: np.asarray(value)})


# (order of the saved drafter, edit, what the message must say)
FOREIGN = {
  'no meta fields': (
    2,
    _pop('meta_order', 'meta_vocab_size', 'meta_start_id', 'meta_eos_id'),
    "missing fields ['meta_order', 'meta_vocab_size', 'meta_start_id', 'meta_eos_id']",
  ),
  'one meta field missing': (1, _pop('meta_eos_id'), "missing fields ['meta_eos_id']"),
  'unknown meta field': (1, _set('meta_smoothing', 3), "unexpected fields ['meta_smoothing']"),
  'meta field not a scalar': (2, _set('meta_vocab_size', [6, 6]), "['meta_vocab_size'] must be"),
  'meta field a float': (2, _set('meta_order', 2.0), "['meta_order'] must be integer scalars"),
  'unknown order': (2, _set('meta_order', 4), 'meta_order must be 1, 2 or 3'),
  'bigram called a trigram': (2, _set('meta_order', 3), "missing ['tri_ids', 'tri_keys'"),
  'trigram keys unsorted': (
    3,
    lambda a: a.update(tri_keys=a['tri_keys'][::-1].copy()),
    'strictly increasing',
  ),
  'bigram without tables': (
    2,
    _pop('next_ids', 'next_log_probs'),
    "missing ['next_ids', 'next_log_probs']",
  ),
  'unigram given bigram tables': (1, _set('meta_order', 2), "missing ['log_base', 'next_ids'"),
  'stray array': (1, _set('weights', np.zeros(3)), "unexpected ['weights']"),
  'table for another vocabulary': (
    1,
    _set('log_probs', np.zeros(7, np.float32)),
    "array 'log_probs' must be floating[6] for meta_vocab_size 6, got float32[7]",
  ),
  'table of the wrong rank': (
    2,
    _set('log_base', np.zeros((6, 1), np.float32)),
    "array 'log_base' must be floating[6]",
  ),
  'ids as floats': (
    2,
    lambda a: a.update(next_ids=a['next_ids'].astype(np.float32)),
    "array 'next_ids' must be integer[6, K]",
  ),
  'K differs': (
    2,
    lambda a: a.update(next_log_probs=a['next_log_probs'][:, :1]),
    'differ in K',
  ),
  'ids outside the vocabulary': (
    2,
    lambda a: a['next_ids'].__setitem__((0, 0), VOCAB),
    'token ids outside [0, 6)',
  ),
}


@pytest.mark.parametrize('case', list(FOREIGN))
def test_load_foreign_npz_names_the_file_and_the_problem(tmp_path, case):
  order, edit, needle = FOREIGN[case]
  with pytest.raises(ValueError) as info:
    _load_edited(tmp_path, order, edit)
  message = str(info.value)
  assert str(tmp_path / 'edited.npz') in message and needle in message, message


def test_load_npy_is_not_an_npz(tmp_path):
  np.save(tmp_path / 'table.npy', np.zeros(VOCAB))
  with pytest.raises(ValueError, match='single .npy array'):
    drafters.NGramDrafter.load(tmp_path / 'table.npy')


# ---------------------------------------------------------------------------------------------
# Trigram drafter: counts, rewinding, and in the decode loops.

TRIGRAM_SEQS = [np.array([3, 4, 5, 1]), np.array([3, 4, 5, 1]), np.array([3, 4, 2, 1])]


def _step(drafter, tokens, cache):
  logits, cache = drafter.steps.step(drafter.params, jnp.asarray(tokens, jnp.int32), cache)
  return np.exp(np.asarray(logits, np.float64)), cache


def _fresh_cache(drafter, batch=1, length=16):
  return drafter.steps.init_cache(drafter.params, jnp.zeros((batch, 1)), None, length)


def test_trigram_fit_interpolates_with_the_bigram():
  add_k, v = 0.5, 8
  tri = drafters.NGramDrafter.fit(
    TRIGRAM_SEQS, vocab_size=v, order=3, add_k=add_k, top_k=4, min_count=2
  )
  bi = drafters.NGramDrafter.fit(TRIGRAM_SEQS, vocab_size=v, order=2, add_k=add_k, top_k=4)
  probs, _ = _step(tri, [[0, 3, 4, 5]], _fresh_cache(tri))
  bi_probs, _ = _step(bi, [[0, 3, 4, 5]], _fresh_cache(bi))
  np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
  # Context (3, 4) was seen 3 times with 2 distinct continuations: Witten-Bell w = 3 / 5;
  # trigram p(5) = 2/3, p(2) = 1/3.
  w = 3 / 5
  np.testing.assert_allclose(probs[0, 2, 5], (1 - w) * bi_probs[0, 2, 5] + w * 2 / 3, rtol=1e-5)
  np.testing.assert_allclose(probs[0, 2, 2], (1 - w) * bi_probs[0, 2, 2] + w * 1 / 3, rtol=1e-5)
  # Context (0, 0) (start, start), seen 3 times, one continuation (3): w = 3 / 4.
  np.testing.assert_allclose(probs[0, 0, 3], 0.25 * bi_probs[0, 0, 3] + 0.75, rtol=1e-5)
  # Context (4, 5) was seen twice (kept, min_count 2); (4, 2) once: left to the bigram.
  np.testing.assert_allclose(probs[0, 3], 1 / 3 * bi_probs[0, 3] + 2 / 3 * np.eye(v)[1], rtol=1e-5)
  probs, _ = _step(tri, [[4, 2]], _fresh_cache(tri).replace(end_index=jnp.array([2])))
  bi_probs, _ = _step(bi, [[4, 2]], _fresh_cache(bi))
  np.testing.assert_allclose(probs[0, 1], bi_probs[0, 1], rtol=1e-5)


@pytest.mark.parametrize('order', [1, 2, 3])
def test_ngram_step_compiles_without_a_loop(order):
  """An n-gram step is straight-line code: on a GPU each iteration of a loop inside the jitted
  decode loop is a round trip to the host (the trigram's binary search as a loop cost c 0.30 of
  a target step on an H200, against 0.04 unrolled)."""
  drafter = drafters.NGramDrafter.fit(TRIGRAM_SEQS, vocab_size=8, order=order, min_count=1)
  tokens = jnp.asarray([[0, 3, 4, 5]], jnp.int32)
  hlo = jax.jit(drafter.steps.step).lower(drafter.params, tokens, _fresh_cache(drafter)).as_text()
  assert 'while' not in hlo


def test_trigram_context_survives_rewinds():
  """Random feeds and rewinds (as the speculative loop makes them) give the same distributions as
  feeding the whole prefix at once: the history restores the context after a rewind."""
  rng = np.random.default_rng(0)
  seqs = [rng.integers(1, 6, size=12) for _ in range(40)]
  drafter = drafters.NGramDrafter.fit(seqs, vocab_size=6, order=3, min_count=1, top_k=3)
  jitted = jax.jit(drafter.steps.step)  # one program per fed length (1, 2 or 3) and the whole

  def step(tokens, cache):
    logits, cache = jitted(drafter.params, jnp.asarray([tokens], jnp.int32), cache)
    return np.exp(np.asarray(logits[0], np.float64)), cache

  length = 128
  prefix, cache = [0], _fresh_cache(drafter, length=length)
  probs, cache = step(prefix, cache)
  for _ in range(30):
    if rng.random() < 0.5 and len(prefix) > 2:  # rewind and feed 2 tokens, as the catch-up does
      start = int(rng.integers(1, len(prefix)))
      prefix = prefix[:start] + list(rng.integers(1, 6, size=2))
      fed = prefix[start:]
      cache = cache.replace(end_index=jnp.array([start]))
    else:
      fed = list(rng.integers(1, 6, size=int(rng.integers(1, 4))))
      prefix = prefix + fed
    probs, cache = step(fed, cache)
    # The whole prefix at once, padded to one shape: position t reads tokens up to t only.
    whole, _ = step(prefix + [0] * (length - len(prefix)), _fresh_cache(drafter, length=length))
    np.testing.assert_allclose(probs, whole[len(prefix) - len(fed) : len(prefix)], rtol=1e-6)
    assert int(cache.end_index[0]) == len(prefix)


def _trigram_for(target, seed=0):
  """A trigram drafter fitted on the target's own samples (so it agrees with it often)."""
  ids = jnp.zeros((256, 1), jnp.int32)
  out = decode.generate(
    target,
    ids,
    jnp.ones_like(ids),
    sampling=sampling_lib.SamplingConfig(temperature=1.0),
    max_new_tokens=6,
    rng=jax.random.key(seed),
  )
  return drafters.NGramDrafter.fit(
    np.asarray(out.tokens), vocab_size=target.steps.vocab_size, order=3, min_count=1
  )


def test_trigram_drafter_of_itself_accepts_everything():
  """A trigram as its own target (and drafter) has alpha exactly 1 at temperature 1: every draft
  of every iteration, catch-up steps included, sees the context the target sees."""
  trigram = _trigram_for(fakes.random_markov(seed=3))
  ids = jnp.zeros((64, 1), jnp.int32)
  out = decode.speculative_generate(
    trigram,
    trigram,
    ids,
    jnp.ones_like(ids),
    gamma=3,
    sampling=sampling_lib.SamplingConfig(temperature=1.0),
    max_new_tokens=12,
    rng=jax.random.key(0),
  )
  assert int(out.stats.drafted.sum()) > 0
  np.testing.assert_allclose(float(out.stats.summed().alpha), 1.0, rtol=1e-5)
