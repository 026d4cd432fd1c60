r"""Expected vs empirical walltime improvement (Leviathan et al. 2022, Table 4 and §3.5).

  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py
  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py:runlocal --workdir=/tmp/x

For every (drafter, gamma, temperature) point the main job's measurement (`evaluation.rows`:
alpha, c, c_fixed and the (gamma+1)-position pass cost measured in the loop, speedup over
autoregressive decoding at batch 1) and two predictions from the same alpha and c:
  predicted_paper     `analysis.walltime_improvement(alpha, gamma, c)` (Thm 3.8: the pass costs
                      one target step, as on the paper's memory-bound TPU);
  predicted_measured  `analysis.walltime_improvement_measured(alpha, gamma, c, pass_cost, c_fixed)`.
Then per (drafter, temperature) the gamma each formula picks (alpha: the mean over the gammas;
c and c_fixed: the medians; `analysis.optimal_gamma`, and the argmax over the measured gammas with their
measured pass costs) against the gamma that measured fastest.

Writes exp_vs_emp.csv / .json (a row per point, printed as it finishes), optimal_gamma.csv /
.json and exp_vs_emp.png (predicted vs measured with the line y = x; speedup vs gamma) to
--workdir (default: config.workdir).
"""

import os
import statistics

import numpy as np
from matplotlib import figure

from experiments import skeleton
from experiments.configs import common
from specdec_jax import analysis
from specdec_jax.measure import evaluation, tables, translation

# Leviathan et al. (arXiv:2211.17192 v2), Table 4, EnDe rows (target T5-XXL, TPU-v4, batch 1):
# (drafter, temperature, gamma, alpha, c, Exp, Emp). Their c comes from profiler traces.
PAPER_TABLE4_ENDE = (
  ('T5-small', 0, 7, 0.75, 0.02, 3.2, 3.4),
  ('T5-base', 0, 7, 0.80, 0.04, 3.3, 2.8),
  ('T5-large', 0, 7, 0.82, 0.11, 2.5, 1.7),
  ('T5-small', 1, 7, 0.62, 0.02, 2.3, 2.6),
  ('T5-base', 1, 5, 0.68, 0.04, 2.4, 2.4),
  ('T5-large', 1, 3, 0.71, 0.11, 2.0, 1.4),
)


def point(row: evaluation.Row) -> dict:
  """A row of `evaluation.rows` (POINT_TABLE's columns) with the paper's prediction and
  E[tokens] added."""
  out = {c.name: getattr(row, c.name, None) for c in POINT_TABLE}
  out['predicted_measured'] = row.predicted_speedup
  if row.method == translation.AUTOREGRESSIVE:
    return out
  out['expected_tokens'] = float(analysis.expected_tokens(row.alpha, row.gamma))
  out['predicted_paper'] = float(analysis.walltime_improvement(row.alpha, row.gamma, row.c))
  return out


def optimal_gammas(points: list[dict]) -> list[dict]:
  """Per (drafter, method, temperature): the gamma each formula picks and the one measured best."""
  spec = [p for p in points if p['method'] != 'autoregressive']
  keys = list(dict.fromkeys((p['task'], p['drafter'], p['method'], p['temp']) for p in spec))
  table = []
  for key in keys:
    group = sorted((p for p in spec if (p['task'], p['drafter'], p['method'], p['temp']) == key),
                   key=lambda p: p['gamma'])  # fmt: skip
    gammas = np.array([p['gamma'] for p in group])
    measured = {p['gamma']: p['speedup'] for p in group}
    alpha = float(np.mean([p['alpha'] for p in group]))
    c = float(statistics.median(p['c'] for p in group))
    c_fixed = float(statistics.median(p['c_fixed'] for p in group))
    formula_gamma = int(analysis.optimal_gamma(alpha, c, max_gamma=int(gammas.max())))
    pass_cost = np.array([p['pass_cost'] for p in group])
    with_pass = analysis.walltime_improvement_measured(alpha, gammas, c, pass_cost, c_fixed)
    pass_cost_gamma = int(gammas[np.argmax(with_pass)])
    measured_gamma = max(measured, key=measured.get)
    table.append(
      dict(
        task=key[0],
        drafter=key[1],
        method=key[2],
        temp=key[3],
        alpha=alpha,
        c=c,
        formula_gamma=formula_gamma,
        formula_gamma_unbounded=int(analysis.optimal_gamma(alpha, c)),
        formula_speedup=float(analysis.walltime_improvement(alpha, formula_gamma, c)),
        pass_cost_gamma=pass_cost_gamma,
        pass_cost_speedup=float(with_pass.max()),
        measured_gamma=int(measured_gamma),
        measured_speedup=measured[measured_gamma],
        speedup_at_formula_gamma=measured.get(formula_gamma),
        speedup_at_pass_cost_gamma=measured[pass_cost_gamma],
      )
    )
  return table


