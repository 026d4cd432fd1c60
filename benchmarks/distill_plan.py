r"""A memory and cost plan for distilling a drafter from a large teacher, without the hardware.

  python -m benchmarks.distill_plan --teacher=t5-11b --distill_config=paper --batch=32,128 \
    --source_length=512 --target_length=128 \
    --machines=v4-8:1x4,v4-8:2x2,v4-32:4x4,v5e-8:1x8,v5e-8:2x4,h100:1x1 \
    --compile_for=tpu-v4,tpu-v5e

The student, its optimizer and its placement are those of
`experiments/configs/distill_drafter.py:<--distill_config>` (`paper`: one decoder layer at the
teacher's width over the teacher's encoder, AdamW, replicated), completed for the teacher by
`distill.student_config_for`; the teacher has the public shapes `t5.CONFIGS[--teacher]` (`t5-11b`:
T5 v1.0 11B, the checkpoint `ende.py:paper` and `distill_drafter.py:paper` read), params in
--teacher_param_dtype computing in float32 (what `pretrained.load_model` gives for a T5X
checkpoint), sharded by `sharding.DEFAULT_RULES` over 'model' as `distill` shards it.

The rows of --compile_for (MACHINE[:DATAxMODEL] items: a machine without a mesh, every row of its
chip) compile the step with the chip's own compiler for their compile-only devices (`machines.compile_only_mesh`; XLA:TPU comes with libtpu, `pip install
'jax[tpu]'`), as planned: the memory is that program's, and fits is the compiler's yes or no. The
others compile on as many simulated XLA:CPU devices as the largest of them has
(`machines.simulate_cpu_devices`), whose buffers bound the accelerator's. For each machine and
DATAxMODEL mesh of --machines and each batch size it builds, with nothing allocated, the teacher's
params (`synthetic.abstract_model`), the student's step-0 train state (`jax.eval_shape` of
`trainer.init_state`, placed by `trainer.state_shardings`) and a batch split over 'data', each a
`jax.ShapeDtypeStruct` carrying its `NamedSharding`; lowers `trainer.compile_step` of
`distill_loss.distill_step` (the live-teacher step, `cache_teacher=False`: the teacher's encoder and
decoder run in every step) and compiles it. Per device it prints:

  teacher   bytes of the teacher's params (its shard of every leaf);
  state     bytes of the student's params and AdamW moments (float32) and the step counters;
  batch     bytes of the batch's rows (int32 ids, bool masks);
  compiled  the step's `memory_analysis()`: argument (= teacher + state + batch), output, temp,
            the compiler's peak of live bytes, and total = argument + output + temp - alias (the
            state is donated), the bound;
  fits      by the chip's own compiler: 'yes' if it compiled the step and its peak fits the
            chip's HBM (`benchmarks.machines`), 'no' if not or if it refused the step for want
            of memory (its message is printed under the table). On XLA:CPU: 'yes' if the total
            fits, 'no' if even teacher + state + batch do not, 'maybe' in between;
  forward   the teacher's forward per step on the roofline of the machine's chip
            (`distill_model.forward_cost`: max(FLOPs / peak, weight bytes / HBM bandwidth) per
            chip; the chips' constants and their sources are in benchmarks/machines.py). Not modelled:
            the model-parallel collectives, the student's own step (its FLOPs per chip are
            printed beside it, the student / teacher column), and the chip's efficiency (the
            roofline is a lower bound on the time).

XLA:CPU compiles the program the step runs on an accelerator (same shapes, shardings and
dtypes: the teacher computes in float32 from its bf16 weights there too), so its buffer sizes
bound the plan; the CPU's own scheduling decides the temporaries, an accelerator's differ (the
reason for --compile_for). Nothing runs; nothing is timed.

The computations live in `benchmarks/distill_model.py` (no flags); this file makes the devices,
reads the flags and prints (the command to rerun first). Results, with the exact command and the CPU:
docs/results/memory_plan.md.
"""

import shlex
import sys

import jax
from absl import app, flags

import benchmarks
from benchmarks import distill_model, machines, synthetic
from experiments.configs import distill_drafter
from specdec_jax.measure import tables
from specdec_jax.models import t5
from specdec_jax.training import distill

DEFAULT_MACHINES = 'v4-8:1x4,v4-8:2x2,v4-32:4x4,v5e-8:1x8,v5e-8:2x4,h100:1x1'

# This main's own flags (`benchmarks.run`).
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
_COMPILE_FOR = benchmarks.define_compile_for(
  "Rows of --machines compiled by their own compiler (XLA:TPU from libtpu) for the machine's "
  "compile-only devices, as planned: fits is that compiler's yes / no. A MACHINE without a mesh "
  '(tpu-v4) takes every row of its chip; with one (v4-8:1x4), that row. The other rows compile '
  'on simulated XLA:CPU devices (bounds).',
  FLAGS,
)
_COMPILE, _COMPILE_DTYPE = benchmarks.define_compile(
  'the step', 'shapes and roofline', '--teacher_param_dtype', FLAGS
)


