r"""The first hour on a TPU VM: the grown pair's costs measured where docs/results.md section 14
only has XLA:TPU's estimates, then its main job, then the table that replaces the estimates.

  python -m scripts.tpu_hour                                # on a v4-8: every stage, ~1 hour
  python -m scripts.tpu_hour --dry_run --machine=v4-8       # anywhere: the plan, compiled for it

The pair is a shipped one (`--pair`, ende48m) with its target grown to `--grow_to` (t5_1_1-xxl:
11B params, the paper's target's cost; `pretrained.grow_pair`, built on the devices in
`--param_dtype`), computing what the shipped target computes. Stages, each its own process (libtpu
reads LIBTPU_INIT_ARGS once, when it starts):

  costs   for each mesh of `--meshes` (1x1: one chip; 1x4: the v4-8, the drafters replicated) and
          each variant of `--variants` (as_is; no_dot_strength_reduction, i.e.
          LIBTPU_INIT_ARGS=--xla_tpu_enable_dot_strength_reduction=false, which makes XLA:TPU run
          a one-row dot on the MXU rather than as a multiply and a reduction): `timing.step_costs`
          of the target with each drafter at `--gamma`: a target step's and a (gamma+1)-position
          pass's seconds, each drafter's call (c, c_alone), in the loop.
  main    the grown pair's main job, `experiments/configs/ende.py:xxl` (as is), its rows in
          `--workdir`/main.

Then the table: per mesh, variant and drafter, the step and the pass in ms, the pass cost, c, and
the formula's speedup (`analysis.walltime_improvement_measured`) at the paper's alpha (0.75, T5-small
on EnDe at T=0) and at the pair's alpha measured by the main job. With `--dry_run` nothing runs:
it prints each stage's command and compiles, for the compile-only devices of `--machine`, what the
stages would run (the grown target's build, `generate`, `speculative_generate` with each drafter),
printing each program's memory per device and XLA:TPU's estimated cycles of a loop iteration.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

from absl import app, flags

FLAGS = flags.FlagValues()
_PAIR = flags.DEFINE_string(
  'pair', 'ende48m', 'A shipped pair (pretrained/<pair>).', flag_values=FLAGS
)
_GROW_TO = flags.DEFINE_string(
  'grow_to', 't5_1_1-xxl', 'T5 shape of the grown target.', flag_values=FLAGS
)
_DTYPE = flags.DEFINE_string(
  'param_dtype', 'bfloat16', "The grown target's params.", flag_values=FLAGS
)
_DRAFTERS = flags.DEFINE_list(
  'drafters', ['distilled', 'trigram', 'bigram'], "The pair's drafters to time.", flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 5, 'Drafts per iteration.', flag_values=FLAGS)
_MESHES = flags.DEFINE_list('meshes', ['1x1', '1x4'], 'DATAxMODEL meshes.', flag_values=FLAGS)
_VARIANTS = flags.DEFINE_list(
  'variants', ['as_is', 'no_dot_strength_reduction'], 'Compiler settings.', flag_values=FLAGS
)
_SOURCE = flags.DEFINE_integer('source_length', 64, 'Source tokens.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Token limit.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timing rounds (the median).', flag_values=FLAGS)
_WORKDIR = flags.DEFINE_string('workdir', '/tmp/tpu_hour', 'Outputs.', flag_values=FLAGS)
_MAIN = flags.DEFINE_string(
  'main', 'experiments/configs/ende.py:xxl', 'The main job config ("" skips it).', flag_values=FLAGS
)
_DRY_RUN = flags.DEFINE_bool(
  'dry_run', False, 'Print the plan, compile it; run nothing.', flag_values=FLAGS
)
_MACHINE = flags.DEFINE_string(
  'machine', 'v4-8', 'The machine --dry_run compiles for.', flag_values=FLAGS
)
_STAGE = flags.DEFINE_string(
  'stage', '', 'Internal: one stage, in this process.', flag_values=FLAGS
)

VARIANT_ENV = {
  'as_is': '',
  'no_dot_strength_reduction': '--xla_tpu_enable_dot_strength_reduction=false',
}
VARIANT_OPTIONS = {
  'as_is': None,
  'no_dot_strength_reduction': {'xla_tpu_enable_dot_strength_reduction': False},
}
PAPER_ALPHA = 0.75  # Leviathan et al. 2023, Table 3: T5-small drafting for T5-XXL, EnDe, T=0
_COSTS = 'COSTS '  # the prefix of a costs stage's JSON lines


@dataclasses.dataclass(frozen=True)
class Stage:
  """One process of the hour: its argv and the LIBTPU_INIT_ARGS it runs under."""

  name: str
  argv: tuple[str, ...]
  libtpu_args: str = ''

  def command(self) -> str:
    env = f'LIBTPU_INIT_ARGS={self.libtpu_args} ' if self.libtpu_args else ''
    return env + ' '.join(self.argv)


def _common_flags() -> list[str]:
  return [
    f'--pair={_PAIR.value}', f'--grow_to={_GROW_TO.value}', f'--param_dtype={_DTYPE.value}',
    f'--drafters={",".join(_DRAFTERS.value)}', f'--gamma={_GAMMA.value}',
    f'--source_length={_SOURCE.value}', f'--max_new_tokens={_MAX_NEW.value}',
    f'--rounds={_ROUNDS.value}',
  ]  # fmt: skip


def plan() -> list[Stage]:
  """Every stage, in order: the costs of each mesh and variant, then the main job."""
  for variant in _VARIANTS.value:
    if variant not in VARIANT_ENV:
      raise app.UsageError(f'--variants: {variant!r} is not one of {sorted(VARIANT_ENV)}.')
  stages = [
    Stage(
      f'costs {mesh} {variant}',
      (
        sys.executable,
        '-m',
        'scripts.tpu_hour',
        '--stage=costs',
        f'--meshes={mesh}',
        *_common_flags(),
      ),
      VARIANT_ENV[variant],
    )
    for mesh in _MESHES.value
    for variant in _VARIANTS.value
  ]
  if _MAIN.value:
    workdir = os.path.join(_WORKDIR.value, 'main')
    argv = (
      sys.executable,
      '-m',
      'experiments.translate',
      f'--config={_MAIN.value}',
      f'--workdir={workdir}',
    )
    stages.append(Stage('main', argv))
  return stages


def _grown_pair(mesh):
  from specdec_jax import pretrained

  pair = pretrained.load(_PAIR.value, mesh=mesh, drafter_sharding='replicated')
  return pretrained.grow_pair(pair, _GROW_TO.value, mesh=mesh, param_dtype=_DTYPE.value)


def costs_stage() -> None:
  """The costs of one mesh under this process's LIBTPU_INIT_ARGS: a JSON line per drafter."""
  from specdec_jax import decode, sharding
  from specdec_jax.measure import timing, translation

  (spec,) = _MESHES.value
  mesh = sharding.mesh_from_spec(spec, 1)
  mesh = None if mesh.size == 1 else mesh
  pair = _grown_pair(mesh)
  with translation.on_mesh(mesh):
    for name in _DRAFTERS.value:
      cost = timing.step_costs(
        pair.target, pair.drafters[name], batch_size=1, source_length=_SOURCE.value,
        gamma=_GAMMA.value, cache_len=decode.buffer_length(_MAX_NEW.value, _GAMMA.value),
        rounds=_ROUNDS.value,
      )  # fmt: skip
      line = dict(mesh=spec, libtpu_args=os.environ.get('LIBTPU_INIT_ARGS', ''), drafter=name)
      print(_COSTS + json.dumps(dict(line, **cost)), flush=True)


