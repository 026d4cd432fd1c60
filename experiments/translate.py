r"""The main job: speculative decoding against autoregressive decoding on a shipped T5 pair (EN->DE
translation by default; debsumm summarization with experiments/configs/debsumm.py), Table-2 style.

  python -m experiments.translate --config=experiments/configs/ende.py
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal --workdir=/tmp/x

Checks the config, the workdir and every model before decoding; prints each row of the table
(`evaluation.TABLE`: task, drafter, method, temp, gamma, K, N (a token tree's nodes: the rows of
`config.tree_nodes`), alpha, block efficiency, c, pass cost, speedup, predicted, predicted per
call, the loop's iteration cost and its prediction, BLEU) as it finishes and appends it to
results.csv / results.json in --workdir (default: config.workdir), so Ctrl-C keeps every finished
row; speedup.png at the end, and the run's wall time (loading, compiling and the cost phase
included). Third-party INFO logs only with --verbosity=0.
"""

import os
import time

from tqdm.auto import tqdm

from experiments import skeleton
from experiments.configs import common
from specdec_jax.measure import evaluation, results_io, translation


def run(config, workdir: str) -> list[evaluation.Row]:
  """Every row of `config`, printed and written to `workdir` as it finishes; speedup.png at the
  end (`experiments.skeleton`: process 0 alone prints and writes on several processes). Rows go
  through `tqdm.write`, so they never interleave with the progress bars."""
  start = time.perf_counter()
  plan = evaluation.prepare(config)
  measured = []

  def measure(results):
    for row in evaluation.rows(plan):
      measured.append(row)
      yield 'results', row

  def finish(results):
    writer = results.writers['results']
    paths = dict(writer.paths, png=os.path.join(workdir, 'speedup.png'))
    if any(r['method'] != translation.AUTOREGRESSIVE for r in writer.rows):
      results_io.plot_speedup(writer.rows, paths['png'])
    minutes, seconds = divmod(round(time.perf_counter() - start), 60)
    results.say(
      f'{len(writer.rows)} rows in ' + ', '.join(paths.values()) + f'; {minutes} min {seconds} s '
      'wall time (loading, compiling and the cost phase included)'
    )
    return paths

  table = skeleton.Table('results', evaluation.TABLE, fields=evaluation.COLUMNS)
  skeleton.run(
    workdir, [table], header=plan.summary(), measure=measure, finish=finish, echo=tqdm.write
  )
  return measured


if __name__ == '__main__':
  common.run_experiment(run)
