"""Tests for specdec_jax.analysis: hand-computed values, limits, brute force, Corollary 3.9."""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from specdec_jax import analysis
from tests import verify_oracle as oracle


def test_acceptance_rate():
  p = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0], [0.2, 0.3, 0.5]])
  q = np.array([[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.5, 0.3, 0.2]])
  np.testing.assert_allclose(analysis.acceptance_rate(p, q), [1.0, 0.0, 0.7])
  np.testing.assert_allclose(analysis.acceptance_rate(q, p), analysis.acceptance_rate(p, q))


@pytest.mark.parametrize(
  'alpha, gamma, expected',
  [
    (0.0, 5, 1.0),
    (0.5, 1, 1.5),
    (0.5, 3, 1.875),
    (0.75, 7, (1 - 0.75**8) / 0.25),  # 3.59954834: the EnDe T5-small anchor, alpha 0.75
    (1.0, 7, 8.0),
    (0.3, 0, 1.0),
  ],
)
def test_expected_tokens(alpha, gamma, expected):
  np.testing.assert_allclose(analysis.expected_tokens(alpha, gamma), expected, rtol=1e-12)


def test_expected_tokens_limit_at_one():
  gammas = np.arange(0, 20)
  np.testing.assert_array_equal(analysis.expected_tokens(1.0, gammas), gammas + 1)
  near_one = analysis.expected_tokens(1 - 1e-12, gammas)
  assert np.all(np.isfinite(near_one))
  np.testing.assert_allclose(near_one, gammas + 1, rtol=1e-9)
  # Equal to the explicit geometric sum everywhere on a grid, alpha = 1 included.
  alphas = np.linspace(0, 1, 101)[:, None]
  geometric = sum(alphas**k * (k <= gammas) for k in range(20))
  np.testing.assert_allclose(analysis.expected_tokens(alphas, gammas), geometric, rtol=1e-12)


def test_walltime_improvement():
  # docs/method.md anchor: EnDe, alpha 0.75, gamma 7; reported 3.4x with a T5-small drafter.
  np.testing.assert_allclose(analysis.walltime_improvement(0.75, 7, 0.0), 3.599548, rtol=1e-6)
  np.testing.assert_allclose(
    analysis.walltime_improvement(0.75, 7, 0.02), 3.599548 / 1.14, rtol=1e-6
  )
  # Bigram anchor: c ~ 0, alpha 0.2, gamma 3 -> 1.248 (reported 1.25x).
  np.testing.assert_allclose(analysis.walltime_improvement(0.2, 3, 0.0), 1.248)
  grid = analysis.walltime_improvement(
    np.linspace(0, 1, 5)[:, None, None], [3, 5, 7], [[0.1], [0.4]]
  )
  assert grid.shape == (5, 2, 3) and np.all(np.isfinite(grid))


def test_walltime_improvement_measured():
  alpha, gamma, c = np.linspace(0, 1, 11)[:, None], np.array([1, 4, 8]), 0.1
  np.testing.assert_allclose(
    analysis.walltime_improvement_measured(alpha, gamma, c, 1.0),
    analysis.walltime_improvement(alpha, gamma, c),
  )
  np.testing.assert_allclose(
    analysis.walltime_improvement_measured(0.5, 3, 0.1, 1.3), 1.875 / (0.3 + 1.3)
  )
  # A multi-draft loop's prediction: its measured tokens per iteration over the same cost.
  np.testing.assert_allclose(analysis.iteration_speedup(2.4, 3, 0.1, 2.0), 2.4 / 2.3)
  # A drafter's fixed cost per iteration adds to the iteration's, once whatever gamma.
  np.testing.assert_allclose(
    analysis.walltime_improvement_measured(0.5, [3, 5], 0.1, 1.3, 0.2),
    [1.875 / (0.3 + 0.2 + 1.3), 1.96875 / (0.5 + 0.2 + 1.3)],
  )


def test_call_speedup_adds_each_methods_fixed_seconds_to_the_loops():
  # 10 s of autoregressive decoding, 2 of them fixed: its loop is 8 s, the speculative loop at
  # 2x is 4 s, plus its own 2.5 s fixed: 10 / 6.5.
  np.testing.assert_allclose(analysis.call_speedup(2.0, 10.0, 2.0, 2.5), 10 / 6.5)
  np.testing.assert_allclose(analysis.call_speedup([1.5, 3.0], 10.0, 0.0, 0.0), [1.5, 3.0])
  # A fixed cost both pay alike pulls the speedup towards 1, from either side.
  assert 1 < analysis.call_speedup(2.0, 10.0, 5.0, 5.0) < 2
  assert 0.5 < analysis.call_speedup(0.5, 10.0, 5.0, 5.0) < 1
  for bad, match in [
    ((0.0, 10.0, 1.0, 1.0), 'must be > 0'),
    ((2.0, 10.0, 11.0, 1.0), 'baseline_fixed must be <= baseline_seconds'),
    ((2.0, 10.0, 1.0, -1.0), 'fixed must be in'),
    ((2.0, np.nan, 1.0, 1.0), 'baseline_seconds must be in'),
  ]:
    with pytest.raises(ValueError, match=match):
      analysis.call_speedup(*bad)


