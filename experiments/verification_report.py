"""Reporting for experiments/verification.py: a line per finished row, the summary as Sun et al.'s
Tables 1-2 (Markdown), and the figures (gain over token verification vs gamma, accepted-length
CCDF, batch size)."""

import itertools
from fractions import Fraction

from matplotlib import figure, ticker

# ----------------------------------------------------------------------------------------------
# Text: one line per finished row, and the summary as Sun et al.'s tables.


def _pm(mean, std, fmt='.3f', suffix='') -> str:
  if mean is None:
    return '-'
  spread = fmt.lstrip('+')  # a standard deviation has no sign
  return f'{mean:{fmt}}{suffix}' + ('' if std is None else f' ± {std:{spread}}')


def format_rows(table: str, rows: list[dict]) -> str:
  """One line for a finished run, summary row or CCDF curve."""
  if table == 'ccdf':
    r = rows[0]
    head = f'ccdf    {r["model"]:<10s} {r["drafter"]:<12s} {r["method"]:<12s}'
    temp = '' if r['temp'] is None else f' T={r["temp"]:g}'
    curve = ' '.join(f'{x["p_at_least_k"]:.3f}' for x in rows[1:])
    exact = f' = {sum(Fraction(x["exact"]) for x in rows[1:])}' if r['estimate'] == 'exact' else ''
    return (
      f'{head}{temp} gamma={r["gamma"]} ({r["estimate"]}): P(tau >= k), k = 1..{r["gamma"]}: '
      f'{curve} | E[tau] {r["mean_accepted"]:.4f}{exact}'
    )
  lines = []
  for r in rows:
    head = (
      f'{r["drafter"]:<10s} {r["method"]:<14s} T={r["temp"]:<4g} gamma={r["gamma"]:<2d} '
      f'B={r["batch_size"]:<3d}'
    )
    if table == 'runs':
      alpha = '-' if r['alpha'] is None else f'{r["alpha"]:.3f}'
      lines.append(
        f'run     {head} seed={r["seed"]} | alpha {alpha} | block eff. '
        f'{r["block_efficiency"]:.3f} | {r["tokens_per_s"]:6.1f} tok/s '
        f'{r["seconds"]:6.2f} s | speedup {r["speedup"]:.3f}x'
      )
    else:
      gains = ''
      if r['block_efficiency_gain_pct'] is not None:
        gains = (
          f' | vs token: block eff. '
          f'{_pm(r["block_efficiency_gain_pct"], r["block_efficiency_gain_pct_std"], "+.1f")}%'
          f', speedup {_pm(r["speedup_gain_pct"], r["speedup_gain_pct_std"], "+.1f")}%'
        )
      lines.append(
        f'summary {head} {r["num_seeds"]} seeds | block eff. '
        f'{_pm(r["block_efficiency_mean"], r["block_efficiency_std"])} | '
        f'{_pm(r["tokens_per_s_mean"], r["tokens_per_s_std"], ".1f")} tok/s | speedup '
        f'{_pm(r["speedup_mean"], r["speedup_std"])}x{gains}'
      )
  return '\n'.join(lines)


def format_tables(summary: list[dict]) -> str:
  """Markdown: one line per (drafter, batch size, temperature, gamma) with Sun et al.'s Table 1
  (block efficiency) and Table 2 (speedup) columns, token, each other verifier and its gain over
  token, then tokens/s of autoregressive decoding and of each verifier (App. D.1); mean ± std
  over seeds."""
  spec = [r for r in summary if r['method'] != 'autoregressive']
  base = {(r['temp'], r['batch_size']): r for r in summary if r['method'] == 'autoregressive'}
  methods = list(dict.fromkeys(r['method'] for r in spec))
  others = [m for m in methods if m != 'token']
  cells = {(r['drafter'], r['batch_size'], r['temp'], r['gamma'], r['method']): r for r in spec}
  header = ['drafter', 'B', 'temp', 'gamma']
  for key in ('block eff.', 'speedup'):
    header += [f'{key} {m}' for m in methods] + [f'{key} gain {m} (%)' for m in others]
  header += ['tok/s autoregressive'] + [f'tok/s {m}' for m in methods]
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for drafter, batch, temp, gamma in dict.fromkeys(k[:4] for k in cells):
    line = [drafter, str(batch), f'{temp:g}', str(gamma)]
    row = {m: cells.get((drafter, batch, temp, gamma, m)) for m in methods}
    for key in ('block_efficiency', 'speedup'):
      line += [_pm(r[f'{key}_mean'], r[f'{key}_std'], '.2f') if r else '-' for r in row.values()]
      line += [
        _pm(row[m][f'{key}_gain_pct'], row[m][f'{key}_gain_pct_std'], '+.1f') if row[m] else '-'
        for m in others
      ]
    for r in [base.get((temp, batch))] + list(row.values()):
      line.append(_pm(r['tokens_per_s_mean'], r['tokens_per_s_std'], '.0f') if r else '-')
    lines.append('| ' + ' | '.join(line) + ' |')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------------------------
# Figures.


