"""Lossless verification of a token tree (`trees.Tree`) in one target pass.

The target's row at every node is known after one pass over the tree: `p[b, u] = Mb(.|prefix of
u)` after the sampling transform plain decoding uses (`sampling.logits_to_probs`). A verifier
walks down from the root, accepting one child per depth, and stops with one more token Y: the
output is the accepted path (node slots) and Y. Each rule is exact (docs/method.md section 13;
checked against exact laws by chi-square over whole sequences, with negative controls, in
tests/verify_tree_test.py) under its own condition on how the tree was drafted:

- `greedy_tree_verify` (T = 0, rule 1d): follow the child equal to the target's argmax; Y is the
  argmax at the last node. The emitted tokens are the target's argmax decoding.
- `sample_along_tree` (rule 1b): at node u draw `y ~ p_u`; if a child of u carries y, descend to
  it, else emit Y = y. Exact for ANY tree fixed before the target's coins (deterministic
  children: `trees.best_first_tree`, `trees.topk_tree`): every emitted token is a fresh draw from
  the target's row at its prefix. Needs no drafter probabilities.
- `recursive_rejection_verify` (rule 1a, SpecInfer / Sequoia without replacement): at node u
  with children `c_1..c_k` (slot order) drawn from `q_u` WITHOUT replacement (`c_i` from q_u
  with `c_1..c_{i-1}` removed and renormalized), set `p_1 = p_u`, `q_1 = q_u`; accept `c_i` with
  probability `min(1, p_i(c_i) / q_i(c_i))`, else `p_{i+1} = norm(max(0, p_i - q_i))` and
  `q_{i+1} = norm(q_i with c_i zeroed)`; if every child is rejected, `Y ~ p_{k+1}`. Exact only for
  children SAMPLED that way: on deterministic top-k children it is lossy (a negative control).

All kernels are jitted, vectorized over the batch, with static shapes (N slots, `max_depth` D).
Inputs must be finite. Rows are independent.

Axes: B batch, N node slots, D max depth, C children slots, V vocab.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling, trees, verify


class TreeResult(NamedTuple):
  """Outcome of verifying one tree per row.

  Attributes:
    path: i32[B, D], the accepted nodes' slots, depth 1 first; -1 past `num_accepted`.
    num_accepted: i32[B], tau in 0..D: the accepted path's length.
    next_token: i32[B], Y, the token emitted after the accepted path.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array


@functools.partial(jax.jit, static_argnames=('max_depth',))
def greedy_tree_verify(tree: trees.Tree, target_ids: jax.Array, *, max_depth: int) -> TreeResult:
  """Temperature 0: the longest root path whose every token is the target's argmax.

  Args:
    tree: `trees.Tree` of N slots.
    target_ids: i32[B, N], the target's argmax at every node.
    max_depth: D, the tree's depth bound.

  Returns:
    TreeResult; Y is the argmax at the path's last node.
  """
  _check(tree, target_ids.shape + (1,), 'target_ids [B, N]')
  return follow_draws(tree, target_ids.astype(jnp.int32), max_depth)


@functools.partial(jax.jit, static_argnames=('max_depth',))
def sample_along_tree(
  rng: jax.Array, tree: trees.Tree, target_probs: jax.Array, *, max_depth: int
) -> TreeResult:
  """Rule 1b: one draw `y_u ~ p_u` per node; from the root, descend while a child carries the
  current node's draw; Y is the draw at the last node.

  Drawing at every node at once is the sequential rule: a node's draw is read only if the walk
  reaches it, and the draws are independent, so the walk sees a fresh draw at each node it visits.

  Args:
    rng: PRNG key.
    tree: `trees.Tree` of N slots, fixed before (independently of) `rng`.
    target_probs: f32[B, N, V], p_u at every node (padding rows: any probability vector).
    max_depth: D.

  Returns:
    TreeResult.
  """
  _check(tree, target_probs.shape, 'target_probs [B, N, V]')
  draws = sampling.sample(rng, jnp.asarray(target_probs, jnp.float32))
  return follow_draws(tree, draws, max_depth)


@functools.partial(jax.jit, static_argnames=('max_depth', 'max_children'))
def recursive_rejection_verify(
  rng: jax.Array,
  tree: trees.Tree,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  *,
  max_depth: int,
  max_children: int,
) -> TreeResult:
  """Rule 1a: recursive rejection over children sampled without replacement (module docstring).

  Args:
    rng: PRNG key.
    tree: `trees.Tree` whose children of node u were drawn from `draft_probs[:, u]` without
      replacement, in slot order, independently of `rng`.
    draft_probs: f32[B, N, V], q_u, the drafter law u's children were drawn from.
    target_probs: f32[B, N, V], p_u.
    max_depth: D.
    max_children: C >= the most children any node has.

  Returns:
    TreeResult.
  """
  _check(tree, target_probs.shape, 'target_probs [B, N, V]')
  _check(tree, draft_probs.shape, 'draft_probs [B, N, V]')
  q_all = jnp.asarray(draft_probs, jnp.float32)
  p_all = jnp.asarray(target_probs, jnp.float32)
  batch = tree.tokens.shape[0]
  kids = trees.children_table(tree, max_children)  # [B, N, C]
  coin_rng, next_rng = jax.random.split(rng)
  coins = jax.random.uniform(coin_rng, (max_depth, max_children, batch), jnp.float32)
  at = lambda x, node: jnp.take_along_axis(x, node[:, None, None], axis=1)[:, 0]

  node = jnp.zeros((batch,), jnp.int32)
  stopped = jnp.zeros((batch,), bool)
  draw_from = jnp.zeros_like(p_all[:, 0])
  path = []
  for depth in range(max_depth):
    children = at(kids, node)  # [B, C]
    child_tokens = jnp.take_along_axis(tree.tokens, jnp.maximum(children, 0), axis=1)
    chosen, residual = node_trials(
      coins[depth], at(p_all, node), at(q_all, node), children, child_tokens
    )
    found = ~stopped & (chosen >= 0)
    draw_from = jnp.where((~stopped & ~found)[:, None], residual, draw_from)
    path.append(jnp.where(found, chosen, -1))
    stopped = stopped | ~found
    node = jnp.where(found, chosen, node)
  draw_from = jnp.where(stopped[:, None], draw_from, at(p_all, node))
  path = jnp.stack(path, axis=1).astype(jnp.int32)
  num_accepted = jnp.sum(path >= 0, axis=1).astype(jnp.int32)
  return TreeResult(path, num_accepted, sampling.sample(next_rng, draw_from))


