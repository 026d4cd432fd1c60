r"""A memory and cost plan for a T5 pair on a device mesh, without the hardware.

  python -m benchmarks.memory_plan --target=t5_1_1-xxl --drafter=t5_1_1-small --mesh=1x4 \
    --batch=1,8,32 --source_length=512 --max_new_tokens=128 --gamma=5 --compile_for=tpu-v4

With --compile_for=MACHINE[:DATAxMODEL] (a name of `benchmarks.machines`: tpu-v4, v4-8:2x2, ...;
without a mesh, --mesh on the machine of its chip with the mesh's device count: tpu-v4 and 1x4, a
v4-8's 4 devices) the loops are compiled by that accelerator's own compiler, compile-only (`machines.compile_only_mesh`;
XLA:TPU comes with libtpu, `pip install 'jax[tpu]'`), as planned (--param_dtype, --dtype). Its
`memory_analysis()` is then the program's own, and fits is the compiler's yes or no: 'yes' when it
compiled the loop and its peak fits the chip's HBM, 'no' when it refuses the program for want of
HBM (its message is printed under the table). Nothing runs; nothing is timed.

Without --compile_for it simulates DATA x MODEL CPU devices (`machines.simulate_cpu_devices`), and
XLA:CPU's buffers bound the accelerator's (below). Either way it builds the pair as
abstract params (`jax.eval_shape` of `t5.init_params`, each leaf a `jax.ShapeDtypeStruct` carrying
its `NamedSharding` from `sharding.param_shardings`; the drafter replicated or sharded per
--drafter_sharding) and abstract sharded inputs, and lowers and compiles the autoregressive and
speculative decode loops (`decode.lower_generate`, `decode.lower_speculative`) with no weight ever
allocated. Per device and batch size it prints:

  params    bytes of each model's params on one device (its shard of every leaf);
  caches    bytes of the decoder caches the loop builds, from their shapes: self-attention
            L x 2 x B x buffer_len x N x H and cross-attention L x 2 x B x S x N x H, times the
            dtype's bytes, sharded as `sharding.DEFAULT_RULES` shard the cache (batch over
            'data', heads over 'model' where they divide);
  compiled  the compiled loop's `memory_analysis()`: argument, output and temporary bytes, the
            compiler's peak of live bytes, and the bound total = params + inputs (ids, mask,
            key) + output + temp - alias;
  fits      with --compile_for, the compiler's verdict (above); without, whether the total
            fits one chip of TPU v4 (32 GiB HBM), TPU v5e (16 GiB) and H100 (80 GiB): 'yes' if
            the compiled total fits, 'no' if even params + caches do not, 'maybe' in between.

Without --compile_for, XLA:CPU computes in float32: compiled as planned (--compile_dtype=params), it upcasts bf16 weights
before every dot and the upcast copies are temporaries (for XXL, about one f32 copy of the
weights). So by default (--compile_dtype=float32) the loops are compiled with float32 params and
activations, and the temporaries of that f32-compiled program (caches, activations, all twice
their bf16 size) are reported as the bound on the bf16 program's; params are counted in
--param_dtype. params + caches is the lower bound.

Then a roofline prediction of one speculative iteration on a chip (--chip, TPU v4 by default),
from each model call's FLOPs and HBM bytes per chip, counted from the config and the shard shapes:
bytes = the decoder params a call reads (all but the cross-attention key / value kernels, which
only build the cache) + the whole decoder cache (attention reads every slot, masked);
FLOPs = 2 x matmul params x tokens + attention (4 x B x T x N x H x (buffer_len + S) per layer).
A call takes max(FLOPs / peak, bytes / bandwidth); collectives over the chip interconnect are not
modelled. From the target step (1 position), the (gamma+1)-position pass and the drafter step it
gives c, the pass cost, and the speedup `analysis.walltime_improvement` predicts (the paper's
assumption: the pass costs one step) and `analysis.walltime_improvement_measured` (the roofline
pass cost), with the paper's alpha (Leviathan et al. 2023, T5-XXL / T5-small on EnDe: 0.75
greedy, 0.62 at temperature 1) and ours (docs/results.md section 3: debsumm distilled 0.66 /
0.54, ende48m distilled 0.49 / 0.48). The FLOPs are cross-checked against XLA's
`cost_analysis()` of one lowered target call (whose FLOPs also count the elementwise work).

The computations live in `benchmarks/memory_model.py` (no flags); this file makes the devices,
reads the flags and prints (the command to rerun first). Results, with the exact commands and the CPU:
docs/results/memory_plan.md.
"""

