"""Checkpoint I/O for T5: Hugging Face, T5X (msgpack, tensorstore/zarr, OCDBT) and orbax.

Every format maps onto the one params layout of `models/t5.py` (T5X names, nested dicts):

  format        read / write                 parameter names                  module
  Hugging Face  load_hf_t5 / save_hf_t5      `hf_names(config)`: one table     hf
  T5X           load_t5x                     `t5x_names(config)`: the identity t5x
  orbax         restore / save               our tree as is, the T5Config      here
                                             beside it as JSON (optionally
                                             bfloat16, an int8 delta from a
                                             base, or sharing a base's arrays)

The building blocks they share (lazy arrays, renaming, checks, placement) are in `common`.

Loaders check the arrays against the config (every parameter present with the shape the config
implies, none left over, and by default none holding NaN or inf: `allow_nonfinite=True` opts
out) and raise one ValueError naming the parameter; damaged files give one ValueError naming the
file or directory; a missing path raises FileNotFoundError.

Every loader takes the same keyword arguments for the hardware it loads onto:
  mesh=     build every param as a `jax.Array` sharded over the mesh (`sharding.param_shardings`
            with `rules=`), each process reading only the slices its devices hold (tensorstore
            slices for T5X, safetensors `get_slice` for HF, orbax restore with target shardings);
            None (the default): whole arrays on the default device.
  dtype=    the compute dtype (`T5Config.dtype`), replacing the checkpoint's.
  param_dtype=  the dtype params are stored in on device (e.g. bfloat16 params of a float32
            model); None: the compute dtype (HF, T5X), or as saved (orbax; see `restore`).
"""

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, SingleDeviceSharding

from specdec_jax import sharding
from specdec_jax.checkpoints import common
from specdec_jax.checkpoints.common import NameTable, Params, PathLike, param_shapes  # noqa: F401
from specdec_jax.checkpoints.hf import (  # noqa: F401 (this module's API)
  config_from_hf,
  config_to_hf,
  hf_names,
  hf_state_dict_to_params,
  load_hf_t5,
  params_to_hf_state_dict,
  save_hf_t5,
)
from specdec_jax.models import t5, t5_fused

# -------------------------------------------------------------------------------------------------
# T5X: `t5x` (imported on first use: only T5X checkpoints need tensorstore's loader).


def load_t5x(
  path: PathLike,
  *,
  config: t5.T5Config | None = None,
  allow_nonfinite: bool = False,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  dtype: str | None = None,
  param_dtype: str | None = None,
) -> t5.T5Model:
  """Loads a T5X checkpoint (msgpack, tensorstore/zarr, or orbax OCDBT; a local path or a
  tensorstore URL such as gs://...); see `t5x.load_t5x`."""
  from specdec_jax.checkpoints import t5x

  return t5x.load_t5x(
    path,
    config=config,
    allow_nonfinite=allow_nonfinite,
    mesh=mesh,
    rules=rules,
    dtype=dtype,
    param_dtype=param_dtype,
  )


# -------------------------------------------------------------------------------------------------
# orbax: `<path>/params/` (an orbax StandardCheckpointer directory) and `<path>/config.json`.


STORAGE_DTYPES = (None, 'bfloat16', 'int8-delta')


