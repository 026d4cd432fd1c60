"""The paper's configuration compiled by XLA:TPU for the v4-8 it names, and its memory per device
checked against a TPU v4 chip's HBM, without a TPU.

`experiments/configs/ende.py:paper` decodes with the public T5 (v1.0) 11B target sharded over
'model' on a 1x4 mesh and T5-small replicated, bf16 params computing in float32 (the T5X loader's
config), batch 1, 128 source tokens, 128 new tokens, gammas up to 7. Its loops at temperature 1
(speculative: block verification at its largest gamma) are compiled for a v4-8's compile-only
devices from abstract params, as `benchmarks.memory_plan --compile_for=tpu-v4` compiles them:
nothing is allocated, nothing runs. Skipped where libtpu is absent.
"""

import dataclasses

import jax
import pytest

from tests import helpers

pytest.importorskip('libtpu', reason=helpers.NO_LIBTPU)

from benchmarks import (  # noqa: E402
  machines,  # noqa: E402
  memory_model,
  synthetic,
)
from experiments.configs import ende  # noqa: E402
from specdec_jax import decode, sharding  # noqa: E402
from specdec_jax.models import t5  # noqa: E402
from specdec_jax.sampling import SamplingConfig  # noqa: E402


def _paper_model(path: str, how: str, mesh, config) -> t5.T5Model:
  """The public T5 of a T5X checkpoint path (its shapes by name), placed as the main job places
  it (`sharding.rules_for(how)`), params in the config's dtype, computing in float32."""
  name = {'t5_11B': 't5-11b', 't5_small': 't5-small'}[path.rstrip('/').split('/')[-2]]
  shapes = dataclasses.replace(t5.CONFIGS[name], dtype='float32')  # infer_t5x_config's dtype
  params = jax.eval_shape(lambda key: t5.init_params(key, shapes), jax.random.key(0))
  rules = sharding.rules_for(how, t5.param_count(params))
  return synthetic.abstract_model(
    shapes, mesh, param_dtype=config.param_dtype, shard=True, rules=rules
  )


def _paper():
  """(target, drafter, ids, loop options) of ende.py:paper on a v4-8's compile-only mesh."""
  config = ende.get_config('paper')
  mesh = machines.compile_only_mesh('v4-8', *sharding.parse_mesh(config.mesh))
  target = _paper_model(config.target, 'model', mesh, config)
  drafter = _paper_model(config.drafter, config.drafter_sharding, mesh, config)
  assert t5.param_count(target.params) > 11e9 and mesh.shape['model'] == 4
  ids = synthetic.abstract_batch(mesh, config.batch_size, config.max_source_length)
  options = dict(sampling=SamplingConfig(temperature=1.0), max_new_tokens=config.max_new_tokens)
  return mesh, target, drafter, ids, dict(options, gamma=max(config.gammas))


@pytest.mark.parametrize(
  'loop', ['speculative', pytest.param('autoregressive', marks=pytest.mark.slow)]
)
def test_the_paper_configuration_compiles_for_a_v4_8_and_fits_its_hbm(loop):
  """Each loop (the speculative one by default: the larger; about 70 CPU-seconds of XLA:TPU)."""
  mesh, target, drafter, ids, options = _paper()
  with jax.set_mesh(mesh):
    if loop == 'speculative':
      lowered = decode.lower_speculative(target, drafter, ids, ids, verifier='block', **options)
      models = (target, drafter)
    else:
      del options['gamma']
      lowered = decode.lower_generate(target, ids, ids, **options)
      models = (target,)
    stats = memory_model.compile_memory(lowered)
  assert 'out_of_memory' not in stats, stats
  # Each device holds a quarter of the target (bf16) and the whole drafter: about 5.3 GiB.
  params = sum(memory_model.bytes_per_device(m.params) for m in models)
  assert stats['argument'] >= params > 5 * machines.GiB, stats
  total = stats['argument'] + stats['output'] + stats['temp'] - stats['alias']
  assert stats['peak'] <= total < machines.TPU_V4.hbm_bytes, stats
