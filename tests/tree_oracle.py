"""Exact laws of one token-tree iteration, in rational arithmetic, for tests/verify_tree_test.py.

Written independently of specdec_jax.verify_tree (recursion over prefixes, Fractions, no arrays).
A tree is a dict `{prefix: (child tokens, in slot order)}` over prefixes relative to the root
(the root is `()`); a node absent from the dict has no children. Models are
tests/verify_oracle.py's `{prefix: (P(0|prefix), ...)}` dicts.

- `along_tree_law`: rule 1b (draw from the target at each node, descend on a child) for a fixed
  tree; `cumulative_law`: the same rule in SGLang's cumulative-threshold form (one coin per node,
  the first sibling with coin <= S_i, S_i the target mass of siblings 1..i), which double counts
  a duplicated sibling.
- `rrs_law`: rule 1a over every tree whose children are drawn from the drafter WITHOUT
  replacement (`branching[d]` per node of depth d), with switches for the plausible bugs the
  negative controls plant; `rrs_fixed_law`: rule 1a on one fixed tree (deterministic children).
- `topk_tree`: the deterministic tree of the drafter's top-k tokens per node (ties by id).

Sizes: V <= 4, depth <= 2, branching <= 3: every function here runs in well under a second.
"""

import itertools
from collections import defaultdict
from fractions import Fraction

from tests import verify_oracle as oracle

ONE, ZERO = Fraction(1), Fraction(0)
Tree = dict[tuple[int, ...], tuple[int, ...]]


def along_tree_law(target: oracle.Model, tree: Tree) -> oracle.Distribution:
  """Law of the emitted sequence (accepted path + Y) under rule 1b on `tree`."""
  out = defaultdict(Fraction)

  def walk(node, reach):
    children = tree.get(node, ())
    for y, prob in enumerate(target[node]):
      if not prob:
        continue
      if y in children:
        walk(node + (y,), reach * prob)
      else:
        out[node + (y,)] += reach * prob

  walk((), ONE)
  return dict(out)


def cumulative_law(target: oracle.Model, tree: Tree) -> oracle.Distribution:
  """Rule 1b as SGLang's cumulative form: with coin u ~ U(0, 1) at node v and
  `S_i = sum_{j <= i} p(c_j)`, child c_i (the first with u <= S_i) is accepted; if none is,
  Y ~ p restricted to the tokens not among the children. Equal to `along_tree_law` for distinct
  siblings; a duplicated sibling is counted twice in S."""
  out = defaultdict(Fraction)

  def walk(node, reach):
    p = target[node]
    children = tree.get(node, ())
    cumulative = ZERO
    for c in children:
      step = min(ONE, cumulative + p[c]) - min(ONE, cumulative)
      cumulative += p[c]
      if step:
        walk(node + (c,), reach * step)
    left = max(ZERO, 1 - cumulative)
    rest = [(y, prob) for y, prob in enumerate(p) if prob and y not in children]
    total = sum(prob for _, prob in rest)
    for y, prob in rest:
      out[node + (y,)] += reach * left * prob / total

  walk((), ONE)
  return dict(out)