def save(
  model: t5.T5Model,
  path: PathLike,
  *,
  storage_dtype: str | None = None,
  delta_base: PathLike | None = None,
  delta_bits: int = 8,
  shared_with: PathLike | None = None,
) -> None:
  """Writes the model with orbax to a new directory; `restore(path)` reads it back bit for bit.

  `storage_dtype='bfloat16'` stores the float32 params of a float32 model as bfloat16 (half the
  bytes on disk; how the shipped pairs are stored): `restore` casts them back to float32, so the
  model that comes back computes in float32 with its weights rounded to bfloat16 (to nearest).

  `storage_dtype='int8-delta'` stores a model fine-tuned from `delta_base` (a `save` directory of
  a model of the same shapes) as its difference from that model, rounded to `delta_bits` bits
  (int8 arrays holding |q| <= 2^(bits-1) - 1 = Q) with one float32 scale per row of each array's
  last axis: w = base + q * scale, |error| <= scale / 2 = max|row delta| / (2 Q). Fewer bits
  compress better on disk (orbax's zstd). 6 bits keep a fine-tune at about bfloat16's precision
  (`delta_error`; the shipped debsumm48m target's errors and size: docs/training.md).
  `delta.json` names the base by its path relative to `path` and its fingerprint; `restore`
  rebuilds the weights from it.

  `shared_with` (a `save` directory, e.g. a pair's target) leaves out every param equal bit for
  bit (as float32) to the one of the same name there: a drafter's frozen copy of the target's
  embeddings and output layer (`t5_growth.drafter_from_target`) is stored once, in the target.
  `shared.json` names that directory (relative to `path`), the params taken from it and their
  fingerprint; `restore` reads them from there. A single process's params.

  Params sharded over the devices of several processes (a multi-host mesh): every process calls
  `save` with the same path, a directory they all see, and writes its own shards (orbax); process
  0 writes the rest. A model in the fused decoder layout is written in the T5X layout.
  """
  import orbax.checkpoint as ocp  # ~1 s of imports that HF / T5X users never need

  model = t5_fused.unfuse_projections(model)

  directory = Path(path).absolute()
  exists = directory.exists()
  sharding.barrier(f'save {directory}: checked')  # before process 0 makes it
  if exists:
    raise FileExistsError(f'{directory} already exists; save writes a new directory.')
  if storage_dtype not in STORAGE_DTYPES:
    raise ValueError(f'storage_dtype must be one of {STORAGE_DTYPES}, got {storage_dtype!r}.')
  if storage_dtype and model.config.dtype != 'float32':
    raise ValueError(f'storage_dtype is for float32 models; this one is {model.config.dtype}.')
  if (storage_dtype == 'int8-delta') != (delta_base is not None):
    raise ValueError("delta_base is needed by storage_dtype='int8-delta', and only by it.")
  if isinstance(delta_bits, bool) or not isinstance(delta_bits, int) or not 2 <= delta_bits <= 8:
    raise ValueError(f'delta_bits must be an int in [2, 8], got {delta_bits!r}.')
  if shared_with is not None and storage_dtype == 'int8-delta':
    raise ValueError('shared_with and int8-delta each store the params against a base: give one.')
  common.check_shapes(common.flatten(model.params), model.config)
  params, delta, shared = model.params, None, None
  if shared_with is not None:
    shared = _shared_names(model, Path(shared_with).absolute(), directory)
  if storage_dtype == 'bfloat16':
    params = jax.tree.map(lambda x: jnp.asarray(x, storage_dtype), params)
    common.check_finite(params, directory)  # a float32 weight beyond bfloat16's range would be inf
  elif storage_dtype == 'int8-delta':
    common.check_finite(params, directory)
    base_dir = Path(delta_base).absolute()
    base = restore(base_dir)
    params = _int8_delta(model, base, base_dir, 2 ** (delta_bits - 1) - 1)
    delta = {
      'base': os.path.relpath(base_dir, directory),
      'base_fingerprint': fingerprint(base.params),
    }
  if shared:
    kept = common.flatten(params)
    params = common.unflatten({n: x for n, x in kept.items() if n not in shared['names']})
  main = sharding.is_main_process()
  if main:
    directory.mkdir(parents=True)
  sharding.barrier(f'save {directory}: made')
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / 'params', params)
  if main and delta:
    (directory / 'delta.json').write_text(json.dumps(delta, indent=2) + '\n')
  if main and shared:
    (directory / 'shared.json').write_text(json.dumps(shared, indent=2) + '\n')
  # Written last, so a directory with a config.json holds a complete checkpoint.
  if main:
    (directory / 'config.json').write_text(
      json.dumps(dataclasses.asdict(model.config), indent=2) + '\n'
    )
  sharding.barrier(f'save {directory}: done')


