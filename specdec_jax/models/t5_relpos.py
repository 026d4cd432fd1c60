"""T5's relative-position buckets, exactly as HF / T5X / Mesh TF compute them (`models.t5` adds
the bias of each bucket to the attention logits)."""

import math

import jax
import jax.numpy as jnp
import numpy as np


def _distance_buckets(num_buckets: int, max_distance: int) -> np.ndarray:
  """int32[max_distance + 1]: the bucket of each distance 0..max_distance (one direction)."""
  max_exact = num_buckets // 2
  distance = np.arange(max_distance + 1)
  # HF/Mesh-TF's float32 formula, tabulated in NumPy: it truncates a float32 logarithm, so a
  # distance on a bucket boundary can land either side by one ulp, and XLA's log differs from
  # torch's / NumPy's in that ulp for some (num_buckets, max_distance). NumPy matches torch.
  ratio = np.maximum(distance, max_exact).astype(np.float32) / np.float32(max_exact)
  scaled = (
    np.log(ratio)
    / np.float32(math.log(max_distance / max_exact))
    * np.float32(num_buckets - max_exact)
  )
  large = np.minimum(max_exact + scaled.astype(np.int32), num_buckets - 1)
  return np.where(distance < max_exact, distance, large).astype(np.int32)


def relative_position_bucket(
  relative_position: jax.Array, *, bidirectional: bool, num_buckets: int, max_distance: int
) -> jax.Array:
  """T5's relative-position bucket, exactly as HF / T5X / Mesh TF `_relative_position_bucket`.

  Half the buckets (per direction) are exact distances, the rest logarithmic up to max_distance;
  farther distances share the last bucket. Bidirectional: keys after the query (positive
  relative positions) use the upper half of the buckets. Causal: positive relative positions
  (future keys, masked anyway) fall in bucket 0.

  Args:
    relative_position: int[...] key position - query position.
    bidirectional: True in the encoder, False in the decoder.
    num_buckets: total number of buckets (>= 4).
    max_distance: distances >= max_distance share a bucket.

  Returns:
    int32[...] buckets in [0, num_buckets).
  """
  relative_position = jnp.asarray(relative_position, jnp.int32)
  if bidirectional:
    num_buckets //= 2
    offset = jnp.where(relative_position > 0, num_buckets, 0)
    distance = jnp.abs(relative_position)
  else:
    offset = 0
    distance = jnp.maximum(-relative_position, 0)
  table = jnp.asarray(_distance_buckets(num_buckets, max_distance))
  return offset + table[jnp.minimum(distance, max_distance)]
