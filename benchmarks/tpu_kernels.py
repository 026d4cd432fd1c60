r"""What XLA:TPU makes of our decode loops: the ops of one iteration and their estimated cycles.

  python -m benchmarks.tpu_kernels                      # T5 11B + T5-small, one v4 chip and v4-8 1x4
  python -m benchmarks.tpu_kernels --compile_for=tpu-v4 --variants=as_is,no_dot_strength_reduction
  python -m benchmarks.tpu_kernels --compile_for=tpu-v5e --target=t5-small --drafter=tiny  # any

Compiles `decode.lower_speculative` (greedy by default) and `decode.lower_generate` for compile-only
TPU devices (`machines.compile_only_mesh`; nothing runs, any host: libtpu is the compiler) at the
paper's shapes by default (T5 11B v1.0 target sharded over 'model' by the project's rules, T5-small
replicated, bf16 params from `synthetic.abstract_model`, batch 1, source 64, 64 new tokens),
and reads XLA:TPU's estimated cycles of every op (`tpu_costs`): estimates, not timings.

Per iteration of each loop (the decode while loop's body and condition, the draft's scan counted
gamma - 1 times): estimated cycles by part (the `jax.named_scope`s of decode.py / decode_steps.py:
target pass, drafter, sampling, verify, emit, and the loop's own work) and by kind of op
(`tpu_costs.kind`: MXU matmuls, multiply+reduce GEMVs, layout copies, cache writes, ...); what
runs once a call outside the loop (the encoder, and anything XLA hoisted out of the loop: weights
copied to another layout, once a call, held as temporaries); XLA:TPU's memory per device
(arguments, temporaries); collectives per iteration (XLA:TPU gives them no estimate: not in the
cycles). `--variants` compiles the same loops with a change the cost model can judge:

- as_is: the code and XLA's defaults.
- no_dot_strength_reduction: `xla_tpu_enable_dot_strength_reduction=False` (a compiler option;
  `LIBTPU_INIT_ARGS=--xla_tpu_enable_dot_strength_reduction=false` on a TPU VM): a one-row dot
  stays a matmul on the MXU instead of becoming a multiply and a reduction on the vector units.
- auto_param_layouts: the loop's params take the layouts XLA chooses (`Format(Layout.AUTO)` on the
  jit's param inputs; a caller would then place the params in `compiled.input_formats`).

Results: docs/performance.md, "What XLA:TPU shows".
"""

import collections
import dataclasses
import functools

import jax
import jax.numpy as jnp
from absl import app, flags
from jax.experimental.layout import Format, Layout
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
from benchmarks import machines, synthetic, tpu_costs
from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import tables

FLAGS = flags.FlagValues()
_TARGET = flags.DEFINE_string('target', 't5-11b', 'Target: a t5.CONFIGS name.', flag_values=FLAGS)
_DRAFTER = flags.DEFINE_string(
  'drafter', 't5-small', 'Drafter: a t5.CONFIGS name (shares the vocabulary).', flag_values=FLAGS
)
_COMPILE_FOR = benchmarks.define_compile_for(
  'A machine without a mesh has all its devices on model; the target is sharded by the project '
  'rules.',
  FLAGS,
  default='tpu-v4,v4-8:1x4',
)
_VARIANTS = flags.DEFINE_list(
  'variants', ['as_is'], 'Of: as_is, no_dot_strength_reduction, auto_param_layouts.',
  flag_values=FLAGS,
)  # fmt: skip
_GAMMA = flags.DEFINE_integer('gamma', 7, 'Drafts per iteration.', flag_values=FLAGS)
_TEMPERATURE = flags.DEFINE_float('temperature', 0.0, 'Sampling temperature.', flag_values=FLAGS)
_BATCH = flags.DEFINE_integer('batch', 1, 'Rows.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer('source_length', 64, 'Source tokens.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Token limit.', flag_values=FLAGS)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'bfloat16', ['bfloat16', 'float32'], 'Params and compute.', flag_values=FLAGS
)
_CACHE = flags.DEFINE_string(
  'compile_cache', None, 'Keep compiled programs here (11B programs take minutes).',
  flag_values=FLAGS,
)  # fmt: skip
_TOP = flags.DEFINE_integer(
  'top', 8, 'Also list the most expensive ops of an iteration (0: none).', flag_values=FLAGS
)

