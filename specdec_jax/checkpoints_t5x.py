"""T5X checkpoints: msgpack (inline or tensorstore/zarr arrays) and orbax OCDBT, read into our
params layout (ours are T5X's names). `checkpoints.load_t5x` calls `load_t5x` here, so only T5X
users import tensorstore. The checks (shapes, finiteness) are `checkpoints`'s, shared with HF.
"""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
from flax import serialization

from specdec_jax.checkpoints import (
  NameTable,
  PathLike,
  _check_finite,
  _flatten,
  _mapped_params,
  param_shapes,
)
from specdec_jax.models import t5

# T5X. A `checkpoint_<step>/` directory in one of two layouts, every array read by tensorstore:
#   msgpack  a `checkpoint` file (flax.serialization) of {'version', 'optimizer': {'target': params,
#            'state': optimizer state}}. Legacy checkpoints hold every array inline; tensorstore ones
#            replace each partitioned array by a tensorstore spec, e.g. {'driver': 'zarr',
#            'kvstore': {'driver': 'file', 'path': 'target.encoder.layers_0.attention.key.kernel'},
#            'metadata': {...}}, whose path is a zarr array directory relative to the checkpoint's
#            directory.
#   OCDBT    a `state/` orbax PyTree checkpoint (T5X's OrbaxCheckpointManager) of {'target': params,
#            'state': ...}: one OCDBT key-value store (`manifest.ocdbt`, data files under `d/` and
#            `ocdbt.process_<i>/d/`) holding a zarr (or zarr3) array per leaf under its dotted path,
#            e.g. key 'target.encoder.layers_0.attention.key.kernel/.zarray'.


def t5x_names(config: t5.T5Config) -> NameTable:
  """The T5X name of each of our parameters: the same name, never transposed."""
  return {name: (name, False) for name in param_shapes(config)}


def load_t5x(
  path: PathLike, *, config: t5.T5Config | None = None, allow_nonfinite: bool = False
) -> t5.T5Model:
  """Loads the params of a T5X checkpoint (msgpack, tensorstore/zarr, or orbax OCDBT).

  Args:
    path: a checkpoint directory (`checkpoint_<step>/`, holding a `checkpoint` file or an OCDBT
      `state/` directory), the msgpack checkpoint file itself, or the OCDBT directory itself.
    config: the model config; by default inferred from the parameter shapes (see
      `infer_t5x_config`: T5X checkpoints carry no config).
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.

  Returns:
    The model; params are jax arrays of `config.dtype`.
  """
  where = _t5x_checkpoint(Path(path))
  if where.is_dir():
    specs = _t5x_ocdbt_specs(where)
  else:
    specs = {
      name: _t5x_leaf_spec(leaf, where.parent, name)
      for name, leaf in _read_t5x_target(where).items()
    }
  arrays = _read_arrays(specs)
  if config is None:
    config = infer_t5x_config({name: array.shape for name, array in arrays.items()})
  params = _mapped_params(arrays, t5x_names(config), config)
  if not allow_nonfinite:
    _check_finite(params, where)
  return t5.T5Model(config=config, params=params)


def infer_t5x_config(shapes: Mapping[str, tuple[int, ...]]) -> t5.T5Config:
  """A T5Config from T5X parameter shapes ('/'-joined names -> shape).

  `relative_attention_max_distance` cannot be seen in the weights; it stays at T5's 128, and the
  token ids at T5's pad 0 / eos 1 / decoder start 0.
  """
  if any(re.match(r'(en|de)coder/layers/', name) for name in shapes):
    raise ValueError('Scanned (stacked-layer) T5X checkpoints are not supported.')

  def shape(name: str) -> tuple[int, ...]:
    if name not in shapes:
      raise ValueError(f'Cannot infer the config: the checkpoint has no parameter {name!r}.')
    return shapes[name]

  vocab_size, d_model = shape('token_embedder/embedding')
  num_heads, num_buckets = shape('encoder/relpos_bias/rel_embedding')
  inner_dim = shape('encoder/layers_0/attention/query/kernel')[1]
  if inner_dim % num_heads:
    raise ValueError(f'Query width {inner_dim} is not a multiple of the {num_heads} heads.')
  gated = 'encoder/layers_0/mlp/wi_0/kernel' in shapes
  return t5.T5Config(
    vocab_size=vocab_size,
    d_model=d_model,
    d_kv=inner_dim // num_heads,
    d_ff=shape(f'encoder/layers_0/mlp/{"wi_0" if gated else "wi"}/kernel')[1],
    num_heads=num_heads,
    num_encoder_layers=_count_layers(shapes, 'encoder'),
    num_decoder_layers=_count_layers(shapes, 'decoder'),
    relative_attention_num_buckets=num_buckets,
    feed_forward='gated-gelu' if gated else 'relu',
    tie_word_embeddings='decoder/logits_dense/kernel' not in shapes,
  )


def _count_layers(shapes: Mapping[str, Any], stack: str) -> int:
  layers = [int(m[1]) for name in shapes if (m := re.match(rf'{stack}/layers_(\d+)/', name))]
  if not layers:
    raise ValueError(f'Cannot infer the config: the checkpoint has no {stack}/layers_0.')
  return max(layers) + 1


def _t5x_checkpoint(path: Path) -> Path:
  """The msgpack `checkpoint` file, or the OCDBT directory, of a T5X checkpoint at `path`."""
  if path.is_file():
    return path
  if not path.is_dir():
    raise FileNotFoundError(f'No T5X checkpoint at {path}.')
  for candidate in (
    path / 'checkpoint',
    path / 'manifest.ocdbt',
    path / 'state' / 'manifest.ocdbt',
  ):
    if candidate.is_file():
      return candidate if candidate.name == 'checkpoint' else candidate.parent
  raise FileNotFoundError(
    f'{path} has no `checkpoint` file and no `state/manifest.ocdbt` (a T5X checkpoint_<step> '
    'directory holds one of them).'
  )


