"""Tests of benchmarks/memory_plan.py and memory_model.py: per-device bytes, cache bytes, fits, the
roofline, the compiled decode plan of tiny models on a (2, 2) mesh of 4 simulated CPU devices, and
the distillation plan (benchmarks/distill_plan.py) of a tiny teacher on 8 of them."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import distill_model, machines, memory_model, synthetic
from experiments.configs import distill_drafter
from specdec_jax import sharding
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig
from tests import helpers

_MESH = AbstractMesh((2, 4), ('data', 'model'))
_ONE = AbstractMesh((1, 1), ('data', 'model'))
GiB = machines.GiB


def _model(name, mesh=_MESH, *, shard=True, dtype='float32', param_dtype='float32'):
  config = dataclasses.replace(t5.CONFIGS[name], dtype=dtype)
  return synthetic.abstract_model(config, mesh, param_dtype=param_dtype, shard=shard)


def _total_bytes(tree):
  return sum(x.size * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


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
  # 'model' (4 ways) splits every param but the norm scales: vocab 128, joined heads 32, MLP 48
  # and the relpos tables' 4 heads all divide by 4. Scales: 2 per encoder layer and 3 per decoder
  # layer, plus each stack's final norm, of D = 32 each.
  scales = (2 * 2 + 1 + 3 * 3 + 1) * 32
  expected = 2 * ((t5.param_count(sharded.params) - scales) // 4 + scales)
  assert memory_model.bytes_per_device(sharded.params) == expected


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
  cache = synthetic.abstract_cache(
    synthetic.abstract_model(config), batch=batch, cache_len=buffer_len,
    source_length=source_length,
  )  # fmt: skip
  whole = memory_model.cache_bytes_per_device(
    config, _ONE, batch=batch, buffer_len=buffer_len, source_length=source_length
  )
  assert whole['self'] == _total_bytes((cache.self_k, cache.self_v))
  assert whole['cross'] == _total_bytes((cache.cross_k, cache.cross_v))


def test_fits_flips_at_each_chips_capacity():
  assert memory_model.fits(16 * GiB, 16 * GiB) == {
    'TPU v4': 'yes',
    'TPU v5e': 'yes',
    'H100 SXM': 'yes',
  }
  assert memory_model.fits(16 * GiB + 1, 16 * GiB + 1)['TPU v5e'] == 'no'
  assert memory_model.fits(32 * GiB + 1, 32 * GiB + 1) == {
    'TPU v4': 'no',
    'TPU v5e': 'no',
    'H100 SXM': 'yes',
  }
  assert memory_model.fits(10 * GiB, 20 * GiB) == {
    'TPU v4': 'yes',
    'TPU v5e': 'maybe',
    'H100 SXM': 'yes',
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


def test_forward_cost_of_a_hand_case():
  # tiny-v1.0: D 32, N 4, H 8 (N*H 32), F 64 (ReLU), 2 + 2 layers, V 128 tied, f32.
  model = _model('tiny-v1.0', _ONE)
  batch, source, target = 2, 6, 3
  cost = distill_model.forward_cost(
    model, _ONE, batch=batch, source_length=source, target_length=target
  )
  attention, mlp = 4 * 32 * 32, 2 * 32 * 64  # q, k, v, o; wi, wo
  encoder = 2 * (attention + mlp)  # x the source tokens
  cross_kv = 2 * 2 * 32 * 32  # the cross-attention keys and values of the source
  decoder = 2 * (attention + 2 * 32 * 32 + mlp) + 128 * 32  # self, cross q / o, MLP; output layer
  matmuls = encoder * batch * source + cross_kv * batch * source + decoder * batch * target
  # 2 matmuls of 2 x queries x keys x N x H: encoder 6 x 6, decoder self 3 x 3 and cross 3 x 6.
  scores = 2 * 2 * 4 * 8 * batch * (2 * source * source + 2 * (target * target + target * source))
  assert cost.flops == 2 * matmuls + scores
  norms, relpos = (2 * 2 + 1 + 2 * 3 + 1) * 32, 2 * 4 * 32  # scales; N x buckets per stack
  assert cost.bytes == 4 * (encoder + cross_kv + decoder + norms + relpos)


def test_forward_cost_per_chip_is_the_global_cost_split_over_the_mesh():
  # Batch 2 over data=2; heads, N*H, d_ff and vocab over model=4: every FLOP splits 8 ways.
  common = dict(batch=2, source_length=6, target_length=3)
  whole = distill_model.forward_cost(_model('tiny-v1.0', _ONE), _ONE, **common)
  chip = distill_model.forward_cost(_model('tiny-v1.0'), _MESH, **common)
  assert chip.flops * 8 == whole.flops


def test_forward_cost_flops_agree_with_xla_cost_analysis():
  model = _model('tiny-v1.1', _ONE)
  common = dict(batch=2, source_length=8, target_length=5)
  ours = distill_model.forward_cost(model, _ONE, **common).flops
  xla = distill_model.xla_forward_cost(model, **common)['flops']
  # XLA also counts the elementwise work (norms, softmax, GELU): a few percent more.
  assert 1.0 <= xla / ours < 1.15, (xla, ours)


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
  target = synthetic.abstract_model(config('tiny-v1.1'), mesh, param_dtype='bfloat16', shard=True)
  drafter = synthetic.abstract_model(config('tiny-v1.0'), mesh, param_dtype='bfloat16', shard=False)
  pair = (target, drafter)
  if in_float32:
    pair = tuple(synthetic.with_dtype(m, 'float32') for m in pair)
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


@helpers.needs_libtpu
def test_the_tpu_compiler_refuses_what_its_hbm_does_not_hold():
  """compile_memory's bytes on XLA:TPU, and its verdict where 20 GiB of output meet a v5e's 16."""
  mesh = machines.compile_only_mesh('tpu-v5e', 1, 1)
  whole = NamedSharding(mesh, P())
  x = jax.ShapeDtypeStruct((), jnp.float32, sharding=whole)

  def lowered(n):
    return jax.jit(lambda x: jnp.zeros((n,), jnp.float32) + x, out_shardings=whole).lower(x)

  fitting = memory_model.compile_memory(lowered(GiB // 4))
  assert fitting['output'] == GiB and fitting['peak'] >= GiB, fitting
  refused = memory_model.compile_memory(lowered(5 * GiB))
  assert list(refused) == ['out_of_memory'], refused
  assert refused['out_of_memory'].startswith('RESOURCE_EXHAUSTED'), refused


def test_rows_of_a_chips_own_compiler_say_yes_or_no():
  target, drafter = _model('tiny-v1.1', _ONE), _model('tiny-v1.0', _ONE)
  stats = dict(argument=100, output=10, alias=0, temp=GiB, peak=GiB, inputs=20)
  compiled = {'autoregressive': stats, 'speculative': {'out_of_memory': 'RESOURCE_EXHAUSTED'}}
  shape = dict(batch=1, source_length=8, max_new_tokens=4, gamma=2)
  rows = memory_model.memory_rows(target, drafter, _ONE, compiled, chip=machines.TPU_V5E, **shape)
  assert [r['fits'] for r in rows] == [{'TPU v5e': 'yes'}, {'TPU v5e': 'no'}]
  assert rows[0]['total'] == rows[0]['params'] + 20 + 10 + GiB and 'total' not in rows[1]
  small = dataclasses.replace(machines.TPU_V5E, hbm_bytes=GiB - 1)  # the peak no longer fits
  rows = memory_model.memory_rows(target, drafter, _ONE, compiled, chip=small, **shape)
  assert rows[0]['fits'] == {'TPU v5e': 'no'}


def test_compiled_plan_on_one_device():
  _check_compiled_plan(sharding.make_mesh(1, 1), batch=2, rows_per_device=2, in_float32=True)


_COMPILED_PLAN_SCRIPT = """
import jax
from specdec_jax import sharding
from benchmarks import machines
from tests import memory_plan_test