def test_ops_increase():
  np.testing.assert_allclose(analysis.ops_increase(0.5, 3, 0.1), (0.3 + 3 + 1) / 1.875)
  np.testing.assert_allclose(analysis.ops_increase(1.0, 5, 0.0), 1.0)  # all accepted, free drafter
  np.testing.assert_allclose(analysis.ops_increase(0.0, 5, 0.0), 6.0)  # nothing accepted


def test_optimal_gamma_matches_brute_force():
  alphas = np.linspace(0, 0.99, 34)
  cs = np.array([0.0, 0.01, 0.05, 0.1, 0.3, 0.6, 1.2])
  result = analysis.optimal_gamma(alphas[:, None], cs[None, :], max_gamma=40)
  assert result.shape == (34, 7)
  for (i, alpha), (j, c) in itertools.product(enumerate(alphas), enumerate(cs)):
    values = [(1 - alpha ** (g + 1)) / ((1 - alpha) * (c * g + 1)) for g in range(1, 41)]
    assert result[i, j] == 1 + int(np.argmax(values)), (alpha, c)


def test_optimal_gamma_known_values():
  assert analysis.optimal_gamma(1.0, 0.1, max_gamma=12) == 12  # unbounded at alpha = 1
  assert analysis.optimal_gamma(0.0, 0.1) == 1
  # alpha 0.8, c 0.05: improvements 3.0823, 3.0921, 3.0780 at gamma 7, 8, 9 (by hand).
  np.testing.assert_allclose(
    analysis.walltime_improvement(0.8, [7, 8, 9], 0.05), [3.0823, 3.0921, 3.0780], atol=1e-4
  )
  assert analysis.optimal_gamma(0.8, 0.05) == 8


def test_corollary_rule():
  alphas = np.linspace(0, 1, 41)[:, None]
  cs = np.linspace(0, 1.5, 31)[None, :]
  best = analysis.walltime_improvement(alphas[..., None], np.arange(1, 65), cs[..., None]).max(-1)
  guaranteed = analysis.speedup_guaranteed(alphas, cs)
  np.testing.assert_array_equal(guaranteed, alphas > cs)
  # alpha > c: some gamma reaches (1 + alpha) / (1 + c) > 1; alpha <= c: no gamma beats 1.
  bound = analysis.guaranteed_improvement(alphas, cs)
  assert np.all(best[guaranteed] >= bound[guaranteed] * (1 - 1e-12))
  assert np.all(bound[guaranteed] > 1)
  assert np.all(best[~guaranteed] <= 1 + 1e-12)
  np.testing.assert_array_equal(bound[~guaranteed], 1.0)
  np.testing.assert_allclose(analysis.guaranteed_improvement(0.6, 0.2), 1.6 / 1.2)


def test_expected_tokens_agrees_with_token_verification():
  """For context-free models acceptances are i.i.d. with rate beta: 1 + E[tau] of the exact
  token-verification oracle equals expected_tokens(beta, gamma)."""
  p = [Fraction(1, 6), Fraction(1, 2), Fraction(1, 3)]
  q = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)]
  beta = analysis.acceptance_rate([float(x) for x in p], [float(x) for x in q])
  for gamma in (1, 2, 3):
    target = oracle.context_free_model(p, 3, gamma)
    drafter = oracle.context_free_model(q, 3, gamma)
    exact = oracle.iteration_distribution(target, drafter, gamma, 'token')
    np.testing.assert_allclose(
      1 + float(oracle.expected_accepted(exact)), analysis.expected_tokens(beta, gamma), rtol=1e-12
    )


@pytest.mark.parametrize(
  'call, message',
  [
    (lambda: analysis.expected_tokens(1.1, 3), 'alpha must be in'),
    (lambda: analysis.expected_tokens(-0.1, 3), 'alpha must be in'),
    (lambda: analysis.expected_tokens(np.nan, 3), 'alpha must be in'),
    (lambda: analysis.expected_tokens(0.5, -1), 'gamma must be in'),
    (lambda: analysis.walltime_improvement(0.5, 3, -0.1), 'c must be in'),
    (lambda: analysis.walltime_improvement_measured(0.5, 3, 0.1, 0.0), 'target_pass_cost'),
    (lambda: analysis.iteration_speedup(-1.0, 3, 0.1, 1.0), 'tokens_per_iteration must be in'),
    (lambda: analysis.iteration_speedup(2.0, 3, 0.1, 1.0, np.nan), 'c_fixed must be in'),
    (lambda: analysis.iteration_speedup(2.0, 3, 0.1, 1.0, -1.5), r'c_fixed \+ target_pass_cost'),
    (lambda: analysis.ops_increase(0.5, 3, -1.0), 'c_hat must be in'),
    (lambda: analysis.optimal_gamma(0.5, 0.1, max_gamma=0), 'max_gamma must be >= 1'),
    (lambda: analysis.speedup_guaranteed([0.5, 2.0], 0.1), 'alpha must be in'),
  ],
)
def test_bad_input(call, message):
  with pytest.raises(ValueError, match=message):
    call()
