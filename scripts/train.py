"""Trains a T5 translation model (target or drafter) on the EN->DE pairs.

  python -m scripts.train --config=experiments/configs/train_target.py --workdir=workdir/target
  python -m scripts.train --config=experiments/configs/train_drafter.py --workdir=workdir/drafter
  python -m scripts.train --config=experiments/configs/train_target.py:runlocal --workdir=/tmp/t

Override any field: `--config.batch_size=256 --config.train_file=wmt.tsv`. Rerunning a command
resumes from the latest checkpoint in --workdir; the trained model is exported to
<workdir>/final and the lowest-valid-loss one to <workdir>/best (checkpoints.restore reads both).
"""

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.configs import common
from specdec_jax import sharding, training

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Training config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, metrics.jsonl and exports.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  sharding.maybe_initialize_distributed()  # multi-host (pod slice) runs only
  del argv
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  print(_CONFIG.value, flush=True)
  result = training.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print(f'final eval: {result}')


if __name__ == '__main__':
  app.run(main, flags_parser=common.flags_parser)
