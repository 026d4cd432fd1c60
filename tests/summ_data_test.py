"""Tests for the debsumm corpus (Debian description -> synopsis) and its training configs.

Fixtures are inline deb822 text (no network, no apt): parsing, rendering, cleaning, grouping,
splitting, the whole build on a pre-filled index cache, batches with targets shorter than the
bucket, and the configs. The test that reads the real corpus is slow and skips when
`data/debsumm` has not been built.
"""

import json
import os
import random

import jax
import numpy as np
import pytest

from experiments.configs import train_summ_drafter, train_summ_target
from specdec_jax.data import batching, debsumm, pairs
from specdec_jax.data import debian_descriptions as dd
from specdec_jax.training import trainer

_TRANSLATION = """Package: 0xffff
Description-md5: 183c49f6505eb3432d1b069800f1f5b6
Description-en: Open Free Fiasco Firmware Flasher
 The ‘Open Free Fiasco Firmware Flasher’ aka 0xFFFF utility implements
 a free userspace handler for the NOLO bootloader.
 .
 Supported operations currently include:
  * generating and unpacking FIASCO images
  * flashing any kind image type to Maemo devices via USB
 .
 Supported are the Nokia 770, N800 and N900.

Package: libfoo1
Description-md5: 00000000000000000000000000000001
Description-en: library for foo - shared library
 Foo does things with bars.
 .
 This package contains the shared library.

Package: libfoo-dev
Description-md5: 00000000000000000000000000000002
Description-en: library for foo - development files
 Foo does things with bars.
 .
 This package contains the development files.

Package: foo-old
Description-md5: 00000000000000000000000000000003
Description-en: transitional package for foo
 This is a transitional package. It can safely be removed.

Package: nolong
Description-md5: 00000000000000000000000000000004
Description-en: a package without an extended description

Package: node-a
Description-md5: 00000000000000000000000000000005
Description-en: get a formatted timestamp
 Node.js is an event-based server-side JavaScript engine.

Package: node-b
Description-md5: 00000000000000000000000000000006
Description-en: make a function mimic another one
 Node.js is an event-based server-side JavaScript engine.
"""

_PACKAGES = """Package: 0xffff
Version: 0.10-1
Architecture: amd64
Description: Open Free Fiasco Firmware Flasher
Description-md5: 183c49f6505eb3432d1b069800f1f5b6

Package: libfoo1
Source: foo (1.2-3)
Version: 1.2-3+b1

Package: libfoo-dev
Source: foo

# comment lines are skipped
Package: node-a
Source: node-a-src
"""


def _descriptions():
  source_of = dd.source_packages(dd.parse_deb822(_PACKAGES.splitlines(keepends=True)))
  return list(dd.translation_descriptions(dd.parse_deb822(_TRANSLATION.splitlines()), source_of))


def test_parse_deb822_fields_and_continuations():
  paragraphs = list(dd.parse_deb822(_TRANSLATION.splitlines(keepends=True)))
  assert len(paragraphs) == 7
  first = paragraphs[0]
  assert first['Package'] == '0xffff'
  assert first['Description-md5'] == '183c49f6505eb3432d1b069800f1f5b6'
  lines = first['Description-en'].split('\n')
  assert lines[0] == 'Open Free Fiasco Firmware Flasher'
  assert lines[3] == ' .' and lines[5] == '  * generating and unpacking FIASCO images'
  with pytest.raises(ValueError, match='continuation line'):
    list(dd.parse_deb822([' starts with a space']))
  with pytest.raises(ValueError, match='no colon'):
    list(dd.parse_deb822(['Package foo']))


def test_source_packages_with_and_without_source_field():
  source_of = dd.source_packages(dd.parse_deb822(_PACKAGES.splitlines()))
  assert source_of == {
    '0xffff': '0xffff',
    'libfoo1': 'foo',
    'libfoo-dev': 'foo',
    'node-a': 'node-a-src',
  }


def test_render_extended_policy_rules():
  synopsis, lines = dd.split_description(
    'Synopsis here \n First  line\n continues.\n .\n  * item one\n\t* item two\n .'
  )
  assert synopsis == 'Synopsis here'
  assert dd.render_extended(lines) == 'First line continues. * item one * item two'
  assert dd.split_description('only a synopsis') == ('only a synopsis', [])
  assert dd.render_extended([]) == ''


def test_translation_descriptions_render_and_map_sources():
  got = {d.package: d for d in _descriptions()}
  assert got['0xffff'].extended == (
    'The ‘Open Free Fiasco Firmware Flasher’ aka 0xFFFF utility implements a free userspace '
    'handler for the NOLO bootloader. Supported operations currently include: * generating and '
    'unpacking FIASCO images * flashing any kind image type to Maemo devices via USB Supported '
    'are the Nokia 770, N800 and N900.'
  )
  assert got['libfoo1'].source_package == 'foo'
  assert got['foo-old'].source_package == 'foo-old'  # not in Packages: its own source
  assert got['nolong'].extended == ''
  with pytest.raises(ValueError, match='not a Translation paragraph'):
    list(dd.translation_descriptions([{'Package': 'x'}], {}))


