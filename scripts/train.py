"""Trains a T5 translation model (target or drafter) on the EN->DE pairs.

  python -m scripts.train --config=experiments/configs/train_target.py --workdir=workdir/target
  python -m scripts.train --config=experiments/configs/train_drafter.py --workdir=workdir/drafter
  python -m scripts.train --config=experiments/configs/train_target.py:runlocal --workdir=/tmp/t

Override any field: `--config.batch_size=256 --config.train_file=wmt.tsv`. Rerunning a command
resumes from the latest checkpoint in --workdir; the trained model is exported to
<workdir>/final and the lowest-valid-loss one to <workdir>/best (checkpoints.restore reads both).
"""

from experiments.configs import common
from specdec_jax.training import trainer


def run(config, workdir: str) -> None:
  print(config, flush=True)
  result = trainer.train_and_evaluate(config, workdir)
  print(f'final eval: {result}')


if __name__ == '__main__':
  common.run_experiment(run)
