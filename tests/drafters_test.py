"""Tests for specdec_jax.drafters: `NGramDrafter.load` refuses files that `save` did not write.

Fitting, stepping and a save/load round trip are tested with the decode loops (decode_test.py).
"""

from pathlib import Path

import jax
import numpy as np
import pytest

from specdec_jax import drafters

VOCAB = 6


def _saved_arrays(tmp_path: Path, order: int) -> dict[str, np.ndarray]:
  """The arrays `save` writes for a small fitted drafter, read back as a dict."""
  drafter = drafters.NGramDrafter.fit(
    [np.array([3, 4, 1]), np.array([2, 5, 5, 1])], vocab_size=VOCAB, order=order, top_k=2
  )
  drafter.save(tmp_path / 'good.npz')
  with np.load(tmp_path / 'good.npz') as f:
    return {k: f[k] for k in f.files}


def _load_edited(tmp_path: Path, order: int, edit) -> None:
  arrays = _saved_arrays(tmp_path, order)
  edit(arrays)
  np.savez(tmp_path / 'edited.npz', **arrays)
  drafters.NGramDrafter.load(tmp_path / 'edited.npz')


@pytest.mark.parametrize('order', [1, 2])
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
  'unknown order': (2, _set('meta_order', 3), 'meta_order must be 1 or 2'),
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