@pytest.mark.parametrize(
  'synopsis, extended, expected',
  [
    ('transitional package for foo', 'Foo.', True),
    ('Foo', 'This is a Transitional dummy package.', True),
    ('dummy package', 'x', True),
    ('metapackage for foo', 'Depends on all of foo.', False),
    ('Transitions between images', 'Animates slides.', False),
  ],
)
def test_is_transitional(synopsis, extended, expected):
  assert dd.is_transitional(synopsis, extended) == expected


def _d(package, synopsis, extended, source=None):
  return dd.Description(package, source or package, synopsis, extended)


def test_clean_descriptions_drop_reasons():
  long_text = 'A tool that does one thing well and says so in a paragraph.'
  result = dd.clean_descriptions(
    [
      _d('a', ' A  tool ', long_text),
      _d('a-too', 'A tool', long_text, source='a'),  # same pair again: listed, kept once
      _d('b', 'shared library', 'Boilerplate shared by several packages.'),
      _d('c', 'development files', 'Boilerplate shared by several packages.'),  # ambiguous
      _d('d', 'transitional package', 'It can safely be removed.'),
      _d('e', 'no extended text', ''),
      _d('f', 'x' * 101, long_text),
      _d('g', 'short', 'y' * 1025),
      _d('h', 'a synopsis longer than its text', 'Short.'),
    ],
    max_source_chars=1024,
    max_target_chars=100,
  )
  pair = (long_text, 'A tool')
  assert result.pairs == [pair]
  assert result.packages == {pair: ['a', 'a-too']}
  assert result.source_packages == {pair: ['a']}
  assert result.dropped == {
    'duplicate': 1,
    'ambiguous': 2,
    'transitional': 1,
    'empty': 1,
    'too_long': 2,
    'not_shorter': 1,
  }
  with pytest.raises(ValueError, match='positive'):
    dd.clean_descriptions([], max_source_chars=0)


def test_fixture_descriptions_end_to_end():
  result = dd.clean_descriptions(_descriptions())
  synopses = sorted(t for _, t in result.pairs)
  assert synopses == [
    'Open Free Fiasco Firmware Flasher',
    'library for foo - development files',
    'library for foo - shared library',
  ]
  assert result.dropped == {'transitional': 1, 'empty': 1, 'ambiguous': 2}


def test_group_sources_links_shared_texts_but_not_transitional_boilerplate():
  ds = [
    _d('gcc-cross-a', 'GNU C compiler for armhf', 'C compiler, cross, armhf.', 'gcc-cross'),
    _d('gm2-a', 'GNU Modula-2 compiler (armhf)', 'The GNU Modula-2 compiler.', 'gcc-cross'),
    _d('gm2-b', 'GNU Modula-2 compiler (s390x)', 'The GNU Modula-2 compiler.', 'gcc-ports'),
    _d('gcc-cross-b', 'GNU C compiler for s390x', 'C compiler, cross, s390x.', 'gcc-ports'),
    _d('x-old', 'transitional', 'This is a transitional package.', 'x'),
    _d('y-old', 'transitional', 'This is a transitional package.', 'y'),
    _d('x', 'the x tool', 'X does x things.', 'x'),
    _d('y', 'the y tool', 'Y does y things.', 'y'),
    _d('z1', 'the z tool', 'Z does z things.', 'z'),
    _d('z2', 'the z tool', 'Z does z things.', 'zz'),  # one pair from two sources
  ]
  result = dd.clean_descriptions(ds)
  groups = dd.group_sources(result.pairs, result.source_packages, dd.link_texts(ds))
  by_synopsis = {t: groups[(s, t)] for s, t in result.pairs}
  assert by_synopsis == {
    'GNU C compiler for armhf': 'gcc-cross',
    'GNU C compiler for s390x': 'gcc-cross',  # linked through the ambiguous Modula-2 text
    'the x tool': 'x',
    'the y tool': 'y',  # the shared transitional text does not link x and y
    'the z tool': 'z',
  }


def _grouped_fixture(n_groups=60, seed=0):
  rng = random.Random(seed)
  data, group_of = [], {}
  for g in range(n_groups):
    for i in range(rng.randint(1, 5)):
      pair = (f'Package {g} part {i} does something useful.', f'tool {g} part {i}')
      data.append(pair)
      group_of[pair] = f'src{g}'
  return data, group_of