def table(costs: list[dict], alphas: dict[str, float]) -> str:
  """The table that replaces section 13's estimates: a row per costs line."""
  from specdec_jax import analysis
  from specdec_jax.measure import tables

  rows = []
  for c in costs:
    formula = lambda alpha: float(
      analysis.walltime_improvement_measured(
        alpha, _GAMMA.value, c['c'], c['pass_cost'], c['c_fixed']
      )
    )
    alpha = alphas.get(c['drafter'])
    rows.append(
      dict(
        mesh=c['mesh'],
        variant='no_dot_strength_reduction' if c['libtpu_args'] else 'as_is',
        drafter=c['drafter'],
        step=c['target_step'] * 1e3,
        pass_=c['target_pass'] * 1e3,
        pass_cost=c['pass_cost'],
        c=c['c'],
        c_alone=c['c_alone'],
        paper=formula(PAPER_ALPHA),
        alpha=alpha,
        ours=None if alpha is None else formula(alpha),
      )
    )
  columns = (
    tables.Column('mesh', align='<', width=5),
    tables.Column('variant', align='<', width=26),
    tables.Column('drafter', align='<', width=9),
    tables.Column('step', 'step ms', '.2f'),
    tables.Column('pass_', f'pass ms ({_GAMMA.value + 1})', '.2f'),
    tables.Column('pass_cost', fmt='.2f'),
    tables.Column('c', fmt='.4f'),
    tables.Column('c_alone', fmt='.4f'),
    tables.Column('paper', f'formula a={PAPER_ALPHA}', '.2f'),
    tables.Column('alpha', 'alpha (T=0)', '.3f'),
    tables.Column('ours', 'formula at alpha', '.2f'),
  )
  return tables.format_table(rows, columns)


