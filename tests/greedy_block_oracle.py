"""Oracles for greedy block verification over several iterations (docs/method.md section 11).

`RationalChain`: exact rational arithmetic on order-1 Markov toy models (a row per last token,
None at the start), written independently of specdec_jax (nested law tuples instead of level
slots, no log space): token, block and greedy block verification iteration by iteration, the
exact law of the first N output tokens, E[accepted] of the first iteration, E[tokens] after T
iterations and the deepest stack of residual levels. It reproduces the numbers of
shared/research/gbv_reference.py, the specification's reference script.

`KernelChain`: the same quantities from `verify_greedy.iteration_law` (the kernel's own h~ values,
corrections and levels, float32) on any model given as prefix -> row, so tests compare the kernel
with the rational oracle and the target's law, deterministically; a negative control (a piece of
verify_greedy swapped) is evaluated the same way.
"""

import functools
import itertools
import math
from fractions import Fraction

import jax.numpy as jnp
import numpy as np

from specdec_jax import verify_greedy

ONE, ZERO = Fraction(1), Fraction(0)
BASE = ('base',)  # the target's own law; ('res', parent, w, rem) is a residual level


def _pos(x):
  return x if x > 0 else ZERO


def _normalize(v):
  total = sum(v)
  return tuple(x / total for x in v)


class RationalChain:
  """Decoding with one verifier on order-1 Markov models {last token or None: row}, exactly."""

  def __init__(self, target: dict, drafter: dict, gamma: int):
    self.target = {k: tuple(Fraction(x) for x in v) for k, v in target.items()}
    self.drafter = {k: tuple(Fraction(x) for x in v) for k, v in drafter.items()}
    self.gamma, self.vocab = gamma, len(self.target[None])
    self._memo = {}
    # Memoized per instance: every law, context and count recurs many times.
    for name in ('row', 'advance', 'joint', 'tokens_after'):
      setattr(self, name, functools.cache(getattr(self, name)))

  def row(self, law, ctx):
    """The law's next-token row at context ctx."""
    if law == BASE:
      return self.target[ctx]
    _, parent, w, _ = law
    r = [_pos(w * p - q) for p, q in zip(self.row(parent, ctx), self.drafter[ctx])]
    return _normalize(r) if sum(r) else self.row(parent, ctx)  # unreachable node: the parent

  def advance(self, law, ctx, token):
    """The law of the token after `token`, emitted at ctx."""
    if law == BASE:
      return law
    _, parent, w, rem = law
    q = self.drafter[ctx][token]
    new_parent = self.advance(parent, ctx, token)
    if rem == 1 or q == 0:
      return new_parent
    return ('res', new_parent, w * self.row(parent, ctx)[token] / q, rem - 1)

  def iteration(self, method, law, ctx):
    """[(prob, emitted tokens, law after, context after)] of one iteration."""
    key = (method, law, ctx)
    if key not in self._memo:
      self._memo[key] = [o for b in self._blocks(ctx) for o in self._verify(method, law, ctx, *b)]
      assert sum(o[0] for o in self._memo[key]) == 1
    return self._memo[key]

  def _blocks(self, ctx):
    for block in itertools.product(range(self.vocab), repeat=self.gamma):
      prob, c = ONE, ctx
      for x in block:
        prob, c = prob * self.drafter[c][x], x
      if prob:
        yield prob, block

  def _verify(self, method, law, ctx, block_prob, xs):
    g, laws, ctxs = self.gamma, [law], [ctx]
    for x in xs:
      laws.append(self.advance(laws[-1], ctxs[-1], x))
      ctxs.append(x)
    p = [self.row(law_i, c) for law_i, c in zip(laws, ctxs)]
    q = [self.drafter[c] for c in ctxs[:g]] + [(ZERO,) * self.vocab]
    ratio = [p[i][xs[i]] / q[i][xs[i]] for i in range(g)]
    w = [ONE]
    for r in ratio:
      w.append(w[-1] * r if method == 'greedy' else min(ONE, w[-1] * r))
    if method == 'token':
      h = [min(ONE, r) for r in ratio]
      taus = [
        (t, math.prod(h[:t], start=ONE) * (1 - h[t]) if t < g else math.prod(h, start=ONE))
        for t in range(g + 1)
      ]
    else:
      h = [ONE]
      for i in range(1, g):
        mass = sum(_pos(w[i] * a - b) for a, b in zip(p[i], q[i]))
        rest = 1 - w[i]
        h.append(
          ONE
          if method == 'greedy' and w[i] >= 1
          else (mass / (mass + rest) if mass + rest else ZERO)
        )
      h.append(min(ONE, w[g]))
      taus = [(t, h[t] * math.prod([1 - x for x in h[t + 1 :]], start=ONE)) for t in range(g + 1)]
    out = []
    for t, tau_prob in taus:
      weight = ONE if method == 'token' or t == g else w[t]
      residual = [_pos(weight * a - b) for a, b in zip(p[t], q[t])]
      residual = _normalize(residual) if sum(residual) else p[t]
      for y, y_prob in enumerate(residual):
        if tau_prob * y_prob:
          after = self.advance(laws[t], ctxs[t], y)
          if method == 'greedy' and t < g - 1 and q[t][y]:
            after = ('res', after, w[t] * p[t][y] / q[t][y], g - t - 1)
          out.append((block_prob * tau_prob * y_prob, xs[:t] + (y,), after, y))
    return out

  def joint(self, method, n, law=BASE, ctx=None):
    """The exact law of the first n output tokens: {tokens: prob}."""
    if n <= 0:
      return {(): ONE}
    out = {}
    for prob, emitted, after, c in self.iteration(method, law, ctx):
      tails = {(): ONE} if len(emitted) >= n else self.joint(method, n - len(emitted), after, c)
      for tail, tail_prob in tails.items():
        key = (emitted + tail)[:n]
        out[key] = out.get(key, ZERO) + prob * tail_prob
    return out

  def target_joint(self, n):
    out = {}
    for seq in itertools.product(range(self.vocab), repeat=n):
      prob, c = ONE, None
      for x in seq:
        prob, c = prob * self.target[c][x], x
      if prob:
        out[seq] = prob
    return out

  def first_accepted(self, method):
    return sum(p * (len(e) - 1) for p, e, _, _ in self.iteration(method, BASE, None))

  def tokens_after(self, method, iterations, law=BASE, ctx=None):
    if iterations == 0:
      return ZERO
    return sum(
      p * (len(e) + self.tokens_after(method, iterations - 1, a, c))
      for p, e, a, c in self.iteration(method, law, ctx)
    )

  def block_bound(self):
    """sum_i sum_{x^i} min(Mb(x^i), Ms(x^i)): no verifier's first iteration keeps more."""
    total = ZERO
    for i in range(1, self.gamma + 1):
      for seq in itertools.product(range(self.vocab), repeat=i):
        p = q = ONE
        c = None
        for x in seq:
          p, q, c = p * self.target[c][x], q * self.drafter[c][x], x
        total += min(p, q)
    return total

  def max_depth(self, method, n):
    """The most residual levels active at once while emitting n tokens."""
    seen, best, todo = set(), 0, [(BASE, None, n)]
    while todo:
      law, ctx, need = todo.pop()
      if (law, ctx, need) in seen or need <= 0:
        continue
      seen.add((law, ctx, need))
      depth, inner = 0, law
      while inner != BASE:
        depth, inner = depth + 1, inner[1]
      best = max(best, depth)
      todo += [(a, c, need - len(e)) for _, e, a, c in self.iteration(method, law, ctx)]
    return best