def plot_improvement(summary: list[dict], path: str) -> bool:
  """Figures 4-5: the gain (%) of each verifier over token vs gamma, one line per temperature
  (and verifier), one panel per drafter; block efficiency above, speedup below. Smallest batch
  size only. Returns False (nothing drawn) when no verifier has a gain."""
  gains = [r for r in summary if r['block_efficiency_gain_pct'] is not None]
  if not gains:
    return False
  gains = [r for r in gains if r['batch_size'] == min(r['batch_size'] for r in gains)]
  drafters = list(dict.fromkeys(r['drafter'] for r in gains))
  methods = list(dict.fromkeys(r['method'] for r in gains))
  fig = figure.Figure(figsize=(4.6 * len(drafters), 7.0), layout='constrained')
  axes = fig.subplots(2, len(drafters), squeeze=False, sharex=True)
  styles = ['-o', '--s', ':^', '-.v']
  for col, drafter in enumerate(drafters):
    for row, (key, label) in enumerate(
      (('block_efficiency', 'block efficiency'), ('speedup', 'walltime speedup'))
    ):
      ax = axes[row, col]
      for (m, method), temp in itertools.product(
        enumerate(methods), sorted({r['temp'] for r in gains})
      ):
        pts = sorted(
          (r['gamma'], r[f'{key}_gain_pct'], r[f'{key}_gain_pct_std'] or 0.0)
          for r in gains
          if r['drafter'] == drafter and r['method'] == method and r['temp'] == temp
        )
        if pts:
          g, y, e = zip(*pts)
          name = f'T = {temp:g}' + (f' ({method})' if len(methods) > 1 else '')
          ax.errorbar(g, y, yerr=e, fmt=styles[m % len(styles)], capsize=3, label=name)
      ax.axhline(0.0, color='grey', lw=0.8)
      ax.set(ylabel=f'{label} gain over token (%)', title=f'{drafter}: {label}')
      ax.set_xticks(sorted({r['gamma'] for r in gains}))
      ax.grid(alpha=0.3)
      if row == 1:
        ax.set_xlabel('gamma (draft length)')
      ax.legend(fontsize=8)
  fig.suptitle('Gain over token verification\n(mean over seeds, ± std of paired gains)')
  fig.savefig(path, dpi=110)
  return True


def plot_ccdf(ccdf: list[dict], path: str) -> bool:
  """Figure 3: P(accepted length >= k) vs k; the toy model (exact) and one panel per drafter of
  the real pair (trace). Returns False when there is nothing to draw."""
  curves = {}
  for r in ccdf:
    curves.setdefault((r['model'], r['drafter'], r['method'], r['temp'], r['gamma']), []).append(r)
  if not curves:
    return False
  panels = list(dict.fromkeys(key[:2] for key in curves))
  fig = figure.Figure(figsize=(4.4 * len(panels), 3.8), layout='constrained')
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  styles = {'token': '-o', 'block': '--s'}
  for ax, (model, drafter) in zip(axes, panels):
    keys = [key for key in curves if key[:2] == (model, drafter)]
    colours = {}
    for key in keys:
      _, _, method, temp, gamma = key
      pts = sorted((r['k'], r['p_at_least_k']) for r in curves[key] if r['k'] >= 1)
      k, y = zip(*pts)
      colour = colours.setdefault((temp, gamma), f'C{len(colours)}')
      temp_text = '' if temp is None else f', T = {temp:g}'
      estimate = curves[key][0]['estimate']
      label = f'{method}, gamma = {gamma}{temp_text} ({estimate})'
      ax.plot(k, y, styles.get(method, ':^'), color=colour, label=label)
    title = (
      'Sun et al. toy: Mb = (1/3, 2/3), Ms = (2/3, 1/3)'
      if model == 'toy'
      else f'{model}, drafter {drafter}'
    )
    ax.set(title=title, xlabel='k', ylabel='P(accepted length >= k)', ylim=(0, 1.02))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.savefig(path, dpi=110)
  return True


def plot_batch(summary: list[dict], path: str) -> bool:
  """App. D.1: tokens/s and block efficiency vs batch size, one panel per temperature, one line
  per (drafter, method). Returns False with fewer than two batch sizes."""
  if len({r['batch_size'] for r in summary}) < 2:
    return False
  temps = sorted({r['temp'] for r in summary})
  fig = figure.Figure(figsize=(4.6 * len(temps), 7.0), layout='constrained')
  axes = fig.subplots(2, len(temps), squeeze=False, sharex=True)
  for col, temp in enumerate(temps):
    rows_t = [r for r in summary if r['temp'] == temp]
    panels = (('tokens_per_s', 'tokens/s'), ('block_efficiency', 'block efficiency'))
    for row, (key, label) in enumerate(panels):
      ax = axes[row, col]
      for drafter, method, gamma in dict.fromkeys(
        (r['drafter'], r['method'], r['gamma']) for r in rows_t
      ):
        pts = sorted(
          (r['batch_size'], r[f'{key}_mean'], r[f'{key}_std'] or 0.0)
          for r in rows_t
          if (r['drafter'], r['method'], r['gamma']) == (drafter, method, gamma)
        )
        b, y, e = zip(*pts)
        name = method if drafter == '-' else f'{drafter} / {method}, gamma = {gamma}'
        ax.errorbar(b, y, yerr=e, fmt='-o', capsize=3, label=name)
      ax.set_xscale('log', base=2)
      sizes = sorted({r['batch_size'] for r in summary})
      ax.set_xticks(sizes, labels=[str(b) for b in sizes])
      ax.xaxis.set_minor_locator(ticker.NullLocator())
      ax.set(title=f'temperature {temp:g}: {label}', ylabel=label)
      ax.grid(alpha=0.3)
      if row == 1:
        ax.set_xlabel('batch size')
      ax.legend(fontsize=8)
  fig.savefig(path, dpi=110)
  return True
