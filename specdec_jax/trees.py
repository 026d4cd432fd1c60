"""Token trees of a static node budget: the representation, its structure helpers, and builders.

A tree holds N node slots per row (static N). Node 0 is the ROOT: the pending token, i.e. the
last committed token, whose target row predicts the first new token. Every other valid node u is
one drafted token `tokens[b, u]` appended to the prefix of its parent `parents[b, u]`. So the
target's row at node u, `p[b, u] = Mb(.|context, root-to-u path)`, is the law of u's children,
and one target pass over the N nodes (ancestor mask, `ancestor_mask`; positions
`committed + depth`, never the slot) scores every node at once.

Invariants (the builders here produce them; `check_tree` checks them on the host):
- node 0 is valid, `parents = -1`, `depth = 0`;
- a valid node u > 0 has a valid parent `parents[u] < u` (slots are a topological order) and
  `depth[u] = depth[parents[u]] + 1 <= max_depth`;
- siblings (valid nodes of one parent) carry DISTINCT tokens: the verifiers' rules and proofs
  (docs/method.md section 13) assume it, and a duplicate only wastes a slot;
- padding slots have `valid = False`, `parents = -1`, `depth = 0`, `tokens = 0`, and are never
  anyone's parent.

Builders (jit-able, static shapes, vectorized over the batch):
- `best_first_tree`: DDTree's tree from a block drafter's per-position laws q_1..q_D: the N - 1
  most probable prefixes under the surrogate `prod_i q_i(v_i)`, by N - 1 pops of a fixed-size
  candidate pool (the heap of DDTree without a heap). Deterministic: verify it with rule 1b
  (`verify_tree.sample_along_tree`) or greedily.
- `topk_tree`: an autoregressive drafter's top-k children, expanded depth by depth with one
  batched drafter call per depth. Deterministic too.
- `sampled_tree`: children DRAWN without replacement from a block drafter's per-position laws,
  a fixed number per depth: verify it with rule 1a (`verify_tree.recursive_rejection_verify`).

Axes: B batch, N node slots, D max depth, V vocab, C children slots, K frontier width.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Tree(NamedTuple):
  """A batch of token trees (module docstring: the invariants).

  Attributes:
    tokens: i32[B, N], node u's token (node 0: the pending token).
    parents: i32[B, N], the parent slot, -1 for the root and padding.
    depth: i32[B, N], 0 for the root and padding; the node's position is committed + depth.
    valid: bool[B, N], False for padding slots.
  """

  tokens: jax.Array
  parents: jax.Array
  depth: jax.Array
  valid: jax.Array


def check_tree(tree: Tree, max_depth: int) -> None:
  """Raises one ValueError naming the first broken invariant (host-side, numpy; for tests and
  debugging: the jitted loop builds its trees with the builders, which keep them)."""
  tokens, parents, depth, valid = (np.asarray(x) for x in tree)
  if tokens.ndim != 2 or not tokens.shape == parents.shape == depth.shape == valid.shape:
    raise ValueError(f'tree fields must all be [B, N], got {[x.shape for x in tree]}')
  num_nodes = tokens.shape[1]
  if not valid[:, 0].all() or (parents[:, 0] != -1).any() or (depth[:, 0] != 0).any():
    raise ValueError('node 0 must be the root: valid, parents = -1, depth = 0')
  slot = np.arange(num_nodes)
  inner = valid[:, 1:]
  par = parents[:, 1:]
  if (inner & ((par < 0) | (par >= slot[1:]))).any():
    raise ValueError('a valid node u > 0 needs a parent slot in 0..u-1')
  safe = np.clip(parents, 0, num_nodes - 1)
  rows = np.arange(tokens.shape[0])[:, None]
  if (valid & (parents >= 0) & ~valid[rows, safe]).any():
    raise ValueError('a valid node has a padding parent')
  if (inner & (depth[:, 1:] != depth[rows, safe][:, 1:] + 1)).any():
    raise ValueError('depth must be the parent depth + 1')
  if (depth > max_depth).any():
    raise ValueError(f'a node is deeper than max_depth = {max_depth}')
  if (~valid & ((parents != -1) | (depth != 0))).any():
    raise ValueError('padding slots need parents = -1 and depth = 0')
  same = (
    (parents[:, :, None] == parents[:, None, :])
    & (tokens[:, :, None] == tokens[:, None, :])
    & valid[:, :, None]
    & valid[:, None, :]
    & ~np.eye(num_nodes, dtype=bool)
    & (parents[:, :, None] >= 0)
  )
  if same.any():
    raise ValueError('siblings must carry distinct tokens')


def children_table(tree: Tree, max_children: int) -> jax.Array:
  """The first `max_children` children of every node, in slot order: i32[B, N, C], -1 padded.

  A node with more children than C keeps its first C (the builders' orders put the drafter's
  best first).
  """
  num_nodes = tree.tokens.shape[1]
  slot = jnp.arange(num_nodes)
  is_child = (tree.parents[:, None, :] == slot[None, :, None]) & tree.valid[:, None, :]
  # top_k of -slot over the children lists them in slot order; -(N) marks "none".
  keyed = jnp.where(is_child, -slot, -num_nodes)
  top, _ = jax.lax.top_k(keyed, max_children)
  return jnp.where(top > -num_nodes, -top, -1).astype(jnp.int32)


def ancestor_mask(tree: Tree, max_depth: int) -> jax.Array:
  """`mask[b, i, j]`: slot j is node i or one of its ancestors (valid i only): bool[B, N, N].

  Row i is its parent's row plus i, so max_depth rounds of "inherit the parent's row" fill it.
  """
  num_nodes = tree.tokens.shape[1]
  own = jnp.eye(num_nodes, dtype=bool)[None] & tree.valid[:, :, None]
  mask = own
  parent = jnp.clip(tree.parents, min=0, max=num_nodes - 1)
  for _ in range(max_depth):
    inherited = jnp.take_along_axis(mask, parent[:, :, None], axis=1)
    mask = own | (inherited & (tree.parents >= 0)[:, :, None] & tree.valid[:, :, None])
  return mask


def path_tokens(tree: Tree, path: jax.Array) -> jax.Array:
  """The tokens along a path of node slots i32[B, D] (-1 entries give 0): i32[B, D]."""
  picked = jnp.take_along_axis(tree.tokens, jnp.maximum(path, 0), axis=1)
  return jnp.where(path >= 0, picked, 0)


def chain(pending: jax.Array, drafts: jax.Array) -> Tree:
  """A chain of drafts as a tree (node i = draft i): pending i32[B], drafts i32[B, G]."""
  batch, gamma = drafts.shape
  index = jnp.arange(gamma + 1, dtype=jnp.int32)
  broadcast = lambda x: jnp.broadcast_to(x, (batch, gamma + 1))
  return Tree(
    jnp.concatenate([pending[:, None], drafts], axis=1).astype(jnp.int32),
    broadcast(index - 1),
    broadcast(index),
    jnp.ones((batch, gamma + 1), bool),
  )


# ----------------------------------------------------------------------------------------------
# Builders.


def best_first_tree(pending: jax.Array, probs: jax.Array, num_nodes: int) -> Tree:
  """DDTree's best-first tree: the root plus the N - 1 most probable prefixes under
  `score(v_1..v_d) = prod_{i<=d} q_i(v_i)`.

  Scores never increase along a path (q <= 1), so the top N - 1 prefixes are prefix-closed and
  form a tree (ties: the earlier-popped candidate). A pool of candidates (parent slot, depth,
  rank among q_depth's sorted tokens) is popped N - 1 times, each pop pushing the popped node's
  next-rank sibling and its rank-0 child, as DDTree's heap does: 2 (N - 1) + 1 candidate slots,
  a max over them per pop. A node of rank r has r better siblings in the tree, so ranks stay
  below N - 1 and only q_i's top N - 1 tokens are sorted. Prefixes of probability 0 are never
  taken: with fewer than N - 1 positive prefixes the rest are padding.

  Args:
    pending: i32[B], the root's token.
    probs: f32[B, D, V], the drafter's law q_i of draft position i (rows sum to 1).
    num_nodes: N >= 2, node slots including the root.

  Returns:
    Tree of N slots, nodes in pop order (parents first), max depth D.
  """
  batch, max_depth, vocab = probs.shape
  budget = num_nodes - 1
  width = min(budget, vocab)
  sorted_probs, sorted_ids = jax.lax.top_k(probs.astype(jnp.float32), width)  # [B, D, W]
  log_sorted = jnp.log(sorted_probs)
  pool = 2 * budget + 1
  rows = jnp.arange(batch)

  def rank_log_prob(depth, rank):
    ok = rank < width
    value = log_sorted[
      rows, jnp.clip(depth - 1, min=0, max=max_depth - 1), jnp.clip(rank, min=0, max=width - 1)
    ]
    return jnp.where(ok, value, -jnp.inf)

  int_pool = lambda: jnp.zeros((batch, pool), jnp.int32)
  cand = {  # the candidate pool: a candidate is node (parent, depth, rank) with its log score
    'parent': int_pool(),
    'depth': int_pool().at[:, 0].set(1),
    'rank': int_pool(),
    'score': jnp.full((batch, pool), -jnp.inf).at[:, 0].set(rank_log_prob(1, 0)),
  }
  nodes = {
    'tokens': jnp.zeros((batch, num_nodes), jnp.int32).at[:, 0].set(pending),
    'parents': jnp.full((batch, num_nodes), -1, jnp.int32),
    'depth': jnp.zeros((batch, num_nodes), jnp.int32),
    'valid': jnp.zeros((batch, num_nodes), bool).at[:, 0].set(True),
    'score': jnp.zeros((batch, num_nodes), jnp.float32),
  }

  def pop(t, state):
    cand, nodes = state
    best = jnp.argmax(cand['score'], axis=1)  # lowest slot on ties
    take = lambda x: x[rows, best]
    parent, depth, rank, score = (
      take(cand['parent']),
      take(cand['depth']),
      take(cand['rank']),
      take(cand['score']),
    )
    ok = score > -jnp.inf
    slot = t + 1
    token = sorted_ids[
      rows, jnp.clip(depth - 1, min=0, max=max_depth - 1), jnp.clip(rank, min=0, max=width - 1)
    ]
    nodes = {
      'tokens': nodes['tokens'].at[:, slot].set(jnp.where(ok, token, 0)),
      'parents': nodes['parents'].at[:, slot].set(jnp.where(ok, parent, -1)),
      'depth': nodes['depth'].at[:, slot].set(jnp.where(ok, depth, 0)),
      'valid': nodes['valid'].at[:, slot].set(ok),
      'score': nodes['score'].at[:, slot].set(score),
    }
    parent_score = jnp.where(parent > 0, nodes['score'][rows, parent], 0.0)
    sibling_score = parent_score + rank_log_prob(depth, rank + 1)
    child_score = jnp.where(depth < max_depth, score + rank_log_prob(depth + 1, 0), -jnp.inf)
    sib, kid = 2 * t + 1, 2 * t + 2
    cand = {
      'parent': cand['parent'].at[:, sib].set(parent).at[:, kid].set(slot),
      'depth': cand['depth'].at[:, sib].set(depth).at[:, kid].set(depth + 1),
      'rank': cand['rank'].at[:, sib].set(rank + 1).at[:, kid].set(0),
      'score': cand['score']
      .at[rows, best]
      .set(-jnp.inf)
      .at[:, sib]
      .set(jnp.where(ok, sibling_score, -jnp.inf))
      .at[:, kid]
      .set(jnp.where(ok, child_score, -jnp.inf)),
    }
    return cand, nodes

  _, nodes = jax.lax.fori_loop(0, budget, pop, (cand, nodes))
  return Tree(nodes['tokens'], nodes['parents'], nodes['depth'], nodes['valid'])


def topk_tree(
  pending: jax.Array,
  root_probs: jax.Array,
  expand: Callable,
  state,
  *,
  top_k: int,
  max_depth: int,
):
  """An autoregressive drafter's tree: top_k children per node, depth by depth, one batched
  drafter call per depth after the first, the frontier kept to the top_k nodes by path
  probability.

  Depth 1 holds the root's top_k tokens; each later depth expands the top_k frontier nodes into
  their top_k children each and keeps the best top_k of those k^2 by path probability (EAGLE-2's
  expansion without its final reranking). N = 1 + top_k * max_depth slots; slot
  `1 + (d - 1) * top_k + j` holds the frontier's j-th node of depth d, best first.

  Args:
    pending: i32[B], the root's token.
    root_probs: f32[B, V], the drafter's law after the root.
    expand: `(tokens i32[B, K], parents i32[B, K], state) -> (probs f32[B, K, V], state)`: the
      drafter's law after each of the K frontier nodes, given each node's token and its parent's
      index in the previous frontier (all 0 at depth 1: the root); called for depths 1..D-1. How
      the drafter keeps its per-node caches is `expand`'s business.
    state: `expand`'s initial state.
    top_k: K, children per expanded node and frontier width.
    max_depth: D.

  Returns:
    (Tree of 1 + K D slots, expand's final state).
  """
  batch = pending.shape[0]
  probs = root_probs[:, None]
  frontier_log = jnp.zeros((batch, 1), jnp.float32)
  tokens, parents = [pending[:, None]], [jnp.full((batch, 1), -1, jnp.int32)]
  depths, valid = [jnp.zeros((batch, 1), jnp.int32)], [jnp.ones((batch, 1), bool)]
  first_slot = 0  # slot of the frontier's first node
  for d in range(1, max_depth + 1):
    k_in = probs.shape[1]
    top_p, top_ids = jax.lax.top_k(probs, top_k)  # [B, k_in, K]
    scores = (frontier_log[:, :, None] + jnp.log(top_p)).reshape(batch, k_in * top_k)
    keep_scores, keep = jax.lax.top_k(scores, top_k)  # best first; ties: lowest index
    from_node = (keep // top_k).astype(jnp.int32)
    new_tokens = jnp.take_along_axis(top_ids.reshape(batch, -1), keep, axis=1)
    ok = keep_scores > -jnp.inf
    tokens.append(jnp.where(ok, new_tokens, 0))
    parents.append(jnp.where(ok, first_slot + from_node, -1).astype(jnp.int32))
    depths.append(jnp.where(ok, d, 0).astype(jnp.int32))
    valid.append(ok)
    first_slot = 1 + (d - 1) * top_k
    frontier_log = keep_scores
    if d < max_depth:
      probs, state = expand(new_tokens.astype(jnp.int32), from_node, state)
      probs = jnp.where(ok[:, :, None], probs, 0.0)  # an invalid frontier node gets no children
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  return Tree(cat(tokens).astype(jnp.int32), cat(parents), cat(depths), cat(valid)), state


def full_tree_size(branching: tuple[int, ...]) -> int:
  """Slots of the full tree with `branching[d]` children per node of depth d: 1 + k_1 + k_1 k_2
  + ..."""
  size, width = 1, 1
  for k in branching:
    width *= k
    size += width
  return size


def sampled_tree(rng: jax.Array | None, pending: jax.Array, probs: jax.Array, branching):
  """A tree whose children are DRAWN from a block drafter's per-position laws, without
  replacement: every node of depth d - 1 gets `branching[d - 1]` children drawn from q_d (Gumbel
  top-k: the same law as drawing one by one, each from q_d with the earlier ones removed and
  renormalized, in slot order). What `verify_tree.recursive_rejection_verify` (rule 1a) needs,
  with `q_u = q_{depth(u) + 1}` (`node_laws`). rng None: no noise, each node's children are q_d's
  top tokens (a deterministic tree, for temperature 0).

  Breadth-first slots: depth d's nodes follow depth d - 1's, each parent's children together, in
  draw order. A child q_d cannot draw (its key is -inf) is padding, and so is its subtree.

  Args:
    rng: PRNG key, or None.
    pending: i32[B], the root's token.
    probs: f32[B, D, V], q_1..q_D, D = len(branching).
    branching: static tuple of children per node at depths 0..D-1.

  Returns:
    Tree of `full_tree_size(branching)` slots.
  """
  batch, _, vocab = probs.shape
  log_q = jnp.log(probs.astype(jnp.float32))
  tokens, parents = [pending[:, None]], [jnp.full((batch, 1), -1, jnp.int32)]
  depths, valid = [jnp.zeros((batch, 1), jnp.int32)], [jnp.ones((batch, 1), bool)]
  first_slot, width = 0, 1
  keys = [None] * len(branching) if rng is None else jax.random.split(rng, len(branching))
  for d, k in enumerate(branching, start=1):
    scores = jnp.broadcast_to(log_q[:, d - 1, None], (batch, width, vocab))
    if keys[d - 1] is not None:
      scores = scores + jax.random.gumbel(keys[d - 1], scores.shape)
    top, ids = jax.lax.top_k(scores, k)  # [B, width, k]
    ok = (top > -jnp.inf) & valid[-1][:, :, None]
    parent_slots = first_slot + jnp.arange(width)
    tokens.append(jnp.where(ok, ids, 0).reshape(batch, -1))
    parents.append(jnp.where(ok, parent_slots[None, :, None], -1).reshape(batch, -1))
    depths.append(jnp.where(ok, d, 0).reshape(batch, -1))
    valid.append(ok.reshape(batch, -1))
    first_slot, width = first_slot + width, width * k
  cat = lambda xs: jnp.concatenate(xs, axis=1)
  return Tree(
    cat(tokens).astype(jnp.int32), cat(parents).astype(jnp.int32), cat(depths).astype(jnp.int32),
    cat(valid),
  )  # fmt: skip


def node_laws(probs: jax.Array, branching) -> jax.Array:
  """The drafter law each node's children were drawn from in `sampled_tree`: q_{depth + 1} at
  every slot of depth < D (leaves: q_D, unread), f32[B, N, V]."""
  depth_of_slot = []
  width = 1
  for d, k in enumerate(branching):
    depth_of_slot += [d] * width
    width *= k
  depth_of_slot += [len(branching) - 1] * width
  return probs[:, jnp.array(depth_of_slot)]


def graft(tree: Tree, branches: jax.Array, lengths: jax.Array, max_depth: int) -> Tree:
  """The tree with each branch's first `lengths[b, m]` tokens grafted as a path under its root.

  Branch m's token i (depth i + 1) follows the current node's child carrying that token when
  there is one, else goes in a new node: so siblings stay distinct, a branch that repeats an
  existing path (or an earlier branch) adds nothing, and one sharing a prefix adds only its new
  suffix. The tree's own nodes keep their slots (data indexed by them stays valid); a new node
  takes the LOWEST padding slot greater than its parent's slot, so slots stay a topological order
  wherever the tree's padding lies. A node with no such slot is dropped with the rest of its
  branch, so every branch keeps a prefix; branches are grafted in order, branch 0 first, each
  whole before the next. Tokens past `max_depth` are dropped too. Trees whose padding is at the
  end (`best_first_tree`, `chain`, a bare root) use every free slot this way.

  A bare root (node 0 valid, N - 1 padding slots) and M branches give the lookup drafter's tree
  (`draft_lookup.proposals`); a drafter's `best_first_tree` and the branches give a hybrid tree.
  Both are fixed before the target's coins: verify them with rule 1b or greedily.

  Args:
    tree: Tree of N slots whose nodes are at most `max_depth` deep.
    branches: i32[B, M, D], the branches' tokens.
    lengths: i32[B, M], tokens of each branch to graft (clipped to 0..min(D, max_depth)).
    max_depth: the result's depth bound, static.

  Returns:
    Tree of N slots (the same node slots as `tree`, plus the grafted nodes).
  """
  batch, num_branches, max_len = branches.shape
  max_len = min(max_len, max_depth)
  if max_len < 1:
    return tree
  slot = jnp.arange(tree.tokens.shape[1], dtype=jnp.int32)
  flat = branches[:, :, :max_len].reshape(batch, num_branches * max_len).astype(jnp.int32)
  lengths = lengths.astype(jnp.int32)

  def step(t, state):
    tokens, parents, depth, valid, node, alive = state
    m, i = t // max_len, t % max_len
    node = jnp.where(i == 0, 0, node)  # node: the slot the branch has reached, i32[B]
    token = jax.lax.dynamic_index_in_dim(flat, t, axis=1, keepdims=False)
    length = jax.lax.dynamic_index_in_dim(lengths, m, axis=1, keepdims=False)
    active = ((i == 0) | alive) & (i < length)
    child = valid & (parents == node[:, None]) & (tokens == token[:, None])
    free = ~valid & (slot > node[:, None])
    found, has_free = child.any(axis=1), free.any(axis=1)
    new = jnp.argmax(free, axis=1)  # the lowest free slot after the node
    place = (active & ~found & has_free)[:, None] & (slot == new[:, None])
    tokens = jnp.where(place, token[:, None], tokens)
    parents = jnp.where(place, node[:, None], parents)
    depth = jnp.where(place, i + 1, depth)
    valid = valid | place
    node = jnp.where(found, jnp.argmax(child, axis=1), new).astype(jnp.int32)
    return tokens, parents, depth, valid, node, active & (found | has_free)

  fields = (tree.tokens, tree.parents, tree.depth)
  state = (*(x.astype(jnp.int32) for x in fields), tree.valid.astype(bool))
  state = (*state, jnp.zeros(batch, jnp.int32), jnp.zeros(batch, bool))
  tokens, parents, depth, valid, _, _ = jax.lax.fori_loop(0, num_branches * max_len, step, state)
  return Tree(tokens, parents, depth, valid)