assert jax.device_count() == 4, jax.devices()
memory_plan_test._check_compiled_plan(
  sharding.make_mesh(2, 2), batch=4, rows_per_device=2, in_float32=False)
print('PLAN_OK')
"""


@pytest.mark.slow  # ~20 s idle: a subprocess, JAX start-up and two compiles
def test_compiled_plan_on_4_simulated_devices():
  helpers.run_on_cpu_devices(_COMPILED_PLAN_SCRIPT, 'PLAN_OK', devices=4)


# The distillation plan: a tiny teacher (tiny-v1.0, bf16) and the `paper` student shrunk.
_STUDENT = 'paper,student.d_model=16,student.num_heads=2,student.d_kv=8,student.d_ff=32'
# Its params (V 128, D 16, N*H 16, F 32 gated, one layer over the teacher's D 32 encoder, tied):
# embedding, relpos (N x 32 buckets), self q k v o, cross q o, cross k v (from D 32), MLP, scales.
_STUDENT_PARAMS = 128 * 16 + 2 * 32 + 4 * 16 * 16 + 2 * 16 * 16 + 2 * 32 * 16 + 3 * 16 * 32 + 4 * 16
_TEACHER_SCALES = (2 * 2 + 1 + 2 * 3 + 1) * 32  # tiny-v1.0's norm scales
_PLAN_SHAPE = dict(source_length=16, target_length=8)


def _distill_rows(machines, *, student_sharding='replicated', compile_dtype=None, batch=8):
  config = distill_drafter.get_config(f'{_STUDENT},student_sharding={student_sharding}')
  return distill_model.distill_rows(
    t5.CONFIGS['tiny-v1.0'],
    config,
    machines,
    [batch],
    teacher_param_dtype='bfloat16',
    compile_dtype=compile_dtype,
    **_PLAN_SHAPE,
  )


def _state_bytes(params_per_device: int) -> int:
  """params and AdamW's two moments in float32, and 3 int32 counters (the step, Adam's count,
  the schedule's count)."""
  return 3 * 4 * params_per_device + 3 * 4


