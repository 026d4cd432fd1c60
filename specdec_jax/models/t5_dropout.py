"""T5's residual dropout, for training only (`models.t5`: embeddings, sublayer outputs, final
norms). Inference passes `dropout=None` and pays nothing."""

import jax
import jax.numpy as jnp

Dropout = tuple[jax.Array, float] | None  # (key, rate) in training, None otherwise


def dropper(dropout: Dropout, stream: int):
  """drop(x, site): inverted dropout of x with a key per (stream, site), or the identity."""
  if dropout is None or dropout[1] == 0.0:
    return lambda x, site: x
  key, rate = dropout
  if not 0.0 <= rate < 1.0:
    raise ValueError(f'dropout rate must be in [0, 1), got {rate}.')
  key = jax.random.fold_in(key, stream)

  def drop(x, site):
    keep = jax.random.bernoulli(jax.random.fold_in(key, site), 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)

  return drop
