"""Tests of benchmarks/memory_plan.py and memory_model.py: per-device bytes, cache bytes, fits, the roofline, and the
compiled plan of tiny models on a (2, 2) mesh of 4 simulated CPU devices."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import memory_model, memory_plan
from specdec_jax import sharding
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig
from tests import helpers

_MESH = AbstractMesh((2, 4), ('data', 'model'))
_ONE = AbstractMesh((1, 1), ('data', 'model'))
GiB = memory_model.GiB


def _model(name, mesh=_MESH, *, shard=True, dtype='float32', param_dtype='float32'):
  config = dataclasses.replace(t5.CONFIGS[name], dtype=dtype)
  return memory_model.abstract_model(config, mesh, param_dtype=param_dtype, shard=shard)


def _total_bytes(tree):
  return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def test_parse_mesh():
  assert memory_plan.parse_mesh('4x2') == (4, 2)
  for bad in ('4', '0x4', 'ax4', '1x2x3'):
    with pytest.raises(ValueError, match='DATAxMODEL'):
      memory_plan.parse_mesh(bad)


def test_bytes_per_device_of_a_fully_sharded_tree_times_devices_is_the_total():
  spec = NamedSharding(_MESH, P('data', 'model'))
  tree = {
    'a': jax.ShapeDtypeStruct((4, 8), jnp.bfloat16, sharding=spec),
    'b': [jax.ShapeDtypeStruct((6, 12), jnp.float32, sharding=spec)],
  }
  assert memory_model.bytes_per_device(tree) * 8 == _total_bytes(tree) == 4 * 8 * 2 + 6 * 12 * 4


def test_param_bytes_per_device_replicated_and_sharded():
  replicated = _model('tiny-v1.1', shard=False, param_dtype='bfloat16')
  total = 2 * t5.param_count(replicated.params)
  assert memory_model.bytes_per_device(replicated.params) == total
  sharded = _model('tiny-v1.1', param_dtype='bfloat16')
  per_device = memory_model.bytes_per_device(sharded.params)
  # Only 'model' shards params (4 ways), and the norm scales and relpos tables stay whole.
  assert total / 4 < per_device < total / 2


@pytest.mark.parametrize('batch', [4, 3])  # 3 rows do not split over data=2: replicated
def test_cache_bytes_match_the_formula_and_init_cache(batch):
  config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], dtype='bfloat16')
  layers, heads, d_kv = config.num_decoder_layers, config.num_heads, config.d_kv
  buffer_len, source_length = 11, 16
  got = memory_model.cache_bytes_per_device(
    config, _MESH, batch=batch, buffer_len=buffer_len, source_length=source_length
  )
  local_batch = batch // 2 if batch % 2 == 0 else batch
  local_heads = heads // 4  # 4 heads over model=4
  per_slot = layers * 2 * local_batch * local_heads * d_kv * 2  # k and v, bf16
  assert got == {'self': per_slot * buffer_len, 'cross': per_slot * source_length}
  # On one device: the bytes of the arrays `t5.init_cache` builds.
  params = jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))
  cache = memory_model.abstract_cache(
    params, config, batch=batch, buffer_len=buffer_len, source_length=source_length
  )
  whole = memory_model.cache_bytes_per_device(
    config, _ONE, batch=batch, buffer_len=buffer_len, source_length=source_length
  )
  assert whole['self'] == _total_bytes((cache.self_k, cache.self_v))
  assert whole['cross'] == _total_bytes((cache.cross_k, cache.cross_v))


def test_fits_flips_at_each_chips_capacity():
  assert memory_model.fits(16 * GiB, 16 * GiB) == {'TPU v4': 'yes', 'TPU v5e': 'yes', 'H100': 'yes'}
  assert memory_model.fits(16 * GiB + 1, 16 * GiB + 1)['TPU v5e'] == 'no'
  assert memory_model.fits(32 * GiB + 1, 32 * GiB + 1) == {
    'TPU v4': 'no',
    'TPU v5e': 'no',
    'H100': 'yes',
  }
  assert memory_model.fits(10 * GiB, 20 * GiB) == {
    'TPU v4': 'yes',
    'TPU v5e': 'maybe',
    'H100': 'yes',
  }
  with pytest.raises(ValueError, match='exceeds upper_bound'):
    memory_model.fits(2, 1)


def test_roofline_seconds_take_the_slower_bound():
  v4 = memory_model.TPU_V4
  compute = memory_model.CallCost(flops=275e12, bytes=1.2e11)
  assert compute.seconds(v4) == pytest.approx(1.0) and compute.bound(v4) == 'compute'
  memory = memory_model.CallCost(flops=27.5e12, bytes=2.4e12)
  assert memory.seconds(v4) == pytest.approx(2.0) and memory.bound(v4) == 'memory'


def test_call_cost_of_a_hand_case():
  # tiny-v1.0: D 32, N 4, H 8 (N*H 32), F 64 (ReLU), 2 decoder layers, V 128 tied, f32.
  model = _model('tiny-v1.0', _ONE)
  batch, positions, buffer_len, source_length = 2, 3, 10, 6
  cost = memory_model.call_cost(
    model,
    _ONE,
    batch=batch,
    positions=positions,
    buffer_len=buffer_len,
    source_length=source_length,
  )
  per_layer = 4 * 32 * 32 + 2 * 32 * 32 + 2 * 32 * 64  # self q,k,v,o; cross q,o; wi, wo
  matmul = 2 * per_layer + 128 * 32  # + the tied output layer
  tokens = batch * positions
  attention = 2 * 4 * tokens * 4 * 8 * (buffer_len + source_length)  # layers x 2 matmuls x 2
  assert cost.flops == 2 * matmul * tokens + attention
  norms = 3 * 2 * 32 + 32  # three per layer, the final one
  relpos = 4 * 32  # N x buckets
  cache = 2 * 2 * batch * 4 * 8 * (buffer_len + source_length)  # layers x (k, v) x B x N x H x S
  assert cost.bytes == 4 * (matmul + norms + relpos + cache)


def test_call_cost_per_chip_is_the_global_cost_split_over_the_mesh():
  # Batch 2 over data=2; heads, N*H, d_ff and vocab over model=4: every term splits 8 ways.
  common = dict(batch=2, positions=3, buffer_len=10, source_length=6)
  whole = memory_model.call_cost(_model('tiny-v1.0', _ONE), _ONE, **common)
  chip = memory_model.call_cost(_model('tiny-v1.0'), _MESH, **common)
  assert chip.flops * 8 == whole.flops


def test_call_cost_flops_agree_with_xla_cost_analysis():
  model = _model('tiny-v1.1', _ONE)
  common = dict(batch=2, positions=4, buffer_len=12, source_length=8)
  ours = memory_model.call_cost(model, _ONE, **common).flops
  xla = memory_model.xla_step_cost(model, **common)['flops']
  # XLA also counts the elementwise work (norms, softmax, GELU): a few percent more.
  assert 1.0 <= xla / ours < 1.15, (xla, ours)


def test_predict_combines_the_call_times_as_the_loop_does():
  target, drafter = _model('tiny-v1.1', _ONE), _model('tiny-v1.0', _ONE)
  p = memory_model.predict(
    target,
    drafter,
    _ONE,
    memory_model.TPU_V4,
    batch=1,
    gamma=3,
    max_new_tokens=8,
    source_length=8,
  )
  s = p['seconds']
  assert p['c'] == pytest.approx(s['drafter_step'] / s['target_step'])
  assert p['pass_cost'] == pytest.approx(s['target_pass'] / s['target_step'])
  assert p['iteration'] == pytest.approx(3 * s['drafter_step'] + s['target_pass'])
  # Memory-bound at batch 1, so the 4-position pass reads what the step reads (plus 5 slots).
  assert 1.0 <= p['pass_cost'] < 1.1
  assert len(p['speedups']) == 2 * len(memory_model.ALPHAS)


def _check_compiled_plan(mesh, *, batch, rows_per_device, in_float32):
  """Compiles both loops of a tiny bf16 pair on `mesh` (as planned, or `in_float32`) and checks
  that the rows' bytes add up."""
  config = lambda name: dataclasses.replace(t5.CONFIGS[name], dtype='bfloat16')
  target = memory_model.abstract_model(
    config('tiny-v1.1'), mesh, param_dtype='bfloat16', shard=True
  )
  drafter = memory_model.abstract_model(
    config('tiny-v1.0'), mesh, param_dtype='bfloat16', shard=False
  )
  pair = (target, drafter)
  if in_float32:
    pair = tuple(memory_model.with_dtype(m, 'float32') for m in pair)
    assert memory_model.bytes_per_device(pair[0].params) == 2 * memory_model.bytes_per_device(
      target.params
    )
  shape = dict(batch=batch, source_length=16, max_new_tokens=8, gamma=3)
  compiled = memory_model.compile_loops(
    *pair, mesh, sampling=SamplingConfig(temperature=1.0), **shape
  )
  rows = memory_model.memory_rows(target, drafter, mesh, compiled, **shape)
  assert [r['loop'] for r in rows] == ['autoregressive', 'speculative']
  inputs = 2 * rows_per_device * 16 * 4 + 8  # ids and mask (int32 rows per device), PRNG key
  for row, models in zip(rows, ([target], [target, drafter])):
    params = sum(memory_model.bytes_per_device(m.params) for m in models)
    assert row['params'] == params, (row, params)
    # The loop's arguments are the params and the batch, each device holding its shard.
    assert 0 <= row['inputs'] <= inputs, row
    # The caches are built inside the loop: temporaries (twice the bf16 bytes in float32).
    assert row['temp'] >= (2 if in_float32 else 1) * row['caches'] > 0, row
    assert row['total'] == params + row['inputs'] + row['output'] + row['temp'] - row['alias']
    if not in_float32:
      assert row['total'] == row['argument'] + row['output'] + row['temp'] - row['alias']
    assert set(row['fits'].values()) == {'yes'}, row


def test_compiled_plan_on_one_device():
  _check_compiled_plan(sharding.make_mesh(1, 1), batch=2, rows_per_device=2, in_float32=True)


_COMPILED_PLAN_SCRIPT = """
import jax
from specdec_jax import sharding
from tests import memory_plan_test

assert jax.device_count() == 4, jax.devices()
memory_plan_test._check_compiled_plan(
  sharding.make_mesh(2, 2), batch=4, rows_per_device=2, in_float32=False)
print('PLAN_OK')
"""


@pytest.mark.slow  # ~20 s idle: a subprocess, JAX start-up and two compiles
def test_compiled_plan_on_4_simulated_devices():
  helpers.run_on_cpu_devices(_COMPILED_PLAN_SCRIPT, 'PLAN_OK', devices=4)
