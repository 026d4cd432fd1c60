"""EN-DE pairs from LibreOffice: the offline help (HTML) and the UI message catalogs (gettext).

Help: every paragraph and heading of a help page carries the same `id` (`par_id...`, `hd_id...`)
in every language, so an English and a German page with the same relative path are joined on
`(path, id)`. Inline platform / application variants (`<span class="switchinline">` holding e.g.
a `MAC` span and a `default...` span, all hidden) would otherwise be concatenated ("LibreOffice -
PreferencesTools - Options"); only the default variant is kept.

UI: `resource/de/LC_MESSAGES/*.mo` map English msgids (prefixed by `context\\x04`) to German.
"""

import gettext
import html.parser
import os
import re
from collections.abc import Iterator

from specdec_jax.data.pairs import Pair

_ID_RE = re.compile(r'^(par|hd)_id')
_VOID_TAGS = frozenset(
  'area base br col embed hr img input link meta param source track wbr'.split()
)
# Variant containers: inline `switchinline` and block `switch`. Children whose id starts with
# 'default' are the generic text; the others are platform (MAC, WIN, UNIX) or module (WRITER,
# CALC, ...) specific.
_SWITCH_CLASSES = frozenset(['switchinline'])


class _HelpParser(html.parser.HTMLParser):
  """Collects the text of every element whose id is `par_id...` or `hd_id...`."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    # Each entry: [tag, skip, is_switch, capture_id or None].
    self._stack: list[list] = []
    self._capture_id: str | None = None
    self._buffer: list[str] = []
    self.paragraphs: list[tuple[str, str]] = []

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    skip = bool(self._stack) and self._stack[-1][1]
    if tag in _VOID_TAGS:
      if tag == 'br' and self._capture_id is not None and not skip:
        self._buffer.append(' ')
      return
    parent_is_switch = bool(self._stack) and self._stack[-1][2]
    if parent_is_switch and not (attrs.get('id') or '').startswith('default'):
      skip = True
    classes = set((attrs.get('class') or '').split())
    capture_id = None
    element_id = attrs.get('id') or ''
    if self._capture_id is None and _ID_RE.match(element_id):
      capture_id = self._capture_id = element_id
      self._buffer = []
    self._stack.append([tag, skip, bool(classes & _SWITCH_CLASSES), capture_id])

  def handle_endtag(self, tag):
    # Tolerate unclosed children: pop up to the innermost open element with this tag.
    for depth in range(len(self._stack) - 1, -1, -1):
      if self._stack[depth][0] == tag:
        break
    else:
      return
    for entry in self._stack[depth:]:
      if entry[3] is not None:
        self.paragraphs.append((entry[3], ''.join(self._buffer)))
        self._capture_id, self._buffer = None, []
    del self._stack[depth:]

  def handle_data(self, data):
    if self._capture_id is not None and not (self._stack and self._stack[-1][1]):
      self._buffer.append(data)

  def close(self):
    super().close()
    if self._stack:  # unclosed elements at the end of the page
      self.handle_endtag(self._stack[0][0])


def parse_help_html(text: str) -> list[tuple[str, str]]:
  """The `(id, text)` of every `par_id` / `hd_id` element of one help page, in document order.

  Text is raw (entities decoded, whitespace not yet normalized); inline switch variants other than
  the default one are left out. An id may occur more than once per page.
  """
  parser = _HelpParser()
  parser.feed(text)
  parser.close()
  return parser.paragraphs


def _help_pages(root: str) -> dict[str, str]:
  pages = {}
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      if name.endswith('.html'):
        full = os.path.join(dirpath, name)
        pages[os.path.relpath(full, root)] = full
  return pages


def join_help_pages(en_html: str, de_html: str) -> list[Pair]:
  """Pairs the paragraphs of an English and a German help page on their ids.

  An id that occurs k times in both pages gives k pairs in order; an id whose count differs
  between the pages is skipped (its occurrences cannot be aligned).
  """
  by_id_de: dict[str, list[str]] = {}
  for element_id, text in parse_help_html(de_html):
    by_id_de.setdefault(element_id, []).append(text)
  by_id_en: dict[str, list[str]] = {}
  for element_id, text in parse_help_html(en_html):
    by_id_en.setdefault(element_id, []).append(text)
  pairs = []
  for element_id, en_texts in by_id_en.items():
    de_texts = by_id_de.get(element_id, [])
    if len(de_texts) == len(en_texts):
      pairs.extend(zip(en_texts, de_texts))
  return pairs


def help_pairs(en_root: str, de_root: str) -> Iterator[Pair]:
  """Yields raw `(en, de)` pairs from two help trees (e.g. `.../help/en-US`, `.../help/de`).

  Pages are matched on their path relative to the roots, in sorted order.
  """
  en_pages, de_pages = _help_pages(en_root), _help_pages(de_root)
  if not en_pages or not de_pages:
    raise ValueError(f'no .html help pages under {en_root!r} or {de_root!r}')
  for relpath in sorted(en_pages.keys() & de_pages.keys()):
    with open(en_pages[relpath], encoding='utf-8') as f:
      en_html = f.read()
    with open(de_pages[relpath], encoding='utf-8') as f:
      de_html = f.read()
    yield from join_help_pages(en_html, de_html)


# Placeholders such as %PRODUCTNAME, %1, $(ARG1), $name$ are kept verbatim; underscores inside
# them are not mnemonics.
_PLACEHOLDER_RE = re.compile(r'(%[A-Za-z0-9_]+%?|\$\([A-Za-z0-9_]+\)|\$[A-Za-z0-9_]+\$)')
# A GTK mnemonic: one underscore before a letter or digit ("_Add", "H_inzufügen").
_MNEMONIC_RE = re.compile(r'(?<!_)_(?=[^\W_])')


def strip_accelerators(text: str, *, gtk_mnemonics: bool) -> str:
  """Removes `~` accelerators (VCL) and, if `gtk_mnemonics`, `_` mnemonics (.ui strings).

  Placeholders (`%PRODUCTNAME`, `%1`, `$(ARG1)`, `$name$`) are left untouched.
  """
  pieces = _PLACEHOLDER_RE.split(text)
  for i in range(0, len(pieces), 2):  # even pieces are outside placeholders
    piece = pieces[i].replace('~', '')
    pieces[i] = _MNEMONIC_RE.sub('', piece) if gtk_mnemonics else piece
  return ''.join(pieces)


def catalog_pairs(catalog: dict) -> Iterator[Pair]:
  """Yields `(en, de)` pairs from a `gettext.GNUTranslations._catalog`.

  Keys are `context\\x04msgid` (the context is dropped) or, for plural entries,
  `(msgid, index)`: only the singular form (index 0) is kept, since the plural msgid is not
  stored in a compiled catalog. The header entry (empty msgid) is skipped. Contexts containing
  `|` come from GTK .ui files, where `_` marks the mnemonic.
  """
  for key, msgstr in catalog.items():
    if isinstance(key, tuple):
      key, index = key
      if index != 0:
        continue
    context, _, msgid = key.rpartition('\x04')
    if not msgid:
      continue
    gtk = '|' in context
    yield (
      strip_accelerators(msgid, gtk_mnemonics=gtk),
      strip_accelerators(msgstr, gtk_mnemonics=gtk),
    )


def mo_pairs(mo_dir: str) -> Iterator[Pair]:
  """Yields raw `(en, de)` pairs from every `*.mo` file in `mo_dir`, in sorted file order."""
  names = sorted(n for n in os.listdir(mo_dir) if n.endswith('.mo'))
  if not names:
    raise ValueError(f'no .mo files in {mo_dir!r}')
  for name in names:
    with open(os.path.join(mo_dir, name), 'rb') as f:
      catalog = gettext.GNUTranslations(f)._catalog
    yield from catalog_pairs(catalog)