# Each table's one column spec: its files hold every column, its lines the printed ones.
POINT_TABLE = (
  *skeleton.ROW_KEY,
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('block_efficiency', 'tok/call', '.2f', 8),
  tables.Column('expected_tokens', 'E[tok]', '.2f', 6),
  tables.Column('c', fmt='.3f', width=6),
  tables.Column('c_fixed', 'c_fix', '.3f', 6),
  tables.Column('pass_cost', 'pass', '.2f', 5),
  tables.Column('predicted_paper', 'EXP', '.2f', 6, suffix='x'),
  tables.Column('predicted_measured', 'EXP(pass)', '.2f', 9, suffix='x'),
  tables.Column('speedup', 'EMP', '.2f', 6, suffix='x'),
  tables.Column('seconds', printed=False),
  tables.Column('tokens_per_s', printed=False),
)
# Each gamma a formula picks (EXP: with c; EXP(pass): with the measured pass cost), the fastest
# measured (EMP), each followed by the speedup measured at it.
OPTIMAL_TABLE = (
  *skeleton.ROW_KEY,
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('c', fmt='.3f', width=6),
  tables.Column('formula_gamma', 'EXP', 'd', 4),
  tables.Column('formula_speedup', printed=False),
  tables.Column('speedup_at_formula_gamma', 'at EXP', '.2f', 6, suffix='x'),
  tables.Column('pass_cost_gamma', 'EXP(pass)', 'd', 9),
  tables.Column('pass_cost_speedup', printed=False),
  tables.Column('speedup_at_pass_cost_gamma', 'at EXP(pass)', '.2f', suffix='x'),
  tables.Column('measured_gamma', 'EMP', 'd', 4),
  tables.Column('measured_speedup', 'at EMP', '.2f', 6, suffix='x'),
  tables.Column('formula_gamma_unbounded', 'EXP (unbounded)', 'd'),
)
PAPER_COLUMNS = ('drafter', 'temp', 'gamma', 'alpha', 'c', 'exp', 'emp')
PAPER_TABLE = (
  tables.Column('drafter', width=9, align='<'),
  tables.Column('temp', fmt='g', width=4),
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('alpha', fmt='.2f', width=5),
  tables.Column('c', fmt='.2f', width=5),
  tables.Column('exp', 'EXP', '.1f', 5, suffix='x'),
  tables.Column('emp', 'EMP', '.1f', 5, suffix='x'),
  tables.Column('ours', fmt='.2f', width=5, suffix='x'),
)


def format_optimal(table: list[dict]) -> str:
  title = (
    'Optimal gamma per drafter and temperature (EXP: formula with c; EXP(pass): with the '
    'measured pass cost; EMP: measured fastest; the speedup measured at each):'
  )
  return title + '\n' + tables.format_table(table, OPTIMAL_TABLE)


def format_paper() -> str:
  """The paper's Table 4 (EnDe), with our formula's EXP from its alpha, gamma and c."""
  paper = [dict(zip(PAPER_COLUMNS, r)) for r in PAPER_TABLE4_ENDE]
  for r in paper:
    r['ours'] = float(analysis.walltime_improvement(r['alpha'], r['gamma'], r['c']))
  title = (
    'Leviathan et al. Table 4 (T5-XXL EnDe, TPU-v4); ours: analysis.walltime_improvement of '
    'its alpha, gamma, c'
  )
  return title + '\n' + tables.format_table(paper, PAPER_TABLE)


