"""Exact laws of one multi-path iteration, by enumerating every K-tuple of drafted paths.

Two kinds of oracle, for tests/verify_multipath_test.py:

- Rational (`gbv_distribution`, `rrs_distribution`): the algorithms in `fractions.Fraction`,
  written independently of specdec_jax.verify_multipath (loops over tuples and tokens, no log
  space, no normalized recursion). `gbv_distribution` is GBV as docs/method.md section 6 states
  it (selection, the skewed law by the closed form `(F_hi^K - F_lo^K) / ((A + Q)^K - A^K)` with
  `A` the drafter mass ranked below the node and `Q` the node's, block verification), with the
  capped or the ratio order, and with the public reference code's mixed tie rule as
  `tie_rule='code'`; it reproduces the exact values of section 9 of that page.
- Kernel math (`all_tuples`): every K-tuple of paths as float32 arrays shaped like the kernels'
  inputs, with its exact probability, so a test can evaluate the kernels' own acceptance
  probabilities and residuals on every outcome and sum the law in float64.

Models are tests/verify_oracle.py's `{prefix: (P(0|prefix), ...)}` dicts. Sizes: V = 3, G = 2,
K <= 3 is at most 729 tuples; everything here takes well under a second there.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

import numpy as np

from tests import verify_oracle as oracle

ONE, ZERO = Fraction(1), Fraction(0)
# Token orders: the ratio p/q (the kernel's), and min(1, p/q) (the public reference code's).
ORDERS = ('ratio', 'capped')
_BIG = Fraction(10) ** 9  # the rank of a token the drafter cannot draw: above every ratio here


def paths(drafter: oracle.Model, gamma: int, vocab: int) -> dict[tuple[int, ...], Fraction]:
  """Every drafted path of `gamma` tokens with its probability (positive ones only)."""
  return oracle.sequence_distribution(drafter, gamma, vocab)


def path_tuples(drafter: oracle.Model, gamma: int, vocab: int, num_drafts: int):
  """Yields (probability, K paths) for every K-tuple of i.i.d. drafted paths."""
  single = list(paths(drafter, gamma, vocab).items())
  for combo in itertools.product(single, repeat=num_drafts):
    prob = ONE
    for _, path_prob in combo:
      prob *= path_prob
    yield prob, tuple(path for path, _ in combo)


def ratio_key(p, q, order: str) -> tuple:
  """Per-token rank keys at a node: `(ratio, id)` with ratio p/q or min(1, p/q)."""
  keys = []
  for t, (pt, qt) in enumerate(zip(p, q)):
    if qt == 0:
      ratio = _BIG
    else:
      ratio = pt / qt if order == 'ratio' else min(ONE, pt / qt)
    keys.append((ratio, t))
  return tuple(keys)


def gbv_distribution(
  target: oracle.Model,
  drafter: oracle.Model,
  gamma: int,
  num_drafts: int,
  order: str = 'ratio',
  tie_rule: str = 'strict',
) -> oracle.Distribution:
  """Exact law of GBV's emitted sequence `X*^tau + (Y,)`.

  tie_rule: 'strict' selects the largest child under `(ratio, id)`, the order the skewed law
    uses; 'code' is the public reference code's selection (the first child, in path order, with
    a strictly larger ratio), which disagrees with the law on ties and is lossy.
  """
  vocab = len(target[()])
  out = defaultdict(Fraction)
  for prob, combo in path_tuples(drafter, gamma, vocab, num_drafts):
    selected = _select(target, drafter, combo, gamma, order, tie_rule)
    p = [target[selected[:i]] for i in range(gamma + 1)]
    q_hat = [skew_row(target, drafter, selected[:i], num_drafts, order) for i in range(gamma)]
    for emitted, emitted_prob in _block_verification(selected, p, q_hat, gamma):
      out[emitted] += prob * emitted_prob
  return dict(out)


def _select(target, drafter, combo, gamma, order, tie_rule):
  node = ()
  for depth in range(gamma):
    children = []
    for path in combo:
      if path[:depth] == node and path[depth] not in children:
        children.append(path[depth])
    keys = ratio_key(target[node], drafter[node], order)
    if tie_rule == 'strict':
      best = max(children, key=lambda t: keys[t])
    else:
      best, best_ratio = None, -ONE
      for t in children:
        if keys[t][0] > best_ratio:
          best, best_ratio = t, keys[t][0]
    node = node + (best,)
  return node


def skew_row(target, drafter, node, num_drafts, order) -> tuple[Fraction, ...]:
  """The law of the next token of the lexicographic maximum of K paths, given it passes `node`."""
  below, mass = ZERO, ONE  # A(v), Q(v)
  for depth in range(len(node)):
    prefix = node[:depth]
    keys, q = ratio_key(target[prefix], drafter[prefix], order), drafter[prefix]
    below += mass * sum(q[s] for s in range(len(q)) if keys[s] < keys[node[depth]])
    mass *= q[node[depth]]
  keys, q = ratio_key(target[node], drafter[node], order), drafter[node]
  total = (below + mass) ** num_drafts - below**num_drafts
  row = []
  for t in range(len(q)):
    lower = below + mass * sum(q[s] for s in range(len(q)) if keys[s] < keys[t])
    row.append(((lower + mass * q[t]) ** num_drafts - lower**num_drafts) / total)
  return tuple(row)


def _block_verification(selected, p, q_hat, gamma):
  """Yields (emitted, probability) of block verification of `selected` with draft law q_hat."""
  weights = [ONE]
  for i in range(gamma):
    weights.append(min(ONE, weights[-1] * p[i][selected[i]] / q_hat[i][selected[i]]))
  accept = []
  for i in range(1, gamma):
    mass = sum(max(ZERO, weights[i] * pt - qt) for pt, qt in zip(p[i], q_hat[i]))
    denominator = mass + 1 - weights[i]
    accept.append(mass / denominator if denominator else ZERO)
  accept.append(weights[gamma])
  for tau in range(gamma + 1):
    tau_prob = ONE if tau == 0 else accept[tau - 1]
    for h in accept[tau:]:
      tau_prob *= 1 - h
    if not tau_prob:
      continue
    if tau == gamma:
      row = list(p[gamma])
    else:
      row = [max(ZERO, weights[tau] * pt - qt) for pt, qt in zip(p[tau], q_hat[tau])]
      row = row if sum(row) else list(p[tau])
    total = sum(row)
    for y, mass in enumerate(row):
      if mass:
        yield selected[:tau] + (y,), tau_prob * mass / total


def rrs_distribution(
  target: oracle.Model,
  drafter: oracle.Model,
  gamma: int,
  num_drafts: int,
  skip_repeats: bool = False,
) -> oracle.Distribution:
  """Exact law of recursive rejection sampling over K i.i.d. paths (one trial per path).

  skip_repeats: try each distinct child once (a lossy variant kept as a control).
  """
  vocab = len(target[()])
  out = defaultdict(Fraction)
  for prob, combo in path_tuples(drafter, gamma, vocab, num_drafts):
    for emitted, emitted_prob in _rrs(
      target, drafter, combo, (), range(num_drafts), gamma, skip_repeats
    ):
      out[emitted] += prob * emitted_prob
  return dict(out)


def _rrs(target, drafter, combo, node, alive, gamma, skip_repeats):
  depth = len(node)
  p = list(target[node])
  if depth == gamma:
    for y, mass in enumerate(p):
      if mass:
        yield node + (y,), mass
    return
  q = drafter[node]
  reach, tried = ONE, set()  # reach: probability that every trial so far was rejected
  for k in alive:
    x = combo[k][depth]
    if skip_repeats and x in tried:
      continue
    tried.add(x)
    accept = min(ONE, p[x] / q[x])
    if accept:
      followers = [j for j in alive if combo[j][depth] == x]
      for emitted, prob in _rrs(
        target, drafter, combo, node + (x,), followers, gamma, skip_repeats
      ):
        yield emitted, reach * accept * prob
    reach *= 1 - accept
    if not reach:
      return
    residual = [max(ZERO, pt - qt) for pt, qt in zip(p, q)]
    p = [r / sum(residual) for r in residual]  # sum > 0: rejection had positive probability
  for y, mass in enumerate(p):
    if mass:
      yield node + (y,), reach * mass


def all_tuples(target: oracle.Model, drafter: oracle.Model, gamma: int, num_drafts: int):
  """Every K-tuple of drafted paths as kernel inputs, with its exact probability.

  Returns:
    (tokens i32[N, K, G], q f32[N, K, G, V], p f32[N, K, G+1, V], probability f64[N]).
  """
  vocab = len(target[()])
  probs, combos = zip(*path_tuples(drafter, gamma, vocab, num_drafts))
  tokens = np.array(combos, np.int32)
  q = np.array(
    [[[drafter[path[:i]] for i in range(gamma)] for path in combo] for combo in combos], np.float64
  )
  p = np.array(
    [[[target[path[:i]] for i in range(gamma + 1)] for path in combo] for combo in combos],
    np.float64,
  )
  return tokens, q.astype(np.float32), p.astype(np.float32), np.array(probs, np.float64)


def total_variation(dist: dict, target: dict) -> float:
  """TV distance between two {outcome: probability} dicts (Fractions or floats)."""
  keys = set(dist) | set(target)
  return float(sum(abs(dist.get(k, 0) - target.get(k, 0)) for k in keys)) / 2