VARIANTS = ('as_is', 'no_dot_strength_reduction', 'auto_param_layouts')
NO_STRENGTH_REDUCTION = {'xla_tpu_enable_dot_strength_reduction': False}
PARTS = ('target', 'drafter', 'sampling', 'verify', 'emit', 'loop')
KINDS = (*tpu_costs.KINDS[:3], 'cache write (layout copy)', *tpu_costs.KINDS[3:])
COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all')


@dataclasses.dataclass(frozen=True)
class LoopReport:
  """One compiled decode loop, read: cycles of an iteration by (part, kind), ops and collectives
  an iteration by part, cycles once a call outside the loop by (part, kind), memory (bytes)."""

  iteration: dict
  ops: dict
  collectives: dict
  outside: dict
  argument_bytes: int
  temp_bytes: int
  top: list

  @property
  def per_iteration(self) -> int:
    return sum(self.iteration.values())


def kind(op: tpu_costs.Op) -> str:
  """`tpu_costs.kind`, with the layout copies a cache write makes named apart."""
  found = tpu_costs.kind(op)
  if found == 'layout copy' and op.op_name.endswith('/scatter'):
    return 'cache write (layout copy)'
  return found


def read(compiled: tpu_costs.Compiled, top: int = 0) -> LoopReport:
  """`LoopReport` of a compiled `speculative_loop` or `autoregressive_loop`."""
  program = compiled.program
  loop = program.traced_loop()  # the decode loop
  body, condition = loop.runs
  inner = program.traced_loops(body)
  if inner:
    raise ValueError(f'A loop inside the decode loop has no trip count: {inner[0].name}.')
  iteration, ops, collectives = collections.Counter(), collections.Counter(), collections.Counter()
  costly = collections.Counter()
  for name in (body, condition):
    for op, times in program.flat(name):
      part = tpu_costs.scope(op)
      iteration[part, kind(op)] += op.cycles * times
      if op.cycles:
        ops[part] += times
        label = op.shape.split('{')[0][:40]
        costly[part, kind(op), label, op.op_name.rsplit('/', 1)[-1]] += op.cycles * times
      if op.opcode.removesuffix('-start') in COLLECTIVES:
        collectives[part] += times
  outside = collections.Counter()
  for op in program.computations[program.entry]:
    if op is not loop:
      for sub, times in program.flat_op(op):
        outside[tpu_costs.scope(sub), kind(sub)] += sub.cycles * times
  return LoopReport(
    iteration=dict(iteration),
    ops=dict(ops),
    collectives=dict(collectives),
    outside=dict(outside),
    argument_bytes=compiled.argument_bytes,
    temp_bytes=compiled.temp_bytes,
    top=costly.most_common(top),
  )


def models(mesh, target: str, drafter: str, dtype: str):
  """(target, drafter) `T5Model`s of abstract params on `mesh`: the target sharded by the project
  rules when the mesh has a 'model' axis over 1, the drafter replicated."""
  config = lambda name: synthetic.shape(name, dtype)
  split = mesh.shape['model'] > 1
  return (
    synthetic.abstract_model(config(target), mesh, param_dtype=dtype, shard=split),
    synthetic.abstract_model(config(drafter), mesh, param_dtype=dtype, shard=False),
  )


