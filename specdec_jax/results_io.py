"""Results on disk: each experiment's table as CSV and strict JSON, rewritten after every row so
that an interrupted run keeps what it measured, and the main job's figure (speedup.png)."""

import csv
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

from specdec_jax.evaluation import AUTOREGRESSIVE, COLUMNS, Row


class ResultsWriter:
  """Writes results.csv and results.json (strict JSON: null for missing values) after every row,
  so an interrupted run keeps what it measured, and speedup.png at `finish`.

  Rows are `Row`s or dicts (any dataclass is written as its fields). Another table: `name` gives
  `<name>.csv` / `<name>.json` and `columns` the CSV's columns; only the main job's table (the
  default columns) has a figure. `rows` holds the rows written, as dicts.
  """

  def __init__(self, workdir: str, *, name: str = 'results', columns: Sequence[str] = COLUMNS):
    os.makedirs(workdir, exist_ok=True)
    self.columns = tuple(columns)
    files = [('csv', f'{name}.csv'), ('json', f'{name}.json')]
    if self.columns == COLUMNS:
      files.append(('png', 'speedup.png'))
    self.paths = {k: os.path.join(workdir, f) for k, f in files}
    probe = os.path.join(workdir, '.writable')
    try:
      with open(probe, 'w') as f:
        f.write('')
      os.remove(probe)
    except OSError as e:
      raise ValueError(f'Cannot write results to {workdir}: {e}') from None
    self.rows: list[dict] = []
    for path in (self.paths['csv'], self.paths['json']):
      if os.path.exists(path):
        os.remove(path)

  def add(self, row: Row | Mapping) -> None:
    if dataclasses.is_dataclass(row):
      row = dataclasses.asdict(row)
    row = {
      k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }
    self.rows.append(row)
    new = not os.path.exists(self.paths['csv'])
    with open(self.paths['csv'], 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=list(self.columns))
      if new:
        writer.writeheader()
      writer.writerow({k: ('' if row.get(k) is None else row[k]) for k in self.columns})
    tmp = self.paths['json'] + '.tmp'
    with open(tmp, 'w') as f:
      json.dump(self.rows, f, indent=1, allow_nan=False)
    os.replace(tmp, self.paths['json'])

  def finish(self) -> dict[str, str]:
    """Draws speedup.png (main job's table) from the rows so far; returns the paths."""
    if 'png' in self.paths and any(r['method'] != AUTOREGRESSIVE for r in self.rows):
      plot_speedup(self.rows, self.paths['png'])
    return self.paths


def plot_speedup(table: Sequence[Row | Mapping], path: str) -> None:
  """speedup.png: measured and predicted speedup vs gamma, one panel per temperature."""
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  temps = sorted({r['temp'] for r in table})
  fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    spec = [r for r in table if r['temp'] == temp and r['method'] != AUTOREGRESSIVE]
    for drafter in sorted({r['drafter'] for r in spec}):
      for method, style in (('token', '-o'), ('block', '--s')):
        pts = sorted(
          (r['gamma'], r['speedup'], r['predicted_speedup'])
          for r in spec
          if r['drafter'] == drafter and r['method'] == method
        )
        if pts:
          g, s, p = zip(*pts)
          (line,) = ax.plot(g, s, style, label=f'{drafter} / {method} (measured)')
          ax.plot(
            g,
            p,
            style[1:],
            color=line.get_color(),
            alpha=0.35,
            label=f'{drafter} / {method} (predicted)',
          )
    ax.axhline(1.0, color='gray', lw=0.8)
    task = spec[0]['task'] if spec else ''
    ax.set(title=f'{task}, temperature {temp}', xlabel='gamma', ylabel='walltime speedup vs AR')
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
