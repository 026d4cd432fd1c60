r"""A memory and cost plan for distilling a drafter from a large teacher, without the hardware.

  python -m benchmarks.distill_plan --teacher=t5-11b --distill_config=paper --batch=32,128 \
    --source_length=512 --target_length=128 \
    --machines=v4-8:1x4,v4-8:2x2,v4-32:4x4,v5e-8:1x8,v5e-8:2x4,h100:1x1

The student, its optimizer and its placement are those of
`experiments/configs/distill_drafter.py:<--distill_config>` (`paper`: one decoder layer at the
teacher's width over the teacher's encoder, AdamW, replicated), completed for the teacher by
`distill.student_config_for`; the teacher has the public shapes `t5.CONFIGS[--teacher]` (`t5-11b`:
T5 v1.0 11B, the checkpoint `ende.py:paper` and `distill_drafter.py:paper` read), params in
--teacher_param_dtype computing in float32 (what `pretrained.load_model` gives for a T5X
checkpoint), sharded by `sharding.DEFAULT_RULES` over 'model' as `distill` shards it.

It simulates as many XLA:CPU devices as the largest machine has
(`machines.simulate_cpu_devices`). For each machine and
DATAxMODEL mesh of --machines and each batch size it builds, with nothing allocated, the teacher's
params (`memory_model.abstract_model`), the student's step-0 train state (`jax.eval_shape` of
`training.init_state`, placed by `training.state_shardings`) and a batch split over 'data', each a
`jax.ShapeDtypeStruct` carrying its `NamedSharding`; lowers `training.compile_step` of
`distill_loss.distill_step` (the live-teacher step, `cache_teacher=False`: the teacher's encoder and
decoder run in every step) and compiles it. Per device it prints:

  teacher   bytes of the teacher's params (its shard of every leaf);
  state     bytes of the student's params and AdamW moments (float32) and the step counters;
  batch     bytes of the batch's rows (int32 ids, bool masks);
  compiled  the step's `memory_analysis()`: argument (= teacher + state + batch), output, temp,
            and total = argument + output + temp - alias (the state is donated), the bound;
  fits      whether the total fits one chip's HBM (`specdec_jax.machines`): 'yes', 'no' if
            even teacher + state + batch do not, 'maybe' in between;
  forward   the teacher's forward per step on the roofline of the machine's chip
            (`distill_model.forward_cost`: max(FLOPs / peak, weight bytes / HBM bandwidth) per
            chip; the chips' constants and their sources are in memory_model.py). Not modelled:
            the model-parallel collectives, the student's own step (its FLOPs per chip are
            printed beside it, the student / teacher column), and the chip's efficiency (the
            roofline is a lower bound on the time).

XLA:CPU compiles the program the step runs on an accelerator (same shapes, shardings and
dtypes: the teacher computes in float32 from its bf16 weights there too), so its buffer sizes are
the plan; the CPU's own scheduling decides the temporaries, an accelerator's may differ.

The computations live in `benchmarks/memory_model.py` (no flags); this file simulates the devices,
reads the flags and prints. Results, with the exact command and the CPU:
docs/results/memory_plan.md.
"""

import dataclasses

import jax
from absl import app, flags

import benchmarks
from benchmarks import distill_model, memory_model
from experiments.configs import distill_drafter
from specdec_jax import distill, machines, sharding
from specdec_jax.models import t5

DEFAULT_MACHINES = 'v4-8:1x4,v4-8:2x2,v4-32:4x4,v5e-8:1x8,v5e-8:2x4,h100:1x1'

# This main's own flags (`benchmarks.flags_parser`): memory_plan and distill_plan (and other
# benchmarks) define --batch, --source_length, ... too; one process (the test suite) imports them.
FLAGS = flags.FlagValues()
_TEACHER = flags.DEFINE_string(
  'teacher', 't5-11b', 'Teacher shapes: a key of t5.CONFIGS.', flag_values=FLAGS
)
_TEACHER_PARAM_DTYPE = flags.DEFINE_enum(
  'teacher_param_dtype',
  'bfloat16',
  ['float32', 'bfloat16'],
  "The teacher's params on device.",
  flag_values=FLAGS,
)
_DISTILL_CONFIG = flags.DEFINE_string(
  'distill_config',
  'paper',
  'Items of experiments/configs/distill_drafter.py (e.g. "paper,student.d_ff=2048"): the '
  "student's shape, optimizer, divergence and student_sharding.",
  flag_values=FLAGS,
)
_MACHINES = flags.DEFINE_string(
  'machines',
  DEFAULT_MACHINES,
  f'MACHINE:DATAxMODEL items, MACHINE one of {sorted(machines.MACHINES)} (simulated devices).',
  flag_values=FLAGS,
)
_BATCH = flags.DEFINE_list(
  'batch', ['32', '128'], 'Batch sizes (global rows per step).', flag_values=FLAGS
)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 512, 'Source tokens per row.', flag_values=FLAGS
)
_TARGET_LENGTH = flags.DEFINE_integer(
  'target_length', 128, 'Target tokens per row.', flag_values=FLAGS
)
_COMPILE = flags.DEFINE_bool(
  'compile', True, 'Compile the step (off: shapes and roofline only).', flag_values=FLAGS
)
_COMPILE_DTYPE = flags.DEFINE_enum(
  'compile_dtype',
  'float32',
  ['float32', 'params'],
  "Compile with the teacher's params in float32 (its temporaries are then the activations "
  'alone) or as planned (--teacher_param_dtype: XLA:CPU then adds a float32 copy of the bf16 '
  'weights to the temporaries).',
  flag_values=FLAGS,
)


