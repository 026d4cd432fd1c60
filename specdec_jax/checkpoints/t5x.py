"""T5X checkpoints: msgpack (inline or tensorstore/zarr arrays) and orbax OCDBT, read into our
params layout (ours are T5X's names). `checkpoints.load_t5x` is `load_t5x` here.

Paths are local paths or tensorstore kvstore URLs (`gs://bucket/.../checkpoint_1000000`,
`file:///...`), passed to tensorstore as they are. Partitioned arrays are read a slice at a time
(`ts_array[index].read()`), so a loader given a mesh reads only the slices its devices hold;
arrays inline in a msgpack file are in memory once the file is parsed.
"""

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts
from flax import serialization
from jax.sharding import Mesh

from specdec_jax import sharding
from specdec_jax.checkpoints import common
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


def t5x_names(config: t5.T5Config) -> common.NameTable:
  """The T5X name of each of our parameters: the same name, never transposed."""
  return {name: (name, False) for name in common.param_shapes(config)}


def load_t5x(
  path: common.PathLike,
  *,
  config: t5.T5Config | None = None,
  allow_nonfinite: bool = False,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  dtype: str | None = None,
  param_dtype: str | None = None,
) -> t5.T5Model:
  """Loads the params of a T5X checkpoint (msgpack, tensorstore/zarr, or orbax OCDBT).

  Args:
    path: a checkpoint directory (`checkpoint_<step>/`, holding a `checkpoint` file or an OCDBT
      `state/` directory), the msgpack checkpoint file itself, or the OCDBT directory itself; a
      local path or a tensorstore kvstore URL (`gs://...`, `file://...`).
    config: the model config; by default inferred from the parameter shapes (see
      `infer_t5x_config`: T5X checkpoints carry no config).
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.
    mesh: build every param sharded over this mesh (`sharding.param_shardings` with `rules`),
      each process reading only the slices its devices hold; None: whole, on the default device.
    rules: the logical-axis rules for `mesh`.
    dtype: the compute dtype (`T5Config.dtype`), replacing the config's (or the inferred
      float32); None keeps it.
    param_dtype: the dtype the params are stored in on device; None: the compute dtype.

  Returns:
    The model; params are jax arrays of `param_dtype`.
  """
  common.check_dtype('dtype', dtype)
  common.check_dtype('param_dtype', param_dtype)
  checkpoint = _t5x_checkpoint(path)
  arrays = _open_arrays(checkpoint.specs())
  if config is None:
    config = infer_t5x_config({name: array.shape for name, array in arrays.items()})
  if dtype is not None:
    config = dataclasses.replace(config, dtype=dtype)
  names = t5x_names(config)
  flat = common.rename(arrays, names)
  params = common.place_params(flat, config, names=names, dtype=param_dtype, mesh=mesh, rules=rules)
  if not allow_nonfinite:
    common.check_finite(params, checkpoint.where)
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


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
  """Where a T5X checkpoint's arrays are.

  Attributes:
    where: the msgpack file or the OCDBT directory, as messages name it (a Path, or a URL).
    kvstore: the tensorstore kvstore of the directory holding them: a spec, or a URL ending '/'.
    contents: the msgpack file's bytes; None for OCDBT.
  """

  where: Path | str
  kvstore: dict[str, Any] | str
  contents: bytes | None

  def specs(self) -> dict[str, np.ndarray | dict[str, Any]]:
    """Every `target` array, by our name: inline numpy, or the tensorstore spec that opens it."""
    if self.contents is None:
      return _t5x_ocdbt_specs(self.kvstore, self.where)
    return {
      name: _t5x_leaf_spec(leaf, self.kvstore, name)
      for name, leaf in _read_t5x_target(self.contents, self.where).items()
    }


