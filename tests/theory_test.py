"""Smoke test of experiments/theory.py: the command line as the README runs it, on small grids."""

import csv
import pathlib
import subprocess
import sys

import numpy as np

from specdec_jax import analysis

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _read_csv(path):
  with open(path) as f:
    rows = list(csv.DictReader(f))
  return {key: np.array([float(row[key]) for row in rows]) for key in rows[0]}


def test_theory_main_writes_plots_and_tables(tmp_path):
  command = [
    sys.executable, '-m', 'experiments.theory', f'--workdir={tmp_path}',
    '--gammas=2,7', '--cs=0.05,0.5', '--alpha_points=11', '--max_gamma=16',
  ]  # fmt: skip
  subprocess.run(command, cwd=_REPO, check=True, capture_output=True, timeout=120)

  for name in ('walltime_improvement.png', 'ops_increase.png', 'optimal_gamma.png'):
    assert (tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', name

  grid = _read_csv(tmp_path / 'theory.csv')
  assert len(grid['alpha']) == 11 * 2 * 2
  assert set(grid['gamma']) == {2, 7} and set(grid['c']) == {0.05, 0.5}
  np.testing.assert_allclose(
    grid['walltime_improvement'],
    analysis.walltime_improvement(grid['alpha'], grid['gamma'], grid['c']),
    atol=1e-6,
  )
  np.testing.assert_allclose(
    grid['ops_increase'], analysis.ops_increase(grid['alpha'], grid['gamma'], grid['c']), atol=1e-6
  )

  best = _read_csv(tmp_path / 'optimal_gamma.csv')
  assert len(best['alpha']) == 11 * 11
  np.testing.assert_array_equal(
    best['optimal_gamma'], analysis.optimal_gamma(best['alpha'], best['c'], max_gamma=16)
  )
  np.testing.assert_array_equal(best['speedup_guaranteed'], best['alpha'] > best['c'])
  assert np.all(best['walltime_improvement'][best['alpha'] > best['c']] > 1)