def rrs_law(
  target: oracle.Model,
  drafter: oracle.Model,
  branching: tuple[int, ...],
  *,
  renormalize_q: bool = True,
  update_p: bool = True,
  remove_all_rejected: bool = True,
) -> oracle.Distribution:
  """Law of rule 1a over sampled trees: children of a depth-d node are `branching[d]` draws
  from the drafter without replacement (fewer if its support is smaller), in draw order.

  renormalize_q: False is a bug: sibling i's acceptance and the residual use q_u itself, not q_u
    with the earlier siblings removed and renormalized.
  update_p: False is a bug: every sibling is tested against p_u, not the updated residual.
  remove_all_rejected: False is a bug: sibling i + 1's law is q_u with only sibling i removed
    (renormalized), not siblings 1..i; the same as the rule for two children, it differs from the
    third child on.
  """
  max_depth = len(branching)
  memo = {}

  def law(node):  # {emitted suffix after node: probability}
    if node in memo:
      return memo[node]
    out = defaultdict(Fraction)
    depth = len(node)
    if depth == max_depth:
      for y, prob in enumerate(target[node]):
        if prob:
          out[(y,)] += prob
      memo[node] = dict(out)
      return memo[node]
    for draws, draws_prob in _draws_without_replacement(drafter[node], branching[depth]):
      for suffix, prob in trials(node, draws).items():
        out[suffix] += draws_prob * prob
    memo[node] = dict(out)
    return memo[node]

  def trials(node, draws):  # {suffix: probability} of the trials over `draws` at `node`
    out = defaultdict(Fraction)
    p, q = list(target[node]), list(drafter[node])
    reach = ONE
    for c in draws:
      accept = min(ONE, p[c] / q[c]) if q[c] else (ONE if p[c] else ZERO)
      if accept:
        for suffix, prob in law(node + (c,)).items():
          out[(c,) + suffix] += reach * accept * prob
      reach *= 1 - accept
      if not reach:
        return out
      if update_p:
        residual = [max(ZERO, pt - qt) for pt, qt in zip(p, q)]
        p = [r / sum(residual) for r in residual] if sum(residual) else p
      if renormalize_q:
        base = q if remove_all_rejected else list(drafter[node])
        left = [ZERO if t == c else qt for t, qt in enumerate(base)]
        q = [x / sum(left) for x in left] if sum(left) else base
    for y, prob in enumerate(p):
      if prob:
        out[(y,)] += reach * prob
    return out

  return law(())


def rrs_fixed_law(target: oracle.Model, drafter: oracle.Model, tree: Tree) -> oracle.Distribution:
  """Rule 1a run on a FIXED tree (e.g. deterministic top-k children), with q = the drafter's
  law at each node: lossy, a negative control."""
  out = defaultdict(Fraction)

  def walk(node, reach):
    p, q = list(target[node]), list(drafter[node])
    for c in tree.get(node, ()):
      accept = min(ONE, p[c] / q[c]) if q[c] else (ONE if p[c] else ZERO)
      if accept:
        walk(node + (c,), reach * accept)
      reach *= 1 - accept
      if not reach:
        return
      residual = [max(ZERO, pt - qt) for pt, qt in zip(p, q)]
      p = [r / sum(residual) for r in residual] if sum(residual) else p
      left = [ZERO if t == c else qt for t, qt in enumerate(q)]
      q = [x / sum(left) for x in left] if sum(left) else q
    for y, prob in enumerate(p):
      if prob:
        out[node + (y,)] += reach * prob

  walk((), ONE)
  return dict(out)


def topk_tree(drafter: oracle.Model, branching: tuple[int, ...]) -> Tree:
  """The drafter's top-`branching[d]` tokens (of positive probability; ties by id) as the
  children of every depth-d node."""
  tree = {}

  def grow(node):
    depth = len(node)
    if depth == len(branching):
      return
    q = drafter[node]
    ranked = sorted((t for t in range(len(q)) if q[t]), key=lambda t: (-q[t], t))
    tree[node] = tuple(ranked[: branching[depth]])
    for c in tree[node]:
      grow(node + (c,))

  grow(())
  return tree


def _draws_without_replacement(q, count):
  """Yields (ordered draws, probability) of `count` draws from q without replacement (fewer if
  q's support is smaller)."""
  support = [t for t, x in enumerate(q) if x]
  count = min(count, len(support))
  for draws in itertools.permutations(support, count):
    prob, left = ONE, ONE
    for t in draws:
      prob *= q[t] / left
      left -= q[t]
    yield draws, prob


def greedy_sequence(target: oracle.Model, length: int) -> tuple[int, ...]:
  """The target's argmax decoding (lowest id on ties) of `length` tokens."""
  seq = ()
  for _ in range(length):
    p = target[seq]
    seq = seq + (max(range(len(p)), key=lambda t: (p[t], -t)),)
  return seq
