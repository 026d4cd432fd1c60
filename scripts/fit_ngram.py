r"""Fits a unigram / bigram / trigram drafter on the references, or on the target's own outputs.

  # on the references (the target side of a pairs file):
  python -m scripts.fit_ngram --pairs=data/ende/train.tsv --tokenizer=pretrained/ende/spm.model \
      --output=pretrained/ende/bigram.npz
  # on the target's outputs for the first 20,000 training sources, greedy and at temperature 1
  # (the n-gram form of distillation; outputs are cached in --workdir in resumable shards, the
  # same shards scripts/distill.py writes with its default settings):
  python -m scripts.fit_ngram --order=3 --target=pretrained/ende/target --num_sources=20000 \
      --workdir=workdir/distill --tokenizer=pretrained/ende/spm.model \
      --output=pretrained/ende/trigram.npz

The drafter conditions on the previous (bigram) or two previous (trigram) decoder tokens, a table
lookup per step (c ~ 0); load it with `drafters.NGramDrafter.load`.
"""

import numpy as np
from absl import app, flags

from specdec_jax import drafters, pretrained
from specdec_jax.data import batching, pairs
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.training import distill_data

_PAIRS = flags.DEFINE_string('pairs', 'data/ende/train.tsv', 'TSV / JSONL of (source, target).')
_TOKENIZER = flags.DEFINE_string('tokenizer', 'pretrained/ende/spm.model', 'SentencePiece.')
_OUTPUT = flags.DEFINE_string('output', 'pretrained/ende/bigram.npz', 'Where to write (.npz).')
_ORDER = flags.DEFINE_integer('order', 2, '1 = unigram, 2 = bigram, 3 = trigram.')
_ADD_K = flags.DEFINE_float('add_k', 0.01, 'Additive smoothing.')
_TOP_K = flags.DEFINE_integer('top_k', 16, 'Continuations kept per context.')
_MIN_COUNT = flags.DEFINE_integer('min_count', 2, 'Trigram contexts seen fewer times are dropped.')
_TARGET = flags.DEFINE_string(
  'target', None, "Fit on this model's outputs (ours, HF or T5X) instead of the references."
)
_TEMPERATURES = flags.DEFINE_list('temperatures', ['0', '1'], 'With --target: one output each.')
_NUM_SOURCES = flags.DEFINE_integer('num_sources', 20_000, 'With --target: first N sources; 0 all.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'With --target: where its outputs are cached.')
_BATCH_SIZE = flags.DEFINE_integer('batch_size', 64, 'With --target: decoding batch size.')
_MAX_LENGTH = flags.DEFINE_integer('max_length', 64, 'With --target: output (and source) tokens.')
_MAX_SOURCE = flags.DEFINE_integer('max_source_length', 0, 'With --target: 0 = --max_length.')


def target_outputs(tok) -> list[np.ndarray]:
  """The target's outputs (EOS included) on the sources of --pairs, one per temperature."""
  if not _WORKDIR.value:
    raise app.UsageError('--target needs --workdir (where its outputs are cached).')
  target = pretrained.load_model(_TARGET.value)
  data = pairs.load_pairs(_PAIRS.value)[: _NUM_SOURCES.value or None]
  sources, _ = batching.encode_pairs(
    data,
    tok,
    max_source_length=_MAX_SOURCE.value or _MAX_LENGTH.value,
    max_target_length=_MAX_LENGTH.value,
  )
  sequences = []
  for t in _TEMPERATURES.value:
    out = distill_data.generate_outputs(
      target,
      sources,
      temperature=float(t),
      batch_size=_BATCH_SIZE.value,
      max_new_tokens=_MAX_LENGTH.value,
      shard_dir=f'{_WORKDIR.value}/data_t{float(t):g}',
    )
    sequences += [row[:n] for row, n in zip(out.targets, out.target_lengths)]
  return sequences


def main(argv):
  del argv
  tok = tokenizer_lib.Tokenizer.load(_TOKENIZER.value)
  if _TARGET.value:
    sequences, what = target_outputs(tok), f'outputs of {_TARGET.value}'
  else:
    sequences = [tok.encode(target) for _, target in pairs.load_pairs(_PAIRS.value)]
    what = f'references of {_PAIRS.value}'
  drafter = drafters.NGramDrafter.fit(
    sequences,
    vocab_size=tok.vocab_size,
    order=_ORDER.value,
    add_k=_ADD_K.value,
    top_k=_TOP_K.value,
    min_count=_MIN_COUNT.value,
    eos_id=tok.eos_id,
  )
  drafter.save(_OUTPUT.value)
  print(f'fitted an order-{_ORDER.value} drafter on {len(sequences)} {what} -> {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