import shlex
import sys

import jax
from absl import app, flags

import benchmarks
from benchmarks import machines, synthetic
from benchmarks.memory_model import (
  PLAN_CHIPS,
  call_cost,
  compile_loops,
  memory_rows,
  predict,
  xla_step_cost,
)
from specdec_jax import decode, sharding
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import tables
from specdec_jax.models import t5

CHIPS = {'v4': machines.TPU_V4, 'v5e': machines.TPU_V5E, 'h100': machines.H100}

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_TARGET = flags.DEFINE_string(
  'target', 't5_1_1-xxl', 'Target: a key of t5.CONFIGS.', flag_values=FLAGS
)
_DRAFTER = flags.DEFINE_string(
  'drafter', 't5_1_1-small', 'Drafter: a key of t5.CONFIGS.', flag_values=FLAGS
)
_MESH = flags.DEFINE_string(
  'mesh', '1x4', 'DATAxMODEL device mesh (simulated on CPU).', flag_values=FLAGS
)
_BATCH = flags.DEFINE_list('batch', ['1', '8', '32'], 'Batch sizes (global).', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 512, 'Source tokens per row.', flag_values=FLAGS
)
_MAX_NEW_TOKENS = flags.DEFINE_integer(
  'max_new_tokens', 128, 'Tokens decoded per row.', flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 5, 'Drafted tokens per iteration.', flag_values=FLAGS)
_PARAM_DTYPE = flags.DEFINE_enum(
  'param_dtype', 'bfloat16', ['float32', 'bfloat16'], 'Params.', flag_values=FLAGS
)
_DTYPE = flags.DEFINE_enum(
  'dtype',
  'bfloat16',
  ['float32', 'bfloat16'],
  'Activation and cache dtype (T5Config.dtype).',
  flag_values=FLAGS,
)
_DRAFTER_SHARDING = flags.DEFINE_enum(
  'drafter_sharding',
  'replicated',
  ['replicated', 'model'],
  'Drafter params on the mesh.',
  flag_values=FLAGS,
)
_TEMPERATURE = flags.DEFINE_float(
  'temperature',
  1.0,
  'Sampling of the compiled loops (> 0 forms probabilities: more temporaries).',
  flag_values=FLAGS,
)
_CHIP = flags.DEFINE_enum(
  'chip',
  None,
  sorted(CHIPS),
  "Chip of the roofline prediction (default: --compile_for's, else v4).",
  flag_values=FLAGS,
)
_COMPILE_FOR = benchmarks.define_compile_for(
  "With its own compiler, as planned: fits is then the compiler's yes / no. A MACHINE without a "
  "mesh (tpu-v4) takes --mesh, on the machine of its chip with the mesh's device count (a v4-8 "
  'for 1x4). Unset: simulated XLA:CPU devices (bounds).',
  FLAGS,
)
_COMPILE, _COMPILE_DTYPE = benchmarks.define_compile(
  'the loops', 'params + caches', '--param_dtype / --dtype', FLAGS
)


def _mesh():
  """(the mesh, the machine compiled for or None): --compile_for's compile-only devices (its
  mesh, or --mesh), else --mesh's simulated XLA:CPU devices."""
  if _MESH.value.strip().lower() in ('', 'auto'):
    raise app.UsageError(f'--mesh must be DATAxMODEL (e.g. 1x4), got {_MESH.value!r}.')
  planned = sharding.parse_mesh(_MESH.value)
  items = benchmarks.compile_for(_COMPILE_FOR)
  if len(items) > 1:
    raise app.UsageError(f'--compile_for={_COMPILE_FOR.value}: one machine a plan.')
  # The host's own JAX runs nothing but the cross-check's CPU lowering: CPU alone, so that no
  # TPU backend is tried on a host without one.
  machines.simulate_cpu_devices(1 if items else planned[0] * planned[1])
  if not items:
    return sharding.make_mesh(*planned), None
  try:
    name, data, model = machines.for_mesh(*items[0], planned)
    return machines.compile_only_mesh(name, data, model), machines.get(name)
  except (ValueError, RuntimeError) as e:
    raise app.UsageError(f'--compile_for={_COMPILE_FOR.value}: {e}') from e


