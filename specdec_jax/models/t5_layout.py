"""Where a decoder pass's inputs sit and what they see: one typed `Layout` for the decoder stack.

The stack (`t5_layers.decoder`) takes embedded inputs and a Layout; the role adapters build both:
a plain chain (`chain`, `teacher`), a block drafter's slots (`t5_block`), a token tree
(`t5_tree.layout`), a block drafter's packed training row (`packed`). Self-attention's relative
bias is read from the positions, its mask from `mask` (None: causal, key position <= query
position, which also hides a cache's stale slots past the chunk).

Axes: B batch (1: shared by every row), T inputs, S keys (the cache's slots, or T without one).
"""

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass(kw_only=True)
class Layout:
  """Attributes:
  q_pos: i32[B|1, T] each input's decoder position.
  k_pos: i32[S] or i32[B|1, S] each key's decoder position.
  mask: bool[B|1, T, S] which keys each input attends to; None: causal (k_pos <= q_pos).
  """

  q_pos: jax.Array
  k_pos: jax.Array
  mask: jax.Array | None = None


def teacher(t: int) -> Layout:
  """T inputs at positions 0..T-1, no cache, causal (teacher forcing)."""
  return Layout(q_pos=jnp.arange(t)[None], k_pos=jnp.arange(t))


def chain(end_index: jax.Array, t: int, num_slots: int) -> Layout:
  """T inputs at positions end_index[b] + t over a cache of `num_slots` slots, causal."""
  return Layout(q_pos=end_index[:, None] + jnp.arange(t), k_pos=jnp.arange(num_slots))


def packed(positions: jax.Array, attend: jax.Array) -> Layout:
  """Inputs packed in one row without a cache: their positions i32[B, T] and mask bool[B, T, T]."""
  return Layout(q_pos=positions, k_pos=positions, mask=attend)
