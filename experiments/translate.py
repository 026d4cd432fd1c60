r"""The main job: speculative EN->DE translation on the shipped T5 pair, Table-2 style.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal --workdir=/tmp/x

Prints the table (task, drafter, temp, gamma, alpha, speedup, block efficiency, c, BLEU) and
writes results.csv, results.json and speedup.png to --workdir (default: config.workdir).
"""

from absl import app, flags
from ml_collections import config_flags

from specdec_jax import evaluation

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config (python file).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory; overrides config.workdir.')


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  config = _CONFIG.value
  rows = evaluation.run(config)
  print(evaluation.format_table(rows))
  paths = evaluation.write_results(rows, _WORKDIR.value or config.workdir)
  print('wrote', ', '.join(paths.values()))


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
