"""One T5 decoder pass over a token tree, and keeping the accepted path's keys and values.

A tree pass (`T5Steps.step_tree`) feeds the N node slots of a `trees.Tree` at cache slots
`end_index[b] + u` with `layout`'s positions and mask:

- node u sits at decoder position `end_index[b] + depth[b, u]`, whatever its slot: T5's self-
  attention bias is relative (bucket of key position - query position), so two siblings share a
  position and a node's bias to its ancestors is the one a plain decode of its root-to-node path
  gives. Taking positions from the slot would shift every node after a sibling (a negative control
  in tests/t5_tree_test.py);
- node u attends to every committed slot (< end_index) and to its ancestors and itself among the
  nodes (`trees.ancestor_mask`); stale slots past the tree stay masked;
- cross-attention is unchanged (no position bias, no mask over decoder positions).

So node u's logits are those of a plain sequential decode of its root-to-node path (checked to
float32 tolerance on tiny random T5s). After verification, `keep_path` moves the accepted nodes'
keys and values into the slots after the root (`end_index + 1 ..`), per row, so the cache is
again a contiguous chain.

Axes: L layers, B batch, N node slots, D max depth, S_max cache slots, NH heads, H head dim.
"""

import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax import trees
from specdec_jax.models.t5_layout import Layout


def layout(tree: trees.Tree, end_index: jax.Array, num_slots: int, max_depth: int) -> Layout:
  """The `t5_layout.Layout` of a tree written at slots end_index[b] + u.

  Args:
    tree: `trees.Tree` of N slots.
    end_index: i32[B], the committed length (the root's slot and position).
    num_slots: S_max, the cache's slots.
    max_depth: D, the tree's depth bound.

  Returns:
    Layout: q_pos i32[B, N] = end_index + depth; k_pos i32[B, S_max], a committed slot's own
    index, a node slot's node position; mask bool[B, N, S_max]: committed slots, and the node's
    ancestors and itself.
  """
  num_nodes = tree.tokens.shape[1]
  positions = end_index[:, None] + tree.depth
  slot = jnp.arange(num_slots)[None]
  offset = slot - end_index[:, None]  # [B, S_max]: the node slot a cache slot holds
  in_tree = (offset >= 0) & (offset < num_nodes)
  node = jnp.clip(offset, min=0, max=num_nodes - 1)
  key_positions = jnp.where(in_tree, jnp.take_along_axis(positions, node, axis=1), slot)
  ancestors = trees.ancestor_mask(tree, max_depth)  # [B, N, N]
  index = jnp.broadcast_to(node[:, None, :], (node.shape[0], num_nodes, num_slots))
  among_nodes = jnp.take_along_axis(ancestors, index, axis=2)  # [B, N, S_max]
  attend = (offset < 0)[:, None] | (in_tree[:, None] & among_nodes)
  return Layout(q_pos=positions, k_pos=key_positions, mask=attend)


def keep_path(cache, path: jax.Array, num_accepted: jax.Array):
  """Moves the accepted nodes' keys and values after the root; the rest becomes stale.

  The tree was written at slots end_index + u (the root at end_index). Slot end_index + 1 + i
  takes node path[b, i]'s entries for i < num_accepted[b] (gathered before any is written, so a
  node moving down onto another's slot is safe), and end_index becomes end_index + 1 + tau.

  Args:
    cache: `cache.DecoderCache` after `step_tree` (end_index: the root's slot).
    path: i32[B, D], accepted node slots (-1 past num_accepted).
    num_accepted: i32[B], tau.

  Returns:
    the cache holding the committed chain, root and accepted path, end_index + 1 + tau.
  """
  start = cache.end_index
  depth = path.shape[1]
  # Unaccepted entries copy their own target slot onto itself (a no-op).
  sources = jnp.where(path >= 0, start[:, None] + path, start[:, None] + 1 + jnp.arange(depth))
  targets = start[:, None] + 1 + jnp.arange(depth)

  def move(kv):  # [L, B, S_max, NH, H]
    rows = jnp.arange(kv.shape[1])[:, None]
    moved = kv[:, rows, jnp.clip(sources, max=kv.shape[2] - 1)]  # [L, B, D, NH, H]
    return kv.at[:, rows, targets].set(moved, mode='drop')

  return cache_lib.rewind(
    cache.replace(self_k=move(cache.self_k), self_v=move(cache.self_v)), start + 1 + num_accepted
  )
