"""Debian package descriptions as summarization pairs: extended description -> synopsis.

Every Debian binary package has a `Description` (Debian Policy 5.6.13): a one-line *synopsis*
and an *extended description* of one or more paragraphs written for the same package. The
archive's `Translation-en` index holds both for every package of a suite (`Package`,
`Description-md5`, `Description-en`) and the `Packages` index names each package's source
package. This module holds the pure parsing, cleaning and grouping functions; fetching the
indices with apt and writing the corpus is `debsumm.py`.

A pair is `(extended description, synopsis)`, both one line of plain text.
"""

import collections
import dataclasses
import re
from collections.abc import Iterable, Iterator, Sequence

from specdec_jax.data.pairs import Pair, normalize_text, source_hash


@dataclasses.dataclass(frozen=True)
class Description:
  """One package's description, as the indices give it (not yet normalized)."""

  package: str
  source_package: str
  synopsis: str
  extended: str  # rendered to one line by `render_extended`; '' if the package has none


def parse_deb822(lines: Iterable[str]) -> Iterator[dict[str, str]]:
  """Paragraphs of a deb822 file (Packages, Translation-en, control): `{field: value}` each.

  Paragraphs are separated by blank lines. A field's value is the rest of its first line,
  stripped, then each continuation line (one starting with a space or tab) on a line of its own,
  kept verbatim: `Description` values need their leading spaces and ` .` lines.
  Comment lines (`#`) are skipped.
  """
  fields: dict[str, str] = {}
  name = None
  for line in lines:
    line = line.rstrip('\r\n')
    if not line.strip():
      if fields:
        yield fields
      fields, name = {}, None
    elif line.startswith('#'):
      continue
    elif line[0] in ' \t':
      if name is None:
        raise ValueError(f'continuation line before any field: {line!r}')
      fields[name] += '\n' + line
    else:
      name, sep, value = line.partition(':')
      if not sep:
        raise ValueError(f'not a field (no colon): {line!r}')
      fields[name] = value.strip()
  if fields:
    yield fields


def split_description(value: str) -> tuple[str, list[str]]:
  """A `Description` value -> (synopsis, extended description lines as written)."""
  synopsis, _, rest = value.partition('\n')
  return synopsis.strip(), rest.split('\n') if rest else []


def render_extended(lines: Sequence[str]) -> str:
  """The extended description as one line of text.

  Policy 5.6.13: each line starts with one space, which is not part of the text; a line that is
  a lone `.` (after that space) is a blank line between paragraphs; lines starting with two or
  more spaces are shown verbatim (lists, code). Flattened here: every line's text joined with
  single spaces, paragraph breaks included, so list items read `... to: * first item * second`.
  """
  words = []
  for line in lines:
    text = line[1:] if line[:1] in (' ', '\t') else line
    if text.strip() == '.':
      continue
    words.append(text)
  return normalize_text(' '.join(words))


def translation_descriptions(
  translation: Iterable[dict[str, str]], source_of: dict[str, str]
) -> Iterator[Description]:
  """`Description`s from `Translation-<lang>` paragraphs (`Package`, `Description-<lang>`).

  Args:
    translation: paragraphs from `parse_deb822` of a Translation index.
    source_of: binary package -> source package (from `source_packages`); a package missing
      there (built only for other architectures) is its own source package.
  """
  for fields in translation:
    key = next((k for k in fields if k.startswith('Description-') and k != 'Description-md5'), '')
    if 'Package' not in fields or not key:
      raise ValueError(f'not a Translation paragraph (fields {sorted(fields)})')
    package = fields['Package']
    synopsis, lines = split_description(fields[key])
    yield Description(package, source_of.get(package, package), synopsis, render_extended(lines))


def source_packages(packages: Iterable[dict[str, str]]) -> dict[str, str]:
  """Binary package -> source package from `Packages` paragraphs.

  `Source` may be absent (same name as the binary) or carry a version: `foo (1.2-3)`.
  """
  out = {}
  for fields in packages:
    package = fields['Package']
    out[package] = fields.get('Source', package).split(' ')[0] or package
  return out


_TRANSITIONAL = re.compile(r'\btransitional\b|\bdummy package\b', re.IGNORECASE)


def is_transitional(synopsis: str, extended: str) -> bool:
  """True for transitional / dummy packages, whose text says nothing about a program."""
  return bool(_TRANSITIONAL.search(synopsis) or _TRANSITIONAL.search(extended))


@dataclasses.dataclass(frozen=True)
class CleanResult:
  """What `clean_descriptions` keeps.

  Attributes:
    pairs: the kept `(extended, synopsis)` pairs, normalized, in first-seen order.
    packages: pair -> the binary packages that have exactly that description (sorted).
    source_packages: pair -> their source packages (sorted).
    dropped: why the other descriptions were dropped (`empty`, `transitional`, `too_long`,
      `not_shorter`, `ambiguous`, `duplicate`), counted per package.
  """

  pairs: list[Pair]
  packages: dict[Pair, list[str]]
  source_packages: dict[Pair, list[str]]
  dropped: collections.Counter


