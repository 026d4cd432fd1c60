"""Distils a drafter from a target (`specdec_jax.training.distill`); see experiments/configs/distill_drafter.py.

  python -m scripts.distill --config=experiments/configs/distill_drafter.py --workdir=workdir/distill

Override any field: `--config.num_train_steps=6000 --config.divergence=tvd`. Rerunning resumes.
"""

from experiments.configs import common
from specdec_jax.training import distill


def run(config, workdir: str) -> None:
  print(config, flush=True)
  result = distill.distill_and_evaluate(config, workdir)
  print(f'final eval: {result}')


if __name__ == '__main__':
  common.run_experiment(run)
