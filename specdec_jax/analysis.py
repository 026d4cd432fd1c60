"""The analysis of Leviathan et al. 2023 (§3), as vectorized numpy functions.

All functions broadcast their arguments against each other (numpy rules), so a whole grid of
`alpha`, `gamma` and `c` is evaluated in one call, e.g.
`walltime_improvement(alphas[:, None], 7, cs[None, :])`. Inputs out of range raise ValueError.

Symbols (docs/method.md, "Analysis"):
  alpha: expected acceptance rate `E_t[beta_t]`, in [0, 1].
  beta:  `sum_x min(p(x), q(x)) = 1 - TV(p, q)` for one target/drafter pair of distributions.
  gamma: number of drafted tokens per iteration (>= 0; 0 means plain target decoding).
  c:     time of one drafter step / time of one target step (>= 0); measured, it is a drafter
         call as the decode loop pays it (`timing.step_costs`).
  c_fixed: what the drafter costs per iteration beyond its gamma calls, in target steps (0 in
         the paper; measured by `timing.step_costs`, negative where a draft costs less than
         gamma of its calls, e.g. unrolled).
  c_hat: drafter arithmetic operations per token / target operations per token (>= 0).

Axes: V vocab; any other axes are broadcast.
"""

import numpy as np


def acceptance_rate(p, q) -> np.ndarray:
  """`beta = sum_x min(p(x), q(x))`, the probability that token verification accepts a draft.

  Args:
    p: [..., V] target probabilities.
    q: [..., V] drafter probabilities.

  Returns:
    float64[...] beta; `alpha` is its mean over positions of the target's own samples.
  """
  return np.sum(np.minimum(np.asarray(p, np.float64), np.asarray(q, np.float64)), axis=-1)


def expected_tokens(alpha, gamma) -> np.ndarray:
  """Expected tokens emitted per iteration: `(1 - alpha^(gamma+1)) / (1 - alpha)` (Eq. 1).

  This is `sum_{k=0}^{gamma} alpha^k`, so it equals `gamma + 1` at `alpha = 1`. It is evaluated as
  `-expm1((gamma+1) log1p(-d)) / d` with `d = 1 - alpha`, which stays accurate as alpha -> 1.
  It is also the factor by which the target's memory traffic falls.

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, >= 0 (need not be an integer).

  Returns:
    float64 array, broadcast shape of the inputs.
  """
  alpha = _in_range('alpha', alpha, 0.0, 1.0)
  gamma = _in_range('gamma', gamma, 0.0)
  deficit = 1.0 - alpha
  safe_deficit = np.where(deficit > 0, deficit, 1.0)
  with np.errstate(divide='ignore'):  # log1p(-1) = -inf at alpha = 0 is fine: expm1(-inf) = -1.
    geometric_sum = -np.expm1((gamma + 1) * np.log1p(-safe_deficit)) / safe_deficit
  return np.where(deficit > 0, geometric_sum, gamma + 1.0)


def walltime_improvement(alpha, gamma, c) -> np.ndarray:
  """Expected walltime improvement: `(1 - alpha^(gamma+1)) / ((1 - alpha)(c gamma + 1))` (Thm 3.8).

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, >= 0.
    c: drafter step time / target step time, >= 0.

  Returns:
    float64 array: speedup factor over plain target decoding (> 1 means faster).
  """
  return walltime_improvement_measured(alpha, gamma, c, 1.0)


def walltime_improvement_measured(alpha, gamma, c, target_pass_cost, c_fixed=0.0) -> np.ndarray:
  """Walltime improvement with a measured cost of the (gamma+1)-position target pass.

  `expected_tokens(alpha, gamma) / (c gamma + c_fixed + target_pass_cost)`, where
  `target_pass_cost` is the time of scoring gamma+1 positions in one target pass relative to a
  1-position target step. The paper assumes `target_pass_cost = 1` (scoring is free while
  memory-bound) and `c_fixed = 0`, which gives `walltime_improvement`.

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, >= 0.
    c: drafter step time / target step time, >= 0.
    target_pass_cost: (gamma+1)-position target pass time / 1-position target step time, > 0.
    c_fixed: what the drafter costs per iteration beyond its gamma calls, in target steps (on a
      CPU its first call reloads what the pass evicted: `timing.step_costs`); may be negative,
      with `c gamma + c_fixed + target_pass_cost` > 0.

  Returns:
    float64 array, broadcast shape of the inputs.
  """
  return iteration_speedup(expected_tokens(alpha, gamma), gamma, c, target_pass_cost, c_fixed)


def iteration_speedup(tokens_per_iteration, gamma, c, target_pass_cost, c_fixed=0.0) -> np.ndarray:
  """Walltime improvement of a loop emitting `tokens_per_iteration` tokens per iteration (the
  block efficiency) at the cost of gamma drafter calls and one target pass:
  `tokens_per_iteration / (c gamma + c_fixed + target_pass_cost)`, in target steps.

  `walltime_improvement_measured` is this at `expected_tokens(alpha, gamma)`. A multi-draft loop
  (K paths) has no closed form of its tokens in alpha: it is predicted from its measured block
  efficiency, with c and the pass cost measured at K rows per row (`timing.step_costs`).
  """
  c = _in_range('c', c, 0.0)
  c_fixed = _in_range('c_fixed', c_fixed, -np.inf)  # measured: any finite value
  target_pass_cost = _in_range('target_pass_cost', target_pass_cost, 0.0)
  if np.any(target_pass_cost == 0):
    raise ValueError('target_pass_cost must be > 0')
  tokens = _in_range('tokens_per_iteration', tokens_per_iteration, 0.0)
  cost = c * gamma + c_fixed + target_pass_cost
  if np.any(cost <= 0):
    raise ValueError(f'c * gamma + c_fixed + target_pass_cost must be > 0, got {np.min(cost)}')
  return tokens / cost