def compile_loops(machine: str, data: int, model: int, variant: str) -> dict:
  """{'speculative': Compiled, 'generate': Compiled} for one machine mesh and variant."""
  if variant not in VARIANTS:
    raise ValueError(f'Unknown variant {variant!r}; one of {VARIANTS}.')
  mesh = machines.compile_only_mesh(machine, data, model)
  target, drafter = models(mesh, _TARGET.value, _DRAFTER.value, _DTYPE.value)
  replicated = NamedSharding(mesh, P())
  ids = jax.ShapeDtypeStruct((_BATCH.value, _SOURCE_LENGTH.value), jnp.int32, sharding=replicated)
  sampling = sampling_lib.SamplingConfig(temperature=_TEMPERATURE.value)
  options = NO_STRENGTH_REDUCTION if variant == 'no_dot_strength_reduction' else None
  tag = f'{machine}:{data}x{model}:{variant}'
  compile_ = functools.partial(
    tpu_costs.compile_lowered, tag=tag, options=options, cache_dir=_CACHE.value
  )
  with jax.set_mesh(mesh):
    if variant == 'auto_param_layouts':
      lowered = _auto_layout_loops(target, drafter, ids, sampling, replicated)
    else:
      lowered = dict(
        speculative=decode.lower_speculative(
          target, drafter, ids, ids, gamma=_GAMMA.value, sampling=sampling,
          max_new_tokens=_MAX_NEW.value,
        ),
        generate=decode.lower_generate(
          target, ids, ids, sampling=sampling, max_new_tokens=_MAX_NEW.value
        ),
      )  # fmt: skip
    return {name: compile_(low) for name, low in lowered.items()}


def _auto_layout_loops(target, drafter, ids, sampling, replicated) -> dict:
  """The two loops lowered with `Format(Layout.AUTO)` on every param: XLA picks their layouts."""
  auto = lambda params: jax.tree.map(lambda x: Format(Layout.AUTO, x.sharding), params)
  key = jax.eval_shape(lambda: jax.random.key(0))
  spec = decode.LoopSpec(sampling=sampling, max_new_tokens=_MAX_NEW.value, gamma=_GAMMA.value)
  ts, ds = target.steps, drafter.steps

  def speculative(tp, dp, i, m, k):
    return decode.speculative_loop(ts, tp, ds, dp, i, m, k, spec=spec)

  def generate(tp, i, m, k):
    ar_spec = decode.LoopSpec(sampling=sampling, max_new_tokens=_MAX_NEW.value)
    return decode.autoregressive_loop(ts, tp, i, m, k, spec=ar_spec)

  inputs = (replicated, replicated, replicated)
  spec_in = (auto(target.params), auto(drafter.params), *inputs)
  return dict(
    speculative=jax.jit(speculative, in_shardings=spec_in).lower(
      target.params, drafter.params, ids, ids, key
    ),
    generate=jax.jit(generate, in_shardings=(auto(target.params), *inputs)).lower(
      target.params, ids, ids, key
    ),
  )


def _mcycles(counter: dict, part=None, kind_=None) -> float:
  return (
    sum(
      v
      for (p, k), v in counter.items()
      if (part is None or p == part) and (kind_ is None or k == kind_)
    )
    / 1e6
  )


def print_report(label: str, reports: dict) -> None:
  """The tables of one machine mesh and variant."""
  spec, gen = reports['speculative'], reports['generate']
  kinds = sorted({k for _, k in spec.iteration} | {k for _, k in gen.iteration})
  kinds = [
    k for k in kinds if _mcycles(spec.iteration, kind_=k) or _mcycles(gen.iteration, kind_=k)
  ]
  print(
    f'\n== {label}: per iteration, estimated Mcycles by part and kind of op (speculative: gamma '
    f'{_GAMMA.value}, its draft scan counted {_GAMMA.value - 1} times); ops with an estimate; '
    'collectives (no estimate)'
  )
  rows = []
  for loop_name, report in (('speculative', spec), ('generate', gen)):
    for part in PARTS:
      total = _mcycles(report.iteration, part)
      if not total and not report.collectives.get(part):
        continue
      rows.append(
        dict(
          loop=loop_name,
          part=part,
          total=total,
          ops=report.ops.get(part, 0),
          collectives=report.collectives.get(part, 0),
          **{k: _mcycles(report.iteration, part, k) for k in kinds},
        )
      )
    rows.append(
      dict(
        loop=loop_name,
        part='iteration',
        total=report.per_iteration / 1e6,
        ops=sum(report.ops.values()),
        collectives=sum(report.collectives.values()),
        **{k: _mcycles(report.iteration, None, k) for k in kinds},
      )
    )
  columns = (
    tables.Column('loop', align='<', width=11),
    tables.Column('part', align='<', width=9),
    tables.Column('total', 'Mcycles', '.3f', 8),
    tables.Column('ops', fmt='d', width=5),
    tables.Column('collectives', 'coll.', 'd', 5),
  ) + tuple(tables.Column(k, _short(k), '.3f', max(8, len(_short(k)))) for k in kinds)
  print(tables.format_table(rows, columns))
  print(
    f'speculative iteration / autoregressive iteration: {spec.per_iteration / gen.per_iteration:.3f}'
  )
  for loop_name, report in (('speculative', spec), ('generate', gen)):
    outside = {f'{p}/{_short(k)}': v / 1e6 for (p, k), v in report.outside.items() if v}
    top = ', '.join(f'{k} {v:.3f}' for k, v in sorted(outside.items(), key=lambda x: -x[1])[:5])
    print(
      f'{loop_name}: once a call outside the loop {sum(report.outside.values()) / 1e6:.3f} '
      f'Mcycles ({top}); per device: arguments {report.argument_bytes / machines.GiB:.2f} GiB, '
      f'temporaries {report.temp_bytes / machines.GiB:.2f} GiB'
    )
  if spec.top:
    print('most expensive ops of a speculative iteration (Mcycles, summed over like ops):')
    for (part, kind_, shape, name), cycles in spec.top:
      print(f'  {cycles / 1e6:8.3f}  {part:8s} {_short(kind_):14s} {shape:40s} {name}')


