"""The one override syntax of every config: `--config=path/to/config.py:item,item,...`.

Items apply in the order written, so a later item wins:
  runlocal                 a variant the config defines (a function that edits the config)
  key=value                sets a field, converted to the type of its default
  student.d_model=128      nested fields with dots
  gammas=3,5,7             a tuple field takes every following item that is not itself a known
                           key=... or variant: `temperatures=0,1e-3,runlocal` is (0.0, 0.001)
                           then the runlocal variant; `drafters=` alone empties it

Booleans are true/false; a field whose default is None takes a string, or `none`.
"""

from collections.abc import Callable

import ml_collections

Variant = Callable[[ml_collections.ConfigDict], None]


def parse(
  arg: str | None, config: ml_collections.ConfigDict, variants: dict[str, Variant] | None = None
) -> ml_collections.ConfigDict:
  """Applies the items of `arg` to `config` (in place) and returns it."""
  variants = variants or {}
  items = [item for item in (arg or '').split(',') if item]
  assignments: list[tuple[str, list[str]]] = []
  plan: list[tuple[str, object]] = []  # ('variant', name) or ('set', (key, values))
  for item in items:
    key = item.split('=', 1)[0]
    if item in variants:
      plan.append(('variant', item))
    elif '=' in item and _has_key(config, key):
      assignments.append((key, [item.split('=', 1)[1]]))
      plan.append(('set', assignments[-1]))
    elif assignments and plan[-1][0] == 'set' and isinstance(_get(config, plan[-1][1][0]), tuple):
      plan[-1][1][1].append(item)  # the next value of a tuple field
    else:
      known = sorted(variants) + sorted(_keys(config))
      raise ValueError(
        f'Unknown config item {item!r} in {arg!r}: use key=value or a variant; '
        f'known: {", ".join(known)}.'
      )
  for kind, what in plan:
    if kind == 'variant':
      variants[what](config)
    else:
      key, values = what
      _set(config, key, _convert(key, _get(config, key), values))
  return config


def _keys(config, prefix=''):
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _keys(value, f'{prefix}{key}.')
    else:
      yield prefix + key


def _has_key(config, key: str) -> bool:
  *parents, last = key.split('.')
  for part in parents:
    if part not in config or not isinstance(config[part], ml_collections.ConfigDict):
      return False
    config = config[part]
  return last in config


def _get(config, key: str):
  for part in key.split('.'):
    config = config[part]
  return config


def _set(config, key: str, value) -> None:
  *parents, last = key.split('.')
  for part in parents:
    config = config[part]
  config[last] = value


def _convert(key: str, default, values: list[str]):
  try:
    if isinstance(default, tuple):
      # An empty default says nothing of its kind: numbers as numbers, anything else as text.
      kind = type(default[0]) if default else type(None)
      return tuple(_scalar(kind, v) for v in values if v)  # `key=` alone: the empty tuple
    if len(values) != 1:
      raise ValueError(f'{key} takes one value, got {values}')
    return _scalar(type(default), values[0])
  except ValueError as e:
    raise ValueError(f'Bad value for config field {key!r} (default {default!r}): {e}') from None


def _scalar(kind, text: str):
  if kind is bool:
    if text.lower() not in ('true', 'false'):
      raise ValueError(f'expected true or false, got {text!r}')
    return text.lower() == 'true'
  if kind is type(None):  # a field that is off by default: None, or a number, or text
    if text.lower() == 'none':
      return None
    for number in (int, float):
      try:
        return number(text)
      except ValueError:
        pass
    return text
  return kind(text)


def flags_parser(argv: list[str]) -> list[str]:
  """`absl.app.run(main, flags_parser=common.flags_parser)`: parses the flags, turning a bad
  `--config.<field>=value` override (an unknown field, a value of the wrong type) into one line
  instead of a traceback from inside ml_collections."""
  import sys

  from absl import flags

  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.exit(f'FATAL Flags parsing error: {e}\nPass --helpshort or --helpfull to see help.')
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    bad = [a for a in argv[1:] if a.startswith('--config.')]
    sys.exit(
      f'Bad config override {" ".join(bad) or ""}: {str(e).strip(chr(34) + chr(39))} '
      '(unknown field or wrong type). The config file lists its fields; items after '
      '":" in --config (e.g. --config=path.py:key=value) are the documented syntax.'
    )


def run_experiment(run: Callable[[ml_collections.ConfigDict, str], object]) -> None:
  """The absl main of an experiment: defines --config (a config file) and --workdir (overrides
  config.workdir), then calls `run(config, workdir)`. Call it under `if __name__ == '__main__'`:
  the flags are defined then, not on import, so tests can import several experiments at once.
  Third-party INFO logs show only with --verbosity=0. On a CPU, few-row dots use XLA's own
  kernels (`xla_cpu.prefer_eigen_dots`; XLA_FLAGS that set the option win)."""
  from absl import app, flags, logging
  from ml_collections import config_flags

  from specdec_jax import sharding
  from specdec_jax.measure import xla_cpu

  xla_cpu.prefer_eigen_dots()  # before any backend starts

  config_flags.DEFINE_config_file('config', None, 'Experiment config (python file).')
  flags.DEFINE_string('workdir', None, 'Output directory; overrides config.workdir.')
  flags.DEFINE_string(
    'coordinator_address',
    None,
    'host:port of process 0, for a multi-process run set up by hand (with --num_processes and '
    '--process_id); on Cloud TPU, SLURM, Open MPI and Kubernetes JAX finds them itself.',
  )
  flags.DEFINE_integer('num_processes', None, 'Processes of a run set up by hand.')
  flags.DEFINE_integer('process_id', None, "This process's index in a run set up by hand.")
  flags.mark_flag_as_required('config')

  def main(argv):
    # Multi-host (pod slice, or processes started by hand) runs only; a no-op otherwise.
    sharding.maybe_initialize_distributed(
      flags.FLAGS.coordinator_address, flags.FLAGS.num_processes, flags.FLAGS.process_id
    )
    if len(argv) > 1:
      raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    if not flags.FLAGS['verbosity'].present:
      logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
    config = flags.FLAGS.config
    workdir = flags.FLAGS.workdir or config.get('workdir')
    if not workdir:
      raise app.UsageError('--workdir is required (this config has no workdir).')
    run(config, workdir)

  app.run(main, flags_parser=flags_parser)
