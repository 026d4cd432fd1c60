r"""The main job: speculative EN->DE translation on the shipped T5 pair, Table-2 style.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal --workdir=/tmp/x

Checks the config, the workdir and every model before decoding; prints each row of the table
(task, drafter, temp, gamma, alpha, block efficiency, c, speedup, predicted, BLEU) as it finishes
and appends it to results.csv / results.json in --workdir (default: config.workdir), so Ctrl-C
keeps every finished row; speedup.png at the end. Third-party INFO logs only with --verbosity=0.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.configs import common
from specdec_jax import evaluation, sharding

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config (python file).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory; overrides config.workdir.')


def main(argv):
  sharding.maybe_initialize_distributed()  # multi-host (pod slice) runs only
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
  config = _CONFIG.value
  writer = evaluation.ResultsWriter(_WORKDIR.value or config.workdir)
  plan = evaluation.prepare(config)
  print(plan.summary(), flush=True)
  print(evaluation.format_table([]), flush=True)
  try:
    for row in evaluation.rows(plan):
      writer.add(row)
      print(evaluation.format_row(row), flush=True)
  finally:
    paths = writer.finish()
    print(f'{len(writer.rows)} rows in', ', '.join(paths.values()))


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main, flags_parser=common.flags_parser)
