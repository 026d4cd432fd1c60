"""Distils a drafter from a target (`specdec_jax.distill`); see experiments/configs/distill_drafter.py.

  python -m scripts.distill --config=experiments/configs/distill_drafter.py --workdir=workdir/distill

Override any field: `--config.num_train_steps=6000 --config.divergence=tvd`. Rerunning resumes.
"""

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.configs import common
from specdec_jax import distill, sharding

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Distillation config file.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Target outputs, checkpoints, metrics, exports.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
  sharding.maybe_initialize_distributed()  # multi-host (pod slice) runs only
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
  print(_CONFIG.value, flush=True)
  result = distill.distill_and_evaluate(_CONFIG.value, _WORKDIR.value)
  print(f'final eval: {result}')


if __name__ == '__main__':
  app.run(main, flags_parser=common.flags_parser)
