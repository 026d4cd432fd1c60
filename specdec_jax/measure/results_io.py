"""Results on disk: each experiment's table as CSV and strict JSON, rewritten after every row so
that an interrupted run keeps what it measured, and the main job's figure (speedup.png,
`plot_speedup`)."""

import csv
import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence

from specdec_jax.measure.evaluation import COLUMNS, Row
from specdec_jax.measure.tables import Column
from specdec_jax.measure.translation import AUTOREGRESSIVE


def as_record(row: Row | Mapping) -> dict:
  """A row as the files hold it: a dict (a dataclass by its fields), None for a non-finite
  float (strict JSON)."""
  if dataclasses.is_dataclass(row):
    row = dataclasses.asdict(row)
  return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}


class ResultsWriter:
  """Writes `<name>.csv` and `<name>.json` (strict JSON: null for missing values) after every
  row, so an interrupted run keeps what it measured.

  Rows are `Row`s or dicts (any dataclass is written as its fields). `columns` are the CSV's
  columns: names, or a table's `tables.Column` spec (every column of it, printed or not); by
  default the main job's (`evaluation.COLUMNS`). `rows` holds the rows written, as dicts. Figures
  are the caller's (the main job's: `plot_speedup`).
  """

  def __init__(
    self, workdir: str, *, name: str = 'results', columns: Sequence[str | Column] = COLUMNS
  ):
    os.makedirs(workdir, exist_ok=True)
    self.columns = tuple(c.name if isinstance(c, Column) else c for c in columns)
    self.paths = {k: os.path.join(workdir, f'{name}.{k}') for k in ('csv', 'json')}
    probe = os.path.join(workdir, '.writable')
    try:
      with open(probe, 'w') as f:
        f.write('')
      os.remove(probe)
    except OSError as e:
      raise ValueError(f'Cannot write results to {workdir}: {e}') from None
    self.rows: list[dict] = []
    for path in self.paths.values():
      if os.path.exists(path):
        os.remove(path)

  def add(self, row: Row | Mapping) -> None:
    row = as_record(row)
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


def plot_speedup(table: Sequence[Mapping], path: str) -> None:
  """speedup.png: speedup over autoregressive decoding against gamma, one panel per temperature.

  One colour per drafter and one marker per verifier (or 'tree': a token tree, at its depth);
  measured solid with filled markers, the prediction dashed with open ones at the same x, so each
  measurement sits above or below its own
  prediction. The prediction drawn is the one that explains a run of whole calls:
  `predicted_call` (the formula over the loop, plus each method's fixed work per call: the encoder,
  the caches' set-up; the table's "pred_call"), where every row has it, else `predicted_speedup`
  (the formula per iteration alone, which a run of short outputs and long sources cannot reach);
  the legend says which. Ticks at the gammas run; the legend outside the panels.
  """
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D

  spec = [r for r in table if r['method'] != AUTOREGRESSIVE]
  per_call = all(r.get('predicted_call') is not None for r in spec)
  prediction = 'predicted_call' if per_call else 'predicted_speedup'
  temps = sorted({r['temp'] for r in spec})
  drafters = list(dict.fromkeys(r['drafter'] for r in spec))  # the table's order
  verifiers = sorted({r['method'] for r in spec}, key=lambda v: (v != 'token', v))
  colors = dict(zip(drafters, plt.get_cmap('tab10').colors))
  markers = dict(zip(verifiers, 'osD^v'))
  # Each (drafter, verifier) a little aside of the gamma it ran, its prediction straight above or
  # below its measurement: methods that measured alike (token and block at temperature 0) stay
  # apart.
  methods = [(d, v) for d in drafters for v in verifiers]
  spread = min(0.4, 0.08 * (len(methods) - 1))
  shift = {m: spread * (i / max(len(methods) - 1, 1) - 0.5) for i, m in enumerate(methods)}
  fig, axes = plt.subplots(
    1, len(temps), figsize=(4.2 * len(temps), 3.6), squeeze=False, sharey=True
  )
  for ax, temp in zip(axes[0], temps):
    rows = [r for r in spec if r['temp'] == temp]
    for drafter in drafters:
      for verifier in verifiers:
        pts = sorted(
          (r['gamma'], r['speedup'], r[prediction])
          for r in rows
          if r['drafter'] == drafter and r['method'] == verifier
        )
        if not pts:
          continue
        gamma, measured, predicted = zip(*pts)
        x = [g + shift[drafter, verifier] for g in gamma]
        style = dict(color=colors[drafter], marker=markers[verifier], markersize=6)
        ax.plot(x, measured, '-', **style)
        if all(p is not None for p in predicted):
          ax.plot(x, predicted, '--', markerfacecolor='white', alpha=0.8, **style)
    ax.axhline(1.0, color='gray', lw=0.8, zorder=0)
    gammas = sorted({r['gamma'] for r in rows})
    ax.set_xticks(gammas)
    ax.set_xlim(gammas[0] - 0.5, gammas[-1] + 0.5)
    ax.set(title=f'{rows[0]["task"]}, temperature {temp:g}', xlabel='gamma (drafts per iteration)')
    ax.grid(axis='y', alpha=0.3)
  axes[0][0].set_ylabel('speedup over autoregressive')
  handles = [Line2D([], [], color=colors[d], lw=2, label=f'drafter: {d}') for d in drafters]
  handles += [
    Line2D(
      [],
      [],
      color='black',
      marker=markers[v],
      ls='none',
      label=f'{"method" if v == "tree" else "verifier"}: {v}',
    )
    for v in verifiers
  ]
  handles += [
    Line2D([], [], color='black', ls='-', marker='o', label='measured'),
    Line2D(
      [],
      [],
      color='black',
      ls='--',
      marker='o',
      markerfacecolor='white',
      label='predicted per call (loop + fixed work per call)'
      if per_call
      else 'predicted per iteration (the formula)',
    ),
  ]
  fig.legend(handles=handles, loc='center left', bbox_to_anchor=(1.0, 0.5), frameon=False)
  fig.tight_layout()
  fig.savefig(path, dpi=110, bbox_inches='tight')
  plt.close(fig)