@pytest.mark.parametrize('num_test, num_valid', [(20, 30), (0, 5), (50, 0)])
def test_split_by_group_keeps_groups_whole_and_is_deterministic(num_test, num_valid):
  data, group_of = _grouped_fixture()
  splits = dd.split_by_group(data, group_of, num_test=num_test, num_valid=num_valid)
  shuffled = list(data)
  random.Random(1).shuffle(shuffled)
  assert splits == dd.split_by_group(shuffled, group_of, num_test=num_test, num_valid=num_valid)
  assert sorted(p for s in splits.values() for p in s) == sorted(data)
  assert num_test <= len(splits['test']) < num_test + 5
  assert num_valid <= len(splits['valid']) < num_valid + 5
  groups = {name: {group_of[p] for p in s} for name, s in splits.items()}
  assert not groups['train'] & groups['test']
  assert not groups['train'] & groups['valid']
  assert not groups['valid'] & groups['test']
  with pytest.raises(ValueError, match='asked for'):
    dd.split_by_group(data, group_of, num_test=len(data), num_valid=1)


def test_release_fields_and_sources_entry():
  text = (
    '-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\nOrigin: Debian\nLabel: Debian\n'
    'Suite: oldstable\nVersion: 12.15\nCodename: bookworm\n'
    'Date: Sat, 11 Jul 2026 10:16:37 UTC\nDescription: Debian 12.15 Released 11 July 2026\n'
  )
  assert debsumm.release_fields(text) == {
    'origin': 'Debian',
    'suite': 'oldstable',
    'version': '12.15',
    'codename': 'bookworm',
    'date': 'Sat, 11 Jul 2026 10:16:37 UTC',
    'description': 'Debian 12.15 Released 11 July 2026',
  }
  entry = debsumm.sources_entry(debsumm.MIRROR, 'bookworm', 'main', 'amd64')
  assert 'Targets: Packages Translations\n' in entry and 'Languages: en\n' in entry


def test_build_debsumm_from_cached_indices(tmp_path):
  """The whole build on a pre-filled cache: fetch_indices reuses it and runs no apt."""
  apt_dir = tmp_path / 'apt'
  apt_dir.mkdir()
  translation, packages = [], []
  for i in range(40):
    source = f'src{i // 2}'
    translation.append(
      f'Package: pkg{i}\nDescription-md5: {i:032x}\nDescription-en: tool number {i}\n'
      f' Tool {i} is a program.\n .\n It does thing {i} for the {source} project.\n'
    )
    packages.append(f'Package: pkg{i}\nSource: {source} (1.0-1)\nVersion: 1.0-1+b1\n')
  (apt_dir / 'Translation-en').write_text('\n'.join(translation), encoding='utf-8')
  (apt_dir / 'Packages').write_text('\n'.join(packages), encoding='utf-8')
  (apt_dir / 'release.json').write_text(json.dumps({'release': {'version': '12.15'}}))
  data_dir = tmp_path / 'out'
  stats = debsumm.build_debsumm(str(data_dir), str(apt_dir), num_test=5, num_valid=5)
  assert stats['total_pairs'] == 40 and stats['source']['release'] == {'version': '12.15'}
  assert [stats['splits'][s]['pairs'] for s in ('test', 'valid')] == [6, 6]  # whole groups
  seen = set()
  for split in ('train', 'valid', 'test'):
    got = pairs.load_pairs(str(data_dir / f'{split}.tsv'))
    names = (data_dir / f'{split}_packages.txt').read_text().splitlines()
    assert len(got) == len(names) == stats['splits'][split]['pairs']
    for (source, target), name in zip(got, names):
      i = int(name.removeprefix('pkg'))
      assert target == f'tool number {i}'
      assert source == f'Tool {i} is a program. It does thing {i} for the src{i // 2} project.'
    sources = {f'src{int(n.removeprefix("pkg")) // 2}' for n in names}
    assert not sources & seen
    seen |= sources
  assert json.loads((data_dir / 'stats.json').read_text())['total_pairs'] == 40
  assert 'train' in debsumm.format_stats(stats)


def test_bucketed_batches_cut_short_targets_to_their_maximum():
  rng = np.random.default_rng(0)
  n, max_source, max_target = 32, 64, 8
  source_lengths = rng.integers(2, max_source + 1, n).astype(np.int32)
  target_lengths = rng.integers(2, max_target + 1, n).astype(np.int32)

  def padded(lengths, width):
    return np.where(np.arange(width) < lengths[:, None], 5, 0).astype(np.int32)

  data = batching.EncodedPairs(
    inputs=padded(source_lengths, max_source),
    targets=padded(target_lengths, max_target),
    input_lengths=source_lengths,
    target_lengths=target_lengths,
  )
  batches = batching.BucketedBatches(data, batch_size=4, buckets=(16, 32, 64), seed=0)
  for step in range(batches.num_batches_per_epoch):
    batch = batches.batch(step)
    length = batch['inputs'].shape[1]
    assert batch['input_mask'].shape == (4, length)
    assert batch['targets'].shape == batch['target_mask'].shape == (4, min(length, max_target))
    np.testing.assert_array_equal(batch['targets'] != 0, batch['target_mask'])


