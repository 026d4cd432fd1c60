"""Trains the shared EN+DE SentencePiece model (T5 ids, vocab 8000) on the train split.

  python -m scripts.train_tokenizer --data_dir=./data/ende

Writes <data_dir>/spm_ende_8k.model (override with --output) and prints a round-trip check.
"""

import os

from absl import app, flags

from specdec_jax.data import pairs, tokenizer

_DATA_DIR = flags.DEFINE_string('data_dir', './data/ende', 'Directory with train.tsv.')
_TRAIN_FILE = flags.DEFINE_string('train_file', None, 'Default: <data_dir>/train.tsv.')
_OUTPUT = flags.DEFINE_string('output', None, 'Default: <data_dir>/spm_ende_8k.model.')
_VOCAB_SIZE = flags.DEFINE_integer('vocab_size', 8000, 'Pieces, incl. 3 special + 256 bytes.')
_MODEL_TYPE = flags.DEFINE_enum('model_type', 'unigram', ['unigram', 'bpe'], 'spm model type.')


def main(argv):
  del argv
  train_file = _TRAIN_FILE.value or os.path.join(_DATA_DIR.value, 'train.tsv')
  output = _OUTPUT.value or os.path.join(_DATA_DIR.value, 'spm_ende_8k.model')
  train = pairs.load_pairs(train_file)
  sentences = [s for pair in train for s in pair]
  tok = tokenizer.train_tokenizer(
    sentences, vocab_size=_VOCAB_SIZE.value, model_type=_MODEL_TYPE.value
  )
  tok.save(output)
  exact = sum(tok.decode(tok.encode(s)) == s for s in sentences)
  lengths = [len(tok.encode(s)) for s in sentences]
  print(f'wrote {output}: vocab {tok.vocab_size}, {len(sentences)} training sentences')
  print(
    f'round trip exact: {exact}/{len(sentences)}; tokens per sentence (with eos): '
    f'mean {sum(lengths) / len(lengths):.1f}, max {max(lengths)}'
  )


if __name__ == '__main__':
  app.run(main)
