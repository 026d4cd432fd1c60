"""Builds the debsumm corpus (Debian extended description -> synopsis) + stats.json.

  python -m scripts.build_summ --data_dir=./data/debsumm

Fetches the bookworm/main `Translation-en` and amd64 `Packages` indices with `apt-get update`
confined to --apt_dir (about 15 MB, cached there; no root needed) and writes
train/valid/test.tsv (`extended<TAB>synopsis`), {split}_packages.txt and stats.json. See
specdec_jax/data/README.md for the source, licenses and the counts it should print.
"""

import os
import time

from absl import app, flags

from specdec_jax.data import debsumm, tokenizer

_DATA_DIR = flags.DEFINE_string('data_dir', './data/debsumm', 'Output directory.')
_APT_DIR = flags.DEFINE_string(
  'apt_dir', None, "apt's private state and the uncompressed indices (default: <data_dir>/apt)."
)
_MIRROR = flags.DEFINE_string(
  'mirror', debsumm.MIRROR, 'Debian mirror, e.g. a snapshot.debian.org archive URI.'
)
_SUITE = flags.DEFINE_string('suite', debsumm.SUITE, 'Debian release (codename).')
_MAX_SOURCE_CHARS = flags.DEFINE_integer(
  'max_source_chars', 1024, 'Drop longer extended descriptions.'
)
_MAX_TARGET_CHARS = flags.DEFINE_integer('max_target_chars', 100, 'Drop longer synopses.')
_NUM_TEST = flags.DEFINE_integer('num_test', 2000, 'Pairs in test.tsv (whole groups, at least).')
_NUM_VALID = flags.DEFINE_integer('num_valid', 2000, 'Pairs in valid.tsv (whole groups, at least).')
_TOKENIZER = flags.DEFINE_string(
  'tokenizer', 'pretrained/ende/spm.model', 'For token lengths in stats.json; "" to skip.'
)


def main(argv):
  del argv
  start = time.time()
  apt_dir = _APT_DIR.value or os.path.join(_DATA_DIR.value, 'apt')
  tok = None
  if _TOKENIZER.value and os.path.exists(_TOKENIZER.value):
    tok = tokenizer.Tokenizer.load(_TOKENIZER.value)
  stats = debsumm.build_debsumm(
    _DATA_DIR.value,
    apt_dir,
    mirror=_MIRROR.value,
    suite=_SUITE.value,
    max_source_chars=_MAX_SOURCE_CHARS.value,
    max_target_chars=_MAX_TARGET_CHARS.value,
    num_test=_NUM_TEST.value,
    num_valid=_NUM_VALID.value,
    tokenizer=tok,
    tokenizer_name=_TOKENIZER.value if tok else '',
  )
  print(debsumm.format_stats(stats))
  print(
    f'wrote {_DATA_DIR.value}/{{train,valid,test}}.tsv and stats.json '
    f'in {time.time() - start:.0f} s'
  )


if __name__ == '__main__':
  app.run(main)
