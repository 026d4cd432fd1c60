"""Sun et al.'s two-token toy model (their §3 and Figure 3a) for experiments/verification.py: exact
accepted-length distributions by enumeration (rationals), the greedy block verifier's first
iteration from its kernel's own law, a Monte Carlo estimate for any other verifier, and the
experiment's 'toy' part (`toy_rows`: the CCDF of every verifier at each toy gamma)."""

import itertools
import math
from collections.abc import Iterator, Sequence
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import verifiers, verify_greedy

# Sun et al. §3: vocabulary {A, B}, both models context-free, gamma 2; token verification accepts
# 10/9 drafts per iteration in expectation, block verification 11/9 (docs/method.md §9).
SUN_TOY_TARGET = (Fraction(1, 3), Fraction(2, 3))  # Mb(A), Mb(B)
SUN_TOY_DRAFTER = (Fraction(2, 3), Fraction(1, 3))  # Ms(A), Ms(B)
EXACT_VERIFIERS = ('token', 'block')


def toy_accepted_distribution(
  target: Sequence, drafter: Sequence, gamma: int, method: str
) -> list[Fraction]:
  """P(tau = k), k = 0..gamma, of one iteration with context-free models, in exact arithmetic.

  Every draft block `X_1..X_gamma` (V**gamma of them) is enumerated with its probability under
  the drafter; given the block, tau's law follows from the verifier's acceptance probabilities:
  token verification (Leviathan et al.) accepts the first t drafts with probability
  `prod_{i<=t} h_i (1 - h_{t+1})`, `h_i = min(1, p(X_i) / q(X_i))`; block verification (Sun et
  al., Alg. 2) tests each sub-block independently with `h_i = r_i / (r_i + 1 - w_i)` (i < gamma;
  0/0 = 0) and `h_gamma = w_gamma`, where `w_0 = 1`, `w_i = min(1, w_{i-1} p(X_i) / q(X_i))`,
  `r_i = sum_x max(0, w_i p(x) - q(x))`, and keeps the longest accepted one (tau = 0 if none).

  Args:
    target: p, the target's distribution over the vocabulary (numbers, or Fractions for exact
      results), the same after every prefix.
    drafter: q, the drafter's, likewise.
    gamma: drafted tokens per iteration.
    method: 'token' or 'block'.

  Returns:
    [P(tau = 0), ..., P(tau = gamma)] as Fractions (exact when the inputs are).
  """
  p = [Fraction(x) for x in target]
  q = [Fraction(x) for x in drafter]
  if len(p) != len(q) or sum(p) != 1 or sum(q) != 1 or min(p + q) < 0:
    raise ValueError(f'target and drafter must be distributions over one vocabulary: {p}, {q}')
  if method not in EXACT_VERIFIERS:
    raise ValueError(f'No exact toy formula for verifier {method!r}; have {EXACT_VERIFIERS}.')
  dist = [Fraction(0)] * (gamma + 1)
  for block in itertools.product(range(len(q)), repeat=gamma):
    block_prob = math.prod((q[x] for x in block), start=Fraction(1))
    if not block_prob:
      continue
    ratios = [p[x] / q[x] for x in block]
    if method == 'token':
      h = [min(Fraction(1), r) for r in ratios]
      tau_probs = [math.prod(h[:t], start=Fraction(1)) * (1 - h[t]) for t in range(gamma)]
      tau_probs.append(math.prod(h, start=Fraction(1)))
    else:
      w = [Fraction(1)]
      for r in ratios:
        w.append(min(Fraction(1), w[-1] * r))
      h = []  # h[i - 1] = h_i
      for i in range(1, gamma):
        residual = sum(max(Fraction(0), w[i] * px - qx) for px, qx in zip(p, q))
        denominator = residual + 1 - w[i]
        h.append(residual / denominator if denominator else Fraction(0))
      h.append(w[gamma])
      rejected_after = [math.prod((1 - x for x in h[t:]), start=Fraction(1)) for t in range(gamma)]
      tau_probs = [rejected_after[0]] + [
        h[t - 1] * (rejected_after[t] if t < gamma else 1) for t in range(1, gamma + 1)
      ]
    for t, prob in enumerate(tau_probs):
      dist[t] += block_prob * prob
  return dist


