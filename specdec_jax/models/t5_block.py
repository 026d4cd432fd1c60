"""A block drafter's inputs (`T5Config.block_size`): where its query slots sit and what they see,
in a drafting call and in the training pass.

A block drafter drafts gamma tokens in one decoder pass: the pending token's output proposes
draft 1, and query slot i (a learned per-offset embedding, `decoder/block_queries` row i - 1),
placed at the position after slot i - 1, proposes draft i + 1. Every input before the slots
(the kept tokens, the pending one last) attends causally, as in a plain decode: their keys and
values are the cache the next call reads. The slots see the kept positions and, by
`T5Config.block_attention`, the slots before them ('causal') or every slot of their block
('bidirectional'). Self-attention's bias is T5's causal relative bias in both: a later slot lies
in the bias's bucket 0, as the query itself does; the slots' own embeddings tell them apart.

- `step_layout`: one drafting call (`T5Steps.step_block`), writing at the cache's end_index.
- `training_layout`: the teacher-forced pass (`t5.block_states`): a sequence of T inputs and the
  block of every anchor packed in one row (DFlash's training layout).

Axes: B batch, T inputs, G gamma (drafts a call), A anchors a row, S_max cache slots.
"""

import jax
import jax.numpy as jnp

from specdec_jax.models import t5_layout
from specdec_jax.models.t5_layout import Layout


def step_layout(num_kept: jax.Array, end_index: jax.Array, width: int, gamma: int, num_slots: int,
                attention: str):  # fmt: skip
  """A drafting call's inputs: each row's num_kept[b] kept tokens, then gamma - 1 slots.

  Args:
    num_kept: int32[B] in 1..width - gamma + 1: the kept tokens of each row, the pending last.
    end_index: int32[B], the cache slot of each row's first input.
    width: the call's inputs, T + G - 1 (T token inputs, the slots overwriting the unread ones).
    gamma: G drafts.
    num_slots: S_max, the cache's slots.
    attention: `T5Config.block_attention`.

  Returns:
    (slots int32[B, width]: 0 at a token, i at query slot i (inputs past the last slot carry
    i >= G: they are never read); logits_at int32[B, G]: the inputs whose outputs are the drafts;
    the `t5_layout.Layout` of the call, the plain causal chain for 'causal').
  """
  slots = jnp.maximum(jnp.arange(width) - num_kept[:, None] + 1, 0)
  logits_at = num_kept[:, None] - 1 + jnp.arange(gamma)
  if attention == 'causal':
    return slots, logits_at, t5_layout.chain(end_index, width, num_slots)
  positions = end_index[:, None] + jnp.arange(width)
  keys = jnp.arange(num_slots)
  last = (end_index + num_kept + gamma - 2)[:, None, None]  # the block's last slot
  attend = (keys <= positions[..., None]) | ((slots > 0)[..., None] & (keys <= last))
  return slots, logits_at, Layout(q_pos=positions, k_pos=keys[None], mask=attend)


def training_layout(anchors: jax.Array, length: int, block_size: int, attention: str):
  """The training pass's packed row: a sequence of `length` inputs, then the block_size - 1 slots
  of each anchor a (a pending token's position), slot j at position a + j.

  Args:
    anchors: int32[B, A] positions in 0..length - 1.
    length: T, the sequence's inputs.
    block_size: G, the drafts of a block (the anchor's own output and G - 1 slots').
    attention: `T5Config.block_attention`.

  Returns:
    (slots int32[B, T + A(G-1)]; the packed `t5_layout.Layout`: positions int32[B, T + A(G-1)],
    mask bool[B, T + A(G-1), T + A(G-1)]): a sequence input sees the sequence causally; a slot
    sees the sequence up to its anchor and its own block's slots up to itself ('causal') or all
    of them ('bidirectional'), as `step_layout` lets it while drafting.
  """
  batch, a, g = anchors.shape[0], anchors.shape[1], block_size
  offsets = jnp.arange(1, g)
  slot_pos = (anchors[:, :, None] + offsets).reshape(batch, -1)  # [B, A(G-1)]
  positions = jnp.concatenate([jnp.broadcast_to(jnp.arange(length), (batch, length)), slot_pos], 1)
  slots = jnp.concatenate(
    [jnp.zeros((batch, length), jnp.int32), jnp.tile(offsets, (batch, a)).astype(jnp.int32)], 1
  )
  # Which block each input belongs to (-1: the sequence) and the anchor it follows.
  block = jnp.concatenate([jnp.full((length,), -1), jnp.repeat(jnp.arange(a), g - 1)])
  anchor_of = jnp.concatenate(
    [jnp.broadcast_to(jnp.arange(length), (batch, length)), jnp.repeat(anchors, g - 1, axis=1)], 1
  )
  is_seq = block < 0
  sees_seq = is_seq[None, None, :] & (positions[:, None, :] <= anchor_of[:, :, None])
  sees_own = ((block[:, None] == block[None, :]) & ~is_seq[None, :])[None]
  if attention == 'causal':
    sees_own = sees_own & (positions[:, None, :] <= positions[:, :, None])
  return slots, t5_layout.packed(positions, sees_seq | sees_own)


def slot_inputs(params, x: jax.Array, slots: jax.Array) -> jax.Array:
  """A block drafter's inputs [B, T, D]: query slot i's learned embedding
  (`decoder/block_queries`, row i - 1) in place of `x` where slots > 0 (the token and its feature
  are then unread)."""
  queries = params['decoder']['block_queries']['embedding'].astype(x.dtype)
  slot_x = jnp.take(queries, jnp.clip(slots - 1, min=0, max=queries.shape[0] - 1), axis=0)
  return jnp.where((slots > 0)[..., None], slot_x, x)
