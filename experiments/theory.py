"""Plots and tables of the analysis of Leviathan et al. 2023, §3 (specdec_jax.analysis).

  python -m experiments.theory --workdir=/tmp/specdec_theory

Writes to --workdir:
  walltime_improvement.png  expected walltime improvement vs alpha, one panel per c, one line per
                            gamma, and the break-even line y = 1.
  ops_increase.png          arithmetic-operations increase vs alpha, one panel per c_hat (= --cs).
  optimal_gamma.png         the optimal gamma over (alpha, c); grey where alpha <= c (no gamma
                            gives a speedup, Corollary 3.9), contours of the speedup it reaches.
  theory.csv                alpha, c, gamma, expected_tokens, walltime_improvement, ops_increase
                            (with c_hat = c) on the --alpha_points x --cs x --gammas grid.
  optimal_gamma.csv         alpha, c, optimal_gamma, walltime_improvement, speedup_guaranteed on
                            the map's grid.

Sanity anchors: alpha 0.75, gamma 7, c 0 gives 3.60x (Leviathan et al. report 3.4x for T5-XXL /
T5-small on EnDe at temperature 0); alpha 0.2, gamma 3, c 0 gives 1.25x (bigram drafter).
"""

import csv
import itertools
import os

import numpy as np
from absl import app, flags, logging
from matplotlib import colors, figure

from specdec_jax import analysis

_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)
_GAMMAS = flags.DEFINE_list('gammas', ['3', '5', '7'], 'Drafted tokens per iteration (lines).')
_CS = flags.DEFINE_list('cs', ['0.1', '0.4', '0.8'], 'Cost ratios c (and c_hat) (panels).')
_ALPHA_POINTS = flags.DEFINE_integer(
  'alpha_points', 101, 'Grid points for alpha (and c on the map).'
)
_MAX_GAMMA = flags.DEFINE_integer('max_gamma', 32, 'Largest gamma searched for the optimum.')


def plot_walltime(path: str, alphas: np.ndarray, gammas, cs) -> None:
  """Walltime improvement vs alpha; one panel per c, one line per gamma, break-even at 1."""
  fig = figure.Figure(figsize=(4.2 * len(cs), 3.8), layout='constrained')
  axes = fig.subplots(1, len(cs), sharey=True, squeeze=False)[0]
  for ax, c in zip(axes, cs):
    for gamma in gammas:
      ax.plot(alphas, analysis.walltime_improvement(alphas, gamma, c), label=f'$\\gamma$ = {gamma}')
    ax.axhline(1.0, color='black', linewidth=0.8, linestyle='--', label='break-even')
    ax.axvline(c, color='grey', linewidth=0.8, linestyle=':', label='$\\alpha = c$')
    ax.set(title=f'c = {c:g}', xlabel='acceptance rate $\\alpha$', xlim=(0, 1))
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('expected walltime improvement (x)')
  axes[0].legend(loc='upper left')
  fig.suptitle('Speculative decoding: walltime improvement (Leviathan et al., Thm 3.8)')
  fig.savefig(path, dpi=120)


def plot_ops(path: str, alphas: np.ndarray, gammas, c_hats) -> None:
  """Arithmetic-operations increase vs alpha; one panel per c_hat, one line per gamma."""
  fig = figure.Figure(figsize=(4.2 * len(c_hats), 3.8), layout='constrained')
  axes = fig.subplots(1, len(c_hats), sharey=True, squeeze=False)[0]
  for ax, c_hat in zip(axes, c_hats):
    for gamma in gammas:
      ax.plot(alphas, analysis.ops_increase(alphas, gamma, c_hat), label=f'$\\gamma$ = {gamma}')
    ax.axhline(1.0, color='black', linewidth=0.8, linestyle='--')
    ax.set(title=f'$\\hat c$ = {c_hat:g}', xlabel='acceptance rate $\\alpha$', xlim=(0, 1))
    ax.grid(alpha=0.3)
  axes[0].set_ylabel('arithmetic operations increase (x)')
  axes[0].legend(loc='upper right')
  fig.suptitle('Speculative decoding: extra arithmetic (Leviathan et al., Thm 3.11)')
  fig.savefig(path, dpi=120)