class KernelChain:
  """Decoding with `verify_greedy`'s distribution mode, exactly up to `dtype`'s rounding
  (float32; float64 inside `jax.enable_x64(True)`).

  Args:
    target_row, drafter_row: prefix (tuple of emitted ids) -> probability row (floats).
    context: prefix -> what the rows of every longer prefix depend on (a hashable key).
    vocab, gamma: V and G.
    eos: an id that ends the output (padded with `pad` after it), or None.
    dtype: the kernel's inputs' dtype.
  """

  def __init__(
    self, target_row, drafter_row, context, vocab, gamma, eos=None, pad=0, dtype=np.float32
  ):
    self.dtype = dtype
    self.target_row, self.drafter_row, self.context = target_row, drafter_row, context
    self.vocab, self.gamma, self.eos, self.pad = vocab, gamma, eos, pad
    self.blocks = np.array(list(itertools.product(range(vocab), repeat=gamma)), np.int32)
    self._memo = {}

  def outcomes(self, prefix, levels):
    """[(prob, emitted, levels after)] of one iteration from `prefix` with `levels`."""
    levels = np.asarray(levels, self.dtype)
    key = (self.context(prefix), tuple(np.round(levels, 5)))
    if key not in self._memo:
      q = np.array(
        [[self.drafter_row(prefix + tuple(b[:i])) for i in range(self.gamma)] for b in self.blocks]
      )
      p = np.array(
        [
          [self.target_row(prefix + tuple(b[:i])) for i in range(self.gamma + 1)]
          for b in self.blocks
        ]
      )
      block_prob = np.prod(np.take_along_axis(q, self.blocks[..., None], -1)[..., 0], axis=1)
      batch = len(self.blocks)
      tau, y, after = map(np.asarray, verify_greedy.iteration_law(
        jnp.asarray(self.blocks), jnp.asarray(q, self.dtype), jnp.asarray(p, self.dtype),
        jnp.asarray(np.broadcast_to(levels, (batch, self.gamma - 1)), self.dtype),
      ))  # fmt: skip
      out = []
      for b, t, tok in itertools.product(range(batch), range(self.gamma + 1), range(self.vocab)):
        prob = block_prob[b] * tau[b, t] * y[b, t, tok]
        if prob > 1e-12:
          out.append((prob, tuple(self.blocks[b, :t]) + (tok,), after[b, t, tok]))
      self._memo[key] = out
    return self._memo[key]

  def _ended(self, emitted):
    return self.eos is not None and self.eos in emitted

  def joint(self, n, prefix=(), levels=None):
    """The law of the first n output tokens (after `prefix`): {tokens: prob}."""
    levels = np.asarray(verify_greedy.empty_levels(1, self.gamma)[0] if levels is None else levels)
    key = ('joint', n, self.context(prefix), tuple(np.round(levels, 5)))
    if n <= 0:
      return {(): 1.0}
    if key in self._memo:
      return self._memo[key]
    out = self._memo[key] = {}
    for prob, emitted, after in self.outcomes(prefix, levels):
      if self._ended(emitted):
        emitted = emitted[: emitted.index(self.eos) + 1]
        emitted += (self.pad,) * max(0, n - len(emitted))
      tails = (
        {(): 1.0} if len(emitted) >= n else self.joint(n - len(emitted), prefix + emitted, after)
      )
      for tail, tail_prob in tails.items():
        key = (emitted + tail)[:n]
        out[key] = out.get(key, 0.0) + prob * tail_prob
    return out

  def first_accepted(self):
    levels = verify_greedy.empty_levels(1, self.gamma)[0]
    return sum(p * (len(e) - 1) for p, e, _ in self.outcomes((), levels))

  def tokens_after(self, iterations, prefix=(), levels=None):
    levels = verify_greedy.empty_levels(1, self.gamma)[0] if levels is None else levels
    if iterations == 0:
      return 0.0
    return sum(
      p * (len(e) + self.tokens_after(iterations - 1, prefix + e, a))
      for p, e, a in self.outcomes(prefix, levels)
    )

  def max_depth(self):
    """The most levels active at once in any state visited so far."""
    outcomes = [o for key, o in self._memo.items() if key[0] != 'joint']
    return max(int(np.isfinite(a).sum()) for o in outcomes for _, _, a in o)


