"""Builds the `debsumm` corpus: Debian extended package descriptions -> their one-line synopsis.

The summarization-style task of this repo, as CNN/DailyMail is the paper's: a paragraph or
more of English in, one short line out. The text comes from two indices of the Debian archive,
fetched by apt itself into a private directory (nothing on the system's apt state changes):
`main/i18n/Translation-en` (every package's synopsis and extended description) and
`main/binary-amd64/Packages` (each package's source package, used to split without leakage).
The parsing and cleaning are in `debian_descriptions.py`.

Output in `data_dir`: `train.tsv`, `valid.tsv`, `test.tsv` (`extended<TAB>synopsis`, UTF-8, no
header, no task prefix), `{split}_packages.txt` (the binary packages of each pair, aligned with
the TSV lines) and `stats.json` (counts, lengths, release, licenses).
"""

import collections
import glob
import hashlib
import json
import os
import re
import subprocess

import numpy as np

from specdec_jax.data import debian_descriptions as dd
from specdec_jax.data.pairs import Pair, write_tsv

MIRROR = 'http://deb.debian.org/debian'
SUITE = 'bookworm'
COMPONENT = 'main'
ARCHITECTURE = 'amd64'
INDICES = ('Packages', 'Translation-en')
LICENSE = (
  'Each description is part of its package (debian/control) and is covered by that '
  "package's license (debian/copyright, all DFSG-free in main); the corpus is a mixed-license "
  'collection of short texts. The archive index files carry no license of their own.'
)


def _apt_options(apt_dir: str) -> list[str]:
  """apt-get options that confine apt to `apt_dir`: its own sources, lists, cache and lock."""
  return [
    f'-oDir::State::Lists={apt_dir}/lists',
    f'-oDir::Cache={apt_dir}/cache',
    f'-oDir::Etc::SourceList={apt_dir}/sources.list',
    f'-oDir::Etc::SourceParts={apt_dir}/sources.list.d',
    '-oAcquire::Languages=en',
    # A snapshot mirror's Release is past its Valid-Until; the signature is still checked.
    '-oAcquire::Check-Valid-Until=false',
  ]


def sources_entry(mirror: str, suite: str, component: str, architecture: str) -> str:
  """The deb822 sources entry for the two indices (and nothing else: no Contents, no DEP-11)."""
  return (
    f'Types: deb\nURIs: {mirror}\nSuites: {suite}\nComponents: {component}\n'
    f'Architectures: {architecture}\nLanguages: en\nTargets: Packages Translations\n'
    'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
  )


def release_fields(text: str) -> dict[str, str]:
  """Origin, Suite, Version, Codename, Date, Description of an (In)Release file's text."""
  out = {}
  for name in ('Origin', 'Suite', 'Version', 'Codename', 'Date', 'Description'):
    match = re.search(rf'^{name}: (.*)$', text, re.MULTILINE)
    if match:
      out[name.lower()] = match.group(1).strip()
  return out


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 20), b''):
      digest.update(block)
  return digest.hexdigest()


