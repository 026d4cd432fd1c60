"""The T5 decoder's key/value cache, with a write position per batch row.

Row b holds `end_index[b]` valid decoder positions; slots at or past it are stale (drafts that were
rejected, or zeros) and the attention mask hides them. Decoding T tokens writes them at each row's
own `end_index` and advances it by T; rewinding a row after a rejection only lowers its `end_index`.

Axis legend: L decoder layers, B batch, T new positions, S_max decoder cache slots,
S_enc encoder positions, N heads, H head dim.
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class DecoderCache:
  """Decoder state between `t5.decode` calls (made by `t5.init_cache`).

  Attributes:
    self_k: [L, B, S_max, N, H] self-attention keys; slot s of row b is valid iff s < end_index[b].
    self_v: [L, B, S_max, N, H] self-attention values, same validity.
    cross_k: [L, B, S_enc, N, H] encoder-decoder attention keys, computed once from the encoder
      output.
    cross_v: [L, B, S_enc, N, H] encoder-decoder attention values.
    encoder_mask: bool[B, S_enc] True at real (non-padding) encoder positions.
    end_index: int32[B] valid decoder positions per row: the slot the next token is written to.
  """

  self_k: jax.Array
  self_v: jax.Array
  cross_k: jax.Array
  cross_v: jax.Array
  encoder_mask: jax.Array
  end_index: jax.Array

  @property
  def max_decode_len(self) -> int:
    """S_max, the number of decoder slots per row."""
    return self.self_k.shape[2]


def write(
  kv: jax.Array, new: jax.Array, end_index: jax.Array, *, layer: int | None = None
) -> jax.Array:
  """Writes each row's new entries at that row's own end index.

  One scatter into `kv` (in place under jit when `kv` is not used afterwards): writing into a
  layer of the stacked [L, ...] cache directly, rather than into a slice that is then put back,
  keeps a decode step from copying the cache. Positions at or past S_max are dropped, so an
  overlong write loses its tail but never lands on valid slots.

  On a TPU, one row of several positions (a batch-1 target pass) is written by a select over the
  row's slots instead (`select_write`, the same values): XLA:TPU lays a one-row scatter of several
  positions out against the attention that reads the cache, and copies the whole stacked cache
  to and from that layout at every layer (docs/performance.md, "What XLA:TPU shows"). Elsewhere
  the scatter stays: on a GPU the select reads and writes every slot of the layer.

  Args:
    kv: [B, S_max, N, H] keys or values, or [L, B, S_max, N, H] with `layer` given.
    new: [B, T, N, H] entries for positions end_index[b] .. end_index[b] + T - 1.
    end_index: int32[B] first slot to write in each row (>= 0).
    layer: which layer of a stacked cache to write, or None for an unstacked one.

  Returns:
    `kv` with `kv[(layer,) b, end_index[b] + t] = new[b, t]`, in kv's dtype.
  """
  batch, t = new.shape[:2]
  if batch == 1 and t > 1:
    return jax.lax.platform_dependent(
      kv,
      new,
      end_index,
      tpu=functools.partial(select_write, layer=layer),
      default=functools.partial(scatter_write, layer=layer),
    )
  return scatter_write(kv, new, end_index, layer=layer)


def scatter_write(kv, new, end_index, *, layer: int | None = None):
  """`write` as a scatter (its path everywhere but a TPU's one row of several positions): the T
  new positions of each row dropped into their slots (out-of-range ones dropped)."""
  batch, t = new.shape[:2]
  rows = jnp.arange(batch)[:, None]
  positions = end_index[:, None] + jnp.arange(t)
  index = (rows, positions) if layer is None else (layer, rows, positions)
  return kv.at[index].set(
    new.astype(kv.dtype), mode='drop', indices_are_sorted=True, unique_indices=True
  )


def select_write(kv, new, end_index, *, layer: int | None = None):
  """`write` as a select (its path on a TPU for one row of several positions): slot s of row b takes new[b, s - end_index[b]] where that is one of the
  T new positions, else keeps its value. Reads and writes the layer's [B, S_max, N, H] slots
  (no arithmetic on the values: NaN or inf in `new` stay in their own slots)."""
  t = new.shape[1]
  layer_kv = kv if layer is None else kv[layer]
  offset = jnp.arange(layer_kv.shape[1])[None, :] - end_index[:, None]  # [B, S_max]
  spread = jnp.take_along_axis(
    new.astype(kv.dtype), jnp.clip(offset, min=0, max=t - 1)[:, :, None, None], axis=1
  )
  inside = ((offset >= 0) & (offset < t))[:, :, None, None]
  written = jnp.where(inside, spread, layer_kv)
  return written if layer is None else kv.at[layer].set(written)


def rewind(cache, end_index):
  """Sets every row's number of valid positions; slots at or past it become stale.

  Args:
    cache: any cache dataclass with an `end_index: int32[B]` field.
    end_index: int[B] (or a scalar for all rows) new valid lengths.

  Returns:
    `cache` with `end_index` replaced, as int32[B] so that jitted callers do not recompile.
  """
  end_index = jnp.broadcast_to(jnp.asarray(end_index, jnp.int32), cache.end_index.shape)
  return cache.replace(end_index=end_index)


def take_rows(cache, rows: jax.Array, *, same_source: bool = False):
  """The cache whose row i is `cache`'s row `rows[i]`: a cache of len(rows) rows.

  A `DecoderCache` holds its batch on axis 1 of the stacked [L, B, ...] keys and values; any other
  cache (n-gram, test fakes) is batch-major in every leaf.

  Args:
    cache: a `DecoderCache`, or any cache dataclass whose leaves are all batch-major.
    rows: int32[R] source row of each new row.
    same_source: every rows[i] encodes the same source as row i (a multi-draft loop choosing among
      copies of one source row; len(rows) is the cache's batch): a `DecoderCache` then keeps its
      encoder side (cross keys and values, mask) as is and gathers only the decoder's.
  """
  if not isinstance(cache, DecoderCache):
    return jax.tree.map(lambda x: jnp.take(x, rows, axis=0), cache)
  per_row = lambda x: jnp.take(x, rows, axis=1)
  encoder = {}
  if not same_source:
    encoder = dict(
      cross_k=per_row(cache.cross_k),
      cross_v=per_row(cache.cross_v),
      encoder_mask=cache.encoder_mask[rows],
    )
  return cache.replace(
    self_k=per_row(cache.self_k),
    self_v=per_row(cache.self_v),
    end_index=cache.end_index[rows],
    **encoder,
  )
