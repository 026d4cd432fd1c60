"""Builds the EN->DE corpus (train/valid/test TSV + stats.json) from Debian packages.

  python -m scripts.build_ende --data_dir=./data/ende

Downloads libreoffice-help-en-us, libreoffice-help-de, libreoffice-l10n-de and trans-de-en with
`apt-get download` (about 12 MB, cached in --packages_dir) and unpacks them with `dpkg-deb -x`.
See specdec_jax/data/README.md for sources, licenses and the counts it should print.
"""

import os

from absl import app, flags

from specdec_jax.data import ende

_DATA_DIR = flags.DEFINE_string('data_dir', './data/ende', 'Output directory.')
_PACKAGES_DIR = flags.DEFINE_string(
  'packages_dir', None, 'Cache of downloaded .deb files (default: <data_dir>/packages).'
)
_MAX_CHARS = flags.DEFINE_integer('max_chars', 256, 'Drop pairs with a longer side.')
_NUM_TEST = flags.DEFINE_integer('num_test', 2000, 'Distinct English sources in test.tsv.')
_NUM_VALID = flags.DEFINE_integer('num_valid', 2000, 'Distinct English sources in valid.tsv.')


def main(argv):
  del argv
  packages_dir = _PACKAGES_DIR.value or os.path.join(_DATA_DIR.value, 'packages')
  stats = ende.build_ende(
    _DATA_DIR.value,
    packages_dir,
    max_chars=_MAX_CHARS.value,
    num_test=_NUM_TEST.value,
    num_valid=_NUM_VALID.value,
  )
  print(ende.format_stats(stats))
  print(f'wrote {_DATA_DIR.value}/{{train,valid,test}}.tsv and stats.json')


if __name__ == '__main__':
  app.run(main)
