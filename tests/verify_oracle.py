"""Exact distribution of one speculative iteration, by enumeration in rational arithmetic.

A toy model maps every prefix (a tuple of token ids, the "context") to a distribution over the
vocabulary, given as a tuple of `fractions.Fraction`. The oracle enumerates every drafted block,
follows docs/method.md's formulas for each verifier in exact arithmetic, and returns the
distribution of the emitted sequence `X^tau + (Y,)` (it determines tau, the accepted drafts, Y).

Written independently of specdec_jax.verify (loops over blocks, no log space) so the two can be
compared. For V <= 4 and G <= 3 every function here runs in well under a second.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

import numpy as np

Model = dict[tuple[int, ...], tuple[Fraction, ...]]
Distribution = dict[tuple[int, ...], Fraction]


def random_model(
  rng: np.random.Generator, vocab: int, max_context: int, zero_prob: float = 0.25
) -> Model:
  """A context-dependent model with small-denominator probabilities and some exact zeros.

  Args:
    rng: numpy generator.
    vocab: V.
    max_context: the model is defined for every prefix of length 0..max_context.
    zero_prob: chance that a token gets probability exactly 0 in a context.

  Returns:
    {prefix: (P(0|prefix), ..., P(V-1|prefix))}.
  """
  model = {}
  for length in range(max_context + 1):
    for prefix in itertools.product(range(vocab), repeat=length):
      weights = rng.integers(1, 7, size=vocab) * (rng.random(vocab) >= zero_prob)
      if weights.sum() == 0:
        weights[rng.integers(vocab)] = 1
      total = int(weights.sum())
      model[prefix] = tuple(Fraction(int(w), total) for w in weights)
  return model


def context_free_model(probs, vocab: int, max_context: int) -> Model:
  """The same distribution `probs` (Fractions) after every prefix."""
  probs = tuple(Fraction(p) for p in probs)
  return {
    prefix: probs
    for length in range(max_context + 1)
    for prefix in itertools.product(range(vocab), repeat=length)
  }


def sequence_distribution(model: Model, length: int, vocab: int) -> Distribution:
  """Exact distribution of `length` tokens sampled autoregressively from `model`."""
  dist = {(): Fraction(1)}
  for _ in range(length):
    dist = {seq + (x,): prob * model[seq][x] for seq, prob in dist.items() for x in range(vocab)}
  return {seq: prob for seq, prob in dist.items() if prob}


def iteration_distribution(
  target: Model, drafter: Model, gamma: int, method: str, stop_below=None
) -> Distribution:
  """Exact distribution of the emitted sequence `X^tau + (Y,)` of one iteration.

  Args:
    target: Mb, defined on prefixes of length 0..gamma.
    drafter: Ms, defined on prefixes of length 0..gamma-1.
    gamma: G, drafted tokens.
    method: 'token' or 'block'.
    stop_below: adaptive draft length: drafting stops after the first `X_i` whose drafter
      probability `q_i(X_i)` is below it (that draft kept), and the block of L <= G drafts is
      verified as a block of length L; None drafts all G.

  Returns:
    {emitted sequence (length 1..G+1): probability}, only positive entries.
  """
  vocab = len(target[()])
  out = defaultdict(Fraction)
  for block, block_prob in sequence_distribution(drafter, gamma, vocab).items():
    p = [target[block[:i]] for i in range(gamma + 1)]  # p[i] = p_{i+1}
    q = [drafter[block[:i]] for i in range(gamma)]
    length = gamma
    if stop_below is not None:  # the full block's probability sums over the unused tail
      length = next((i + 1 for i in range(gamma) if q[i][block[i]] < stop_below), gamma)
    for emitted, prob in _verify_block(block[:length], p, q, length, method).items():
      out[emitted] += block_prob * prob
  return dict(out)


def _verify_block(block, p, q, gamma, method) -> Distribution:
  """{X^tau + (Y,): probability} of verifying the drafted `block` of `gamma` tokens."""
  ratios = [p[i][block[i]] / q[i][block[i]] for i in range(gamma)]  # q > 0: block was drafted.
  if method == 'token':
    weights = [Fraction(1)] * (gamma + 1)
    accept = [min(Fraction(1), r) for r in ratios]
    tau_probs = [_prod(accept[:t]) * (1 - accept[t] if t < gamma else 1) for t in range(gamma + 1)]
  elif method == 'block':
    weights = [Fraction(1)]
    for r in ratios:
      weights.append(min(Fraction(1), weights[-1] * r))
    accept = []
    for i in range(1, gamma):
      residual_mass = sum(_residual(weights[i], p[i], q[i]))
      denominator = residual_mass + 1 - weights[i]
      accept.append(residual_mass / denominator if denominator else Fraction(0))
    if gamma:
      accept.append(weights[gamma])
    # accept[i-1] = h_i; tau is the largest accepted i, 0 if none.
    tau_probs = [_prod(1 - h for h in accept)] + [
      accept[t - 1] * _prod(1 - h for h in accept[t:]) for t in range(1, gamma + 1)
    ]
  else:
    raise ValueError(f'unknown method {method!r}')
  out = defaultdict(Fraction)
  for tau, tau_prob in enumerate(tau_probs):
    if not tau_prob:
      continue
    for y, y_prob in enumerate(_next_token_distribution(tau, weights[tau], p, q, gamma)):
      if y_prob:
        out[tuple(block[:tau]) + (y,)] += tau_prob * y_prob
  return out


def _next_token_distribution(tau, weight, p, q, gamma) -> list[Fraction]:
  """`p_{G+1}` at tau = G, else `norm(max(0, w_tau p_{tau+1} - q_{tau+1}))` (p_{tau+1} if 0)."""
  if tau == gamma:
    return list(p[gamma])
  residual = _residual(weight, p[tau], q[tau])
  total = sum(residual)
  return [r / total for r in residual] if total else list(p[tau])


def _residual(weight, p, q) -> list[Fraction]:
  return [max(Fraction(0), weight * px - qx) for px, qx in zip(p, q)]


def _prod(values) -> Fraction:
  out = Fraction(1)
  for v in values:
    out *= v
  return out


def continue_with_target(dist: Distribution, target: Model, length: int) -> Distribution:
  """Extends every emitted sequence by sampling from `target` up to `length` tokens."""
  vocab = len(target[()])
  out = defaultdict(Fraction)
  for seq, prob in dist.items():
    for tail, tail_prob in _continuations(seq, target, length, vocab):
      out[seq + tail] += prob * tail_prob
  return dict(out)


def _continuations(seq, target, length, vocab):
  if len(seq) >= length:
    yield (), Fraction(1)
    return
  for x in range(vocab):
    if target[seq][x]:
      for tail, prob in _continuations(seq + (x,), target, length, vocab):
        yield (x,) + tail, target[seq][x] * prob


def expected_accepted(dist: Distribution) -> Fraction:
  """E[tau] = E[len(emitted) - 1]."""
  return sum((len(seq) - 1) * prob for seq, prob in dist.items())
