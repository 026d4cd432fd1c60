"""Builds the EN->DE corpus from Debian packages: LibreOffice help + UI catalogs, Ding dictionary.

The packages are fetched with `apt-get download` (no install, no root needed for the download
itself) into a cache directory and unpacked with `dpkg-deb -x` into a temporary directory.
Output in `data_dir`: `train.tsv`, `valid.tsv`, `test.tsv` (`en<TAB>de`, no header) and
`stats.json` (counts per source and split, package versions, licenses).
"""

import collections
import dataclasses
import glob
import json
import os
import subprocess
import tempfile

from specdec_jax.data import ding, libreoffice
from specdec_jax.data.pairs import Pair, clean_pairs, split_pairs, write_tsv


@dataclasses.dataclass(frozen=True)
class Source:
  """One origin of pairs: the Debian packages it needs and where its files are inside them."""

  name: str
  packages: tuple[str, ...]
  license: str
  description: str


SOURCES = (
  Source(
    'libreoffice_help',
    ('libreoffice-help-en-us', 'libreoffice-help-de'),
    'MPL-2.0',
    'LibreOffice 7.4 offline help, paragraphs joined on (page path, par_id/hd_id)',
  ),
  Source(
    'libreoffice_ui',
    ('libreoffice-l10n-de',),
    'MPL-2.0',
    'LibreOffice 7.4 UI message catalogs (gettext .mo), msgid en -> msgstr de',
  ),
  Source(
    'ding',
    ('trans-de-en',),
    'GPL-2+',
    'Ding DE-EN dictionary (TU Chemnitz), example sentences and sentence-like entries',
  ),
)

_HELP_DIR = 'usr/share/libreoffice/help'
_MO_DIR = 'usr/lib/libreoffice/program/resource/de/LC_MESSAGES'
_DING_FILE = 'usr/share/trans/de-en'


def fetch_package(name: str, packages_dir: str) -> str:
  """Returns the path of `name_*.deb` in `packages_dir`, running `apt-get download` if absent."""
  os.makedirs(packages_dir, exist_ok=True)
  found = sorted(glob.glob(os.path.join(packages_dir, f'{name}_*.deb')))
  if not found:
    subprocess.run(['apt-get', 'download', name], cwd=packages_dir, check=True)
    found = sorted(glob.glob(os.path.join(packages_dir, f'{name}_*.deb')))
  if not found:
    raise ValueError(f'apt-get download {name} left no {name}_*.deb in {packages_dir}')
  return found[-1]


def package_version(deb: str) -> str:
  """The `Version` field of a .deb file."""
  result = subprocess.run(
    ['dpkg-deb', '--field', deb, 'Version'], check=True, capture_output=True, text=True
  )
  return result.stdout.strip()


def raw_pairs(source: str, root: str) -> list[Pair]:
  """The unfiltered `(en, de)` pairs of one source from a tree its packages were unpacked into."""
  if source == 'libreoffice_help':
    help_dir = os.path.join(root, _HELP_DIR)
    return list(
      libreoffice.help_pairs(os.path.join(help_dir, 'en-US'), os.path.join(help_dir, 'de'))
    )
  if source == 'libreoffice_ui':
    return list(libreoffice.mo_pairs(os.path.join(root, _MO_DIR)))
  if source == 'ding':
    with open(os.path.join(root, _DING_FILE), encoding='utf-8') as f:
      return list(ding.ding_pairs(f))
  raise ValueError(f'unknown source {source!r}; known: {[s.name for s in SOURCES]}')


