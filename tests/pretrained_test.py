"""The shipped pairs (pretrained/): each loads, and greedy speculative decoding with each of its
drafters is greedy decoding of its target, token for token."""

import functools

import jax
import numpy as np
import pytest

from experiments.configs import ende
from specdec_jax import decode, pretrained, sampling, step_models
from specdec_jax.measure import job_config
from tests import helpers

PAIRS = [
  pytest.param(name, marks=helpers.needs_pair(name)) for name in ('ende', 'ende48m', 'debsumm48m')
]
# The main job's pair by default; the 13.5M and debsumm pairs with -m slow (~20 CPU-s each).
DEFAULT_PAIRS = [
  p if p.values[0] == 'ende48m' else pytest.param(*p.values, marks=[*p.marks, pytest.mark.slow])
  for p in PAIRS
]


# The default tests share a pair's load and its greedy reference (one program: one batch shape).
_load = functools.cache(pretrained.load)
_DEFAULT_SENTENCES = 8
_GREEDY = dict(
  sampling=sampling.SamplingConfig(temperature=0.0), max_new_tokens=48, rng=jax.random.key(0)
)


def _source(pair, num_sentences):
  sources = [s for s, _ in pair.test_pairs()[:num_sentences]]
  return pair.tokenizer.encode_batch(sources, 64, truncate=True)


@functools.cache
def _reference(name, num_sentences):
  """The target's greedy decoding of the first `num_sentences` test sources of pair `name`."""
  pair = _load(name)
  return np.asarray(decode.generate(pair.target, *_source(pair, num_sentences), **_GREEDY).tokens)


def _greedy_parity(name, drafter_names, num_sentences=_DEFAULT_SENTENCES, gamma=None):
  pair = _load(name)
  ids, mask = _source(pair, num_sentences)
  ref = _reference(name, num_sentences)
  for drafter in drafter_names:
    out = decode.speculative_generate(
      pair.target, pair.drafters[drafter], ids, mask, gamma=gamma or pair.gamma(0.0), **_GREEDY
    )
    np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=drafter)
    alpha = np.asarray(out.stats.alpha)  # per row
    assert np.all((alpha >= 0) & (alpha <= 1)) and alpha.mean() > 0, drafter


@pytest.mark.parametrize('name', DEFAULT_PAIRS)
def test_shipped_pair_loads_and_its_recommended_drafter_is_lossless(name):
  pair = _load(name)
  assert pair.recommended in pair.drafters and {'bigram', 'trigram'} <= set(pair.drafters)
  for temperature in (0.0, 1.0):
    assert pair.gamma(temperature) >= 1
  _greedy_parity(name, [pair.recommended])


@helpers.needs_pair('ende')
def test_load_pair_reads_only_its_pair_fields():
  # What a loaded pair depends on is `job_config.PAIR_FIELDS` (tests/conftest's
  # `pairs_loaded_once` keys on them): fails if `load_pair` reads another config field.
  read = set()

  class Recording:
    def __init__(self, config):
      self._config = config

    def get(self, name, default=None):
      read.add(name)
      return self._config.get(name, default)

    def __getattr__(self, name):
      read.add(name)
      return getattr(self._config, name)

  pair = job_config.load_pair(Recording(ende.get_config('runlocal,pretrained=ende')), None)
  assert pair.target is not None and {'pretrained', 'decoder_layout'} <= read
  assert read <= set(job_config.PAIR_FIELDS), read - set(job_config.PAIR_FIELDS)


@pytest.mark.slow
@pytest.mark.parametrize('name', PAIRS)
def test_every_shipped_drafter_is_lossless(name):
  _greedy_parity(name, sorted(_load(name).drafters), num_sentences=16)


BLOCK_PAIRS = [p for p in DEFAULT_PAIRS if p.values[0] != 'ende']


@pytest.mark.parametrize('name', BLOCK_PAIRS)
def test_shipped_block_drafter_drafts_a_block_a_call_losslessly(name):
  """Each 48M pair ships a block drafter (one call proposes block_size drafts); greedy
  speculative decoding with it at its largest gamma is its target's greedy decoding."""
  steps = _load(name).drafters['block'].steps
  assert steps.block_size >= 8 and callable(steps.step_block) and steps.reads_target_states
  _greedy_parity(name, ['block'], gamma=steps.block_size)


@pytest.mark.slow
@pytest.mark.parametrize('name', [p.values[0] for p in BLOCK_PAIRS])
def test_shipped_block_drafters_are_lossless_on_the_test_set(name):
  # Each of the pair's block drafters ('block'; on ende48m also 'wide').
  pair = _load(name)
  blocks = [
    d for d, m in pair.drafters.items() if job_config.is_block(step_models.as_step_model(m)[0])
  ]
  assert 'block' in blocks
  for drafter in blocks:
    for gamma in (4, pair.drafters[drafter].steps.block_size):
      _greedy_parity(name, [drafter], num_sentences=100, gamma=gamma)


@pytest.mark.slow  # ~3 min: 40 sentences decoded plainly, then through 33-node trees
@helpers.needs_pair('ende48m')
def test_wide_drafters_tree_is_lossless_on_the_main_jobs_sentences():
  # The rows of docs/results.md section 11 that keep 2.5 tokens per call: one `wide` call and a
  # best-first tree of 33 nodes an iteration, greedy output the target's token for token.
  pair = _load('ende48m')
  sources = [s for s, _ in pair.test_pairs()[:40]]
  ids, mask = pair.tokenizer.encode_batch(sources, 64, truncate=True)
  kw = dict(sampling=sampling.SamplingConfig(temperature=0.0), max_new_tokens=64, rng=None)
  ref = np.asarray(decode.generate(pair.target, ids, mask, **kw).tokens)
  out = decode.speculative_generate(
    pair.target, pair.drafters['wide'], ids, mask, gamma=8, tree=decode.TreeSpec(33), **kw
  )
  np.testing.assert_array_equal(np.asarray(out.tokens), ref)
  assert float(out.stats.block_efficiency.mean()) > 2


def test_read_manifest_gives_a_dict_of_its_own(tmp_path):
  # A directory without pair.json reads the default manifest: a copy, so that a caller adding a
  # drafter to it (scripts/add_drafter.py) leaves the default as it was.
  manifest = pretrained.read_manifest(tmp_path)
  manifest['drafters']['mine'] = 'mine'
  assert 'mine' not in pretrained.read_manifest(tmp_path)['drafters']
  (tmp_path / 'pair.json').write_text('{"target": "t", "drafters": {}, "recommended": "x"}')
  assert pretrained.read_manifest(tmp_path)['target'] == 't'