def _t5x_checkpoint(path: common.PathLike) -> _Checkpoint:
  """The msgpack `checkpoint` file, or the OCDBT directory, of a T5X checkpoint at `path`."""
  if common.is_url(path):
    return _t5x_checkpoint_at_url(str(path))
  path = Path(path)
  if path.is_file():
    return _Checkpoint(path, _file_kvstore(path.parent), path.read_bytes())
  if not path.is_dir():
    raise FileNotFoundError(f'No T5X checkpoint at {path}.')
  if (path / 'checkpoint').is_file():
    return _Checkpoint(path / 'checkpoint', _file_kvstore(path), (path / 'checkpoint').read_bytes())
  for directory in (path, path / 'state'):
    if (directory / 'manifest.ocdbt').is_file():
      return _Checkpoint(directory, directory.absolute().as_uri(), None)
  raise FileNotFoundError(
    f'{path} has no `checkpoint` file and no `state/manifest.ocdbt` (a T5X checkpoint_<step> '
    'directory holds one of them).'
  )


def _file_kvstore(directory: Path) -> dict[str, Any]:
  return {'driver': 'file', 'path': str(directory.absolute()) + '/'}


def _t5x_checkpoint_at_url(url: str) -> _Checkpoint:
  """`_t5x_checkpoint` for a tensorstore kvstore URL: the same layouts, read through tensorstore."""
  url = url.rstrip('/')

  def read(directory: str, key: str) -> bytes | None:
    found = ts.KvStore.open(directory).result().read(key).result()
    return found.value if found.state == 'value' else None

  try:
    if (contents := read(url + '/', 'checkpoint')) is not None:
      return _Checkpoint(url + '/checkpoint', url + '/', contents)
    for directory in (url, url + '/state'):
      if read(directory + '/', 'manifest.ocdbt') is not None:
        return _Checkpoint(directory, directory + '/', None)
    parent, _, name = url.rpartition('/')
    if '/' in url.split('://', 1)[1] and (contents := read(parent + '/', name)) is not None:
      return _Checkpoint(url, parent + '/', contents)  # the msgpack file itself
  except Exception as e:  # tensorstore reports every failure as one ValueError-like status
    raise ValueError(f'Cannot read the T5X checkpoint at {url} ({_ts_reason(e)}).') from e
  raise FileNotFoundError(
    f'No T5X checkpoint at {url}: no `checkpoint` file, `manifest.ocdbt` or '
    '`state/manifest.ocdbt` under it.'
  )


def _is_tensorstore_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value


def _read_t5x_target(raw: bytes, file: Path | str) -> dict[str, Any]:
  """The flat `optimizer/target` of a T5X checkpoint file: arrays or tensorstore specs."""
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
  return common.flatten(target, is_leaf=_is_tensorstore_spec)


def _t5x_leaf_spec(
  leaf: Any, kvstore: dict[str, Any] | str, name: str
) -> np.ndarray | dict[str, Any]:
  """An inline array as is, or the tensorstore spec that opens a partitioned one.

  Args:
    leaf: the msgpack file's value for the parameter.
    kvstore: the checkpoint directory's kvstore (a spec whose path ends '/', or a URL ending '/').
    name: the parameter, for messages.
  """
  if isinstance(leaf, np.ndarray):
    return leaf
  if not _is_tensorstore_spec(leaf):
    raise ValueError(
      f'T5X parameter {name!r} is a {type(leaf).__name__}, neither an array nor a tensorstore spec.'
    )
  if leaf['driver'] != 'zarr':
    raise ValueError(f'T5X parameter {name!r}: unsupported tensorstore driver {leaf["driver"]!r}.')
  spec_kvstore = leaf.get('kvstore')
  # tensorstore < 0.1.14 kept the path at the top level of the spec.
  relative = spec_kvstore.get('path') if isinstance(spec_kvstore, Mapping) else leaf.get('path')
  if not relative:
    raise ValueError(f'T5X parameter {name!r}: tensorstore spec without a path: {leaf}.')
  # T5X writes paths relative to the checkpoint directory (gcs ones under a dummy bucket); the
  # last component alone also finds arrays of a checkpoint moved after an absolute-path write.
  # Only the location is kept: the array's own metadata says its shape, dtype and chunks.
  array = relative.rstrip('/').rsplit('/', 1)[-1]
  if isinstance(kvstore, str):
    return {'driver': 'zarr', 'kvstore': kvstore + array + '/'}
  return {'driver': 'zarr', 'kvstore': {**kvstore, 'path': kvstore['path'] + array}}


