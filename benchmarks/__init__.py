"""Benchmark mains: each prints ratios measured in one run (these machines are noisy).

Every main keeps its flags on its own `FlagValues` and ends with `benchmarks.run(main, FLAGS)`
(several define --target, --dtype, ... and one process, the test suite, imports them all). Every
decode benchmark calls `start()` first in its main, so that its few-row dots run on the kernels
the main job uses (`specdec_jax.measure.xla_cpu`); `--noeigen_dots` keeps XLA:CPU's default.
A benchmark that decodes a shipped pair loads it with `load_pair`, in the main job's decoder layout.
"""

import sys

from absl import app, flags, logging

from benchmarks import machines
from specdec_jax import pretrained
from specdec_jax.measure import job_config, xla_cpu

_EIGEN_DOTS = flags.DEFINE_bool(
  'eigen_dots',
  True,
  "Few-row dots on XLA's own kernels, as the main job runs them (xla_cpu.prefer_eigen_dots); "
  "--noeigen_dots for XLA:CPU's default (YNNPACK).",
)


def start() -> None:
  """The XLA:CPU options of --eigen_dots; call before JAX starts (first thing in main)."""
  if _EIGEN_DOTS.value:
    xla_cpu.prefer_eigen_dots()


def load_pair(name_or_dir: str) -> pretrained.Pair:
  """A shipped pair (`pretrained.load`, one device) in the decoder layout the main job decodes it
  in here (`job_config.fastest_layout`: fused projections but on one TPU chip), so that a
  benchmark's autoregressive baseline is the main job's."""
  pair = pretrained.load(name_or_dir)
  return pretrained.fuse_pair(pair) if job_config.fastest_layout(None) == 'fused' else pair


def define_compile_for(
  help_: str, flag_values: flags.FlagValues, default: str | None = None
) -> flags.FlagHolder:
  """--compile_for on a main's own flags, in the one convention of every benchmark:
  MACHINE[:DATAxMODEL][,...] (`machines.parse_machines`); read it with `compile_for`."""
  return flags.DEFINE_string(
    'compile_for',
    default,
    f'MACHINE[:DATAxMODEL],... with MACHINE one of {", ".join(machines.MACHINES)}: compile '
    f'for it, compile-only (any host; nothing runs). {help_}',
    flag_values=flag_values,
  )


def define_compile(
  what: str, skipped: str, planned: str, flag_values: flags.FlagValues
) -> tuple[flags.FlagHolder, flags.FlagHolder]:
  """--compile and --compile_dtype of a memory planner: whether to compile `what` (off:
  `skipped` only), and on XLA:CPU in float32 or with the params as planned (`planned`: the flags
  that plan them)."""
  compile_ = flags.DEFINE_bool(
    'compile', True, f'Compile {what} (off: {skipped} only).', flag_values=flag_values
  )
  dtype = flags.DEFINE_enum(
    'compile_dtype',
    'float32',
    ['float32', 'params'],
    f'On XLA:CPU (without --compile_for): compile {what} in float32 (whose temporaries bound the '
    f"planned dtype's) or as planned ({planned}: XLA:CPU then adds a float32 copy of the bf16 "
    'weights to the temporaries).',
    flag_values=flag_values,
  )
  return compile_, dtype


def compile_for(holder: flags.FlagHolder, *, one_chip: bool = False) -> list:
  """--compile_for's items, [(machine name, (data, model) or None)], [] where it is unset;
  `one_chip`: at most one item, a machine of one device (its name, or None). UsageError naming the
  convention."""
  if not holder.value:
    return None if one_chip else []
  try:
    items = machines.parse_machines(holder.value)
  except ValueError as e:
    raise app.UsageError(f'--compile_for={holder.value}: {e}') from e
  if not one_chip:
    return items
  if len(items) != 1 or machines.get(items[0][0]).devices != 1:
    one = sorted(n for n, m in machines.MACHINES.items() if m.devices == 1)
    raise app.UsageError(f'--compile_for={holder.value}: this main compiles for one chip: {one}.')
  return items[0][0]


def quiet_checkpoint_logs() -> None:
  """Warnings and up alone, unless --verbosity says otherwise: orbax logs every file it reads at
  INFO, and a main that loads a shipped pair would print pages of it."""
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


def run(main, own: flags.FlagValues) -> None:
  """`app.run(main)` with `own`, the main's own flags, parsed beside absl's (`flags_parser`)."""
  app.run(main, flags_parser=flags_parser(own))


def flags_parser(own: flags.FlagValues):
  """The flags parser of `run`, for a main whose flags are its own `FlagValues`
  (`flag_values=FLAGS` in each DEFINE): they join absl's flags only when the main runs, listed in
  --help as its own."""

  def parse(argv: list[str]) -> list[str]:
    flags.FLAGS.append_flag_values(own)
    for name in own:
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], own[name])
    argv = app.parse_flags_with_usage(argv)
    own.mark_as_parsed()
    return argv

  return parse