# ----------------------------------------------------------------------------------------------
# Building blocks, public so that tests plant bugs in one of them (negative controls).


def follow_draws(tree: trees.Tree, draws: jax.Array, max_depth: int) -> TreeResult:
  """From the root, move to the child carrying the current node's draw while there is one.

  Args:
    tree: `trees.Tree` of N slots.
    draws: i32[B, N], one token per node (a draw from p_u, or its argmax).
    max_depth: D.

  Returns:
    TreeResult with Y = the last node's draw.
  """
  node = jnp.zeros(draws.shape[:1], jnp.int32)
  stopped = jnp.zeros(draws.shape[:1], bool)
  slots = jnp.arange(draws.shape[1], dtype=jnp.int32)
  path = []
  for _ in range(max_depth):
    y = jnp.take_along_axis(draws, node[:, None], axis=1)
    match = (tree.parents == node[:, None]) & tree.valid & (tree.tokens == y)
    # Siblings are distinct, so at most one slot matches; the lowest wins if not.
    child = jnp.min(jnp.where(match, slots, draws.shape[1]), axis=1)
    found = ~stopped & (child < draws.shape[1])
    path.append(jnp.where(found, child, -1))
    stopped = stopped | ~found
    node = jnp.where(found, child, node)
  path = jnp.stack(path, axis=1).astype(jnp.int32)
  num_accepted = jnp.sum(path >= 0, axis=1).astype(jnp.int32)
  return TreeResult(path, num_accepted, jnp.take_along_axis(draws, node[:, None], axis=1)[:, 0])


def node_trials(coins, p_node, q_node, children, child_tokens):
  """Rule 1a's trials at one node, in slot order, until one is accepted.

  Args:
    coins: f32[C, B], one uniform per trial.
    p_node: f32[B, V], p_u.
    q_node: f32[B, V], q_u.
    children: i32[B, C], the node's children slots (-1: none).
    child_tokens: i32[B, C], their tokens.

  Returns:
    (chosen i32[B]: the accepted child's slot or -1, residual f32[B, V]: what Y is drawn from
    when none is accepted, `p_{k+1}`, unnormalized).
  """

  def trial(carry, inputs):
    p_i, q_i, chosen = carry
    coin, child, token = inputs
    tried = (chosen < 0) & (child >= 0)
    x = token[:, None]
    p_x = jnp.take_along_axis(p_i, x, axis=1)[:, 0]
    q_x = jnp.take_along_axis(q_i, x, axis=1)[:, 0]
    accepted = tried & (coin < verify.token_acceptance(p_x, q_x))
    rejected = tried & ~accepted
    p_next = residual_after_rejection(p_i, q_i)
    q_next = draft_after_rejection(q_i, token)
    p_i = jnp.where(rejected[:, None], p_next, p_i)
    q_i = jnp.where(rejected[:, None], q_next, q_i)
    return (p_i, q_i, jnp.where(accepted, child, chosen)), None

  chosen = jnp.full(children.shape[:1], -1, jnp.int32)
  (p_last, _, chosen), _ = jax.lax.scan(
    trial, (p_node, q_node, chosen), (coins, children.T, child_tokens.T)
  )
  return chosen, p_last


def residual_after_rejection(p: jax.Array, q: jax.Array) -> jax.Array:
  """`norm(max(0, p - q))`, f32[B, V]; p itself where that is all zero (p = q: rejection had
  probability 0)."""
  left = jnp.maximum(p - q, 0.0)
  mass = jnp.sum(left, axis=-1, keepdims=True)
  return jnp.where(mass > 0, left / jnp.where(mass > 0, mass, 1.0), p)


def draft_after_rejection(q: jax.Array, token: jax.Array) -> jax.Array:
  """The law of the next sibling without replacement: q with `token` zeroed, renormalized,
  f32[B, V]; q itself where nothing is left (no further sibling can have been drawn)."""
  left = jnp.where(jnp.arange(q.shape[-1]) == token[:, None], 0.0, q)
  mass = jnp.sum(left, axis=-1, keepdims=True)
  return jnp.where(mass > 0, left / jnp.where(mass > 0, mass, 1.0), q)


def _check(tree: trees.Tree, probs_shape, what: str) -> None:
  """Raises ValueError unless the tree's fields are [B, N] and `probs_shape` is [B, N, V]."""
  shape = tree.tokens.shape
  if len(shape) != 2 or any(x.shape != shape for x in tree):
    raise ValueError(f'tree fields must all be [B, N], got {[x.shape for x in tree]}')
  if len(probs_shape) != 3 or tuple(probs_shape[:2]) != shape:
    raise ValueError(f'{what} must match the tree {shape}, got {tuple(probs_shape)}')