def _shared_names(model: t5.T5Model, base_dir: Path, directory: Path) -> dict:
  """shared.json's content: the base's path relative to `directory`, the names of the model's
  params equal to the base's, and their fingerprint; raises if there are none."""
  base = common.flatten(restore(base_dir).params)
  names = sorted(
    name
    for name, leaf in common.flatten(model.params).items()
    if name in base
    and np.array_equal(np.asarray(base[name], np.float32), np.asarray(leaf, np.float32))
  )
  if not names:
    raise ValueError(f'shared_with {base_dir}: no param of this model equals one of its params.')
  return {
    'base': os.path.relpath(base_dir, directory),
    'names': names,
    'fingerprint': fingerprint(common.unflatten({n: base[n] for n in names})),
  }


def fingerprint(params: Params) -> str:
  """sha256 of a params tree's names, shapes and float32 values (identifies a delta's base)."""
  digest = hashlib.sha256()
  for name, leaf in sorted(common.flatten(params).items()):
    value = np.asarray(leaf, np.float32)
    digest.update(f'{name}{value.shape}'.encode())
    digest.update(value.tobytes())
  return digest.hexdigest()


def _int8_delta(model: t5.T5Model, base: t5.T5Model, base_dir: Path, levels: int) -> Params:
  """{'q': int8 tree in [-levels, levels], 'scale': float32 tree}: model = base + q * scale, one
  scale per row of the last axis."""
  flat, base_flat = common.flatten(model.params), common.flatten(base.params)
  for name in sorted(set(flat) | set(base_flat)):
    shape, base_shape = np.shape(flat.get(name)), np.shape(base_flat.get(name))
    if name not in flat or name not in base_flat or shape != base_shape:
      raise ValueError(
        f'delta_base {base_dir} does not match the model at {name}: shape {base_shape} there, '
        f'{shape} here.'
      )
  q, scale = {}, {}
  for name, leaf in flat.items():
    delta = np.asarray(leaf, np.float32) - np.asarray(base_flat[name], np.float32)
    row_scale = np.max(np.abs(delta), axis=-1, keepdims=True) / levels
    row_scale = np.where(row_scale > 0, row_scale, 1.0).astype(np.float32)
    q[name] = np.clip(np.rint(delta / row_scale), -levels, levels).astype(np.int8)
    scale[name] = row_scale
  return {'q': common.unflatten(q), 'scale': common.unflatten(scale)}


def delta_error(model: t5.T5Model, path: PathLike) -> dict[str, float]:
  """How far the checkpoint at `path` (e.g. int8-delta) is from `model` (the float32 weights it
  was made from), beside a bfloat16 copy's distance: the max and mean abs error over all params,
  and the largest weight."""
  stored = common.flatten(restore(path).params)
  worst, total, count, largest = (
    {'stored': 0.0, 'bfloat16': 0.0},
    {'stored': 0.0, 'bfloat16': 0.0},
    0,
    0.0,
  )
  for name, leaf in common.flatten(model.params).items():
    w = np.asarray(leaf, np.float32)
    rounded = np.asarray(jnp.asarray(w, jnp.bfloat16), np.float32)
    for key, got in (('stored', np.asarray(stored[name], np.float32)), ('bfloat16', rounded)):
      error = np.abs(got - w)
      worst[key] = max(worst[key], float(error.max()))
      total[key] += float(error.sum())
    count += w.size
    largest = max(largest, float(np.abs(w).max()))
  return {
    'max_stored': worst['stored'],
    'max_bfloat16': worst['bfloat16'],
    'mean_stored': total['stored'] / count,
    'mean_bfloat16': total['bfloat16'] / count,
    'largest_weight': largest,
  }