def test_distill_plan_bytes_on_one_device():
  (row,) = _distill_rows([('h100', 1, 1)])
  teacher = t5.CONFIGS['tiny-v1.0']
  shapes = jax.eval_shape(lambda key: t5.init_params(key, teacher), jax.random.key(0))
  assert row['teacher'] == 2 * t5.param_count(shapes)
  assert row['state'] == _state_bytes(_STUDENT_PARAMS)
  assert row['batch_bytes'] == 8 * (16 + 8) * (4 + 1)  # int32 ids and bool masks
  assert row['fits'] == 'yes' and 'total' not in row
  common = dict(batch=8, **_PLAN_SHAPE)
  assert row['forward'] == distill_model.forward_cost(
    _model('tiny-v1.0', _ONE, param_dtype='bfloat16'), _ONE, **common
  )
  student = distill_drafter.get_config(_STUDENT).student.to_dict()
  student = t5.T5Config(**dict(student, vocab_size=128, encoder_dim=32))
  student = synthetic.abstract_model(student, _ONE, param_dtype='float32', shard=False)
  assert t5.param_count(student.params) == _STUDENT_PARAMS
  assert row['student_forward'] == distill_model.forward_cost(student, _ONE, **common)


def test_distill_plan_rejects_a_mesh_of_another_size():
  with pytest.raises(ValueError, match='v4-8 has 4 devices; a 2x4 mesh has 8'):
    _distill_rows([('v4-8', 2, 4)])


def _check_distill_plan():
  """On a 2x4 mesh (v5e-8): every byte count is what the shardings imply, and the compiled step's
  arguments are those bytes."""
  teacher_params = t5.param_count(
    jax.eval_shape(lambda key: t5.init_params(key, t5.CONFIGS['tiny-v1.0']), jax.random.key(0))
  )
  # Every teacher param but the norm scales splits over model = 4 (vocab 128, N*H 32, F 64, and
  # the relpos tables' 4 heads); the batch's 8 rows over data = 2.
  teacher = 2 * ((teacher_params - _TEACHER_SCALES) // 4 + _TEACHER_SCALES)
  batch = 4 * (16 + 8) * (4 + 1)
  (replicated,) = _distill_rows([('v5e-8', 2, 4)], compile_dtype='params')
  assert (replicated['teacher'], replicated['batch_bytes']) == (teacher, batch)
  assert replicated['state'] == _state_bytes(_STUDENT_PARAMS)
  assert replicated['argument'] == teacher + _state_bytes(_STUDENT_PARAMS) + batch
  assert replicated['total'] == (
    replicated['argument'] + replicated['output'] + replicated['temp'] - replicated['alias']
  )
  # Sharded over model = 4: all but the relpos table (2 heads) and the scales (D = 16).
  (sharded,) = _distill_rows([('v5e-8', 2, 4)], student_sharding='model', compile_dtype='float32')
  whole = 2 * 32 + 4 * 16
  state = _state_bytes((_STUDENT_PARAMS - whole) // 4 + whole)
  assert (sharded['teacher'], sharded['state']) == (teacher, state)
  # Compiled with the teacher in float32: its params take twice the planned bytes there.
  assert sharded['argument'] == 2 * teacher + state + batch
  assert (
    sharded['total']
    == teacher + state + batch + sharded['output'] + sharded['temp'] - (sharded['alias'])
  )
  for row in (replicated, sharded):
    assert row['alias'] == row['state'] and row['fits'] == 'yes', row


_DISTILL_PLAN_SCRIPT = """
import jax
from tests import memory_plan_test

assert jax.device_count() == 8, jax.devices()
memory_plan_test._check_distill_plan()
print('DISTILL_PLAN_OK')
"""


def test_distill_plan_on_8_simulated_devices():  # ~15 CPU-seconds: two small compiles
  helpers.run_on_cpu_devices(_DISTILL_PLAN_SCRIPT, 'DISTILL_PLAN_OK', devices=8)