@pytest.mark.parametrize('module', [train_summ_target, train_summ_drafter])
def test_summ_configs_parse_and_runlocal_builds(module):
  config = module.get_config()
  assert config.model.vocab_size == 8000
  assert (config.max_source_length, config.max_target_length) == (256, 32)
  assert max(config.length_buckets) == config.max_source_length
  assert config.tokenizer == './data/debsumm/spm_debsumm_8k.model'
  small = module.get_config('runlocal,data_dir=/tmp/elsewhere')
  assert small.tokenizer == '/tmp/elsewhere/spm_debsumm_8k.model'  # follows data_dir
  assert module.get_config('tokenizer=/x/spm.model').tokenizer == '/x/spm.model'
  assert small.num_train_steps < 10 and max(small.length_buckets) == small.max_source_length
  model_config = trainer.model_config_from(small)
  assert model_config.d_model <= 32
  with pytest.raises(ValueError, match='Unknown config item'):
    module.get_config('runlokal')


def test_summ_shapes_match_the_ende_configs():
  from experiments.configs import train_drafter, train_target

  assert train_summ_target.get_config().model == train_target.get_config().model
  assert train_summ_drafter.get_config().model == train_drafter.get_config().model


def test_from_ende48m_starts_from_the_48m_target_and_checkpoints_often():
  config = train_summ_target.get_config('from_ende48m')
  with open(os.path.join(config.init_from, 'config.json')) as f:
    shipped = json.load(f)
  model = trainer.model_config_from(config)
  # The shipped target's own shape, so init_from restores it as it is (no growing).
  assert {k: getattr(model, k) for k in config.model} == {k: shipped[k] for k in config.model}
  assert model.d_model == 512 and model.num_decoder_layers == 8
  assert os.path.exists(config.tokenizer) and config.tokenizer.endswith('ende48m/spm.model')
  assert max(config.length_buckets) == config.max_source_length <= 256
  assert config.max_target_length == 40
  # A session cut off loses at most one checkpoint interval; evaluations land on checkpoints.
  assert config.checkpoint_every <= 100 and config.eval_every % config.checkpoint_every == 0
  assert config.num_train_steps % config.eval_every == 0


def test_train_step_with_targets_shorter_than_sources():
  config = train_summ_target.get_config('runlocal')
  config.model.vocab_size = 300
  model_config = trainer.model_config_from(config)
  optimizer_config = trainer.OptimizerConfig.from_config(config)
  state = trainer.init_state(jax.random.key(0), model_config, optimizer_config)
  rng = np.random.default_rng(0)
  batch = {
    'inputs': rng.integers(3, 300, (4, 64)).astype(np.int32),
    'input_mask': np.ones((4, 64), bool),
    'targets': rng.integers(3, 300, (4, 32)).astype(np.int32),
    'target_mask': np.ones((4, 32), bool),
  }
  state, metrics = trainer.jit_train_step(
    state,
    batch,
    model_config=model_config,
    optimizer_config=optimizer_config,
    label_smoothing=0.1,
  )
  assert int(state.step) == 1 and np.isfinite(float(metrics['nll']))


_DATA_DIR = os.path.join(os.path.dirname(__file__), '..', 'data', 'debsumm')


@pytest.mark.slow
@pytest.mark.skipif(
  not os.path.exists(os.path.join(_DATA_DIR, 'stats.json')),
  reason='run scripts/build_summ.py first',
)
def test_built_debsumm_corpus_disjoint_splits():
  splits = {
    s: pairs.load_pairs(os.path.join(_DATA_DIR, f'{s}.tsv')) for s in ('train', 'valid', 'test')
  }
  assert len(splits['train']) >= 20_000
  assert len(splits['valid']) >= 2000 and len(splits['test']) >= 2000
  for split in splits.values():
    assert all(0 < len(t) < len(s) for s, t in split)
  sources = {s: {text for text, _ in p} for s, p in splits.items()}
  assert not (sources['train'] & sources['valid'] or sources['train'] & sources['test'])
  packages = {}
  for s in splits:
    with open(os.path.join(_DATA_DIR, f'{s}_packages.txt'), encoding='utf-8') as f:
      packages[s] = {name for line in f for name in line.split()}
  assert not (packages['train'] & packages['valid'] or packages['train'] & packages['test'])