def _pair(mesh) -> tuple[t5.T5Model, t5.T5Model]:
  """The flags' target (sharded) and drafter (per --drafter_sharding) as abstract models."""
  target = synthetic.abstract_model(
    synthetic.shape(_TARGET.value, _DTYPE.value), mesh, param_dtype=_PARAM_DTYPE.value, shard=True
  )
  drafter = synthetic.abstract_model(
    synthetic.shape(_DRAFTER.value, _DTYPE.value),
    mesh,
    param_dtype=_PARAM_DTYPE.value,
    shard=_DRAFTER_SHARDING.value == 'model',
  )
  return target, drafter


def _print_header(target, drafter, mesh, shape: dict, machine) -> None:
  data, model = mesh.shape['data'], mesh.shape['model']
  print('python -m benchmarks.memory_plan ' + shlex.join(sys.argv[1:]))
  devices = list(mesh.devices.flat)
  where = (
    f'simulated {devices[0].platform} devices'
    if machine is None
    else f'{machines.on_devices(devices)} of a {machine.name}, compile-only: nothing ran'
  )
  print(
    f'{_TARGET.value} + {_DRAFTER.value} (drafter {_DRAFTER_SHARDING.value}), mesh '
    f'{data}x{model} ({where}), params {_PARAM_DTYPE.value}, activations/caches {_DTYPE.value}, '
    f'source {shape["source_length"]}, {shape["max_new_tokens"]} new tokens, gamma '
    f'{shape["gamma"]}, temperature {_TEMPERATURE.value}'
  )
  if machine is not None:
    how = (
      f'as planned by XLA:{devices[0].platform.upper()} for {machine.name}; peak: its peak of live '
      f"bytes; fits: it compiled the loop and the peak fits the chip's "
      f'{tables.gib(machine.chip.hbm_bytes)} GiB; '
    )
  elif _COMPILE_DTYPE.value == 'float32':
    how = "in float32 (XLA:CPU computes in f32): the f32 temporaries bound the planned dtype's; "
  else:
    how = 'as planned; XLA:CPU upcasts bf16 to f32, so temp holds f32 copies of the weights; '
  print(
    f'params {t5.param_count(target.params) / 1e9:.2f}B + {t5.param_count(drafter.params) / 1e6:.0f}M'
    '; GiB per device. argument / output / temp / peak: the loops compiled '
    + how
    + 'total = params + inputs + output + temp - alias, the upper bound.'
  )


def _print_memory(target, drafter, mesh, batches: list[int], shape: dict, machine) -> None:
  """The memory table: a row per batch and loop (`memory_rows`), compiled unless --nocompile,
  for `machine` by its compiler (None: XLA:CPU)."""
  compiled_pair = (target, drafter)
  if machine is None and _COMPILE_DTYPE.value == 'float32':
    compiled_pair = (
      synthetic.with_dtype(target, 'float32'),
      synthetic.with_dtype(drafter, 'float32'),
    )
  sampling = sampling_lib.SamplingConfig(temperature=_TEMPERATURE.value)
  chips = PLAN_CHIPS if machine is None else [machine.chip]
  columns = 'argument | output | temp | peak | total | ' + ' | '.join(c.name for c in chips)
  print(f'\n| batch | loop | params | caches | params+caches | {columns} |')
  print('|' + '---:|' * (10 + len(chips)))
  refused = []
  for batch in batches:
    compiled = None
    if _COMPILE.value:
      compiled = compile_loops(*compiled_pair, mesh, batch=batch, sampling=sampling, **shape)
    chip = None if machine is None else machine.chip
    for row in memory_rows(target, drafter, mesh, compiled, chip=chip, batch=batch, **shape):
      keys = ('argument', 'output', 'temp', 'peak', 'total')
      measured = [tables.gib(row[k]) for k in keys] if 'total' in row else ['-'] * 5
      cells = [str(batch), row['loop'], tables.gib(row['params']), tables.gib(row['caches'])]
      cells += [tables.gib(row['params'] + row['caches'])] + measured + list(row['fits'].values())
      print('| ' + ' | '.join(cells) + ' |', flush=True)
      if 'out_of_memory' in row:
        refused.append(f'batch {batch} {row["loop"]}: {row["out_of_memory"]}')
  for line in refused:
    print(f'  {line}')


