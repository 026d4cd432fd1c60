"""EN-DE sentence pairs from the Ding dictionary (Debian `trans-de-en`, `/usr/share/trans/de-en`).

A line is `german :: english`. Both sides are split into sub-entries on ` | ` (aligned one to one)
and each sub-entry into alternatives on `; ` (synonyms: any German alternative translates any
English one; the final `.`, `!` or `?` of the last alternative is given to the others). Annotations are removed: `{f}`, `{vt}` (grammar), `[ugs.]`, `[Am.]` (usage),
`<Aalmolch>` (search keywords) and a comment in parentheses after the final punctuation
(`Seid fruchtbar und mehret euch. (biblisch)`). Only sentence-like pairs are kept: both sides
with at least `min_words` words, starting with an upper-case letter (or a digit / quote) and
ending with `.`, `!` or `?`.
"""

import re
from collections.abc import Iterable, Iterator

from specdec_jax.data.pairs import Pair

_ANNOTATION_RE = re.compile(r'\s*(\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>)')
_TRAILING_COMMENT_RE = re.compile(r'([.!?])\s*\([^()]*\)$')
_SENTENCE_START_RE = re.compile(r'^[\w"„“‚‘\'(¿¡]')
_SENTENCE_END_RE = re.compile(r'[.!?]["“”’\')]?$')


def clean_entry(text: str) -> str:
  """Removes Ding annotations and a trailing parenthesized comment; collapses whitespace."""
  text = ' '.join(_ANNOTATION_RE.sub('', text).split())
  return _TRAILING_COMMENT_RE.sub(r'\1', text)


def is_sentence(text: str, *, min_words: int = 4) -> bool:
  """Whether a cleaned entry looks like a full sentence (see the module docstring)."""
  if len(text.split()) < min_words or not _SENTENCE_END_RE.search(text):
    return False
  first = text[0]
  return bool(_SENTENCE_START_RE.match(text)) and not first.islower()


def _split_alternatives(entry: str) -> list[str]:
  # 'That is small comfort; This is scant comfort.' puts the final punctuation once for all.
  alts = [clean_entry(a) for a in entry.split('; ')]
  final = alts[-1][-1:] if alts[-1] else ''
  if final in ('.', '!', '?'):
    alts = [a if not a or a[-1] in '.!?' else a + final for a in alts]
  return alts


def _align_alternatives(de_alts: list[str], en_alts: list[str]) -> Iterator[tuple[str, str]]:
  if len(de_alts) == len(en_alts):
    yield from zip(de_alts, en_alts)
  elif len(de_alts) == 1:
    yield from ((de_alts[0], en) for en in en_alts)
  elif len(en_alts) == 1:
    yield from ((de, en_alts[0]) for de in de_alts)
  else:  # all alternatives are synonyms; pairing in order stays a valid translation
    yield from zip(de_alts, en_alts)


def line_pairs(line: str, *, min_words: int = 4) -> list[Pair]:
  """The sentence-like `(en, de)` pairs of one dictionary line (empty for comments / words)."""
  line = line.strip()
  if not line or line.startswith('#') or line.count(' :: ') != 1:
    return []
  de_side, en_side = line.split(' :: ')
  de_subs, en_subs = de_side.split(' | '), en_side.split(' | ')
  if len(de_subs) != len(en_subs):
    return []
  pairs = []
  for de_sub, en_sub in zip(de_subs, en_subs):
    de_alts, en_alts = _split_alternatives(de_sub), _split_alternatives(en_sub)
    for de, en in _align_alternatives(de_alts, en_alts):
      if is_sentence(de, min_words=min_words) and is_sentence(en, min_words=min_words):
        pairs.append((en, de))
  return pairs


def ding_pairs(lines: Iterable[str], *, min_words: int = 4) -> Iterator[Pair]:
  """Yields `(en, de)` sentence pairs from the lines of a Ding `de-en` file."""
  for line in lines:
    yield from line_pairs(line, min_words=min_words)
