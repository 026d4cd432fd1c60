"""SentencePiece tokenizer with T5 ids (pad 0, eos 1, unk 2, no bos), trained on both languages.

Identity normalization, no whitespace squeezing and byte fallback make `decode(encode(s)) == s`
for every string (unseen characters become UTF-8 byte pieces instead of unk).

Axes: B batch, S sequence length.
"""

import io
from collections.abc import Iterable, Sequence

import numpy as np
import sentencepiece as spm

from specdec_jax.step_models import PAD_ID  # the decode loops' padding too

EOS_ID = 1
UNK_ID = 2


class Tokenizer:
  """A thin wrapper around `sentencepiece.SentencePieceProcessor` with T5 conventions."""

  def __init__(self, model_proto: bytes):
    """Builds the tokenizer from a serialized SentencePiece model.

    Raises:
      ValueError: if the model does not use pad 0, eos 1, unk 2 (the T5 ids).
    """
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
    ids = (self._sp.pad_id(), self._sp.eos_id(), self._sp.unk_id())
    if ids != (PAD_ID, EOS_ID, UNK_ID):
      raise ValueError(f'expected T5 ids pad/eos/unk = 0/1/2, model has {ids}')
    self._proto = model_proto

  @classmethod
  def load(cls, path: str) -> 'Tokenizer':
    """Reads a `.model` file written by `train_tokenizer` (or any T5-style spm model)."""
    with open(path, 'rb') as f:
      return cls(f.read())

  def save(self, path: str) -> None:
    with open(path, 'wb') as f:
      f.write(self._proto)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  @property
  def pad_id(self) -> int:
    return PAD_ID

  @property
  def eos_id(self) -> int:
    return EOS_ID

  @property
  def unk_id(self) -> int:
    return UNK_ID

  def encode(self, text: str, *, add_eos: bool = True) -> list[int]:
    """Token ids of `text`, followed by eos when `add_eos`."""
    ids = self._sp.encode(text, out_type=int)
    return ids + [EOS_ID] if add_eos else ids

  def decode(self, ids: Iterable[int]) -> str:
    """The text of `ids`, cut at the first eos; pad ids are dropped.

    A model's vocabulary may be larger than its tokenizer's (the public T5 checkpoints: 32,128
    ids over 32,000 pieces); ids past the tokenizer are written out, never dropped: the 100 after
    it as T5's sentinels `<extra_id_K>` (K = size + 99 - id), any others as `<id_N>`.
    """
    size, text, run = self.vocab_size, [], []
    for i in ids:
      i = int(i)
      if i == EOS_ID:
        break
      if i == PAD_ID:
        continue
      if i < size:
        run.append(i)
        continue
      text.append(self._sp.decode(run))
      run = []
      text.append(f'<extra_id_{size + 99 - i}>' if i < size + 100 else f'<id_{i}>')
    return ''.join(text + [self._sp.decode(run)])

  def id_to_piece(self, i: int) -> str:
    return self._sp.id_to_piece(int(i))

  def encode_batch(
    self, texts: Sequence[str], max_len: int, *, add_eos: bool = True, truncate: bool = False
  ) -> tuple[np.ndarray, np.ndarray]:
    """Encodes and right-pads a batch to a fixed length.

    Args:
      texts: B strings.
      max_len: S, the padded length.
      add_eos: append eos to every sequence (counted in S).
      truncate: cut long sequences to S tokens (the last one stays eos when `add_eos`) instead
        of raising.

    Returns:
      `ids` int32[B, S] (pad 0) and `mask` bool[B, S] (True on real tokens, eos included).

    Raises:
      ValueError: if a sequence is longer than `max_len` and not `truncate`.
    """
    if max_len <= 0:
      raise ValueError(f'max_len must be positive, got {max_len}')
    ids = np.full((len(texts), max_len), PAD_ID, np.int32)
    mask = np.zeros((len(texts), max_len), bool)
    for b, text in enumerate(texts):
      seq = self.encode(text, add_eos=add_eos)
      if len(seq) > max_len:
        if not truncate:
          raise ValueError(f'text {b} has {len(seq)} tokens > max_len={max_len}: {text[:60]!r}')
        seq = seq[: max_len - 1] + [EOS_ID] if add_eos else seq[:max_len]
      ids[b, : len(seq)] = seq
      mask[b, : len(seq)] = True
    return ids, mask


def train_tokenizer(
  sentences: Iterable[str],
  *,
  vocab_size: int = 8000,
  model_type: str = 'unigram',
  character_coverage: float = 0.9999,
  max_sentence_length: int = 4096,
  num_threads: int = 2,
) -> Tokenizer:
  """Trains a SentencePiece model with T5 ids, identity normalization and byte fallback.

  Args:
    sentences: training text, one sentence per item (both languages for a shared vocabulary).
    vocab_size: total pieces, including the 3 special ids and the 256 byte pieces.
    model_type: 'unigram' (as T5) or 'bpe'.
    character_coverage: share of characters covered by pieces; the rest fall back to bytes.
    max_sentence_length: longer sentences (in bytes) are skipped by the trainer.
    num_threads: trainer threads.

  Returns:
    The trained `Tokenizer` (save it with `Tokenizer.save`).
  """
  if model_type not in ('unigram', 'bpe'):
    raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
  if vocab_size < 3 + 256 + 1:
    raise ValueError(f'vocab_size must exceed the 259 special + byte pieces, got {vocab_size}')
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(sentences),
    model_writer=model,
    vocab_size=vocab_size,
    model_type=model_type,
    character_coverage=character_coverage,
    normalization_rule_name='identity',
    remove_extra_whitespaces=False,
    byte_fallback=True,
    pad_id=PAD_ID,
    eos_id=EOS_ID,
    unk_id=UNK_ID,
    bos_id=-1,
    pad_piece='<pad>',
    eos_piece='</s>',
    unk_piece='<unk>',
    max_sentence_length=max_sentence_length,
    num_threads=num_threads,
    minloglevel=2,
  )
  return Tokenizer(model.getvalue())