def _short(kind_: str) -> str:
  return {
    'matmul (MXU)': 'MXU',
    'gemv (multiply+reduce)': 'GEMV',
    'layout copy': 'copy',
    'cache write (layout copy)': 'cache copy',
    'cache write': 'cache write',
    'elementwise / other': 'other',
    'loop control': 'control',
  }.get(kind_, kind_)


def main(argv):
  del argv
  benchmarks.start()
  for variant in _VARIANTS.value:
    if variant not in VARIANTS:
      raise app.UsageError(f'--variants: {variant!r} is not one of {VARIANTS}.')
  meshes = [machines.for_mesh(*item) for item in benchmarks.compile_for(_COMPILE_FOR)]
  print(
    f'{_TARGET.value} target + {_DRAFTER.value} drafter, {_DTYPE.value}, batch {_BATCH.value}, '
    f'source {_SOURCE_LENGTH.value}, {_MAX_NEW.value} new tokens, temperature '
    f'{_TEMPERATURE.value:g}; {tpu_costs.versions()}; XLA:TPU estimated cycles of compiled '
    'programs (compile-only: estimates, not timings)',
    flush=True,
  )
  summary = []
  for machine, data, model in meshes:
    for variant in _VARIANTS.value:
      compiled = compile_loops(machine, data, model, variant)
      reports = {name: read(c, _TOP.value) for name, c in compiled.items()}
      label = f'{machine} {data}x{model}, {variant}'
      print_report(label, reports)
      spec, gen = reports['speculative'], reports['generate']
      summary.append(
        dict(
          mesh=f'{machine}:{data}x{model}',
          variant=variant,
          iteration=spec.per_iteration / 1e6,
          target=_mcycles(spec.iteration, 'target'),
          drafter=_mcycles(spec.iteration, 'drafter') + _mcycles(spec.iteration, 'sampling'),
          step=gen.per_iteration / 1e6,
          ratio=spec.per_iteration / gen.per_iteration,
          outside=sum(spec.outside.values()) / 1e6,
          temp=spec.temp_bytes / machines.GiB,
        )
      )
  columns = (
    tables.Column('mesh', align='<', width=14),
    tables.Column('variant', align='<', width=26),
    tables.Column('iteration', 'spec. iteration', '.3f'),
    tables.Column('target', 'target pass', '.3f'),
    tables.Column('drafter', 'draft', '.3f'),
    tables.Column('step', 'AR iteration', '.3f'),
    tables.Column('ratio', 'spec. / AR', '.3f'),
    tables.Column('outside', 'spec. outside', '.3f'),
    tables.Column('temp', 'spec. temp GiB', '.2f'),
  )
  print(f'\nsummary (Mcycles per iteration; per device)\n{tables.format_table(summary, columns)}')


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