def restore(
  path: PathLike,
  *,
  allow_nonfinite: bool = False,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  dtype: str | None = None,
  param_dtype: str | None = None,
) -> t5.T5Model:
  """Reads a model written by `save`; arrays come back with the dtypes they were saved with,
  except that a float32 model's bfloat16-stored params (`save(..., storage_dtype=)`) come back
  as float32, and an int8-delta checkpoint comes back as its base plus the delta (float32, or
  `param_dtype`), after checking that the base is the checkpoint the delta was made from; a
  `save(..., shared_with=)` checkpoint takes the arrays it shares from its base, after checking
  that the base still holds them.

  Args:
    path: the (local) directory `save` wrote.
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.
    mesh: restore every param sharded over this mesh (`sharding.param_shardings` with `rules`):
      orbax reads only the slices this process's devices hold. None: on the default device.
    rules: the logical-axis rules for `mesh`.
    dtype: the compute dtype (`T5Config.dtype`), replacing the saved config's.
    param_dtype: the dtype params are restored as (orbax casts while reading); None: as saved,
      or float32 when the compute dtype is float32.

  Raises:
    FileNotFoundError: `path` is not a directory written by `save` (or the base of its delta or
      of its shared arrays is missing).
    ValueError: orbax cannot read the params (corrupt or truncated files), the params do not fit
      the config, (unless allowed) a weight is NaN or inf, a delta's base is not the
      checkpoint it was made from, or a shared base no longer holds the shared arrays.
  """
  common.check_dtype('dtype', dtype)
  common.check_dtype('param_dtype', param_dtype)
  if common.is_url(path):
    raise ValueError(f'restore reads local directories, got the URL {path!r}.')
  directory = Path(path).absolute()
  for needed in (directory / 'config.json', directory / 'params'):
    if not needed.exists():
      raise FileNotFoundError(
        f'No checkpoint written by checkpoints.save at {directory}: {needed.name} is missing.'
      )
  config = _config_from_json(directory / 'config.json')
  if dtype is not None:
    config = dataclasses.replace(config, dtype=dtype)
  targets = None if mesh is None else common.shardings_by_name(config, mesh, rules)
  if (directory / 'delta.json').exists():
    params = _restore_int8_delta(directory, allow_nonfinite=allow_nonfinite)
    common.check_shapes(common.flatten(params), config)
    params = common.unflatten(
      {
        name: jax.device_put(
          jnp.asarray(leaf, param_dtype or config.dtype), None if targets is None else targets[name]
        )
        for name, leaf in common.flatten(params).items()
      }
    )
  else:
    shared = (
      _restore_shared(directory, allow_nonfinite) if (directory / 'shared.json').exists() else {}
    )
    params = _restore_orbax(directory, config, targets or {}, param_dtype, shared)
    if not allow_nonfinite:
      common.check_finite(params, directory)
  return t5.T5Model(config=config, params=params)


def _restore_shared(directory: Path, allow_nonfinite: bool) -> dict:
  """The params a `save(..., shared_with=)` directory takes from its base (by name, float32
  host arrays), after checking the base still holds what they were."""
  meta = common.read_json(directory / 'shared.json')
  base_dir = (directory / meta['base']).resolve()
  if not (base_dir / 'config.json').exists():
    raise FileNotFoundError(
      f'{directory} takes {len(meta["names"])} params from {base_dir}, which is missing.'
    )
  base = common.flatten(restore(base_dir, allow_nonfinite=allow_nonfinite).params)
  taken = {name: np.asarray(base[name], np.float32) for name in meta['names'] if name in base}
  if len(taken) < len(meta['names']) or fingerprint(common.unflatten(taken)) != meta['fingerprint']:
    raise ValueError(
      f'{directory} takes {", ".join(meta["names"])} from {base_dir}, but that checkpoint no '
      'longer holds what they were (their fingerprint differs).'
    )
  return taken


