"""Checks at the boundary of the decode loops: one clear error before anything runs.

Inside the jitted loops nothing can raise, so bad input is refused here (ids, masks, integral
gamma / max_new_tokens, the sampling type, the PRNG key), and non-finite values, which only show up while
decoding, are counted by the loops and raised as `NonFiniteError` after them.

Axis legend: B batch, S source length.
"""

import numbers

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode_stats, step_models
from specdec_jax import sampling as sampling_lib


class NonFiniteError(ValueError):
  """A model produced NaN or inf logits while decoding: the output is not a sample of it."""


# The shape of a raw key's data (`jax.random.PRNGKey(seed)`); eval_shape: no backend starts at
# import (jax.distributed.initialize must come first).
_RAW_KEY = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))


def check_rng(rng, sampling: sampling_lib.SamplingConfig) -> jax.Array:
  """The decode loops' PRNG key: `rng` if it is one key (`jax.random.key(seed)`, or a raw
  `jax.random.PRNGKey(seed)`). None only at temperature 0, where the loops draw nothing (a fixed
  key stands in, so the program is the one a key gives)."""
  if rng is None:
    if not sampling.greedy:
      raise ValueError(
        f'rng=None, but sampling at temperature {sampling.temperature} draws random numbers: '
        'pass rng=jax.random.key(seed) (None is only accepted at temperature 0).'
      )
    return jax.random.key(0)
  dtype, shape = getattr(rng, 'dtype', None), getattr(rng, 'shape', None)
  typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) and shape == ()
  raw = dtype == jnp.uint32 and shape == _RAW_KEY.shape
  if not isinstance(rng, (jax.Array, np.ndarray)) or not (typed or raw):
    raise TypeError(
      f'rng must be one PRNG key, e.g. jax.random.key(seed); got {type(rng).__name__} with '
      f'dtype {dtype} and shape {shape}.'
    )
  return rng


def as_int(name: str, value, minimum: int) -> int:
  """An integral argument as a Python int (so 3 and np.int64(3) share one compiled program)."""
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise TypeError(f'{name} must be an int, got {value!r} ({type(value).__name__}).')
  if value < minimum:
    raise ValueError(f'{name} must be >= {minimum}, got {value}.')
  return int(value)


def check_inputs(steps, input_ids, input_mask, max_new_tokens, *, drafter=None):
  """Validates the arguments every loop takes; returns (ids int32, mask int32, max_new_tokens)."""
  max_new_tokens = as_int('max_new_tokens', max_new_tokens, 1)
  # Abstract inputs (`jax.ShapeDtypeStruct`, for lowering) and a batch sharded over several hosts
  # cannot be read here: check their shapes and dtypes only.
  local = not any(map(_is_abstract, (input_ids, input_mask)))
  ids = np.asarray(input_ids) if local else _shape_dtype(input_ids)
  mask = np.asarray(input_mask) if local else _shape_dtype(input_mask)
  if ids.dtype == object or not np.issubdtype(ids.dtype, np.integer):
    raise TypeError(f'input_ids must hold integer token ids, got dtype {ids.dtype}.')
  if ids.ndim != 2 or ids.shape != mask.shape:
    raise ValueError(
      'input_ids and input_mask must both be [batch, length], got shapes '
      f'{ids.shape} and {mask.shape}.'
    )
  if ids.shape[0] < 1 or ids.shape[1] < 1:
    raise ValueError(f'input_ids needs at least one row and one position, got shape {ids.shape}.')
  if not (mask.dtype == bool or np.issubdtype(mask.dtype, np.integer)) or (
    local and not np.isin(mask, (0, 1)).all()
  ):
    values = np.unique(mask)[:5] if local else '?'
    raise TypeError(
      f'input_mask must be bool or 0/1 integers (1 at real tokens), got dtype '
      f'{mask.dtype} with values {values}.'
    )
  if local:
    lowest, highest = int(ids.min()), int(ids.max())
    if lowest < 0 or highest >= steps.vocab_size:
      raise ValueError(
        f'input_ids must be in [0, vocab_size={steps.vocab_size}), got ids in '
        f'[{lowest}, {highest}].'
      )
  for role, model in (('model', steps), ('drafter', drafter)):
    max_source = model and step_models.limit(model, 'max_source_length')
    if max_source is not None and ids.shape[1] > max_source:
      raise ValueError(
        f"Inputs of length {ids.shape[1]} exceed the {role}'s max_source_length={max_source}."
      )
  max_target = step_models.limit(steps, 'max_target_length')
  if max_target is not None and max_new_tokens > max_target:
    raise ValueError(
      f"max_new_tokens={max_new_tokens} exceeds the model's max_target_length={max_target}."
    )
  return _as_int32(input_ids), _as_int32(input_mask), max_new_tokens


def _is_abstract(x) -> bool:
  """True for a `jax.ShapeDtypeStruct` or an array spanning devices of other processes."""
  return isinstance(x, jax.ShapeDtypeStruct) or decode_stats.spans_processes(x)


def _shape_dtype(x) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(x.shape, x.dtype)


def _as_int32(x):
  """The caller's array as int32, not the host copy: a sharded batch keeps its placement, and an
  abstract one stays abstract (with its sharding)."""
  if isinstance(x, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(x.shape, jnp.int32, sharding=x.sharding)
  if isinstance(x, jax.Array):
    return x.astype(jnp.int32)
  return jnp.asarray(np.asarray(x), jnp.int32)


def check_sampling(sampling):
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise TypeError(
      f'sampling must be a sampling.SamplingConfig (e.g. SamplingConfig('
      f'temperature=0.0) for greedy), got {sampling!r}.'
    )


def raise_if_nonfinite(out, what: str):
  """Raises NonFiniteError if `out.stats.nonfinite` counts any row (waits for the result).

  Counts spanning several processes are gathered first, so every process raises the same error
  (or none): call it on every process.
  """
  rows = np.flatnonzero(decode_stats.to_host(out.stats.nonfinite))
  if rows.size:
    raise NonFiniteError(
      f'{what} produced NaN or inf in {rows.size} row(s) (first: {rows[:8].tolist()}): the '
      'output is not a sample of the model. Check the params (the checkpoint loaders reject '
      'non-finite weights) and the inputs; pass check_finite=False to get the output anyway, '
      'with the per-row counts in out.stats.nonfinite.'
    )
  return out