def markov_rows(model: dict):
  """(prefix -> row, prefix -> context) of an order-1 Markov model {last token or None: row}."""
  rows = {k: np.array([float(x) for x in v]) for k, v in model.items()}
  last = lambda prefix: prefix[-1] if prefix else None
  return (lambda prefix: rows[last(prefix)]), last


def total_variation(a: dict, b: dict) -> float:
  return float(sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b)) / 2)


# Sun et al. §3's toy (context-free, V = 2, gamma 2) and three of the reference script's models.
TOY = (
  {c: (Fraction(1, 3), Fraction(2, 3)) for c in (None, 0, 1)},
  {c: (Fraction(2, 3), Fraction(1, 3)) for c in (None, 0, 1)},
)
MARKOV3 = (
  {None: (Fraction(1, 2), Fraction(3, 10), Fraction(1, 5)), 0: (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)),
   1: (Fraction(1, 5), Fraction(3, 5), Fraction(1, 5)), 2: (Fraction(1, 3), Fraction(1, 3), Fraction(1, 3))},
  {None: (Fraction(1, 5), Fraction(3, 10), Fraction(1, 2)), 0: (Fraction(1, 4), Fraction(1, 4), Fraction(1, 2)),
   1: (Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)), 2: (Fraction(1, 6), Fraction(1, 2), Fraction(1, 3))},
)  # fmt: skip
ZEROS = (
  {None: (Fraction(1, 3),) * 3, 0: (Fraction(1, 2), Fraction(1, 2), ZERO),
   1: (Fraction(1, 3),) * 3, 2: (Fraction(1, 10), Fraction(3, 10), Fraction(3, 5))},
  {None: (Fraction(1, 2), Fraction(1, 2), ZERO), 0: (Fraction(1, 3),) * 3,
   1: (Fraction(1, 2), ZERO, Fraction(1, 2)), 2: (Fraction(1, 5), Fraction(2, 5), Fraction(2, 5))},
)  # fmt: skip
BINARY = (
  {None: (Fraction(2, 5), Fraction(3, 5)), 0: (Fraction(1, 4), Fraction(3, 4)), 1: (Fraction(3, 5), Fraction(2, 5))},
  {None: (Fraction(3, 4), Fraction(1, 4)), 0: (Fraction(1, 2), Fraction(1, 2)), 1: (Fraction(1, 5), Fraction(4, 5))},
)  # fmt: skip
