"""Tests for specdec_jax.data: help/catalog/Ding parsers, cleaning and splits, files, tokenizer.

All fixtures are inline (no network, no packages). The one test that reads the real built corpus
is marked slow and skips when `data/ende` has not been built.
"""

import gettext
import json
import os
import random
import struct

import numpy as np
import pytest

from specdec_jax.data import ding, ende, libreoffice, pairs, tokenizer

_HELP_EN = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>General</title></head><body>
<div id="DisplayArea">
<h1 id="hd_id3153311" dir="auto">
  General
</h1>
<p id="par_id3156410" class="paragraph">Defines <span class="emph">general</span> settings.</p>
<p class="embedded">No id here, so not collected.</p>
<p id="par_id1" class="paragraph">Open a document, choose <span id="swln_1" class="switchinline"><span
 hidden="true" id="MACtext_1" class="MAC"><span class="emph">LibreOffice - Preferences</span>
</span><span hidden="true" id="defaulttext_1"><span class="emph">Tools - Options</span></span>
</span><span class="emph"> - Calc</span>.</p>
<span id="swln_2" class="switch"><span hidden="true" id="WRITERtext_2" class="WRITER">
<p id="par_id2" class="paragraph">Only in Writer.</p>
</span></span>
<p id="par_id3">Line one<br>line two &amp; more.</p>
<p id="par_id4">First copy.</p>
<p id="par_id4">Second copy.</p>
<p id="par_id5">Only once in English.</p>
<p id="par_id6">Not in German.</p>
</div></body></html>"""

_HELP_DE = """<!DOCTYPE html><html><head><meta charset="utf-8"><title>Allgemein</title></head><body>
<div id="DisplayArea">
<h1 id="hd_id3153311" dir="auto">Allgemein</h1>
<p id="par_id3156410" class="paragraph">Legt <span class="emph">allgemeine</span> Einstellungen fest.</p>
<p id="par_id1" class="paragraph">Öffnen Sie ein Dokument, wählen Sie <span id="swln_1"
 class="switchinline"><span hidden="true" id="MACtext_1" class="MAC">LibreOffice – Einstellungen
