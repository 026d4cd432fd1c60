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
import re

import jax
import jax.numpy as jnp
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


# Both slow (`pytest -m slow`): the speculative loop took 229 s of the default suite's 1,858 s
# (2026-11-27, 2 loaded cores); tests/tpu_compile_test.py compiles the same loops for a v4-8 on
# tiny shapes in the default run.
@pytest.mark.slow
@pytest.mark.parametrize('loop', ['speculative', 'autoregressive'])
def test_the_paper_configuration_compiles_for_a_v4_8_and_fits_its_hbm(loop):
  """Each loop (the speculative one: the larger; 70-230 CPU-seconds of XLA:TPU)."""
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


def _shipped_config(name: str):
  """The T5Config of a shipped pair's model (its config.json), without reading its params."""
  import json

  from specdec_jax import pretrained

  return t5.T5Config(**json.loads((pretrained.ROOT / name / 'config.json').read_text()))


@pytest.mark.slow  # ~4-20 min of XLA:TPU compiling (1,305 s at load 5-10); docs/results.md section 12
def test_the_grown_xxl_pair_builds_and_decodes_on_a_v4_8_within_its_hbm_and_its_drafter_sums_nothing():
  """ende.py:xxl on a v4-8 as 1x4: ende48m's target grown to t5_1_1-xxl shapes (11B params,
  bfloat16) and its distilled drafter following it, replicated. Compiled by XLA:TPU from abstract
  params (nothing allocated): the build (`t5_growth.lower_grow`: from the 48M params to the
  sharded 11B ones on the devices) and the speculative loop each fit a v4 chip's HBM, and in the
  loop's compiled HLO the replicated drafter's scope has no collective while the target pass has
  three all-reduces a decoder layer (self-attention, cross-attention and MLP outputs summed over
  'model') and one more. About 2 CPU-minutes of XLA:TPU."""
  from benchmarks import tpu_costs, tpu_kernels
  from specdec_jax.models import t5_growth

  config = ende.get_config('xxl')
  mesh = machines.compile_only_mesh('v4-8', 1, 4)
  small = synthetic.abstract_model(
    _shipped_config('ende48m/target'), mesh, param_dtype='float32', shard=False
  )
  grown = t5_growth.grown_config(small.config, config.grow_to)
  lowered, target = t5_growth.lower_grow(small, grown, mesh=mesh, param_dtype=config.param_dtype)
  build = memory_model.compile_memory(lowered)
  assert 'out_of_memory' not in build, build
  assert (
    t5.param_count(target.params) > 10.9e9
  )  # T5-XXL's shapes in the pair's 8,000-piece vocabulary
  params = memory_model.bytes_per_device(target.params)  # a quarter of 22 GB
  assert build['output'] >= params > 5 * machines.GiB, build
  assert build['peak'] < machines.TPU_V4.hbm_bytes, build

  drafter_config = dataclasses.replace(
    _shipped_config('ende48m/distilled'), encoder_dim=grown.d_model
  )  # what follow_grown_encoder gives
  drafter = synthetic.abstract_model(
    drafter_config, mesh, param_dtype=config.param_dtype, shard=False
  )
  assert drafter.rules == sharding.REPLICATED_RULES
  ids = synthetic.abstract_batch(mesh, config.batch_size, config.max_source_length)
  options = dict(sampling=SamplingConfig(temperature=1.0), max_new_tokens=config.max_new_tokens)
  with jax.set_mesh(mesh):
    lowered = decode.lower_speculative(
      target, drafter, ids, ids, verifier='block', gamma=max(config.gammas), **options
    )
  compiled = lowered.compile()
  stats = memory_model.memory_stats(compiled)
  total = stats['argument'] + stats['output'] + stats['temp'] - stats['alias']
  assert stats['peak'] <= total < machines.TPU_V4.hbm_bytes, stats
  report = tpu_kernels.read(
    tpu_costs.Compiled(compiled.as_text(), stats['argument'], stats['temp'])
  )
  print(
    f'grown XXL pair on v4-8 1x4, bytes a device: build {build}; loop {stats}; {report.collectives}'
  )
  assert report.collectives.get('drafter', 0) == 0, report.collectives
  assert report.collectives['target'] == 3 * grown.num_decoder_layers + 1, report.collectives


@pytest.mark.parametrize('rules', ['replicated', 'model'])
def test_a_replicated_drafter_s_program_has_no_collective(rules):
  """A drafter whose params are whole on every device of a v4-8's 1x4 mesh (T5-small's shape,
  2 layers) builds its cache and makes a call with no collective in XLA:TPU's program. Negative
  control: with the target's rules on its activations ('heads' and 'mlp' over 'model', what the
  drafter carried before `T5Model.rules`) XLA splits its heads over the 4 devices and sums each
  layer's outputs."""
  from benchmarks import tpu_kernels

  mesh = machines.compile_only_mesh('v4-8', 1, 4)
  config = dataclasses.replace(t5.CONFIGS['t5-small'], num_encoder_layers=0, encoder_dim=512)
  config = dataclasses.replace(config, num_decoder_layers=2)
  drafter = synthetic.abstract_model(config, mesh, param_dtype='bfloat16', shard=False)
  if rules == 'model':
    drafter = drafter.replace(rules=sharding.DEFAULT_RULES)
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  encoded = jax.ShapeDtypeStruct((1, 16, 512), jnp.float32, sharding=whole)
  mask = jax.ShapeDtypeStruct((1, 16), jnp.int32, sharding=whole)
  tokens = jax.ShapeDtypeStruct((1, 2), jnp.int32, sharding=whole)
  steps = drafter.steps

  def call(params, encoded, mask, tokens):
    return steps.step(params, tokens, steps.init_cache(params, encoded, mask, 8))

  with jax.set_mesh(mesh):
    text = jax.jit(call).lower(drafter.params, encoded, mask, tokens).compile().as_text()
  found = sum(len(re.findall(rf' {name}(-start)?\(', text)) for name in tpu_kernels.COLLECTIVES)
  assert (found == 0) == (rules == 'replicated'), found
