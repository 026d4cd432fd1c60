"""benchmarks/tpu_costs.py, benchmarks/paper_scale_tpu.py and benchmarks/tpu_kernels.py: the HLO
reader on hand-written text, then (where libtpu is installed) programs compiled for a TPU v4 chip
on this host: the calibration's linearity, trip counts, scopes, kinds, and the compiled-cost
definitions of c and c_fixed at tiny shapes."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from benchmarks import machines, paper_scale_tpu, synthetic, tpu_costs, tpu_kernels
from specdec_jax import analysis
from specdec_jax.models import t5

# Several test processes may compile for a TPU at once; libtpu otherwise takes a lock per host.
os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')

_HLO = """HloModule m, entry_computation_layout={()->f32[]}

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one), backend_config={"estimated_cycles":"2"}
  %y = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused, metadata={op_name="jit(f)/while/body/target/mul"}, backend_config={"window_config":{"estimated_cycles":"100"}}
  ROOT %t = (s32[], f32[8]) tuple(%next, %y)
}

%fused (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  ROOT %m = f32[8]{0} multiply(%a, %a)
}

%cond (q: (s32[], f32[8])) -> pred[] {
  %q = (s32[], f32[8]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main () -> f32[] {
  %zero = s32[] constant(0)
  %init = f32[8]{0} broadcast(), backend_config={"estimated_cycles":"7"}
  %tup = (s32[], f32[8]) tuple(%zero, %init)
  %w = (s32[], f32[8]) while(%tup), condition=%cond, body=%body, metadata={op_name="jit(f)/while"}
  %out = f32[8]{0} get-tuple-element(%w), index=1
  ROOT %r = f32[] copy(%out), backend_config={"estimated_cycles":"11"}
}
"""


def test_parse_sums_a_loop_by_its_counted_trips():
  program = tpu_costs.parse(_HLO)
  assert program.entry == 'main'
  (loop,) = program.loops()
  assert loop.runs == ('body', 'cond') and loop.trip_count == 5
  assert program.cycles('body') == 102
  assert program.cycles() == 7 + 5 * 102 + 11
  fusion = next(op for op in program.computations['body'] if op.opcode == 'fusion')
  assert dict(fusion.fused) == {'parameter': 1, 'multiply': 1}
  assert fusion.read_bytes == 32 and fusion.bytes == 32
  assert tpu_costs.scope(fusion) == 'target'
  assert tpu_costs.kind(fusion) == 'elementwise / other'
  times = {op.name: n for op, n in program.flat()}
  assert times['y'] == 5 and times['lt'] == 6 and times['r'] == 1
  assert program.table() == {'elementwise / other': 7 + 5 * 102, 'layout copy': 11}


def test_a_loop_of_traced_length_has_no_trip_count():
  program = tpu_costs.parse(_HLO.replace('constant(5)', 'parameter(1)'))
  assert program.loops()[0].trip_count is None
  with pytest.raises(ValueError, match='no known trip count'):
    program.cycles()
  assert program.cycles('body') == 102


def test_shape_bytes():
  assert tpu_costs.shape_bytes('bf16[1024,16384]{0,1:T(8,128)(2,1)}') == 2 * 1024 * 16384
  assert tpu_costs.shape_bytes('(f32[6]{0}, s32[2,3]{1,0}, pred[])') == 24 + 24 + 1


def test_parse_needs_an_entry():
  with pytest.raises(ValueError, match='No ENTRY computation'):
    tpu_costs.parse('%f (a: f32[]) -> f32[] {\n}\n')


@pytest.mark.parametrize('per_call', [10.0, 50.0])
def test_drafter_cost_is_the_timed_definition_unclamped(per_call):
  step, draft, gamma = 1000.0, 100.0, 4  # a draft cheaper than gamma calls of 50: c_fixed < 0
  c, c_fixed = paper_scale_tpu.drafter_cost(step, draft, per_call, gamma=gamma)
  assert c == pytest.approx(per_call / step)
  assert c_fixed == pytest.approx((draft - gamma * per_call) / step)
  assert (c_fixed < 0) == (per_call == 50.0)
  pass_cost, alpha = 0.5, 0.75
  want = analysis.expected_tokens(alpha, gamma) / (gamma * c + c_fixed + pass_cost)
  # Table 4 reads the formula with c_fixed as measured, negative included.
  got = analysis.walltime_improvement_measured(alpha, gamma, c, pass_cost, c_fixed)
  assert float(got) == pytest.approx(want)


@pytest.fixture(scope='module')
def device():
  try:
    return machines.compile_only_devices('tpu-v4')[0]
  except RuntimeError as e:
    pytest.skip(f'No TPU compiler here (libtpu): {e}')


def test_calibration_scales_with_bytes(device):
  # Each reference program's cycles grow with the bytes it moves, from 256 MiB on: twice the
  # bytes, twice the cycles. (Below 128 MiB XLA:TPU prefetches the weight into on-chip memory
  # with ops it gives no estimate: a 64 MiB matmul reads 16x faster than a 256 MiB one.)
  for name in ('stream', 'matmul', 'gemv'):
    small, large = (tpu_costs.reference_cycles(device, name, n) for n in (2**28, 2**29))
    assert large / small == pytest.approx(2, rel=0.02), name
  small = tpu_costs.reference_cycles(device, 'matmul', 2**26)
  assert small < tpu_costs.reference_cycles(device, 'matmul', 2**28) / 8
  cal = tpu_costs.calibrate(device, 2**28)
  # XLA:TPU's model: the MXU streams a weight faster than the vector units do.
  assert cal.matmul > cal.stream > cal.gemv > 0


def test_compiled_scan_trips_scopes_and_kinds(device):
  on = jax.sharding.SingleDeviceSharding(device)
  w = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16, sharding=on)
  x = jax.ShapeDtypeStruct((8, 2048), jnp.bfloat16, sharding=on)

  def f(w, x):
    def body(x, _):
      with jax.named_scope('target'):
        return (x @ w).astype(jnp.bfloat16), None

    return jax.lax.scan(body, x, None, length=5)[0]

  program = tpu_costs.parse(tpu_costs.compile_text(f, w, x))
  (loop,) = program.loops()
  assert loop.trip_count == 5
  body = program.computations[loop.runs[0]]
  matmuls = [op for op in body if tpu_costs.kind(op) == 'matmul (MXU)']
  assert matmuls and all(tpu_costs.scope(op) == 'target' for op in matmuls)
  once = sum(op.cycles for op in program.computations[program.entry] if op is not loop)
  assert program.cycles() == once + 5 * program.cycles(loop.runs[0])
  one_row = jax.ShapeDtypeStruct((1, 2048), jnp.bfloat16, sharding=on)
  gemv = tpu_costs.parse(tpu_costs.compile_text(lambda w, x: x @ w, w, one_row))
  assert 'gemv (multiply+reduce)' in gemv.table()


_TINY = dataclasses.replace(t5.CONFIGS['tiny-v1.0'], d_model=128, d_kv=32, d_ff=256)


def test_compiled_calls_and_drafter_costs(device, tmp_path):
  setup = paper_scale_tpu.Setup(device=device, machine='tpu-v4', source_length=8,
                                cache_dir=str(tmp_path))  # fmt: skip
  bf16 = dataclasses.replace(_TINY, dtype='bfloat16')
  target = synthetic.abstract_model(bf16, device)
  drafter = synthetic.abstract_model(
    dataclasses.replace(bf16, num_encoder_layers=0, num_decoder_layers=1, encoder_dim=128), device
  )
  step = paper_scale_tpu.call_cycles(setup, target, positions=1, cache_len=16)
  again = paper_scale_tpu.call_cycles(setup, target, positions=1, cache_len=16)
  assert step.per_iteration > 0 and again == step  # a 1-position "pass": pass cost 1 exactly
  wide = paper_scale_tpu.call_cycles(setup, target, positions=4, cache_len=16)
  assert wide.per_iteration != step.per_iteration
  kw = dict(gamma=3, cache_len=16)
  without = paper_scale_tpu.iteration_program(setup, target, drafter, draft_length=0, **kw)
  without = paper_scale_tpu.loop_cost(without)
  program = paper_scale_tpu.iteration_program(setup, target, drafter, draft_length=8, **kw)
  cost = paper_scale_tpu.draft_cost(program, gamma=3, extra_calls=5)
  alone = paper_scale_tpu.call_cycles(setup, drafter, positions=1, cache_len=16)
  # An iteration of the draft's scan is one drafter call and its argmax; the draft's ops are what
  # the iteration has beyond the pass on fixed drafts.
  assert cost.per_call == pytest.approx(alone.per_iteration, rel=0.25)
  assert 0 < cost.draft < cost.iteration
  assert cost.iteration - without.per_iteration == pytest.approx(cost.draft, rel=0.25)
  with pytest.raises(ValueError, match='one draft scan of 6 iterations'):
    paper_scale_tpu.draft_cost(program, gamma=3, extra_calls=4)
  assert len(os.listdir(tmp_path)) == 5  # each program compiled once, the repeat from the cache


def test_kernels_report_of_a_tiny_pair(device, tmp_path):
  with pytest.MonkeyPatch.context() as patch:
    patch.setitem(t5.CONFIGS, 'tiny-test', _TINY)
    tpu_kernels.FLAGS(['tpu_kernels', '--target=tiny-test', '--drafter=tiny-test', '--gamma=3',
                       '--max_new_tokens=8', '--source_length=8'])  # fmt: skip
    try:
      compiled = tpu_kernels.compile_loops('tpu-v4', 1, 1, 'as_is')
    finally:
      tpu_kernels.FLAGS.unparse_flags()
  spec = tpu_kernels.read(compiled['speculative'])
  gen = tpu_kernels.read(compiled['generate'])
  parts = {part for part, _ in spec.iteration if spec.iteration[part, _]}
  assert {'target', 'drafter'} <= parts and 'drafter' not in {p for p, _ in gen.iteration}
  # The draft scan counts gamma - 1 times: its drafter calls outweigh one call of the drafter.
  assert tpu_kernels._mcycles(spec.iteration, 'drafter') > 0
  assert spec.per_iteration > gen.per_iteration > 0
