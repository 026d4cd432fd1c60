r"""The main job: speculative EN->DE translation on the shipped T5 pair, Table-2 style.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal --workdir=/tmp/x

Checks the config, the workdir and every model before decoding; prints each row of the table
(task, drafter, temp, gamma, alpha, block efficiency, c, speedup, predicted, BLEU) as it finishes
and appends it to results.csv / results.json in --workdir (default: config.workdir), so Ctrl-C
keeps every finished row; speedup.png at the end. Third-party INFO logs only with --verbosity=0.
"""

from experiments.configs import common
from specdec_jax import evaluation


def run(config, workdir: str) -> list[dict]:
  """Every row of `config`, printed and written to `workdir` as it finishes."""
  writer = evaluation.ResultsWriter(workdir)
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
  return writer.rows


if __name__ == '__main__':
  common.run_experiment(run)