def plot(points: list[dict], path: str) -> None:
  """Left: predicted vs measured speedup (both formulas) with y = x. Then one panel per
  temperature: measured (solid) and predicted (dotted: paper; dashed: measured pass cost)
  speedup vs gamma."""
  spec = [p for p in points if p['method'] != 'autoregressive']
  temps = sorted({p['temp'] for p in spec})
  drafters = list(dict.fromkeys(p['drafter'] for p in spec))
  colors = {d: f'C{i}' for i, d in enumerate(drafters)}
  fig = figure.Figure(figsize=(5.0 * (1 + len(temps)), 4.4), layout='constrained')
  axes = fig.subplots(1, 1 + len(temps), squeeze=False)[0]
  ax = axes[0]
  for p in spec:
    face = colors[p['drafter']] if p['temp'] == 0 else 'none'
    ax.scatter(p['predicted_paper'], p['speedup'], marker='o', edgecolors=colors[p['drafter']],
               facecolors=face, s=28)  # fmt: skip
    ax.scatter(p['predicted_measured'], p['speedup'], marker='^', edgecolors=colors[p['drafter']],
               facecolors=face, s=28)  # fmt: skip
  paper = np.array([(exp, emp) for *_, exp, emp in PAPER_TABLE4_ENDE])
  ax.scatter(paper[:, 0], paper[:, 1], marker='x', color='0.5', label='paper Table 4 (T5-XXL, TPU)')
  values = [v for p in spec for v in (p['predicted_paper'], p['predicted_measured'], p['speedup'])]
  lo, hi = 0.9 * min(min(values), paper.min()), 1.1 * max(max(values), paper.max())
  ax.plot([lo, hi], [lo, hi], 'k--', lw=0.8, label='y = x')
  for d in drafters:
    ax.scatter([], [], marker='s', color=colors[d], label=d)
  ax.scatter([], [], marker='o', color='grey', label='EXP: paper formula (pass = 1 step)')
  ax.scatter([], [], marker='^', color='grey', label='EXP: measured pass cost')
  ax.scatter([], [], marker='o', facecolors='none', edgecolors='grey', label='hollow: temp 1')
  ticks = [x for x in (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6) if lo <= x <= hi]
  ax.set(xscale='log', yscale='log', xticks=ticks, yticks=ticks, xticklabels=map(str, ticks),
         yticklabels=map(str, ticks))  # fmt: skip
  ax.minorticks_off()
  ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel='predicted speedup (EXP)',
         ylabel='measured speedup (EMP)', title='EXP vs EMP, every (drafter, gamma, temp)')  # fmt: skip
  ax.legend(fontsize=7)
  ax.grid(alpha=0.3)
  for ax, temp in zip(axes[1:], temps):
    for d in drafters:
      pts = sorted((p for p in spec if p['drafter'] == d and p['temp'] == temp),
                   key=lambda p: p['gamma'])  # fmt: skip
      if not pts:
        continue
      g = [p['gamma'] for p in pts]
      ax.plot(g, [p['speedup'] for p in pts], '-o', color=colors[d], label=f'{d} (EMP)')
      ax.plot(g, [p['predicted_paper'] for p in pts], ':', color=colors[d])
      ax.plot(g, [p['predicted_measured'] for p in pts], '--', color=colors[d])
    ax.plot([], [], 'k:', label='EXP, paper formula')
    ax.plot([], [], 'k--', label='EXP, measured pass cost')
    ax.axhline(1.0, color='grey', lw=0.8)
    ax.set(xlabel='gamma', ylabel='speedup vs autoregressive', title=f'temperature {temp:g}')
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
  fig.savefig(path, dpi=110)


def run(config, workdir: str, *, echo=print, progress: bool = True) -> dict[str, str]:
  """Measures every point of `config`, writing each as it finishes; returns the output paths."""
  plan = evaluation.prepare(config)

  def finish(results):
    points = results.rows['points']
    paths = results.paths('points')
    if any(p['method'] != 'autoregressive' for p in points):
      table = optimal_gammas(points)
      for r in table:
        results.add('optimal', r)
      paths.update(results.paths('optimal', 'optimal_'))
      paths['png'] = os.path.join(workdir, 'exp_vs_emp.png')
      plot(points, paths['png'])
      results.say(format_optimal(table))
    results.say(format_paper())
    results.say(f'{len(points)} rows in ' + ', '.join(paths.values()))
    return paths

  return skeleton.run(
    workdir,
    [
      skeleton.Table('points', POINT_TABLE, file='exp_vs_emp'),
      skeleton.Table('optimal', OPTIMAL_TABLE, file='optimal_gamma', printed=False),
    ],
    header=plan.summary(),
    measure=lambda _: (('points', point(row)) for row in evaluation.rows(plan, progress=progress)),
    finish=finish,
    echo=echo,
  )


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: run(config, workdir, echo=lambda s: print(s, flush=True))
  )