def merge_sources(
  raw: dict[str, list[Pair]], *, max_chars: int
) -> tuple[dict[Pair, str], dict[str, dict]]:
  """Cleans each source, then deduplicates across sources (the first source listed wins).

  Args:
    raw: source name -> raw pairs, in priority order.
    max_chars: longest side kept, in characters.

  Returns:
    `origin`: every kept pair -> its source name (insertion ordered), and per-source counts
    `{'raw', 'kept', 'dropped': {reason: n}}` where `dropped['in_earlier_source']` counts pairs
    already contributed by an earlier source.
  """
  origin: dict[Pair, str] = {}
  counts = {}
  for name, pairs in raw.items():
    kept, dropped = clean_pairs(pairs, max_chars=max_chars)
    new = [p for p in kept if p not in origin]
    if len(new) < len(kept):
      dropped['in_earlier_source'] = len(kept) - len(new)
    origin.update((p, name) for p in new)
    counts[name] = {'raw': len(pairs), 'kept': len(new), 'dropped': dict(sorted(dropped.items()))}
  return origin, counts


def build_ende(
  data_dir: str,
  packages_dir: str,
  *,
  max_chars: int = 256,
  num_test: int = 2000,
  num_valid: int = 2000,
) -> dict:
  """Downloads, extracts, cleans, splits and writes the corpus; returns the stats it wrote.

  Args:
    data_dir: output directory (created).
    packages_dir: cache of the .deb files (reused when present).
    max_chars: longest sentence kept, in characters, on either side.
    num_test: distinct English sources in test.tsv.
    num_valid: distinct English sources in valid.tsv.

  Returns:
    The content of `data_dir/stats.json`.
  """
  os.makedirs(data_dir, exist_ok=True)
  raw, package_info = {}, {}
  for source in SOURCES:
    with tempfile.TemporaryDirectory(prefix=f'ende_{source.name}_') as root:
      for package in source.packages:
        deb = fetch_package(package, packages_dir)
        package_info[package] = {'file': os.path.basename(deb), 'version': package_version(deb)}
        subprocess.run(['dpkg-deb', '-x', deb, root], check=True)
      raw[source.name] = raw_pairs(source.name, root)

  origin, source_counts = merge_sources(raw, max_chars=max_chars)
  splits = split_pairs(list(origin), num_test=num_test, num_valid=num_valid)
  split_stats = {}
  for split, pairs in splits.items():
    write_tsv(pairs, os.path.join(data_dir, f'{split}.tsv'))
    by_origin = collections.Counter(origin[p] for p in pairs)
    split_stats[split] = {
      'pairs': len(pairs),
      'unique_sources': len({s for s, _ in pairs}),
      'by_source': {s.name: by_origin[s.name] for s in SOURCES},
    }
  stats = {
    'sources': {
      s.name: {
        'description': s.description,
        'license': s.license,
        'packages': {p: package_info[p] for p in s.packages},
        **source_counts[s.name],
      }
      for s in SOURCES
    },
    'total_pairs': len(origin),
    'splits': split_stats,
    'settings': {'max_chars': max_chars, 'num_test': num_test, 'num_valid': num_valid},
    'split_rule': 'distinct en sources sorted by sha256(en); first num_test -> test, '
    'next num_valid -> valid, rest -> train',
  }
  with open(os.path.join(data_dir, 'stats.json'), 'w', encoding='utf-8') as f:
    json.dump(stats, f, indent=2, ensure_ascii=False)
  return stats


def format_stats(stats: dict) -> str:
  """A plain-text table of pairs per source and split (what build_ende.py prints)."""
  names = list(stats['sources'])
  lines = [f'{"source":<18}{"raw":>9}{"kept":>9}' + ''.join(f'{s:>9}' for s in stats['splits'])]
  for name in names:
    info = stats['sources'][name]
    per_split = ''.join(f'{v["by_source"][name]:>9}' for v in stats['splits'].values())
    lines.append(f'{name:<18}{info["raw"]:>9}{info["kept"]:>9}{per_split}')
  totals = ''.join(f'{v["pairs"]:>9}' for v in stats['splits'].values())
  lines.append(f'{"total":<18}{"":>9}{stats["total_pairs"]:>9}{totals}')
  for name in names:
    lines.append(f'dropped {name}: {stats["sources"][name]["dropped"]}')
  return '\n'.join(lines)