def _measured_alphas(workdir: str) -> dict[str, float]:
  """Alpha at temperature 0 of each drafter (its first token-verification row), from a main job's
  results.json; {} where it has none."""
  path = pathlib.Path(workdir) / 'results.json'
  if not path.exists():
    return {}
  out = {}
  for row in json.loads(path.read_text()):
    if row['temp'] == 0 and row['method'] == 'token' and row['gamma'] == _GAMMA.value:
      out.setdefault(row['drafter'], row['alpha'])
  return out


def run(stages: list[Stage]) -> None:
  """Runs every stage, then prints the table."""
  costs = []
  for stage in stages:
    print(f'== {stage.name}: {stage.command()}', flush=True)
    env = dict(os.environ)
    if stage.libtpu_args:
      env['LIBTPU_INIT_ARGS'] = (env.get('LIBTPU_INIT_ARGS', '') + ' ' + stage.libtpu_args).strip()
    out = subprocess.run(stage.argv, env=env, stdout=subprocess.PIPE, text=True, check=True)
    print(out.stdout, end='', flush=True)
    costs += [
      json.loads(line[len(_COSTS) :]) for line in out.stdout.splitlines() if line.startswith(_COSTS)
    ]
  print('\n' + table(costs, _measured_alphas(os.path.join(_WORKDIR.value, 'main'))))


def dry_run(stages: list[Stage]) -> None:
  """Prints the stages and compiles their programs for `--machine`'s compile-only devices."""
  import jax

  from benchmarks import machines, synthetic, tpu_costs, tpu_kernels
  from specdec_jax import decode, pretrained, sharding
  from specdec_jax.models import t5, t5_growth
  from specdec_jax.sampling import SamplingConfig

  for stage in stages:
    print(f'would run: {stage.command()}', flush=True)
  with machines.quiet_libtpu():  # the host's backend starts here: CPU, libtpu told there is no TPU
    jax.devices()
  pair = pretrained.load(_PAIR.value)  # the shipped pair on the host: its shapes, its n-grams
  grown = t5_growth.grown_config(pair.target.config, _GROW_TO.value)
  for spec in _MESHES.value:
    data, model = sharding.parse_mesh(spec)
    machine = machines.with_devices(_MACHINE.value, data * model)
    mesh = machines.compile_only_mesh(machine.name, data, model)
    whole = lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=jax.NamedSharding(mesh, jax.P())
    )
    small = pair.target.replace(params=jax.tree.map(whole, pair.target.params))
    build, target = t5_growth.lower_grow(small, grown, mesh=mesh, param_dtype=_DTYPE.value)
    ids = synthetic.abstract_batch(mesh, 1, _SOURCE.value)
    options = dict(sampling=SamplingConfig(), max_new_tokens=_MAX_NEW.value)
    drafters = {}  # abstract, built before the mesh is set (a key made under it would run there)
    for name in _DRAFTERS.value:
      drafter = pair.drafters[name]
      if isinstance(drafter, t5.T5Model) and drafter.steps.shares_target_encoder:
        drafters[name] = synthetic.abstract_model(
          dataclasses.replace(drafter.config, encoder_dim=grown.d_model), mesh,
          param_dtype=_DTYPE.value, shard=False,
        )  # fmt: skip
      else:
        drafters[name] = dataclasses.replace(drafter, params=jax.tree.map(whole, drafter.params))
    with jax.set_mesh(mesh):
      lowered = {'build': build, 'generate': decode.lower_generate(target, ids, ids, **options)}
      for name, drafter in drafters.items():
        lowered[name] = decode.lower_speculative(
          target, drafter, ids, ids, gamma=_GAMMA.value, **options
        )
    for variant in _VARIANTS.value:
      for name, low in lowered.items():
        where = f'{machine.name} {spec} {variant}: {name}'
        try:
          compiled = tpu_costs.compile_lowered(
            low, tag=f'{machine.name}:{spec}', options=VARIANT_OPTIONS[variant]
          )
        except jax.errors.JaxRuntimeError as e:  # XLA:TPU refuses what exceeds the chip's HBM
          if 'RESOURCE_EXHAUSTED' not in str(e):
            raise
          print(f'does not fit {where}: {str(e).strip().splitlines()[0]}', flush=True)
          continue
        cycles = ''
        if name != 'build':
          cycles = f', {tpu_kernels.read(compiled).per_iteration / 1e6:.3f} Mcycles an iteration'
        print(
          f'compiled for {where}: arguments '
          f'{compiled.argument_bytes / machines.GiB:.2f} GiB, temporaries '
          f'{compiled.temp_bytes / machines.GiB:.2f} GiB a device{cycles}',
          flush=True,
        )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _STAGE.value == 'costs':
    return costs_stage()
  if _STAGE.value:
    raise app.UsageError(f'--stage: only costs, got {_STAGE.value!r}.')
  stages = plan()
  return dry_run(stages) if _DRY_RUN.value else run(stages)


if __name__ == '__main__':
  import benchmarks

  app.run(main, flags_parser=benchmarks.flags_parser(FLAGS))