def clean_descriptions(
  descriptions: Iterable[Description], *, max_source_chars: int = 1024, max_target_chars: int = 100
) -> CleanResult:
  """Normalizes descriptions into pairs and drops those that do not make a summarization pair.

  In this order, per package: `empty` (no synopsis or no extended description),
  `transitional` (`is_transitional`), `too_long` (extended over `max_source_chars` or synopsis
  over `max_target_chars`), `not_shorter` (the synopsis is not shorter than the extended text).
  Then over all packages: `ambiguous` (an extended description that comes with two or more
  different synopses, e.g. one boilerplate text shared by many packages: its synopsis cannot be
  told from it; all its packages are dropped) and `duplicate` (a pair already kept for another
  package: kept once, its packages listed).

  Args:
    descriptions: from `translation_descriptions`.
    max_source_chars: longest extended description kept, in characters after normalization.
    max_target_chars: longest synopsis kept.

  Returns:
    A `CleanResult`.
  """
  if max_source_chars <= 0 or max_target_chars <= 0:
    raise ValueError(f'max chars must be positive, got {max_source_chars}, {max_target_chars}')
  dropped = collections.Counter()
  candidates: dict[Pair, list[Description]] = {}
  synopses_of: dict[str, set[str]] = collections.defaultdict(set)
  for d in descriptions:
    synopsis, extended = normalize_text(d.synopsis), normalize_text(d.extended)
    if not synopsis or not extended:
      dropped['empty'] += 1
    elif is_transitional(synopsis, extended):
      dropped['transitional'] += 1
    elif len(extended) > max_source_chars or len(synopsis) > max_target_chars:
      dropped['too_long'] += 1
    elif len(synopsis) >= len(extended):
      dropped['not_shorter'] += 1
    else:
      candidates.setdefault((extended, synopsis), []).append(d)
      synopses_of[extended].add(synopsis)
  kept, packages, sources = [], {}, {}
  for pair, ds in candidates.items():
    if len(synopses_of[pair[0]]) > 1:
      dropped['ambiguous'] += len(ds)
      continue
    names = sorted({d.package for d in ds})
    # The same package twice (one entry per architecture's description) is not a duplicate.
    if len(names) > 1:
      dropped['duplicate'] += len(names) - 1
    kept.append(pair)
    packages[pair] = names
    sources[pair] = sorted({d.source_package for d in ds})
  return CleanResult(kept, packages, sources, dropped)


def link_texts(descriptions: Iterable[Description]) -> list[tuple[str, str]]:
  """`(source package, normalized extended text)` of every description that may link families.

  Transitional boilerplate ("This is a transitional package. It can safely be removed.") is
  shared by dozens of unrelated source packages and would chain them together, so it is left out.
  """
  out = []
  for d in descriptions:
    extended = normalize_text(d.extended)
    if extended and not is_transitional(d.synopsis, extended):
      out.append((d.source_package, extended))
  return out


def group_sources(
  pairs: Sequence[Pair], sources_of: dict[Pair, list[str]], links: Iterable[tuple[str, str]]
) -> dict[Pair, str]:
  """Each pair's group: the smallest source package name of its connected component.

  Source packages are linked when they share a pair or when one extended description text
  appears in both (`links`: `(source package, extended text)` pairs from `link_texts`,
  ambiguous descriptions included: e.g. gcc-12-cross and gcc-12-cross-ports share the text of
  their Modula-2 cross compilers). Splitting by group keeps a text and a family of
  near-identical descriptions from several source packages in one split.
  """
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    while parent[x] != x:
      parent[x] = parent[parent[x]]
      x = parent[x]
    return x

  def union(a: str, b: str) -> None:
    ra, rb = find(a), find(b)
    if ra != rb:
      parent[max(ra, rb)] = min(ra, rb)

  for pair in pairs:
    first, *rest = sources_of[pair]
    for other in rest:
      union(first, other)
  first_with_text: dict[str, str] = {}
  for source, text in links:
    union(first_with_text.setdefault(text, source), source)
  return {pair: find(sources_of[pair][0]) for pair in pairs}


def split_by_group(
  pairs: Sequence[Pair],
  group_of: dict[Pair, str],
  *,
  num_test: int,
  num_valid: int,
  key=None,
) -> dict[str, list[Pair]]:
  """Deterministic train / valid / test split of whole groups.

  Groups are ordered by `key(group)` (default: the sha256 of the group name, see
  `pairs.source_hash`); whole groups go to test until it holds at least `num_test` pairs, then
  to valid until it holds `num_valid`, the rest to train. Within a split, pairs are ordered by
  the hash of their source text (a shuffled-looking but fixed order).

  Returns:
    `{'train': [...], 'valid': [...], 'test': [...]}`.
  """
  if num_test < 0 or num_valid < 0:
    raise ValueError(f'split sizes must be >= 0, got test={num_test} valid={num_valid}')
  if num_test + num_valid > len(pairs):
    raise ValueError(f'asked for {num_test} test + {num_valid} valid pairs of {len(pairs)}')
  key = key or source_hash
  members: dict[str, list[Pair]] = collections.defaultdict(list)
  for pair in pairs:
    members[group_of[pair]].append(pair)
  splits = {'train': [], 'valid': [], 'test': []}
  for group in sorted(members, key=lambda g: (key(g), g)):
    if len(splits['test']) < num_test:
      name = 'test'
    elif len(splits['valid']) < num_valid:
      name = 'valid'
    else:
      name = 'train'
    splits[name].extend(members[group])
  for name in splits:
    splits[name].sort(key=lambda p: (source_hash(p[0]), p))
  return splits