def _restore_orbax(
  directory: Path, config: t5.T5Config, targets: dict, param_dtype, shared: dict
) -> Params:
  """The params of an orbax `save` directory with those it takes from its base (`shared`, by
  name), each leaf onto its sharding in `targets` (by name; the default device for any other) as
  `param_dtype`, or as saved (float32 for a float32 model: bfloat16-stored params are cast back)."""
  import orbax.checkpoint as ocp

  try:
    with ocp.StandardCheckpointer() as checkpointer:
      saved = common.flatten(_orbax_tree(checkpointer.metadata(directory / 'params')))
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    raise _damaged(directory, e) from e
  common.check_shapes({**saved, **shared}, config)
  default = SingleDeviceSharding(jax.devices()[0])
  dtype = lambda leaf: jnp.dtype(
    param_dtype or ('float32' if config.dtype == 'float32' else leaf.dtype)
  )
  target = {
    name: jax.ShapeDtypeStruct(leaf.shape, dtype(leaf), sharding=targets.get(name, default))
    for name, leaf in saved.items()
  }
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      own = common.flatten(checkpointer.restore(directory / 'params', common.unflatten(target)))
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    raise _damaged(directory, e) from e
  taken = {  # as the model computes (or param_dtype)
    name: jax.device_put(jnp.asarray(leaf, param_dtype or config.dtype), targets.get(name, default))
    for name, leaf in shared.items()
  }
  return common.unflatten({**own, **taken})


def _restore_int8_delta(directory: Path, *, allow_nonfinite: bool) -> Params:
  """base + q * scale as float32 numpy arrays, after checking the base is the one it was made from.
  Whole arrays are read on every process (a fine-tune's delta, small by design)."""
  import orbax.checkpoint as ocp

  meta = common.read_json(directory / 'delta.json')
  base_dir = (directory / meta['base']).resolve()
  if not (base_dir / 'config.json').exists():
    raise FileNotFoundError(
      f'{directory} stores its weights as an int8 delta from {base_dir}, which is missing.'
    )
  base = restore(base_dir, allow_nonfinite=allow_nonfinite)
  if fingerprint(base.params) != meta['base_fingerprint']:
    raise ValueError(
      f'{directory} stores its weights as an int8 delta from {base_dir}, but that checkpoint '
      'is not the one the delta was made from (its fingerprint differs).'
    )
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      stored = checkpointer.restore(directory / 'params')
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    raise _damaged(directory, e) from e
  q, scale = common.flatten(stored['q']), common.flatten(stored['scale'])
  params = {
    name: np.asarray(leaf, np.float32) + np.asarray(q[name], np.float32) * np.asarray(scale[name])
    for name, leaf in common.flatten(base.params).items()
  }
  if not allow_nonfinite:
    common.check_finite(params, directory)
  return common.unflatten(params)


def _orbax_tree(metadata):
  """The tree of array metadata (shape, dtype) in what `StandardCheckpointer.metadata` returns."""
  metadata = getattr(metadata, 'item_metadata', metadata)
  return getattr(metadata, 'tree', metadata)


def _damaged(directory: Path, error: Exception) -> ValueError:
  reason = (str(error).strip().splitlines() or [''])[0]
  reason = reason if len(reason) <= 300 else reason[:300] + '...'
  return ValueError(
    f'Cannot restore the orbax checkpoint at {directory}; its params/ files are damaged or '
    f'incomplete ({type(error).__name__}: {reason}).'
  )


def _config_from_json(file: Path) -> t5.T5Config:
  fields = common.read_json(file)
  if not isinstance(fields, Mapping):
    raise ValueError(f'{file}: expected a JSON object of T5Config fields.')
  unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(t5.T5Config)})
  if unknown:
    raise ValueError(f'{file}: unknown T5Config field(s) {unknown}.')
  return t5.T5Config(**fields)