_REFUSED = []  # the compiler's messages of the steps it refused for want of memory


def _print_row(row: dict) -> None:
  compiled = [row.get(k) for k in ('argument', 'output', 'temp', 'peak', 'total')]
  cells = [row['machine'], row['mesh'], str(row['batch']), row['compiler']]
  cells += [tables.gib(row[k]) for k in ('teacher', 'state', 'batch_bytes')]
  cells += ['-' if v is None else tables.gib(v) for v in compiled]
  cells += [row['fits'], f'{row["forward_seconds"] * 1e3:.1f}', row['forward_bound']]
  cells += [f'{300 * row["student_forward"].flops / row["forward"].flops:.1f}%']
  cells += [f'{row.get("compile_seconds", 0):.0f}']
  print('| ' + ' | '.join(cells) + ' |', flush=True)
  if 'out_of_memory' in row:
    _REFUSED.append(f'{row["machine"]} {row["mesh"]} batch {row["batch"]}: {row["out_of_memory"]}')


def _meshes() -> tuple[list[tuple[str, int, int]], set]:
  """(--machines' (machine, data, model) items, what --compile_for compiles with its own
  compiler: chips and rows), checked; the host gets as many simulated XLA:CPU devices as the
  largest mesh compiled there."""
  try:
    meshes = machines.parse_machine_mesh(_MACHINES.value)
  except ValueError as e:
    raise app.UsageError(f'--machines={_MACHINES.value}: {e}') from e
  own = set()
  for name, mesh in benchmarks.compile_for(_COMPILE_FOR) if _COMPILE.value else ():
    own.add(machines.get(name).chip if mesh is None else (name, *mesh))
  on_cpu = [d * m for name, d, m in meshes if machines.get(name).chip not in own
            and (name, d, m) not in own]  # fmt: skip
  machines.simulate_cpu_devices(max(on_cpu, default=1))
  return meshes, own


def _print_header(teacher, config, student, student_params, shape, compile_dtype) -> None:
  print('python -m benchmarks.distill_plan ' + shlex.join(sys.argv[1:]))
  print(
    f'teacher {_TEACHER.value} ({t5.param_count(teacher.params) / 1e9:.2f}B params, '
    f'{_TEACHER_PARAM_DTYPE.value}, computing in float32, sharded over model); student '
    f'distill_drafter.py:{_DISTILL_CONFIG.value} ({t5.param_count(student_params) / 1e6:.1f}M '
    f'params, float32, AdamW, {config.student_sharding}, divergence {config.divergence}): '
    f'{student}; source {shape["source_length"]}, target {shape["target_length"]}; compiled by '
    f'XLA:TPU for {", ".join(n.strip() for n in (_COMPILE_FOR.value or "").split(",") if n.strip()) or "no chip"} (compile-only, as planned: '
    f"nothing ran), else on simulated cpu devices with the teacher's params in "
    f'{compile_dtype or "-"}.'
  )
  print(
    "\nGiB per device. argument / output / temp / peak: the compiled step (peak: its compiler's "
    'peak of live bytes); total = teacher + student state + batch + output + temp - alias. Fits: '
    "by the chip's own compiler (compiler tpu), the step compiled and its peak fits the HBM; on "
    'cpu, bounds (maybe between them). Teacher forward: per step on the roofline of the '
    "machine's chip. Student / teacher: the student's forward and backward (3 x its forward) "
    "in FLOPs per chip, against the teacher's forward."
  )
  print(
    '\n| machine | mesh | batch | compiler | teacher | student state | batch | argument | output | '
    'temp | peak | total | fits | teacher forward (ms) | bound | student / teacher | compile (s) |'
  )
  print('|---|---|---:|---|' + '---:|' * 13)


def main(argv):
  del argv
  meshes, own = _meshes()
  teacher_config = synthetic.shape(_TEACHER.value, dtype='float32')
  config = distill_drafter.get_config(_DISTILL_CONFIG.value)
  one = jax.sharding.AbstractMesh((1, 1), ('data', 'model'))
  teacher = synthetic.abstract_model(
    teacher_config, one, param_dtype=_TEACHER_PARAM_DTYPE.value, shard=True
  )
  student = distill.student_config_for(config, teacher)
  student_params = synthetic.abstract_model(student).params  # its shapes, for the count
  batches = [int(b) for b in _BATCH.value]
  shape = dict(source_length=_SOURCE_LENGTH.value, target_length=_TARGET_LENGTH.value)
  compile_dtype = _COMPILE_DTYPE.value if _COMPILE.value else None
  _print_header(teacher, config, student, student_params, shape, compile_dtype)
  distill_model.distill_rows(
    teacher_config,
    config,
    meshes,
    batches,
    teacher_param_dtype=_TEACHER_PARAM_DTYPE.value,
    compile_dtype=compile_dtype,
    compile_for=own,
    log=_print_row,
    **shape,
  )
  for line in _REFUSED:
    print(f'  {line}')

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
  benchmarks.run(main, FLAGS)