def plot_optimal_gamma(path: str, alphas: np.ndarray, cs: np.ndarray, max_gamma: int) -> None:
  """Map of the optimal gamma over (alpha, c), with speedup contours; grey where alpha <= c."""
  best_gamma = analysis.optimal_gamma(alphas[None, :], cs[:, None], max_gamma=max_gamma)
  best = analysis.walltime_improvement(alphas[None, :], best_gamma, cs[:, None])
  pays = analysis.speedup_guaranteed(alphas[None, :], cs[:, None])
  fig = figure.Figure(figsize=(6.4, 5.0), layout='constrained')
  ax = fig.subplots()
  ax.set_facecolor('0.8')
  norm = colors.LogNorm(vmin=1, vmax=max_gamma)
  mesh = ax.pcolormesh(
    alphas, cs, np.ma.masked_where(~pays, best_gamma), norm=norm, cmap='viridis', shading='nearest'
  )
  colorbar = fig.colorbar(mesh, ax=ax, label='optimal $\\gamma$')
  colorbar.set_ticks([g for g in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64) if g <= max_gamma])
  colorbar.set_ticklabels([str(g) for g in colorbar.get_ticks().astype(int)])
  colorbar.minorticks_off()
  levels = [1.25, 1.5, 2, 3, 5]
  contours = ax.contour(alphas, cs, best, levels=levels, colors='white', linewidths=0.8)
  ax.clabel(contours, fmt=lambda x: f'{x:g}x', fontsize=8)
  ax.plot([0, 1], [0, 1], color='black', linewidth=0.8, linestyle='--')
  ax.text(0.15, 0.7, 'no speedup\n($\\alpha \\leq c$)', ha='center')
  ax.set(xlabel='acceptance rate $\\alpha$', ylabel='cost ratio c', xlim=(0, 1), ylim=(0, 1))
  ax.set_title('Optimal $\\gamma$ (colour) and walltime improvement it reaches (contours)')
  fig.savefig(path, dpi=120)


def write_grid_csv(path: str, alphas: np.ndarray, gammas, cs) -> None:
  """One row per (alpha, c, gamma): the formulas of specdec_jax.analysis, with c_hat = c."""
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(
      ['alpha', 'c', 'gamma', 'expected_tokens', 'walltime_improvement', 'ops_increase']
    )
    for c, gamma in itertools.product(cs, gammas):
      tokens = analysis.expected_tokens(alphas, gamma)
      walltime = analysis.walltime_improvement(alphas, gamma, c)
      ops = analysis.ops_increase(alphas, gamma, c)
      for row in zip(alphas, tokens, walltime, ops):
        writer.writerow([f'{row[0]:.6g}', c, gamma] + [f'{x:.6f}' for x in row[1:]])


def write_optimal_csv(path: str, alphas: np.ndarray, cs: np.ndarray, max_gamma: int) -> None:
  """One row per (alpha, c) of the map: the optimal gamma and the improvement it reaches."""
  best_gamma = analysis.optimal_gamma(alphas[None, :], cs[:, None], max_gamma=max_gamma)
  best = analysis.walltime_improvement(alphas[None, :], best_gamma, cs[:, None])
  pays = analysis.speedup_guaranteed(alphas[None, :], cs[:, None])
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['alpha', 'c', 'optimal_gamma', 'walltime_improvement', 'speedup_guaranteed'])
    for (i, c), (j, alpha) in itertools.product(enumerate(cs), enumerate(alphas)):
      writer.writerow(
        [f'{alpha:.6g}', f'{c:.6g}', best_gamma[i, j], f'{best[i, j]:.6f}', int(pays[i, j])]
      )


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  gammas = [int(g) for g in _GAMMAS.value]
  cs = [float(c) for c in _CS.value]
  if _ALPHA_POINTS.value < 2:
    raise app.UsageError('--alpha_points must be >= 2')
  workdir = _WORKDIR.value
  os.makedirs(workdir, exist_ok=True)

  alphas = np.linspace(0.0, 1.0, _ALPHA_POINTS.value)
  map_alphas = np.linspace(0.0, 0.99, _ALPHA_POINTS.value)  # the optimum is unbounded at alpha 1
  map_cs = np.linspace(0.0, 1.0, _ALPHA_POINTS.value)
  outputs = {
    'walltime_improvement.png': lambda p: plot_walltime(p, alphas, gammas, cs),
    'ops_increase.png': lambda p: plot_ops(p, alphas, gammas, cs),
    'optimal_gamma.png': lambda p: plot_optimal_gamma(p, map_alphas, map_cs, _MAX_GAMMA.value),
    'theory.csv': lambda p: write_grid_csv(p, alphas, gammas, cs),
    'optimal_gamma.csv': lambda p: write_optimal_csv(p, map_alphas, map_cs, _MAX_GAMMA.value),
  }
  for name, write in outputs.items():
    write(os.path.join(workdir, name))
    logging.info('wrote %s', os.path.join(workdir, name))
  logging.info(
    'anchors: alpha 0.75, gamma 7, c 0: %.2fx; alpha 0.2, gamma 3, c 0: %.2fx',
    analysis.walltime_improvement(0.75, 7, 0.0),
    analysis.walltime_improvement(0.2, 3, 0.0),
  )


if __name__ == '__main__':
  app.run(main)
