"""The one chi-square test of the distribution tests: observed counts against exact probabilities.

Significance is the callers' (SIGNIFICANCE, 1e-3, throughout): a p-value below it rejects "these
samples come from that distribution".
"""

import collections

import numpy as np
import scipy.stats

SIGNIFICANCE = 1e-3  # chi-square tests reject losslessness below this p-value


def pvalue(observed, probs, *, min_expected: float = 5.0) -> float:
  """Pearson chi-square p-value of `observed` counts under the exact `probs`.

  Cells whose expected count is below `min_expected` are pooled into one. Any observation in a
  cell of probability 0 gives p = 0 (the sampler produced an impossible outcome).

  Args:
    observed: counts, an array [K] or a {outcome: count} dict.
    probs: exact probabilities of the same cells, an array [K] or an {outcome: prob} dict whose
      keys include every observed outcome (a missing key means probability 0).
  """
  if isinstance(probs, dict):
    keys = list(probs)
    if set(observed) - set(keys):
      return 0.0
    observed = np.array([observed.get(k, 0) for k in keys], np.float64)
    probs = np.array([probs[k] for k in keys], np.float64)
  observed, probs = np.asarray(observed, np.float64), np.asarray(probs, np.float64)
  if observed[probs == 0].sum() > 0:
    return 0.0
  expected = probs / probs.sum() * observed.sum()
  small = expected < min_expected
  obs = np.append(observed[~small & (probs > 0)], observed[small].sum())
  exp = np.append(expected[~small & (probs > 0)], expected[small].sum())
  if exp[-1] == 0:
    obs, exp = obs[:-1], exp[:-1]
  return scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def rows_pvalue(samples: np.ndarray, exact: dict) -> float:
  """`pvalue` of the observed rows (tuples) of `samples` against an exact {row: prob}
  distribution; an impossible row fails the calling test at once."""
  observed = collections.Counter(map(tuple, samples.tolist()))
  assert set(observed) <= set(exact), f'impossible outputs: {set(observed) - set(exact)}'
  return pvalue(observed, exact)
