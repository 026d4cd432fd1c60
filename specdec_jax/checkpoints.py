"""Checkpoint I/O for T5: Hugging Face, T5X (msgpack, tensorstore/zarr, OCDBT) and orbax.

Every format maps onto the one params layout of `models/t5.py` (T5X names, nested dicts):

  format        read / write                 parameter names                  module
  Hugging Face  load_hf_t5 / save_hf_t5      `hf_names(config)`: one table     checkpoints_hf
  T5X           load_t5x                     `t5x_names(config)`: the identity checkpoints_t5x
  orbax         restore / save               our tree as is, the T5Config      here
                                             beside it as JSON

The building blocks they share (lazy arrays, renaming, checks, placement) are `checkpoint_utils`.

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
import json
from collections.abc import Mapping
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, SingleDeviceSharding

from specdec_jax import checkpoint_utils as utils
from specdec_jax import sharding
from specdec_jax.checkpoint_utils import NameTable, Params, PathLike, param_shapes  # noqa: F401
from specdec_jax.checkpoints_hf import (  # noqa: F401 (this module's API)
  config_from_hf,
  config_to_hf,
  hf_names,
  hf_state_dict_to_params,
  load_hf_t5,
  params_to_hf_state_dict,
  save_hf_t5,
)
from specdec_jax.models import t5

# -------------------------------------------------------------------------------------------------
# T5X: `checkpoints_t5x` (imported on first use: only T5X checkpoints need tensorstore's loader).


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
  tensorstore URL such as gs://...); see `checkpoints_t5x.load_t5x`."""
  from specdec_jax import checkpoints_t5x

  return checkpoints_t5x.load_t5x(
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


def save(model: t5.T5Model, path: PathLike, *, storage_dtype: str | None = None) -> None:
  """Writes the model with orbax to a new directory; `restore(path)` reads it back bit for bit.

  `storage_dtype='bfloat16'` stores the float32 params of a float32 model as bfloat16 (half the
  bytes on disk; how the shipped pairs are stored): `restore` casts them back to float32, so the
  model that comes back computes in float32 with its weights rounded to bfloat16 (to nearest).
  """
  import orbax.checkpoint as ocp  # ~1 s of imports that HF / T5X users never need

  directory = Path(path).absolute()
  if directory.exists():
    raise FileExistsError(f'{directory} already exists; save writes a new directory.')
  if storage_dtype not in (None, 'bfloat16'):
    raise ValueError(f"storage_dtype must be None or 'bfloat16', got {storage_dtype!r}.")
  if storage_dtype and model.config.dtype != 'float32':
    raise ValueError(f'storage_dtype is for float32 models; this one is {model.config.dtype}.')
  utils.check_shapes(utils.flatten(model.params), model.config)
  params = model.params
  if storage_dtype:
    params = jax.tree.map(lambda x: jnp.asarray(x, storage_dtype), params)
    utils.check_finite(params, directory)  # a float32 weight beyond bfloat16's range would be inf
  directory.mkdir(parents=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / 'params', params)
  # Written last, so a directory with a config.json holds a complete checkpoint.
  (directory / 'config.json').write_text(
    json.dumps(dataclasses.asdict(model.config), indent=2) + '\n'
  )


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
  as float32.

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
    FileNotFoundError: `path` is not a directory written by `save`.
    ValueError: orbax cannot read the params (corrupt or truncated files), the params do not fit
      the config, or (unless allowed) a weight is NaN or inf.
  """
  import orbax.checkpoint as ocp

  utils.check_dtype('dtype', dtype)
  utils.check_dtype('param_dtype', param_dtype)
  if utils.is_url(path):
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
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      saved = utils.flatten(_orbax_tree(checkpointer.metadata(directory / 'params')))
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    raise _damaged(directory, e) from e
  utils.check_shapes(saved, config)
  targets = {} if mesh is None else utils.param_shardings(config, mesh, rules)
  default = SingleDeviceSharding(jax.devices()[0])
  target = {}
  for name, leaf in saved.items():
    # Params of a float32 model are float32 (or stored as bfloat16, then cast back).
    leaf_dtype = param_dtype or ('float32' if config.dtype == 'float32' else leaf.dtype)
    target[name] = jax.ShapeDtypeStruct(
      leaf.shape, jnp.dtype(leaf_dtype), sharding=targets.get(name, default)
    )
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      params = checkpointer.restore(directory / 'params', utils.unflatten(target))
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    raise _damaged(directory, e) from e
  if not allow_nonfinite:
    utils.check_finite(params, directory)
  return t5.T5Model(config=config, params=params)


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
  fields = utils.read_json(file)
  if not isinstance(fields, Mapping):
    raise ValueError(f'{file}: expected a JSON object of T5Config fields.')
  unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(t5.T5Config)})
  if unknown:
    raise ValueError(f'{file}: unknown T5Config field(s) {unknown}.')
  return t5.T5Config(**fields)
