r"""The main job: speculative decoding against autoregressive decoding on a shipped T5 pair (EN->DE
translation by default; debsumm summarization with experiments/configs/debsumm.py), Table-2 style.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal --workdir=/tmp/x

Checks the config, the workdir and every model before decoding; prints each row of the table
(`evaluation.TABLE`: task, drafter, method, temp, gamma, K, alpha, block efficiency, c, pass cost,
speedup, predicted, predicted per call, the loop's iteration cost and its prediction, BLEU) as it
finishes and appends it to results.csv / results.json in --workdir (default: config.workdir), so
Ctrl-C keeps every finished row; speedup.png at the end. Third-party INFO logs only with
--verbosity=0.
"""

from tqdm.auto import tqdm

from experiments.configs import common
from specdec_jax import sharding
from specdec_jax.measure import evaluation, results_io, tables


def run(config, workdir: str) -> list[evaluation.Row]:
  """Every row of `config`, printed and written to `workdir` as it finishes.

  On several processes (a multi-host slice) every process decodes its share and process 0 alone
  prints and writes. Rows go through `tqdm.write`, so they never interleave with the bar.
  """
  main = sharding.is_main_process()
  writer = results_io.ResultsWriter(workdir) if main else None
  plan = evaluation.prepare(config)
  say = tqdm.write if main else (lambda text: None)
  say(plan.summary())
  say(tables.format_header(evaluation.TABLE))
  rows = []
  try:
    for row in evaluation.rows(plan):
      rows.append(row)
      if writer:
        writer.add(row)
      say(tables.format_line(row, evaluation.TABLE))
  finally:
    if writer:
      paths = writer.finish()
      say(f'{len(writer.rows)} rows in ' + ', '.join(paths.values()))
  return rows


if __name__ == '__main__':
  common.run_experiment(run)
