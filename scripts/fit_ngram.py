r"""Fits a unigram / bigram drafter on the target side of a pairs file.

  python -m scripts.fit_ngram --pairs=data/ende/train.tsv --tokenizer=data/ende/spm_ende_8k.model \
      --output=pretrained/ende/bigram.npz

The drafter conditions on the previous decoder token only (c ~ 0 per step); load it with
`drafters.NGramDrafter.load`.
"""

from absl import app, flags

from specdec_jax import drafters
from specdec_jax.data import pairs
from specdec_jax.data import tokenizer as tokenizer_lib

_PAIRS = flags.DEFINE_string('pairs', 'data/ende/train.tsv', 'TSV / JSONL of (source, target).')
_TOKENIZER = flags.DEFINE_string('tokenizer', 'data/ende/spm_ende_8k.model', 'SentencePiece.')
_OUTPUT = flags.DEFINE_string('output', 'pretrained/ende/bigram.npz', 'Where to write (.npz).')
_ORDER = flags.DEFINE_integer('order', 2, '1 = unigram, 2 = bigram.')
_ADD_K = flags.DEFINE_float('add_k', 0.01, 'Additive smoothing.')
_TOP_K = flags.DEFINE_integer('top_k', 16, 'Continuations kept per bigram context.')


def main(argv):
  del argv
  tok = tokenizer_lib.Tokenizer.load(_TOKENIZER.value)
  targets = [tok.encode(target) for _, target in pairs.load_pairs(_PAIRS.value)]
  drafter = drafters.NGramDrafter.fit(
    targets,
    vocab_size=tok.vocab_size,
    order=_ORDER.value,
    add_k=_ADD_K.value,
    top_k=_TOP_K.value,
    eos_id=tok.eos_id,
  )
  drafter.save(_OUTPUT.value)
  print(f'fitted an order-{_ORDER.value} drafter on {len(targets)} sequences -> {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
