"""benchmarks/__init__.py: the pairs a benchmark decodes are in the main job's decoder layout."""

from unittest import mock

import jax

import benchmarks
from specdec_jax.measure import job_config
from tests import helpers


@helpers.needs_pair('ende')
def test_a_benchmarks_pair_decodes_in_the_main_jobs_layout():
  # On this CPU the T5s are fused (n-gram drafters as loaded), as the main job's are; on one TPU
  # chip both keep the T5X layout (XLA:TPU's estimate: docs/performance.md).
  attention = lambda m: m.params['decoder']['layers_0']['self_attention']
  pair = benchmarks.load_pair('ende')
  assert 'qkv' in attention(pair.target) and 'query' not in attention(pair.target)
  assert (
    'qkv' in attention(pair.drafters['distilled']) and 'log_base' in pair.drafters['bigram'].params
  )
  with mock.patch.object(jax, 'default_backend', return_value='tpu'):
    assert job_config.fastest_layout(None) == 't5x'
    assert 'query' in attention(benchmarks.load_pair('ende').target)