def toy_monte_carlo_distribution(
  verifier: verifiers.Verifier,
  target: Sequence,
  drafter: Sequence,
  gamma: int,
  samples: int,
  seed: int,
) -> np.ndarray:
  """P(tau = k), k = 0..gamma, estimated from `samples` first iterations (from its initial
  state) of a registered verifier's kernel on context-free models: float64[gamma + 1]."""
  p = np.asarray([float(x) for x in target], np.float32)
  q = np.asarray([float(x) for x in drafter], np.float32)
  rng = np.random.default_rng(seed)
  drafts = rng.choice(len(q), size=(samples, gamma), p=q / q.sum())
  state = None if verifier.init_state is None else verifier.init_state(samples, gamma)
  tau, _, _ = jax.jit(verifier.verify)(
    jax.random.key(seed),
    jnp.asarray(drafts, jnp.int32),
    jnp.broadcast_to(q, (samples, gamma, len(q))),
    jnp.broadcast_to(p, (samples, gamma + 1, len(p))),
    None,
    state,
  )
  return np.bincount(np.asarray(tau), minlength=gamma + 1) / samples


def toy_greedy_block_distribution(target: Sequence, drafter: Sequence, gamma: int) -> np.ndarray:
  """P(tau = k), k = 0..gamma, of greedy block verification's first iteration (from the target's
  own law) on context-free models: its kernel's distribution mode (`verify_greedy.iteration_law`,
  float32) weighted by every draft block's probability: float64[gamma + 1]."""
  p = np.asarray([float(x) for x in target], np.float32)
  q = np.asarray([float(x) for x in drafter], np.float32)
  blocks = np.array(list(itertools.product(range(len(q)), repeat=gamma)), np.int32)
  rows = len(blocks)
  tau_probs, _, _ = verify_greedy.iteration_law(
    jnp.asarray(blocks),
    jnp.broadcast_to(q, (rows, gamma, len(q))),
    jnp.broadcast_to(p, (rows, gamma + 1, len(p))),
    verify_greedy.empty_levels(rows, gamma),
  )
  return np.prod(q.astype(np.float64)[blocks], axis=1) @ np.asarray(tau_probs, np.float64)


def ccdf_of_distribution(dist: Sequence) -> list:
  """P(tau >= k), k = 0..gamma, from P(tau = k)."""
  return [sum(dist[k:], start=type(dist[0])(0)) for k in range(len(dist))]


def ccdf_of_lengths(accepted: np.ndarray, gamma: int) -> np.ndarray:
  """P(tau >= k), k = 0..gamma, of observed accepted lengths: float64[gamma + 1]."""
  accepted = np.asarray(accepted)
  if accepted.size == 0:
    return np.full(gamma + 1, np.nan)
  return (accepted[:, None] >= np.arange(gamma + 1)).mean(axis=0)


def toy_rows(config) -> Iterator[tuple[str, list[dict]]]:
  """Sun et al.'s toy model: the accepted-length CCDF of every verifier at each toy gamma."""
  for gamma in config.toy_gammas:
    for method in config.verifiers:
      if method in EXACT_VERIFIERS:
        dist = toy_accepted_distribution(SUN_TOY_TARGET, SUN_TOY_DRAFTER, gamma, method)
        estimate, samples = 'exact', None
      elif method == verify_greedy.NAME:  # its first iteration: the rest depends on the state
        dist = list(toy_greedy_block_distribution(SUN_TOY_TARGET, SUN_TOY_DRAFTER, gamma))
        estimate, samples = 'kernel_law', None
      else:
        fn = verifiers.get(method)
        args = (SUN_TOY_TARGET, SUN_TOY_DRAFTER, gamma, config.toy_samples, config.seeds[0])
        dist = list(toy_monte_carlo_distribution(fn, *args))
        estimate, samples = 'monte_carlo', config.toy_samples
      ccdf = ccdf_of_distribution(dist)
      mean = sum(ccdf[1:])
      yield (
        'ccdf',
        [
          dict(
            model='toy',
            drafter='Ms=(2/3,1/3)',
            method=method,
            temp=None,
            gamma=gamma,
            k=k,
            p_at_least_k=float(value),
            exact=str(value) if estimate == 'exact' else None,
            mean_accepted=float(mean),
            samples=samples,
            estimate=estimate,
          )
          for k, value in enumerate(ccdf)
        ],
      )