def call_speedup(loop_speedup, baseline_seconds, baseline_fixed, fixed) -> np.ndarray:
  """Whole-call speedup when every call also pays seconds outside the decode loop (the encoder
  over the source, the caches' set-up, dispatch), which the loop formulas above leave out.

  The autoregressive loop takes `baseline_seconds - baseline_fixed`, the speculative loop that
  over `loop_speedup`, and each method adds its own fixed seconds:
  `baseline_seconds / (fixed + (baseline_seconds - baseline_fixed) / loop_speedup)`. At no fixed
  cost it is `loop_speedup`; a fixed cost both pay alike pulls it towards 1.

  Args:
    loop_speedup: the loop's predicted speedup (`walltime_improvement_measured`), > 0.
    baseline_seconds: autoregressive decoding's seconds over the calls, > 0.
    baseline_fixed: its fixed seconds over those calls, in [0, baseline_seconds].
    fixed: the speculative method's fixed seconds over the same calls, >= 0.

  Returns:
    float64 array, broadcast shape of the inputs.
  """
  loop_speedup = _in_range('loop_speedup', loop_speedup, 0.0)
  baseline_seconds = _in_range('baseline_seconds', baseline_seconds, 0.0)
  if np.any(loop_speedup == 0) or np.any(baseline_seconds == 0):
    raise ValueError('loop_speedup and baseline_seconds must be > 0')
  baseline_fixed = _in_range('baseline_fixed', baseline_fixed, 0.0)
  if np.any(baseline_fixed > baseline_seconds):
    raise ValueError('baseline_fixed must be <= baseline_seconds (a part of them)')
  fixed = _in_range('fixed', fixed, 0.0)
  return baseline_seconds / (fixed + (baseline_seconds - baseline_fixed) / loop_speedup)


def ops_increase(alpha, gamma, c_hat) -> np.ndarray:
  """Factor by which arithmetic operations grow: `(c_hat gamma + gamma + 1)(1 - alpha) /
  (1 - alpha^(gamma+1))` (Thm 3.11).

  Each iteration runs the drafter gamma times and the target on gamma+1 positions, and emits
  `expected_tokens(alpha, gamma)` tokens.

  Args:
    alpha: acceptance rate in [0, 1].
    gamma: drafted tokens per iteration, >= 0.
    c_hat: drafter ops per token / target ops per token, >= 0.

  Returns:
    float64 array (>= 1 when c_hat >= 0).
  """
  c_hat = _in_range('c_hat', c_hat, 0.0)
  gamma = _in_range('gamma', gamma, 0.0)
  return (c_hat * gamma + gamma + 1.0) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha, c, max_gamma: int = 64) -> np.ndarray:
  """The integer gamma in 1..max_gamma maximizing `walltime_improvement(alpha, gamma, c)`.

  Brute force over all candidates; ties, including gains below float64 resolution (c = 0 makes
  every extra draft worth its alpha^gamma), go to the smallest gamma. The optimum is finite for
  alpha < 1; at alpha = 1 with c < 1 the improvement grows without bound and max_gamma is
  returned. Whether the best gamma pays off at all is `speedup_guaranteed(alpha, c)`.

  Args:
    alpha: acceptance rate in [0, 1].
    c: drafter step time / target step time, >= 0.
    max_gamma: largest gamma considered, >= 1.

  Returns:
    int64 array, broadcast shape of alpha and c.
  """
  if max_gamma < 1:
    raise ValueError(f'max_gamma must be >= 1, got {max_gamma}')
  alpha, c = np.broadcast_arrays(np.asarray(alpha, np.float64), np.asarray(c, np.float64))
  gammas = np.arange(1, max_gamma + 1)
  improvement = walltime_improvement(alpha[..., None], gammas, c[..., None])
  return gammas[np.argmax(improvement, axis=-1)]


def speedup_guaranteed(alpha, c) -> np.ndarray:
  """Corollary 3.9: speculative decoding can be faster than the target alone iff `alpha > c`.

  If `alpha > c`, gamma = 1 already gives `(1 + alpha) / (1 + c) > 1`
  (see `guaranteed_improvement`). Conversely, if `alpha <= c` then
  `sum_{k<=gamma} alpha^k <= 1 + gamma c`, so no gamma improves on the target alone.

  Args:
    alpha: acceptance rate in [0, 1].
    c: drafter step time / target step time, >= 0.

  Returns:
    bool array, broadcast shape of the inputs.
  """
  return _in_range('alpha', alpha, 0.0, 1.0) > _in_range('c', c, 0.0)


def guaranteed_improvement(alpha, c) -> np.ndarray:
  """Walltime improvement the best gamma is guaranteed to reach: `(1 + alpha) / (1 + c)` if
  `alpha > c` (Corollary 3.9; attained at gamma = 1), else 1 (gamma = 0: do not speculate).

  Args:
    alpha: acceptance rate in [0, 1].
    c: drafter step time / target step time, >= 0.

  Returns:
    float64 array >= 1, broadcast shape of the inputs.
  """
  alpha = _in_range('alpha', alpha, 0.0, 1.0)
  c = _in_range('c', c, 0.0)
  return np.maximum((1.0 + alpha) / (1.0 + c), 1.0)


def _in_range(name: str, x, low: float, high: float = np.inf) -> np.ndarray:
  """x as float64, or ValueError naming `name` if any entry is outside [low, high] or NaN."""
  x = np.asarray(x, np.float64)
  if not np.all((x >= low) & (x <= high)):
    bad = x[~((x >= low) & (x <= high))].flat[0]
    raise ValueError(f'{name} must be in [{low}, {high}], got {bad}')
  return x
