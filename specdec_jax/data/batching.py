"""Tokenized sentence pairs and fixed-shape, length-bucketed training batches.

Every batch has `batch_size` rows and a length from a short list of buckets, so a jitted train
step compiles once per bucket. The order of batches is a pure function of (seed, step): training
resumed at step k sees exactly the batches an uninterrupted run would have seen.

Axes: P pairs, B batch, L bucket length (source and target share it).
"""

import dataclasses
from collections.abc import Sequence

import numpy as np

from specdec_jax.data.pairs import Pair
from specdec_jax.data.tokenizer import PAD_ID, Tokenizer


@dataclasses.dataclass(frozen=True)
class EncodedPairs:
  """Token ids of P pairs, eos included, right-padded with 0.

  Attributes:
    inputs: int32[P, S] source ids.
    targets: int32[P, T] target ids.
    input_lengths: int32[P] real source tokens (eos included).
    target_lengths: int32[P] real target tokens (eos included).
  """

  inputs: np.ndarray
  targets: np.ndarray
  input_lengths: np.ndarray
  target_lengths: np.ndarray

  def __len__(self) -> int:
    return len(self.inputs)


def encode_pairs(
  pairs: Sequence[Pair], tokenizer: Tokenizer, *, max_source_length: int, max_target_length: int
) -> tuple[EncodedPairs, int]:
  """Tokenizes pairs (eos appended), dropping those longer than the maximum lengths.

  Returns:
    The kept pairs (in input order) and the number dropped for length.
  """
  sources, targets = [], []
  for source, target in pairs:
    s, t = tokenizer.encode(source), tokenizer.encode(target)
    if len(s) <= max_source_length and len(t) <= max_target_length:
      sources.append(s)
      targets.append(t)
  if not sources:
    raise ValueError(
      f'no pair fits max_source_length={max_source_length}, max_target_length={max_target_length}'
    )

  def pad(seqs, length):
    out = np.full((len(seqs), length), PAD_ID, np.int32)
    for i, seq in enumerate(seqs):
      out[i, : len(seq)] = seq
    return out

  encoded = EncodedPairs(
    inputs=pad(sources, max_source_length),
    targets=pad(targets, max_target_length),
    input_lengths=np.array([len(s) for s in sources], np.int32),
    target_lengths=np.array([len(t) for t in targets], np.int32),
  )
  return encoded, len(pairs) - len(sources)


def batch_arrays(
  data: EncodedPairs, index: np.ndarray, source_length: int, target_length: int
) -> dict[str, np.ndarray]:
  """Rows `index`, cut to the given lengths: `inputs`, `input_mask`, `targets`, `target_mask`.

  Returns:
    `inputs` int32[B, S], `input_mask` bool[B, S], `targets` int32[B, T], `target_mask`
    bool[B, T]; masks are True on real tokens (eos included).
  """
  return {
    'inputs': data.inputs[index, :source_length],
    'input_mask': np.arange(source_length) < data.input_lengths[index, None],
    'targets': data.targets[index, :target_length],
    'target_mask': np.arange(target_length) < data.target_lengths[index, None],
  }


class BucketedBatches:
  """Shuffled fixed-shape batches, bucketed by max(source length, target length).

  Each epoch shuffles the pairs of every bucket, cuts them into full batches (the remainder of a
  bucket waits for a later epoch's shuffle) and shuffles the order of all batches, with a
  generator seeded by (seed, epoch).
  """

  def __init__(self, data: EncodedPairs, *, batch_size: int, buckets: Sequence[int], seed: int):
    """Args:
    data: the tokenized training pairs.
    batch_size: B rows per batch.
    buckets: increasing lengths; the last must cover the longest pair.
    seed: shuffling seed.
    """
    buckets = sorted(buckets)
    longest = int(max(data.input_lengths.max(), data.target_lengths.max()))
    if buckets[-1] < longest:
      raise ValueError(f'largest bucket {buckets[-1]} < longest pair ({longest} tokens)')
    if batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {batch_size}')
    self.data, self._batch_size, self._seed = data, batch_size, seed
    pair_length = np.maximum(data.input_lengths, data.target_lengths)
    which = np.searchsorted(buckets, pair_length)  # smallest bucket >= length
    self._buckets = [(length, np.flatnonzero(which == b)) for b, length in enumerate(buckets)]
    self.num_batches_per_epoch = sum(len(idx) // batch_size for _, idx in self._buckets)
    if self.num_batches_per_epoch == 0:
      raise ValueError(f'{len(data)} pairs give no full batch of {batch_size} in any bucket')
    self._epoch, self._order = None, None

  def _epoch_order(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    if epoch != self._epoch:
      rng = np.random.default_rng([self._seed, epoch])
      batches = []
      for length, idx in self._buckets:
        shuffled = rng.permutation(idx)
        for start in range(0, len(idx) - self._batch_size + 1, self._batch_size):
          batches.append((length, np.sort(shuffled[start : start + self._batch_size])))
      order = rng.permutation(len(batches))
      self._epoch, self._order = epoch, [batches[i] for i in order]
    return self._order

  def batch_index(self, step: int) -> tuple[np.ndarray, int, int]:
    """(rows of the data, source length, target length) of training step `step` (0-based)."""
    epoch, i = divmod(step, self.num_batches_per_epoch)
    length, index = self._epoch_order(epoch)[i]
    # A bucket bounds both sides; a side whose maximum is shorter (summaries: 256 source tokens,
    # 32 target tokens) is cut to that maximum instead of padded to the bucket.
    return index, min(length, self.data.inputs.shape[1]), min(length, self.data.targets.shape[1])

  def batch(self, step: int) -> dict[str, np.ndarray]:
    """The batch of training step `step` (0-based); see `batch_arrays` for the fields."""
    return batch_arrays(self.data, *self.batch_index(step))


def eval_batches(data: EncodedPairs, batch_size: int) -> list[dict[str, np.ndarray]]:
  """All pairs in order, in full-length batches of `batch_size`, so evaluation compiles once.

  The last batch is filled up with copies of pair 0 whose masks are all False (weight 0).
  """
  batches = []
  for start in range(0, len(data), batch_size):
    index = np.arange(start, min(start + batch_size, len(data)))
    real = len(index)
    index = np.concatenate([index, np.zeros(batch_size - real, int)])
    batch = batch_arrays(data, index, data.inputs.shape[1], data.targets.shape[1])
    for key in ('input_mask', 'target_mask'):
      batch[key][real:] = False
    batches.append(batch)
  return batches