def _gib(n: float) -> str:
  return f'{n / machines.GiB:.2f}'


def _print_row(row: dict) -> None:
  compiled = [row.get(k) for k in ('argument', 'output', 'temp', 'total')]
  cells = [row['machine'], row['mesh'], str(row['batch'])]
  cells += [_gib(row[k]) for k in ('teacher', 'state', 'batch_bytes')]
  cells += ['-' if v is None else _gib(v) for v in compiled]
  cells += [row['fits'], f'{row["forward_seconds"] * 1e3:.1f}', row['forward_bound']]
  cells += [f'{300 * row["student_forward"].flops / row["forward"].flops:.1f}%']
  cells += [f'{row.get("compile_seconds", 0):.0f}']
  print('| ' + ' | '.join(cells) + ' |', flush=True)


def main(argv):
  del argv
  try:
    meshes = machines.parse_machine_mesh(_MACHINES.value)
  except ValueError as e:
    raise app.UsageError(f'--machines: {e}') from e
  for name, data, model in meshes:
    if data * model != machines.MACHINES[name].devices:
      raise app.UsageError(
        f'{name} has {machines.MACHINES[name].devices} devices; the mesh {data}x{model} has '
        f'{data * model}.'
      )
  machines.simulate_cpu_devices(max(data * model for _, data, model in meshes))
  if _TEACHER.value not in t5.CONFIGS:
    raise app.UsageError(f'Unknown teacher {_TEACHER.value!r}; choose one of {sorted(t5.CONFIGS)}.')
  teacher_config = dataclasses.replace(t5.CONFIGS[_TEACHER.value], dtype='float32')
  config = distill_drafter.get_config(_DISTILL_CONFIG.value)
  one = sharding.make_mesh(1, 1)
  teacher = memory_model.abstract_model(
    teacher_config, one, param_dtype=_TEACHER_PARAM_DTYPE.value, shard=True
  )
  student = distill.student_config_for(config, teacher)
  student_params = jax.eval_shape(lambda key: t5.init_params(key, student), jax.random.key(0))
  batches = [int(b) for b in _BATCH.value]
  shape = dict(source_length=_SOURCE_LENGTH.value, target_length=_TARGET_LENGTH.value)
  compile_dtype = _COMPILE_DTYPE.value if _COMPILE.value else None
  print(
    f'teacher {_TEACHER.value} ({t5.param_count(teacher.params) / 1e9:.2f}B params, '
    f'{_TEACHER_PARAM_DTYPE.value}, computing in float32, sharded over model); student '
    f'distill_drafter.py:{_DISTILL_CONFIG.value} ({t5.param_count(student_params) / 1e6:.1f}M '
    f'params, float32, AdamW, {config.student_sharding}, divergence {config.divergence}): '
    f'{student}; source {shape["source_length"]}, target {shape["target_length"]}; '
    f'{jax.device_count()} simulated {jax.devices()[0].platform} devices; step compiled with the '
    f"teacher's params in {compile_dtype or '-'}."
  )
  print(
    '\nGiB per device. argument / output / temp: the compiled step; total = teacher + student '
    'state + batch + output + temp - alias. Teacher forward: per step on the roofline of the '
    "machine's chip. Student / teacher: the student's forward and backward (3 x its forward) "
    "in FLOPs per chip, against the teacher's forward."
  )
  print(
    '\n| machine | mesh | batch | teacher | student state | batch | argument | output | temp | '
    'total | fits | teacher forward (ms) | bound | student / teacher | compile (s) |'
  )
  print('|---|---|' + '---:|' * 13)
  distill_model.distill_rows(
    teacher_config,
    config,
    meshes,
    batches,
    teacher_param_dtype=_TEACHER_PARAM_DTYPE.value,
    compile_dtype=compile_dtype,
    log=_print_row,
    **shape,
  )

  print('\nCross-check (global, unsharded teacher forward): analytic FLOPs vs XLA cost_analysis')
  for batch in batches:
    ours = distill_model.forward_cost(teacher, one, batch=batch, **shape)
    xla = distill_model.xla_forward_cost(teacher, batch=batch, **shape)
    print(
      f'  B={batch}: analytic {ours.flops:.4g} FLOPs, XLA {xla["flops"]:.4g} '
      f'({xla["flops"] / ours.flops:.3f}x)',
      flush=True,
    )


if __name__ == '__main__':
  app.run(main, flags_parser=benchmarks.flags_parser(FLAGS))