def _is_tensorstore_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value


def _read_t5x_target(file: Path) -> dict[str, Any]:
  """The flat `optimizer/target` of a T5X checkpoint file: arrays or tensorstore specs."""
  raw = file.read_bytes()
  if raw.startswith(b'model_checkpoint_path'):
    raise ValueError(f'{file} is a TensorFlow (Mesh TF) checkpoint index, not a T5X checkpoint.')
  try:
    contents = serialization.msgpack_restore(raw)
  except Exception as e:  # msgpack raises several unrelated types on foreign bytes
    raise ValueError(f'{file} is not a T5X checkpoint (not flax msgpack: {e}).') from e
  optimizer = contents.get('optimizer') if isinstance(contents, Mapping) else None
  target = optimizer.get('target') if isinstance(optimizer, Mapping) else None
  if not isinstance(target, Mapping):
    keys = sorted(contents) if isinstance(contents, Mapping) else type(contents).__name__
    raise ValueError(f'{file}: no optimizer/target params in the checkpoint (found {keys}).')
  return _flatten(target, is_leaf=_is_tensorstore_spec)


def _t5x_leaf_spec(leaf: Any, directory: Path, name: str) -> np.ndarray | dict[str, Any]:
  """An inline array as is, or the tensorstore spec that opens a partitioned one."""
  if isinstance(leaf, np.ndarray):
    return leaf
  if not _is_tensorstore_spec(leaf):
    raise ValueError(
      f'T5X parameter {name!r} is a {type(leaf).__name__}, neither an array nor a tensorstore spec.'
    )
  if leaf['driver'] != 'zarr':
    raise ValueError(f'T5X parameter {name!r}: unsupported tensorstore driver {leaf["driver"]!r}.')
  kvstore = leaf.get('kvstore')
  # tensorstore < 0.1.14 kept the path at the top level of the spec.
  relative = kvstore.get('path') if isinstance(kvstore, Mapping) else leaf.get('path')
  if not relative:
    raise ValueError(f'T5X parameter {name!r}: tensorstore spec without a path: {leaf}.')
  # T5X writes paths relative to the checkpoint directory (gcs ones under a dummy bucket); the
  # last component alone also finds arrays of a checkpoint moved after an absolute-path write.
  # Only the location is kept: the array's own metadata says its shape, dtype and chunks.
  local = directory.absolute() / Path(relative.rstrip('/')).name
  return {'driver': 'zarr', 'kvstore': {'driver': 'file', 'path': str(local)}}


# The OCDBT key of a target array's metadata: (array path 'target.<dotted name>', the dotted name,
# zarr's or zarr3's metadata file).
_OCDBT_TARGET_KEY = re.compile(r'(target\.([^/]+))/(\.zarray|zarr\.json)')


def _t5x_ocdbt_specs(directory: Path) -> dict[str, dict[str, Any]]:
  """The tensorstore spec of every `target` array of an orbax OCDBT checkpoint, by our name."""
  kvstore = {'driver': 'ocdbt', 'base': directory.absolute().as_uri()}
  try:
    # 'target.' up to 'target/' ('/' follows '.'): exactly the keys under the params.
    params = ts.KvStore.KeyRange(inclusive_min='target.', exclusive_max='target/')
    keys = ts.KvStore.open(kvstore).result().list(params).result()
  except Exception as e:  # tensorstore reports every failure as one ValueError-like status
    raise ValueError(f'{directory} is not a readable OCDBT checkpoint ({_ts_reason(e)}).') from e
  specs = {}
  for key in keys:
    match = _OCDBT_TARGET_KEY.fullmatch(key.decode())
    if match:
      array_path, dotted, metadata_file = match.groups()
      driver = 'zarr' if metadata_file == '.zarray' else 'zarr3'
      specs[dotted.replace('.', '/')] = {
        'driver': driver,
        'kvstore': {**kvstore, 'path': array_path},
      }
  if not specs:
    raise ValueError(
      f'{directory}: no `target` params in the OCDBT checkpoint (T5X keeps them under keys '
      "'target.<dotted name>/'); is it a T5X train state?"
    )
  return specs


def _read_arrays(sources: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Host numpy arrays (native byte order) from inline arrays or tensorstore specs, by name.

  Every array is opened at once (tensorstore futures), then read in turn; tensorstore reads the
  chunks of one array concurrently.

  Raises:
    FileNotFoundError: a spec's array does not exist (the message names its location).
    ValueError: tensorstore cannot read an array (damaged metadata or chunks).
  """
  opened = {
    name: ts.open(source, open=True, read=True)
    for name, source in sources.items()
    if not isinstance(source, np.ndarray)
  }
  arrays = {}
  for name, source in sources.items():
    if isinstance(source, np.ndarray):
      arrays[name] = source
      continue
    try:
      arrays[name] = opened[name].result().read().result()
    except Exception as e:  # tensorstore reports every failure as a ValueError-like status
      kvstore = source['kvstore']
      location = ' in '.join(filter(None, (kvstore.get('path'), kvstore.get('base'))))
      message = f'T5X parameter {name!r}: cannot read the array at {location} ({_ts_reason(e)}).'
      if str(e).startswith('NOT_FOUND'):
        raise FileNotFoundError(message) from e
      raise ValueError(message) from e
  return arrays


def _ts_reason(error: Exception) -> str:
  """A tensorstore error's first line without the spec it appends."""
  reason = (str(error).strip().splitlines() or [''])[0].split(' [tensorstore_spec=')[0]
  return reason if len(reason) <= 300 else reason[:300] + '...'
