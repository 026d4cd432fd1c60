"""Building blocks shared by the checkpoint formats (`checkpoints`, `checkpoints.hf`,
`checkpoints.t5x`): flat names, the shapes a config implies, checked renaming, lazy arrays read a
slice at a time, placement on a device mesh, and the finiteness check.

A loader opens its checkpoint as `LazyArray`s (shape known, nothing read), renames them with its
name table (`rename`), checks them against the config (`check_shapes`), then `place_params` reads
each one: whole onto the default device without a mesh, or, with one, only the slices the
process's devices hold (the shardings of `sharding.param_shardings`), each distinct slice once.

  sources = {name: LazyArray(shape, read) for ...}  # read(index) -> the array's [index]
  params = place_params(rename(sources, names), config, names=names, mesh=mesh, dtype='bfloat16')
  check_finite(params, where, names)
"""

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from specdec_jax import sharding
from specdec_jax.models import t5

Params = dict[str, Any]
PathLike = str | Path
# Our '/'-joined parameter path -> (the parameter's name in a checkpoint, stored transposed).
NameTable = dict[str, tuple[str, bool]]
# One slice per axis, as `Sharding.addressable_devices_indices_map` gives them.
Index = tuple[slice, ...]
# The dtypes params may be stored in (those of `T5Config.dtype`).
PARAM_DTYPES = ('float32', 'bfloat16')


def flatten(tree: Mapping, is_leaf: Callable[[Any], bool] = lambda x: False) -> dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x}; `is_leaf` stops the descent at dicts that are values."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping) and not is_leaf(value):
      flat.update({f'{key}/{k}': v for k, v in flatten(value, is_leaf).items()})
    else:
      flat[str(key)] = value
  return flat


def unflatten(flat: Mapping[str, Any]) -> Params:
  """{'a/b': x} -> {'a': {'b': x}}."""
  tree: Params = {}
  for name, value in flat.items():
    *parents, leaf = name.split('/')
    node = tree
    for parent in parents:
      node = node.setdefault(parent, {})
    node[leaf] = value
  return tree


def param_shapes(config: t5.T5Config) -> dict[str, tuple[int, ...]]:
  """The shape of every parameter `t5.init_params` makes for `config`, by '/'-joined path."""
  return dict(_param_shapes(config))


@functools.cache
def _param_shapes(config: t5.T5Config) -> dict[str, tuple[int, ...]]:
  abstract = jax.eval_shape(lambda rng: t5.init_params(rng, config), jax.random.key(0))
  return {name: tuple(leaf.shape) for name, leaf in flatten(abstract).items()}


def read_json(file: Path) -> Any:
  """The parsed contents of a JSON file; ValueError naming the file if it is not JSON."""
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f'{file} is not valid JSON ({e}).') from e


def is_url(path: PathLike) -> bool:
  """Whether `path` is a `scheme://...` URL (gs://, file://, ...) rather than a local path."""
  return isinstance(path, str) and '://' in path and path.split('://')[0].isidentifier()


def check_dtype(name: str, dtype: str | None) -> None:
  """Raises ValueError unless `dtype` is None or one of `PARAM_DTYPES`."""
  if dtype is not None and dtype not in PARAM_DTYPES:
    raise ValueError(f'{name} must be one of {PARAM_DTYPES} (or None), got {dtype!r}.')


# -------------------------------------------------------------------------------------------------
# Lazy arrays: a shape and a function that reads any slice.


def full_index(shape: tuple[int, ...]) -> Index:
  return (slice(None),) * len(shape)


@dataclasses.dataclass(frozen=True)
class LazyArray:
  """An array of a checkpoint that is read a slice at a time.

  Attributes:
    shape: the array's shape.
    read: index (one slice per axis) -> numpy array of the array's [index].
  """

  shape: tuple[int, ...]
  read: Callable[[Index], np.ndarray]

  @classmethod
  def of(cls, array: Any) -> 'LazyArray':
    """`array` itself if lazy, else a lazy view of it as numpy (already in memory)."""
    if isinstance(array, LazyArray):
      return array
    array = np.asarray(array)
    return cls(tuple(array.shape), lambda index: array[index])

  @property
  def T(self) -> 'LazyArray':  # noqa: N802 (numpy's name)
    """The transpose: reads the transposed slice of this array."""
    return LazyArray(self.shape[::-1], lambda index: np.asarray(self.read(index[::-1])).T)

  def __array__(self, dtype=None, copy=None) -> np.ndarray:
    """The whole array (read now)."""
    array = np.asarray(self.read(full_index(self.shape)))
    return array if dtype is None else array.astype(dtype)


def rename(
  source: Mapping[str, Any], names: NameTable, *, ignored: frozenset[str] = frozenset()
) -> dict[str, LazyArray]:
  """Our flat arrays from a checkpoint's flat arrays (renamed, transposed where stored so).

  Reads nothing: every array comes back as a `LazyArray` (arrays in memory are wrapped).

  Args:
    source: checkpoint name -> array or `LazyArray`, e.g. an HF state dict.
    names: the name table, e.g. `hf.hf_names(config)`.
    ignored: checkpoint names that may be present and are not read.

  Raises:
    ValueError: a parameter is missing, or the checkpoint has parameters the table does not.
  """
  for ours, (name, _) in names.items():
    if name not in source:
      hint = '' if name == ours else f' (ours: {ours})'
      raise ValueError(f'Checkpoint is missing parameter {name!r}{hint}.')
  unexpected = sorted(set(source) - {name for name, _ in names.values()} - ignored)
  if unexpected:
    raise ValueError(
      f'Checkpoint has {len(unexpected)} parameter(s) the config does not, e.g. {unexpected[:3]}; '
      'does the config (layer counts, feed_forward, tie_word_embeddings) match the checkpoint?'
    )
  flat = {}
  for ours, (name, transposed) in names.items():
    array = LazyArray.of(source[name])
    flat[ours] = array.T if transposed else array
  return flat