# The OCDBT key of a target array's metadata: (array path 'target.<dotted name>', the dotted name,
# zarr's or zarr3's metadata file).
_OCDBT_TARGET_KEY = re.compile(r'(target\.([^/]+))/(\.zarray|zarr\.json)')


def _t5x_ocdbt_specs(base: str, where: Path | str) -> dict[str, dict[str, Any]]:
  """The tensorstore spec of every `target` array of the orbax OCDBT checkpoint at `base`."""
  kvstore = {'driver': 'ocdbt', 'base': base}
  try:
    # 'target.' up to 'target/' ('/' follows '.'): exactly the keys under the params.
    params = ts.KvStore.KeyRange(inclusive_min='target.', exclusive_max='target/')
    keys = ts.KvStore.open(kvstore).result().list(params).result()
  except Exception as e:  # tensorstore reports every failure as one ValueError-like status
    raise ValueError(f'{where} is not a readable OCDBT checkpoint ({_ts_reason(e)}).') from e
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
      f'{where}: no `target` params in the OCDBT checkpoint (T5X keeps them under keys '
      "'target.<dotted name>/'); is it a T5X train state?"
    )
  return specs


def _open_arrays(sources: Mapping[str, Any]) -> dict[str, common.LazyArray]:
  """Lazy arrays (read by slice) from inline arrays or tensorstore specs, by name.

  Every array is opened at once (tensorstore futures); opening reads only the metadata.

  Raises:
    FileNotFoundError: a spec's array does not exist (the message names its location).
    ValueError: tensorstore cannot open an array (damaged metadata).
  """
  opened = {
    name: ts.open(source, open=True, read=True)
    for name, source in sources.items()
    if not isinstance(source, np.ndarray)
  }
  arrays = {}
  for name, source in sources.items():
    if isinstance(source, np.ndarray):
      arrays[name] = common.LazyArray.of(source)
      continue
    try:
      store = opened[name].result()
    except Exception as e:  # tensorstore reports every failure as a ValueError-like status
      raise _read_error(name, source, e) from e
    arrays[name] = common.LazyArray(
      tuple(store.shape),
      lambda index, name=name, store=store, source=source: _read(name, store, source, index),
    )
  return arrays


def _read(name: str, store: ts.TensorStore, source: dict[str, Any], index: common.Index):
  try:
    return read_tensorstore_slice(store, index)
  except Exception as e:  # damaged chunks surface only when read
    raise _read_error(name, source, e) from e


def read_tensorstore_slice(store: ts.TensorStore, index: common.Index) -> np.ndarray:
  """store[index] as host numpy: tensorstore reads only the chunks that the slice touches."""
  return store[index].read().result()


def _read_error(name: str, source: dict[str, Any], error: Exception) -> Exception:
  kvstore = source['kvstore']
  if isinstance(kvstore, Mapping):
    location = ' in '.join(filter(None, (kvstore.get('path'), kvstore.get('base'))))
  else:
    location = kvstore
  message = f'T5X parameter {name!r}: cannot read the array at {location} ({_ts_reason(error)}).'
  if str(error).startswith('NOT_FOUND'):
    return FileNotFoundError(message)
  return ValueError(message)


def _ts_reason(error: Exception) -> str:
  """A tensorstore error's first line without the spec it appends."""
  reason = (str(error).strip().splitlines() or [''])[0].split(' [tensorstore_spec=')[0]
  return reason if len(reason) <= 300 else reason[:300] + '...'