</span><span hidden="true" id="defaulttext_1">Extras – Optionen</span></span> – Calc.</p>
<span id="swln_2" class="switch"><span hidden="true" id="WRITERtext_2" class="WRITER">
<p id="par_id2" class="paragraph">Nur in Writer.</p>
</span></span>
<p id="par_id3">Zeile eins<br/>Zeile zwei &amp; mehr.</p>
<p id="par_id4">Erste Kopie.</p>
<p id="par_id4">Zweite Kopie.</p>
<p id="par_id5">Einmal.</p>
<p id="par_id5">Zweimal.</p>
</div></body></html>"""


def _norm(pair_list):
  return [tuple(pairs.normalize_text(s) for s in p) for p in pair_list]


def test_parse_help_html_keeps_default_switch_variant_only():
  got = dict(libreoffice.parse_help_html(_HELP_EN)[:3])
  assert pairs.normalize_text(got['par_id1']) == 'Open a document, choose Tools - Options - Calc.'
  assert pairs.normalize_text(got['hd_id3153311']) == 'General'
  assert pairs.normalize_text(got['par_id3156410']) == 'Defines general settings.'


def test_join_help_pages_on_ids():
  got = _norm(libreoffice.join_help_pages(_HELP_EN, _HELP_DE))
  assert got == [
    ('General', 'Allgemein'),
    ('Defines general settings.', 'Legt allgemeine Einstellungen fest.'),
    (
      'Open a document, choose Tools - Options - Calc.',
      'Öffnen Sie ein Dokument, wählen Sie Extras – Optionen – Calc.',
    ),
    ('Only in Writer.', 'Nur in Writer.'),
    ('Line one line two & more.', 'Zeile eins Zeile zwei & mehr.'),
    ('First copy.', 'Erste Kopie.'),
    ('Second copy.', 'Zweite Kopie.'),
    # par_id5 (1 vs 2 occurrences) and par_id6 (missing in German) cannot be aligned.
  ]


def test_help_pairs_matches_pages_by_relative_path(tmp_path):
  for lang, page in (('en-US', _HELP_EN), ('de', _HELP_DE)):
    os.makedirs(tmp_path / lang / 'text' / 'shared')
    (tmp_path / lang / 'text' / 'shared' / 'a.html').write_text(page, encoding='utf-8')
  (tmp_path / 'en-US' / 'text' / 'shared' / 'only_en.html').write_text(_HELP_EN, encoding='utf-8')
  got = list(libreoffice.help_pairs(str(tmp_path / 'en-US'), str(tmp_path / 'de')))
  assert len(got) == 7
  with pytest.raises(ValueError, match='no .html'):
    list(libreoffice.help_pairs(str(tmp_path / 'en-US'), str(tmp_path / 'missing')))


def _write_mo(path, entries):
  """Writes a GNU .mo file (little endian, no hash table) from `{msgid_bytes: msgstr_bytes}`."""
  keys = sorted(entries)
  ids = b''.join(k + b'\0' for k in keys)
  strs = b''.join(entries[k] + b'\0' for k in keys)
  n = len(keys)
  ids_start = 7 * 4 + 16 * n
  strs_start = ids_start + len(ids)
  id_table, str_table, id_off, str_off = [], [], ids_start, strs_start
  for k in keys:
    id_table += [len(k), id_off]
    str_table += [len(entries[k]), str_off]
    id_off += len(k) + 1
    str_off += len(entries[k]) + 1
  header = struct.pack('<7I', 0x950412DE, 0, n, 7 * 4, 7 * 4 + 8 * n, 0, 0)
  with open(path, 'wb') as f:
    f.write(header + struct.pack(f'<{4 * n}I', *id_table, *str_table) + ids + strs)


def test_mo_pairs_strips_context_accelerators_and_plurals(tmp_path):
  entries = {
    b'': b'Content-Type: text/plain; charset=UTF-8\nPlural-Forms: nplurals=2; plural=n != 1;\n',
    b'STR_SAVE\x04~Save': 'Speichern'.encode(),
    b'dialog|add\x04_Add': 'H_inzufügen'.encode(),
    b'STR_NAME\x04Name_with_underscore': 'Name_mit_Unterstrich'.encode(),
    b'STR_PROD\x04%PRODUCT_NAME has ~%1 pages': '%PRODUCT_NAME hat ~%1 Seiten'.encode(),
    b'dlg|x\x04Value of $(ARG_1) and %AVERAGE_VALUE': 'Wert von $(ARG_1) und %AVERAGE_VALUE'.encode(),
    b'STR_N\x04One page\x00%1 pages': '1 Seite\x00%1 Seiten'.encode(),
  }
  _write_mo(tmp_path / 'x.mo', entries)
  with open(tmp_path / 'x.mo', 'rb') as f:
    assert gettext.GNUTranslations(f).gettext('dialog|add\x04_Add') == 'H_inzufügen'
  got = sorted(libreoffice.mo_pairs(str(tmp_path)))
  assert got == sorted(
    [
      ('Save', 'Speichern'),
      ('Add', 'Hinzufügen'),
      ('Name_with_underscore', 'Name_mit_Unterstrich'),  # not a .ui string: no mnemonics
      ('%PRODUCT_NAME has %1 pages', '%PRODUCT_NAME hat %1 Seiten'),
      ('Value of $(ARG_1) and %AVERAGE_VALUE', 'Wert von $(ARG_1) und %AVERAGE_VALUE'),
      ('One page', '1 Seite'),
    ]
  )
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(ValueError, match='no .mo'):
    list(libreoffice.mo_pairs(str(tmp_path / 'empty')))


_DING_LINES = """# Version :: devel
Aal {m} [cook.] | Aale {pl} :: eel | eels
Trost {m} | Das ist (nur) ein schwacher Trost für die Betroffenen. | Das ist kein Trost für mich. :: comfort | That is small comfort for those affected; This is scant comfort for those affected. | That’s no comfort to me.
fruchtbar {adj} | Seid fruchtbar und mehret euch. (biblisch) <mehren> :: fruitful | Be fruitful and multiply.
Er kam; sie ging; er blieb hier. :: He came; she went.
Das ist gut für dich. | Das ist schlecht. :: That is good for you.
zu tun haben mit jdm. {vt} :: to have dealings with sb.
Ich bin müde und will schlafen [ugs.]. :: I am tired and want to sleep [coll.].
""".splitlines()


def test_ding_pairs_sentences_aligned_and_cleaned():
  got = list(ding.ding_pairs(_DING_LINES))
  assert got == [
    (
      'That is small comfort for those affected.',
      'Das ist (nur) ein schwacher Trost für die Betroffenen.',
    ),
    (
      'This is scant comfort for those affected.',
      'Das ist (nur) ein schwacher Trost für die Betroffenen.',
    ),
    ('That’s no comfort to me.', 'Das ist kein Trost für mich.'),
    ('Be fruitful and multiply.', 'Seid fruchtbar und mehret euch.'),
    ('I am tired and want to sleep.', 'Ich bin müde und will schlafen.'),
  ]


@pytest.mark.parametrize(
  'text, expected',
  [
    ('Aal {m} [cook.]', 'Aal'),
    ('Seid fruchtbar. (biblisch)', 'Seid fruchtbar.'),
    ('Das ist (nur) gut.', 'Das ist (nur) gut.'),
    ('Aalmolche {pl} <Aalmolch>  (Amphiuma)', 'Aalmolche (Amphiuma)'),
  ],
)
def test_ding_clean_entry(text, expected):
  assert ding.clean_entry(text) == expected


def test_clean_pairs_normalizes_and_filters():
  raw = [
    ('  Hello\tworld\n', 'Hallo  Welt'),
    ('Hello world', 'Hallo Welt'),  # duplicate after normalization
    ('Cafe\u0301', 'Caf\u00e9'),  # NFC makes both sides 'Café': identical
    ('', 'leer'),
    ('x' * 257, 'lang'),
    ('OK', 'OK'),
    ('Hello world', 'Hallo, Welt'),  # same source, other target: kept
  ]
  kept, dropped = pairs.clean_pairs(raw, max_chars=256)
  assert kept == [('Hello world', 'Hallo Welt'), ('Hello world', 'Hallo, Welt')]
  assert dropped == {'duplicate': 1, 'identical': 2, 'empty': 1, 'too_long': 1}
  with pytest.raises(ValueError, match='max_chars'):
    pairs.clean_pairs(raw, max_chars=0)


def _fixture_pairs(n=300, seed=0):
  rng = random.Random(seed)
  out = []
  for i in range(n):
    out.append((f'sentence {i}', f'Satz {i}'))
    if rng.random() < 0.3:  # a source with several translations
      out.append((f'sentence {i}', f'Satz Nummer {i}'))
  return out


@pytest.mark.parametrize('num_test, num_valid', [(20, 30), (0, 5), (50, 0)])
def test_split_pairs_deterministic_and_disjoint_sources(num_test, num_valid):
  data = _fixture_pairs()
  splits = pairs.split_pairs(data, num_test=num_test, num_valid=num_valid)
  shuffled = list(data)
  random.Random(1).shuffle(shuffled)
  assert splits == pairs.split_pairs(shuffled, num_test=num_test, num_valid=num_valid)
  sources = {name: {s for s, _ in split} for name, split in splits.items()}
  assert len(sources['test']) == num_test and len(sources['valid']) == num_valid
  assert not sources['test'] & sources['valid']
  assert not sources['test'] & sources['train']
  assert not sources['valid'] & sources['train']
  assert sorted(p for split in splits.values() for p in split) == sorted(data)


def test_split_pairs_too_many_requested():
  with pytest.raises(ValueError, match='only 2'):
    pairs.split_pairs([('a', 'b'), ('c', 'd')], num_test=2, num_valid=1)


def test_merge_sources_dedups_across_sources():
  origin, counts = ende.merge_sources(
    {
      'first': [('Save', 'Speichern'), ('Open', 'Öffnen')],
      'second': [('Save', 'Speichern'), ('Close', 'Schließen')],
    },
    max_chars=256,
  )
  assert origin == {
    ('Save', 'Speichern'): 'first',
    ('Open', 'Öffnen'): 'first',
    ('Close', 'Schließen'): 'second',
  }
  assert counts['second'] == {'raw': 2, 'kept': 1, 'dropped': {'in_earlier_source': 1}}


def test_write_tsv_and_load_pairs_round_trip(tmp_path):
  data = [('Hello "world"', 'Hallo „Welt“'), ('Ünïcödé ✓', 'x\\ty')]
  assert pairs.write_tsv(data, tmp_path / 'a.tsv') == 2
  assert pairs.load_pairs(str(tmp_path / 'a.tsv')) == data
  with pytest.raises(ValueError, match='tab or newline'):
    pairs.write_tsv([('a\tb', 'c')], tmp_path / 'b.tsv')


def test_load_pairs_jsonl_both_key_styles(tmp_path):
  lines = [
    json.dumps({'source': 'Hello', 'target': 'Hallo'}),
    '',
    json.dumps({'en': 'Tab\there', 'de': 'Tab\thier', 'id': 3}, ensure_ascii=False),
  ]
  (tmp_path / 'a.jsonl').write_text('\n'.join(lines) + '\n', encoding='utf-8')
  assert pairs.load_pairs(str(tmp_path / 'a.jsonl')) == [
    ('Hello', 'Hallo'),
    ('Tab\there', 'Tab\thier'),
  ]


@pytest.mark.parametrize(
  'name, content, match',
  [
    ('bad.tsv', 'only one column\n', r'bad.tsv:1: expected source<TAB>target'),
    ('bad.jsonl', '{"en": "a", "de": "b"}\n{"src": "a"}\n', r'bad.jsonl:2: expected keys'),
    ('bad.jsonl', 'not json\n', r'bad.jsonl:1: invalid JSON'),
    ('bad.csv', 'a,b\n', 'unknown extension'),
  ],
)
def test_load_pairs_errors(tmp_path, name, content, match):
  (tmp_path / name).write_text(content, encoding='utf-8')
  with pytest.raises(ValueError, match=match):
    pairs.load_pairs(str(tmp_path / name))


# Real sentences from the built corpus (LibreOffice help / UI, Ding).
_REAL = [
  (
    'Opens a dialog where you can add, edit, and remove icons.',
    'Öffnet einen Dialog zum Hinzufügen, Ändern und Entfernen von Symbolen.',
  ),
  (
    'The number to be converted to a Roman numeral must be in the 0 - 3999 range.',
    'Die Zahl, die in eine römische Zahl umgewandelt werden soll, muss im Bereich 0–3999 liegen.',
  ),
  (
    'Choose Table - AutoFormat Styles, and then click the format that you to want to apply.',
    'Wählen Sie Tabelle – AutoFormat… und klicken Sie dann auf das zuzuweisende Format.',
  ),
  (
    'Mean value line with value %AVERAGE_VALUE and standard deviation %STD_DEVIATION',
    'Mittelwertlinie mit Wert %AVERAGE_VALUE und Standardabweichung %STD_DEVIATION',
  ),
  ('That’s no comfort to me.', 'Das ist kein Trost für mich.'),
  ('The visitors totalled 3,000.', 'Insgesamt kamen 3.000 Besucher.'),
  ('(Just) as you please!', '(Ganz) wie Sie wollen!'),
  ('Lies have short legs.', 'Lügen haben kurze Beine.'),
]


@pytest.fixture(scope='module')
def tiny_tokenizer():
  sentences = [s for pair in _REAL for s in pair] * 5
  return tokenizer.train_tokenizer(sentences, vocab_size=360)


def test_tokenizer_t5_ids_and_exact_round_trip(tiny_tokenizer):
  tok = tiny_tokenizer
  assert (tok.pad_id, tok.eos_id, tok.unk_id, tok.vocab_size) == (0, 1, 2, 360)
  assert [tok.id_to_piece(i) for i in range(3)] == ['<pad>', '</s>', '<unk>']
  unseen = ['Größenänderung: 😀 ∑ 中文 «x»', '  two  spaces\tand tab ', '']
  for text in [s for pair in _REAL for s in pair] + unseen:
    ids = tok.encode(text)
    assert ids[-1] == tok.eos_id and tok.unk_id not in ids
    assert tok.decode(ids) == text
    assert tok.encode(text, add_eos=False) == ids[:-1]
  # Decoding stops at eos and ignores pads.
  ids = tok.encode('Lies have short legs.')
  assert tok.decode([0] + ids + tok.encode('junk')) == 'Lies have short legs.'


def test_tokenizer_writes_ids_past_its_vocabulary(tiny_tokenizer):
  # A model's vocabulary may exceed the tokenizer's (T5: 32,128 ids, 32,000 pieces, 100
  # sentinels): such ids are written out, never dropped, and decoding goes on after them.
  tok = tiny_tokenizer
  words = tok.encode('short legs', add_eos=False)
  ids = words + [360 + 99, 360, 360 + 100] + words + [tok.eos_id, 360]
  assert tok.decode(ids) == 'short legs<extra_id_0><extra_id_99><id_460>short legs'


def test_tokenizer_save_load(tiny_tokenizer, tmp_path):
  tiny_tokenizer.save(tmp_path / 'spm.model')
  loaded = tokenizer.Tokenizer.load(tmp_path / 'spm.model')
  assert loaded.encode(_REAL[0][1]) == tiny_tokenizer.encode(_REAL[0][1])


def test_encode_batch_pads_masks_and_truncates(tiny_tokenizer):
  tok = tiny_tokenizer
  texts = ['Lies have short legs.', 'Lügen haben kurze Beine.', '']
  lengths = [len(tok.encode(t)) for t in texts]
  max_len = max(lengths) + 2
  ids, mask = tok.encode_batch(texts, max_len)
  assert ids.dtype == np.int32 and mask.dtype == bool and ids.shape == (3, max_len)
  np.testing.assert_array_equal(mask.sum(1), lengths)
  np.testing.assert_array_equal(ids[~mask], 0)
  assert [tok.decode(row) for row in ids] == texts
  with pytest.raises(ValueError, match='text 0 has'):
    tok.encode_batch(texts, 3)
  cut, cut_mask = tok.encode_batch(texts, 3, truncate=True)
  assert cut[0, 2] == tok.eos_id and cut_mask[:2].all()


def test_train_tokenizer_rejects_bad_args():
  with pytest.raises(ValueError, match='model_type'):
    tokenizer.train_tokenizer(['a'], model_type='wordpiece')
  with pytest.raises(ValueError, match='vocab_size'):
    tokenizer.train_tokenizer(['a'], vocab_size=100)


_DATA_DIR = os.path.join(os.path.dirname(__file__), '..', 'data', 'ende')


@pytest.mark.slow
@pytest.mark.skipif(
  not os.path.exists(os.path.join(_DATA_DIR, 'spm_ende_8k.model')),
  reason='run scripts/build_ende.py and scripts/train_tokenizer.py first',
)
def test_built_corpus_round_trip_and_disjoint_splits():
  tok = tokenizer.Tokenizer.load(os.path.join(_DATA_DIR, 'spm_ende_8k.model'))
  assert tok.vocab_size == 8000
  splits = {
    s: pairs.load_pairs(os.path.join(_DATA_DIR, f'{s}.tsv')) for s in ('train', 'valid', 'test')
  }
  for s in ('valid', 'test'):
    for pair in splits[s]:
      for text in pair:
        assert tok.decode(tok.encode(text)) == text
  sources = {s: {en for en, _ in p} for s, p in splits.items()}
  assert not (sources['train'] & sources['valid'] or sources['train'] & sources['test'])
  assert len(sources['test']) == len(sources['valid']) == 2000