def check_shapes(
  flat: Mapping[str, Any], config: t5.T5Config, names: NameTable | None = None
) -> None:
  """Raises ValueError unless `flat` has exactly the paths and shapes that `config` implies.

  Args:
    flat: our '/'-joined path -> array (anything with a shape).
    config: the model config.
    names: a checkpoint's name table, so that errors use its names and storage layout.
  """
  expected = _param_shapes(config)
  for ours, shape in expected.items():
    name, transposed = (names or {}).get(ours, (ours, False))
    if ours not in flat:
      raise ValueError(f'The params are missing parameter {name!r}.')
    got = tuple(flat[ours].shape)
    if got != shape:
      if transposed:  # report shapes as the checkpoint stores them
        shape, got = shape[::-1], got[::-1]
      raise ValueError(
        f'Shape mismatch for parameter {name!r}: the config implies {shape}, got {got}.'
      )
  unexpected = sorted(set(flat) - set(expected))
  if unexpected:
    raise ValueError(f'Params have parameter(s) the config does not: {unexpected[:3]}.')


# -------------------------------------------------------------------------------------------------
# Placement: whole on the default device, or sharded over a mesh.


def shardings_by_name(
  config: t5.T5Config, mesh: Mesh, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> dict[str, NamedSharding]:
  """The `NamedSharding` of each parameter of `config` on `mesh`, by '/'-joined path (the flat
  form of `sharding.param_shardings`, for loaders that read one named array at a time)."""
  abstract = jax.eval_shape(lambda rng: t5.init_params(rng, config), jax.random.key(0))
  return flatten(sharding.param_shardings(abstract, mesh, rules))


def place(array: LazyArray, dtype: str, target: jax.sharding.Sharding | None = None) -> jax.Array:
  """Reads `array` into a `jax.Array` of `dtype`.

  Without `target`, reads it whole onto the default device. With one, reads only the slices that
  this process's devices hold (`target.addressable_devices_indices_map`), each distinct slice once
  (replicas share the read), and assembles the global array from them.
  """
  if target is None:
    return jnp.asarray(array.read(full_index(array.shape)), dtype)
  groups: dict[tuple, tuple[Index, list[jax.Device]]] = {}
  for device, index in target.addressable_devices_indices_map(array.shape).items():
    key = tuple((s.start, s.stop, s.step) for s in index)  # slices are unhashable before 3.12
    groups.setdefault(key, (index, []))[1].append(device)
  shards = []
  for index, devices in groups.values():
    host = np.asarray(array.read(index)).astype(jnp.dtype(dtype))
    shards.extend(jax.device_put(host, device) for device in devices)
  return jax.make_array_from_single_device_arrays(array.shape, target, shards)


def place_params(
  flat: Mapping[str, LazyArray],
  config: t5.T5Config,
  *,
  names: NameTable | None = None,
  dtype: str | None = None,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> Params:
  """Checks renamed checkpoint arrays against `config`, then reads them as our params tree.

  Args:
    flat: our '/'-joined path -> array (as `rename` returns).
    config: the model config.
    names: the checkpoint's name table, for error messages.
    dtype: the dtype the params are stored in on device (None: `config.dtype`).
    mesh: shard every param over this mesh (`sharding.param_shardings` with `rules`), each
      process reading only its devices' slices; None: whole arrays on the default device.
    rules: the logical-axis rules for `mesh`.

  Raises:
    ValueError: a parameter is missing, left over, or has a shape the config does not imply.
  """
  check_dtype('param_dtype', dtype)
  check_shapes(flat, config, names)
  dtype = dtype or config.dtype
  targets = {} if mesh is None else shardings_by_name(config, mesh, rules)
  return unflatten({ours: place(array, dtype, targets.get(ours)) for ours, array in flat.items()})


@jax.jit
def _nonfinite_counts(params: Params) -> Params:
  return jax.tree.map(lambda x: jnp.sum(~jnp.isfinite(x)), params)


def check_finite(params: Params, where: Any, names: NameTable | None = None) -> None:
  """Raises ValueError naming the first parameter that holds a NaN or an infinity.

  Runs on the arrays as loaded, after the cast to the storage dtype, so a float32 value beyond
  the range of a bfloat16 param counts too. A NaN weight would otherwise surface, if at all, as
  NaN logits deep inside decoding. One jitted reduction over the whole tree: sharded params are
  counted where they live, and only one scalar per param comes to the host.

  Args:
    params: the loaded params tree.
    where: the checkpoint, for the message.
    names: a checkpoint's name table, so the message also gives the parameter's name there.
  """
  counts = flatten(jax.device_get(_nonfinite_counts(params)))
  arrays = flatten(params)
  for ours, count in counts.items():
    if not count:
      continue
    name, _ = (names or {}).get(ours, (ours, False))
    stored_as = '' if name == ours else f' (stored as {name!r})'
    raise ValueError(
      f'Parameter {ours!r}{stored_as} of {where} has {int(count)} non-finite value(s) (NaN or '
      f'inf) as {arrays[ours].dtype}: the checkpoint is corrupt, or was saved after training '
      'diverged. Pass allow_nonfinite=True to load it anyway.'
    )