def _print_roofline(target, drafter, mesh, chip, batches: list[int], shape: dict) -> dict:
  """The roofline table of each batch (`predict`); returns the predictions by batch."""
  print(
    f'\nRoofline on one {chip.name} chip ({chip.peak_flops / 1e12:.0f} TFLOP/s bf16, '
    f'{chip.hbm_bandwidth / 1e9:.0f} GB/s HBM) per chip of the '
    f'{mesh.shape["data"]}x{mesh.shape["model"]} mesh; ms per call:'
  )
  print(
    '\n| batch | target step | pass (gamma+1) | pass cost | drafter step | c | iteration | '
    'bound (step/pass/drafter) |'
  )
  print('|' + '---:|' * 8)
  predictions = {}
  for batch in batches:
    p = predictions[batch] = predict(target, drafter, mesh, chip, batch=batch, **shape)
    s = p['seconds']
    bounds = '/'.join(p['bounds'][k] for k in ('target_step', 'target_pass', 'drafter_step'))
    print(
      f'| {batch} | {s["target_step"] * 1e3:.3f} | {s["target_pass"] * 1e3:.3f} | '
      f'{p["pass_cost"]:.2f} | {s["drafter_step"] * 1e3:.3f} | {p["c"]:.3f} | '
      f'{p["iteration"] * 1e3:.3f} | {bounds} |'
    )
  return predictions


def _print_speedups(predictions: dict, gamma: int) -> None:
  batches = list(predictions)
  print(
    f'\nPredicted speedup at gamma {gamma}: paper = analysis.walltime_improvement '
    '(pass cost 1), roofline = analysis.walltime_improvement_measured (roofline pass cost); '
    'best gamma by the paper formula.'
  )
  print(
    '\n| alpha from | temp | alpha | '
    + ' | '.join(f'B={b} paper / roofline' for b in batches)
    + ' |'
  )
  print('|---|---:|---:|' + '---|' * len(batches))
  for i, row in enumerate(predictions[batches[0]]['speedups']):
    cells = [
      f'{predictions[b]["speedups"][i]["paper"]:.2f}x / '
      f'{predictions[b]["speedups"][i]["roofline"]:.2f}x (best gamma '
      f'{predictions[b]["speedups"][i]["best_gamma"]})'
      for b in batches
    ]
    print(
      f'| {row["alpha_source"]} | {row["temperature"]} | {row["alpha"]} | '
      + ' | '.join(cells)
      + ' |'
    )


def _print_cross_check(target, batches: list[int], shape: dict) -> None:
  one = jax.sharding.AbstractMesh((1, 1), ('data', 'model'))
  print('\nCross-check (global, unsharded target call): analytic FLOPs vs XLA cost_analysis')
  for batch in batches:
    for positions in (1, shape['gamma'] + 1):
      buffer_len = decode.buffer_length(shape['max_new_tokens'], shape['gamma'])
      common = dict(
        batch=batch,
        positions=positions,
        buffer_len=buffer_len,
        source_length=shape['source_length'],
      )
      ours = call_cost(synthetic.unsharded(target), one, **common)
      xla = xla_step_cost(target, **common)
      print(
        f'  B={batch} T={positions}: analytic {ours.flops:.4g} FLOPs, XLA {xla["flops"]:.4g} '
        f'({xla["flops"] / ours.flops:.3f}x); analytic bytes {ours.bytes:.4g}, XLA bytes '
        f'accessed {xla["bytes accessed"]:.4g} ({xla["bytes accessed"] / ours.bytes:.2f}x)',
        flush=True,
      )


def main(argv):
  del argv
  mesh, machine = _mesh()
  batches = [int(b) for b in _BATCH.value]
  shape = dict(
    source_length=_SOURCE_LENGTH.value, max_new_tokens=_MAX_NEW_TOKENS.value, gamma=_GAMMA.value
  )
  target, drafter = _pair(mesh)
  _print_header(target, drafter, mesh, shape, machine)
  _print_memory(target, drafter, mesh, batches, shape, machine)
  chip = CHIPS[_CHIP.value] if _CHIP.value else machine.chip if machine else machines.TPU_V4
  predictions = _print_roofline(target, drafter, mesh, chip, batches, shape)
  _print_speedups(predictions, shape['gamma'])
  _print_cross_check(target, batches, shape)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
