"""Sentence pairs: normalization, filtering, deduplication, splitting and TSV / JSONL files.

A pair is a tuple `(source, target)` of plain strings (English, German for the EN->DE corpus).
The split is decided by a hash of the source alone, so a source sentence never appears in two
splits, and the same pairs always give the same split.
"""

import collections
import hashlib
import json
import os
import unicodedata
from collections.abc import Iterable, Sequence

Pair = tuple[str, str]


def normalize_text(text: str) -> str:
  """Unicode NFC, every run of whitespace (tabs and newlines included) to one space, stripped."""
  return ' '.join(unicodedata.normalize('NFC', text).split())


def clean_pairs(
  pairs: Iterable[Pair], *, max_chars: int = 256
) -> tuple[list[Pair], collections.Counter]:
  """Normalizes pairs and drops empty, identical, overlong and repeated ones.

  Args:
    pairs: raw `(source, target)` strings.
    max_chars: a pair with either side longer than this (after normalization) is dropped.

  Returns:
    The kept pairs in first-seen order, and a Counter of why the others were dropped
    (`empty`, `identical`, `too_long`, `duplicate`).
  """
  if max_chars <= 0:
    raise ValueError(f'max_chars must be positive, got {max_chars}')
  kept, seen, dropped = [], set(), collections.Counter()
  for source, target in pairs:
    source, target = normalize_text(source), normalize_text(target)
    if not source or not target:
      dropped['empty'] += 1
    elif source == target:
      dropped['identical'] += 1
    elif len(source) > max_chars or len(target) > max_chars:
      dropped['too_long'] += 1
    elif (source, target) in seen:
      dropped['duplicate'] += 1
    else:
      seen.add((source, target))
      kept.append((source, target))
  return kept, dropped


def source_hash(source: str) -> str:
  """The hex sha256 of the source sentence: the key that orders sources for the split."""
  return hashlib.sha256(source.encode('utf-8')).hexdigest()


def split_pairs(
  pairs: Sequence[Pair], *, num_test: int = 2000, num_valid: int = 2000
) -> dict[str, list[Pair]]:
  """Deterministic train / valid / test split by the hash of the source sentence.

  Distinct sources are ordered by `source_hash`; the first `num_test` go to test, the next
  `num_valid` to valid, the rest to train. Every pair follows its source, so a source sentence
  with several translations keeps all of them in one split.

  Args:
    pairs: `(source, target)` pairs (normally the output of `clean_pairs`).
    num_test: number of distinct source sentences in the test split.
    num_valid: number of distinct source sentences in the valid split.

  Returns:
    `{'train': [...], 'valid': [...], 'test': [...]}`, each list sorted by (hash, pair).
  """
  if num_test < 0 or num_valid < 0:
    raise ValueError(f'split sizes must be >= 0, got test={num_test} valid={num_valid}')
  sources = sorted({s for s, _ in pairs}, key=source_hash)
  if num_test + num_valid > len(sources):
    raise ValueError(
      f'asked for {num_test} test + {num_valid} valid sources but there are only {len(sources)}'
    )
  split_of = {}
  for rank, source in enumerate(sources):
    split_of[source] = (
      'test' if rank < num_test else 'valid' if rank < num_test + num_valid else 'train'
    )
  splits = {'train': [], 'valid': [], 'test': []}
  for pair in sorted(pairs, key=lambda p: (source_hash(p[0]), p)):
    splits[split_of[pair[0]]].append(pair)
  return splits


def write_tsv(pairs: Iterable[Pair], path: str) -> int:
  """Writes `source<TAB>target` lines (UTF-8, no header); returns the number of lines.

  Raises:
    ValueError: if a side contains a tab or a newline (normalize the pairs first).
  """
  count = 0
  with open(path, 'w', encoding='utf-8') as f:
    for source, target in pairs:
      for side in (source, target):
        if '\t' in side or '\n' in side or '\r' in side:
          raise ValueError(f'pair side contains a tab or newline, normalize first: {side!r}')
      f.write(f'{source}\t{target}\n')
      count += 1
  return count


_JSON_KEYS = (('source', 'target'), ('en', 'de'))


def load_pairs(path: str) -> list[Pair]:
  """Reads sentence pairs from a TSV or JSONL file (chosen by extension).

  TSV (`.tsv`, `.txt`): `source<TAB>target` per line, extra columns ignored, no header.
  JSONL (`.jsonl`, `.json`): one object per line with keys `source`/`target` or `en`/`de`.
  Blank lines are skipped. This is how the built corpus and user files (e.g. WMT) are read.

  Args:
    path: the file.

  Returns:
    A list of `(source, target)` strings, as written (not normalized).

  Raises:
    ValueError: on an unknown extension or a malformed line (the message names the line).
  """
  ext = os.path.splitext(path)[1].lower()
  if ext not in ('.tsv', '.txt', '.jsonl', '.json'):
    raise ValueError(f'load_pairs: unknown extension {ext!r} of {path} (want .tsv or .jsonl)')
  pairs = []
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, start=1):
      line = line.rstrip('\n').rstrip('\r')
      if not line.strip():
        continue
      if ext in ('.tsv', '.txt'):
        fields = line.split('\t')
        if len(fields) < 2:
          raise ValueError(f'{path}:{lineno}: expected source<TAB>target, got {line[:80]!r}')
        pairs.append((fields[0], fields[1]))
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f'{path}:{lineno}: invalid JSON ({e})') from None
      for source_key, target_key in _JSON_KEYS:
        if isinstance(record, dict) and source_key in record and target_key in record:
          pairs.append((str(record[source_key]), str(record[target_key])))
          break
      else:
        raise ValueError(f'{path}:{lineno}: expected keys source/target or en/de')
  return pairs