def fetch_indices(
  apt_dir: str,
  *,
  mirror: str = MIRROR,
  suite: str = SUITE,
  component: str = COMPONENT,
  architecture: str = ARCHITECTURE,
) -> dict:
  """`apt_dir/Packages`, `apt_dir/Translation-en` (uncompressed) and `apt_dir/release.json`.

  Reused when all three exist; otherwise `apt-get update` runs with its state confined to
  `apt_dir` (about 15 MB downloaded; no root needed), `apt-get indextargets`
  finds the two files and `apt-helper cat-file` uncompresses them.

  Returns:
    The content of `release.json`: the release's fields, the source entry and the size and
    sha256 of each uncompressed index.
  """
  info_path = os.path.join(apt_dir, 'release.json')
  if os.path.exists(info_path) and all(os.path.exists(os.path.join(apt_dir, n)) for n in INDICES):
    with open(info_path, encoding='utf-8') as f:
      return json.load(f)
  apt_dir = os.path.abspath(apt_dir)
  for sub in ('lists/partial', 'cache/archives/partial', 'sources.list.d'):
    os.makedirs(os.path.join(apt_dir, sub), exist_ok=True)
  open(os.path.join(apt_dir, 'sources.list'), 'w').close()
  entry = sources_entry(mirror, suite, component, architecture)
  with open(os.path.join(apt_dir, 'sources.list.d', 'debsumm.sources'), 'w') as f:
    f.write(entry)
  options = _apt_options(apt_dir)
  subprocess.run(['apt-get', *options, 'update'], check=True)
  listing = subprocess.run(
    ['apt-get', *options, 'indextargets', '--format', '$(IDENTIFIER)\t$(FILENAME)'],
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  files = dict(line.split('\t', 1) for line in listing.splitlines() if '\t' in line)
  wanted = {'Packages': 'Packages', 'Translations': 'Translation-en'}
  info = {'source_entry': entry, 'indices': {}}
  for identifier, name in wanted.items():
    if identifier not in files or not os.path.exists(files[identifier]):
      raise ValueError(f'apt-get update gave no {identifier} index: {listing!r}')
    out = os.path.join(apt_dir, name)
    with open(out, 'wb') as f:
      subprocess.run(
        ['/usr/lib/apt/apt-helper', 'cat-file', files[identifier]], stdout=f, check=True
      )
    info['indices'][name] = {'bytes': os.path.getsize(out), 'sha256': _sha256(out)}
  releases = glob.glob(os.path.join(apt_dir, 'lists', '*InRelease')) + glob.glob(
    os.path.join(apt_dir, 'lists', '*_Release')
  )
  if releases:
    with open(releases[0], encoding='utf-8', errors='replace') as f:
      info['release'] = release_fields(f.read())
  with open(info_path, 'w', encoding='utf-8') as f:
    json.dump(info, f, indent=2)
  return info


def read_descriptions(apt_dir: str) -> list[dd.Description]:
  """Every `Description` of `apt_dir/Translation-en`, with source packages from `Packages`."""
  with open(os.path.join(apt_dir, 'Packages'), encoding='utf-8') as f:
    source_of = dd.source_packages(dd.parse_deb822(f))
  with open(os.path.join(apt_dir, 'Translation-en'), encoding='utf-8') as f:
    return list(dd.translation_descriptions(dd.parse_deb822(f), source_of))


def _lengths(values: list[int]) -> dict:
  a = np.asarray(values)
  q = np.percentile(a, [50, 90, 95, 99]) if len(a) else [0] * 4
  return {
    'mean': round(float(a.mean()), 1) if len(a) else 0.0,
    'p50': float(q[0]),
    'p90': float(q[1]),
    'p95': float(q[2]),
    'p99': float(q[3]),
    'max': int(a.max()) if len(a) else 0,
  }


def length_stats(pairs: list[Pair], tokenizer=None, fits=(64, 128, 192, 256)) -> dict:
  """Characters (and, with a tokenizer, tokens incl. eos) of sources and targets."""
  out = {
    'source_chars': _lengths([len(s) for s, _ in pairs]),
    'target_chars': _lengths([len(t) for _, t in pairs]),
  }
  if tokenizer is not None:
    source = [len(tokenizer.encode(s)) for s, _ in pairs]
    target = [len(tokenizer.encode(t)) for _, t in pairs]
    out['source_tokens'] = _lengths(source)
    out['target_tokens'] = _lengths(target)
    n = max(len(pairs), 1)
    out['source_tokens_fit'] = {str(k): round(sum(x <= k for x in source) / n, 4) for k in fits}
    out['target_tokens_fit'] = {
      str(k): round(sum(x <= k for x in target) / n, 4) for k in (16, 24, 32, 48)
    }
  return out


def build_debsumm(
  data_dir: str,
  apt_dir: str,
  *,
  mirror: str = MIRROR,
  suite: str = SUITE,
  max_source_chars: int = 1024,
  max_target_chars: int = 100,
  num_test: int = 2000,
  num_valid: int = 2000,
  tokenizer=None,
  tokenizer_name: str = '',
) -> dict:
  """Fetches the indices, cleans, groups, splits and writes the corpus; returns its stats.

  Args:
    data_dir: output directory (created).
    apt_dir: apt's private state and the uncompressed indices (reused when present).
    mirror: Debian mirror URI (e.g. a snapshot.debian.org archive URI to pin a date).
    suite: the release (codename).
    max_source_chars: longest extended description kept, in characters.
    max_target_chars: longest synopsis kept, in characters.
    num_test: test gets whole source-package groups until it has this many pairs.
    num_valid: the same for valid.
    tokenizer: optional `Tokenizer` for token lengths in the stats.
    tokenizer_name: what to call it in the stats.

  Returns:
    The content of `data_dir/stats.json`.
  """
  os.makedirs(data_dir, exist_ok=True)
  release = fetch_indices(apt_dir, mirror=mirror, suite=suite)
  descriptions = read_descriptions(apt_dir)
  cleaned = dd.clean_descriptions(
    descriptions, max_source_chars=max_source_chars, max_target_chars=max_target_chars
  )
  group_of = dd.group_sources(cleaned.pairs, cleaned.source_packages, dd.link_texts(descriptions))
  splits = dd.split_by_group(cleaned.pairs, group_of, num_test=num_test, num_valid=num_valid)
  split_stats = {}
  for split, pairs in splits.items():
    write_tsv(pairs, os.path.join(data_dir, f'{split}.tsv'))
    with open(os.path.join(data_dir, f'{split}_packages.txt'), 'w', encoding='utf-8') as f:
      f.writelines(' '.join(cleaned.packages[p]) + '\n' for p in pairs)
    split_stats[split] = {
      'pairs': len(pairs),
      'groups': len({group_of[p] for p in pairs}),
      'source_packages': len({s for p in pairs for s in cleaned.source_packages[p]}),
      **length_stats(pairs, tokenizer),
    }
  group_sizes = collections.Counter(group_of.values())
  stats = {
    'task': 'debsumm: Debian extended package description -> synopsis (no input prefix)',
    'source': {
      'indices': f'{mirror} {suite}/{COMPONENT} Translation-en + binary-{ARCHITECTURE} Packages',
      **release,
      'license': LICENSE,
    },
    'descriptions': len(descriptions),
    'packages': len({d.package for d in descriptions}),
    'source_packages': len({d.source_package for d in descriptions}),
    'total_pairs': len(cleaned.pairs),
    'dropped': dict(sorted(cleaned.dropped.items())),
    'groups': len(group_sizes),
    'largest_groups': dict(group_sizes.most_common(5)),
    'splits': split_stats,
    'tokenizer': tokenizer_name,
    'settings': {
      'max_source_chars': max_source_chars,
      'max_target_chars': max_target_chars,
      'num_test': num_test,
      'num_valid': num_valid,
    },
    'split_rule': 'groups = source packages linked by a shared package or extended text; groups '
    'sorted by sha256(name); test takes whole groups until >= num_test pairs, then valid, rest '
    'train',
  }
  with open(os.path.join(data_dir, 'stats.json'), 'w', encoding='utf-8') as f:
    json.dump(stats, f, indent=2, ensure_ascii=False)
  return stats


def format_stats(stats: dict) -> str:
  """A plain-text summary (what build_summ.py prints)."""
  release = stats['source'].get('release', {})
  lines = [
    f'{release.get("description", "")} ({release.get("date", "")})',
    f'descriptions {stats["descriptions"]} ({stats["packages"]} packages, '
    f'{stats["source_packages"]} source packages) -> {stats["total_pairs"]} pairs in '
    f'{stats["groups"]} groups',
    f'dropped: {stats["dropped"]}',
    f'{"split":<7}{"pairs":>8}{"groups":>8}{"src chars p50/p95":>20}{"tgt chars p50/p95":>20}'
    + (f'{"src tok p50/p95/max":>22}{"tgt tok p95/max":>18}' if stats['tokenizer'] else ''),
  ]
  for name, s in stats['splits'].items():
    sc, tc = s['source_chars'], s['target_chars']
    cells = [f'{sc["p50"]:.0f}/{sc["p95"]:.0f}', f'{tc["p50"]:.0f}/{tc["p95"]:.0f}']
    line = f'{name:<7}{s["pairs"]:>8}{s["groups"]:>8}{cells[0]:>20}{cells[1]:>20}'
    if 'source_tokens' in s:
      st, tt = s['source_tokens'], s['target_tokens']
      tok_cells = [f'{st["p50"]:.0f}/{st["p95"]:.0f}/{st["max"]}', f'{tt["p95"]:.0f}/{tt["max"]}']
      line += f'{tok_cells[0]:>22}{tok_cells[1]:>18}'
    lines.append(line)
  return '\n'.join(lines)
