"""Checkpoint I/O for T5: Hugging Face, T5X (msgpack, tensorstore/zarr, OCDBT) and orbax.

Every format maps onto the one params layout of `models/t5.py` (T5X names, nested dicts):

  format        read / write                 parameter names
  Hugging Face  load_hf_t5 / save_hf_t5      `hf_names(config)`: one table, used both ways
  T5X           load_t5x                     `checkpoints_t5x.t5x_names(config)`: the identity
  orbax         restore / save               our tree as is, the T5Config beside it as JSON

Loaders check the arrays against the config (every parameter present with the shape the config
implies, none left over, and by default none holding NaN or inf: `allow_nonfinite=True` opts
out) and raise one ValueError naming the parameter; damaged files give one ValueError naming the
file or directory; a missing path raises FileNotFoundError. HF and T5X arrays are read into
host numpy, renamed, then cast to `config.dtype`; orbax restores the arrays exactly as saved
(or, stored as bfloat16 for a float32 model, cast back to float32).

Axis legend: V vocab, D model dim, N heads, H head dim (d_kv), F d_ff, K relative-position buckets.
HF `nn.Linear` weights are [out, in] where our kernels are [in, out], and HF's relative-position
table is [K, N] where ours is [N, K]: both are stored transposed.
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
import safetensors.numpy

from specdec_jax.models import t5

Params = dict[str, Any]
PathLike = str | Path
# Our '/'-joined parameter path -> (the parameter's name in a checkpoint, stored transposed).
NameTable = dict[str, tuple[str, bool]]

# -------------------------------------------------------------------------------------------------
# Shared by every format: flat names, the shapes a config implies, checked renaming.


def _flatten(tree: Mapping, is_leaf: Callable[[Any], bool] = lambda x: False) -> dict[str, Any]:
  """{'a': {'b': x}} -> {'a/b': x}; `is_leaf` stops the descent at dicts that are values."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, Mapping) and not is_leaf(value):
      flat.update({f'{key}/{k}': v for k, v in _flatten(value, is_leaf).items()})
    else:
      flat[str(key)] = value
  return flat


def _unflatten(flat: Mapping[str, Any]) -> Params:
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
  return {name: tuple(leaf.shape) for name, leaf in _flatten(abstract).items()}


def _rename(
  source: Mapping[str, Any], names: NameTable, *, ignored: frozenset[str] = frozenset()
) -> dict[str, np.ndarray]:
  """Our flat arrays from a checkpoint's flat arrays (renamed, transposed where stored so).

  Args:
    source: checkpoint name -> array, e.g. an HF state dict.
    names: the name table, e.g. `hf_names(config)`.
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
    array = np.asarray(source[name])
    flat[ours] = array.T if transposed else array
  return flat


def _check_shapes(
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
    got = tuple(np.shape(flat[ours]))
    if got != shape:
      if transposed:  # report shapes as the checkpoint stores them
        shape, got = shape[::-1], got[::-1]
      raise ValueError(
        f'Shape mismatch for parameter {name!r}: the config implies {shape}, got {got}.'
      )
  unexpected = sorted(set(flat) - set(expected))
  if unexpected:
    raise ValueError(f'Params have parameter(s) the config does not: {unexpected[:3]}.')


def _mapped_params(
  source: Mapping[str, Any],
  names: NameTable,
  config: t5.T5Config,
  ignored: frozenset[str] = frozenset(),
) -> Params:
  """Renames a checkpoint's flat arrays with `names`, checks them against `config`, casts them."""
  flat = _rename(source, names, ignored=ignored)
  _check_shapes(flat, config, names)
  return _unflatten({ours: jnp.asarray(array, dtype=config.dtype) for ours, array in flat.items()})


def _check_finite(params: Params, where: Path, names: NameTable | None = None) -> None:
  """Raises ValueError naming the first parameter that holds a NaN or an infinity.

  Runs on the arrays as loaded, after the cast to the config's dtype, so a float32 value beyond
  the range of a float16 or bfloat16 config counts too. A NaN weight would otherwise surface, if
  at all, as NaN logits deep inside decoding.

  Args:
    params: the loaded params tree.
    where: the checkpoint, for the message.
    names: a checkpoint's name table, so the message also gives the parameter's name there.
  """
  for ours, array in _flatten(params).items():
    finite = jnp.isfinite(array)
    if bool(jnp.all(finite)):
      continue
    name, _ = (names or {}).get(ours, (ours, False))
    stored_as = '' if name == ours else f' (stored as {name!r})'
    raise ValueError(
      f'Parameter {ours!r}{stored_as} of {where} has {int(finite.size - jnp.sum(finite))} '
      f'non-finite value(s) (NaN or inf) as {array.dtype}: the checkpoint is corrupt, or was '
      'saved after training diverged. Pass allow_nonfinite=True to load it anyway.'
    )


def _read_json(file: Path) -> Any:
  """The parsed contents of a JSON file; ValueError naming the file if it is not JSON."""
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f'{file} is not valid JSON ({e}).') from e


# -------------------------------------------------------------------------------------------------
# Hugging Face transformers (T5ForConditionalGeneration): one name table, used in both directions.

# Per transformer block: (our sublayer, its pre-norm, HF module); HF numbers them block.{i}.layer.{j}.
_BLOCKS = {
  'encoder': (
    ('attention', 'pre_attention_layer_norm', 'SelfAttention'),
    ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'),
  ),
  'decoder': (
    ('self_attention', 'pre_self_attention_layer_norm', 'SelfAttention'),
    ('encoder_decoder_attention', 'pre_cross_attention_layer_norm', 'EncDecAttention'),
    ('mlp', 'pre_mlp_layer_norm', 'DenseReluDense'),
  ),
}
_HF_ATTENTION = {'query': 'q', 'key': 'k', 'value': 'v', 'out': 'o'}
_FINAL_NORMS = {'encoder': 'encoder_norm', 'decoder': 'decoder_norm'}
# Names HF checkpoints may carry that we never read: copies of `shared.weight`, and a
# cross-attention bias table old HF versions stored although no layer uses it.
_HF_IGNORED = frozenset(
  {
    'encoder.embed_tokens.weight',
    'decoder.embed_tokens.weight',
    'decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight',
  }
)


def hf_names(config: t5.T5Config) -> NameTable:
  """The HF state-dict name of each of our parameters, and whether HF stores it transposed."""
  mlp = ('wi_0', 'wi_1', 'wo') if config.feed_forward == 'gated-gelu' else ('wi', 'wo')
  names = {'token_embedder/embedding': ('shared.weight', False)}
  num_layers = {'encoder': config.num_encoder_layers, 'decoder': config.num_decoder_layers}
  for stack, blocks in _BLOCKS.items():
    # One relative-position table per stack, shared by its layers; HF keeps it in block 0.
    names[f'{stack}/relpos_bias/rel_embedding'] = (
      f'{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight',
      True,
    )
    for i in range(num_layers[stack]):
      for j, (sublayer, norm, module) in enumerate(blocks):
        ours, theirs = f'{stack}/layers_{i}', f'{stack}.block.{i}.layer.{j}'
        names[f'{ours}/{norm}/scale'] = (f'{theirs}.layer_norm.weight', False)
        kernels = {k: k for k in mlp} if sublayer == 'mlp' else _HF_ATTENTION
        for our_kernel, their_kernel in kernels.items():
          names[f'{ours}/{sublayer}/{our_kernel}/kernel'] = (
            f'{theirs}.{module}.{their_kernel}.weight',
            True,
          )
    names[f'{stack}/{_FINAL_NORMS[stack]}/scale'] = (f'{stack}.final_layer_norm.weight', False)
  if not config.tie_word_embeddings:
    names['decoder/logits_dense/kernel'] = ('lm_head.weight', True)
  return names


def params_to_hf_state_dict(params: Params, config: t5.T5Config) -> dict[str, np.ndarray]:
  """Our params as an HF T5ForConditionalGeneration state dict (numpy, C-contiguous).

  A tied model has no `lm_head.weight`: HF ties it to `shared.weight` when loading.
  """
  names = hf_names(config)
  flat = _flatten(params)
  _check_shapes(flat, config, names)
  state_dict = {}
  for ours, (name, transposed) in names.items():
    array = np.asarray(flat[ours])
    state_dict[name] = np.ascontiguousarray(array.T if transposed else array)
  return state_dict


def hf_state_dict_to_params(state_dict: Mapping[str, Any], config: t5.T5Config) -> Params:
  """Our params (jax arrays of `config.dtype`) from an HF T5ForConditionalGeneration state dict.

  Raises:
    ValueError: a parameter is missing, has a shape `config` does not imply, or is left over; or
      the config ties the output layer to the embedding but `lm_head.weight` differs from it.
  """
  state_dict = dict(state_dict)
  lm_head = state_dict.pop('lm_head.weight', None)
  shared = state_dict.get('shared.weight')
  if config.tie_word_embeddings:
    if lm_head is not None and not np.array_equal(np.asarray(lm_head), np.asarray(shared)):
      raise ValueError(
        "Parameter 'lm_head.weight' differs from 'shared.weight', but the config ties the output "
        'layer to the embedding (tie_word_embeddings / scale_decoder_outputs true); an untied '
        'T5 v1.1 checkpoint needs tie_word_embeddings false.'
      )
  elif lm_head is not None:
    state_dict['lm_head.weight'] = lm_head
  elif shared is not None:
    # HF >= 5 saves one copy when lm_head *is* the embedding tensor (as in its randomly
    # initialized T5 v1.1): an unscaled output layer equal to the embedding.
    state_dict['lm_head.weight'] = shared
  return _mapped_params(state_dict, hf_names(config), config, ignored=_HF_IGNORED)


# HF config.json key -> T5Config field, for the fields that carry over unchanged.
_HF_CONFIG_FIELDS = {
  'vocab_size': 'vocab_size',
  'd_model': 'd_model',
  'd_kv': 'd_kv',
  'd_ff': 'd_ff',
  'num_heads': 'num_heads',
  'num_layers': 'num_encoder_layers',
  'num_decoder_layers': 'num_decoder_layers',
  'relative_attention_num_buckets': 'relative_attention_num_buckets',
  'relative_attention_max_distance': 'relative_attention_max_distance',
  'layer_norm_epsilon': 'layer_norm_epsilon',
  'pad_token_id': 'pad_token_id',
  'eos_token_id': 'eos_token_id',
  'decoder_start_token_id': 'decoder_start_token_id',
}
# HF spells the tanh-approximate gated GELU of T5 v1.1 several ways ('gated-gelu' is special-cased
# to "gelu_new" in HF's T5Config); the exact-erf or SiLU variants are not this model.
_HF_FEED_FORWARD = {
  'relu': 'relu',
  'gated-gelu': 'gated-gelu',
  'gated-gelu_new': 'gated-gelu',
  'gated-gelu_pytorch_tanh': 'gated-gelu',
}


def config_from_hf(hf_config: Mapping[str, Any]) -> t5.T5Config:
  """A T5Config from the fields of an HF T5 config.json (HF's defaults for absent fields).

  Raises:
    ValueError: the config is not a T5 (or mT5) encoder-decoder this model can run.
  """
  model_type = hf_config.get('model_type', 't5')
  if model_type not in ('t5', 'mt5'):
    raise ValueError(f"Unsupported model_type {model_type!r} in config.json (need 't5' or 'mt5').")
  if not hf_config.get('is_encoder_decoder', True):
    raise ValueError('Unsupported config.json: is_encoder_decoder is false.')
  feed_forward = hf_config.get('feed_forward_proj', 'relu')
  if feed_forward not in _HF_FEED_FORWARD:
    raise ValueError(
      f'Unsupported feed_forward_proj {feed_forward!r} in config.json '
      f'(supported: {", ".join(_HF_FEED_FORWARD)}).'
    )
  fields = {
    ours: hf_config[hf] for hf, ours in _HF_CONFIG_FIELDS.items() if hf_config.get(hf) is not None
  }
  fields.setdefault('num_decoder_layers', fields.get('num_encoder_layers', 6))
  fields.setdefault('decoder_start_token_id', fields.get('pad_token_id', 0))
  if isinstance(fields.get('eos_token_id'), list):
    if len(fields['eos_token_id']) != 1:
      raise ValueError(f'Unsupported eos_token_id {fields["eos_token_id"]} (need a single id).')
    fields['eos_token_id'] = fields['eos_token_id'][0]
  # HF >= 5 always ties the tensors and records T5 v1.0's output scaling D**-0.5 in
  # `scale_decoder_outputs`; older configs say it with `tie_word_embeddings` (default true).
  tied = hf_config.get('scale_decoder_outputs', hf_config.get('tie_word_embeddings', True))
  return t5.T5Config(
    **fields, feed_forward=_HF_FEED_FORWARD[feed_forward], tie_word_embeddings=bool(tied)
  )


def config_to_hf(config: t5.T5Config) -> dict[str, Any]:
  """The HF config.json fields for `config` (read the same by transformers 4.x and 5.x)."""
  return {
    'architectures': ['T5ForConditionalGeneration'],
    'model_type': 't5',
    'is_encoder_decoder': True,
    **{hf: getattr(config, ours) for hf, ours in _HF_CONFIG_FIELDS.items()},
    'feed_forward_proj': config.feed_forward,
    'tie_word_embeddings': config.tie_word_embeddings,
    'scale_decoder_outputs': config.tie_word_embeddings,
  }


_HF_WEIGHT_FILES = (
  'model.safetensors',
  'model.safetensors.index.json',
  'pytorch_model.bin',
  'pytorch_model.bin.index.json',
)


def _hf_weight_files(directory: Path) -> list[Path]:
  """The weight files of an HF checkpoint directory, single-file or sharded (`*.index.json`)."""
  for name in _HF_WEIGHT_FILES:
    file = directory / name
    if not file.is_file():
      continue
    if not name.endswith('.index.json'):
      return [file]
    index = _read_json(file)
    weight_map = index.get('weight_map') if isinstance(index, Mapping) else None
    if (
      not isinstance(weight_map, Mapping)
      or not weight_map
      or not all(isinstance(s, str) for s in weight_map.values())
    ):
      raise ValueError(
        f'{file} has no "weight_map" of parameter names to weight files, which a sharded '
        'checkpoint index holds; is the index truncated, or not written by save_pretrained?'
      )
    shards = [directory / s for s in sorted(set(weight_map.values()))]
    for shard in shards:
      if not shard.is_file():
        raise FileNotFoundError(f'{file} lists the weight file {shard.name}, which is missing.')
    return shards
  raise FileNotFoundError(
    f'No weights in {directory}: expected one of {", ".join(_HF_WEIGHT_FILES)}.'
  )


def _read_weights(file: Path) -> dict[str, np.ndarray]:
  """One HF weight file (safetensors, or a pickled PyTorch state dict) as numpy arrays."""
  if file.suffix == '.safetensors':
    # BF16 tensors too: importing ml_dtypes taught numpy the dtype name 'bfloat16'.
    return safetensors.numpy.load_file(file)
  import torch  # only pickled PyTorch checkpoints need torch

  state_dict = torch.load(file, map_location='cpu', weights_only=True)
  # float32 holds every bfloat16 exactly, and torch's `.numpy()` has no bfloat16.
  return {
    name: (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()
    for name, t in state_dict.items()
  }


def load_hf_t5(
  path: PathLike, *, config: t5.T5Config | None = None, allow_nonfinite: bool = False
) -> t5.T5Model:
  """Loads an HF T5ForConditionalGeneration checkpoint directory (save_pretrained layout).

  Args:
    path: directory with config.json and model.safetensors (or pytorch_model.bin, or sharded
      *.index.json variants of either).
    config: overrides config.json (which then need not exist).
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.

  Returns:
    The model; params are jax arrays of `config.dtype`.
  """
  directory = Path(path)
  if not directory.is_dir():
    raise FileNotFoundError(f'No Hugging Face checkpoint directory at {directory}.')
  if config is None:
    config_file = directory / 'config.json'
    if not config_file.is_file():
      raise FileNotFoundError(f'{directory} has no config.json (or pass config=).')
    config = config_from_hf(_read_json(config_file))
  state_dict = {}
  for file in _hf_weight_files(directory):
    state_dict.update(_read_weights(file))
  params = hf_state_dict_to_params(state_dict, config)
  if not allow_nonfinite:
    _check_finite(params, directory, hf_names(config))
  return t5.T5Model(config=config, params=params)


def save_hf_t5(model: t5.T5Model, path: PathLike) -> None:
  """Writes config.json and model.safetensors that HF's `from_pretrained` loads as this model.

  Weights are written as float32 (exact for bfloat16 params).
  """
  directory = Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  state_dict = params_to_hf_state_dict(model.params, model.config)
  safetensors.numpy.save_file(
    {name: array.astype(np.float32) for name, array in state_dict.items()},
    directory / 'model.safetensors',
    metadata={'format': 'pt'},  # transformers refuses safetensors files without it
  )
  (directory / 'config.json').write_text(json.dumps(config_to_hf(model.config), indent=2) + '\n')


# -------------------------------------------------------------------------------------------------
# T5X: `checkpoints_t5x` (imported on first use: only T5X checkpoints need tensorstore).


def load_t5x(
  path: PathLike, *, config: t5.T5Config | None = None, allow_nonfinite: bool = False
) -> t5.T5Model:
  """Loads a T5X checkpoint (msgpack, tensorstore/zarr, or orbax OCDBT); see
  `checkpoints_t5x.load_t5x`."""
  from specdec_jax import checkpoints_t5x

  return checkpoints_t5x.load_t5x(path, config=config, allow_nonfinite=allow_nonfinite)


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
  _check_shapes(_flatten(model.params), model.config)
  params = model.params
  if storage_dtype:
    params = jax.tree.map(lambda x: jnp.asarray(x, storage_dtype), params)
    _check_finite(params, directory)  # a float32 weight beyond bfloat16's range would be inf
  directory.mkdir(parents=True)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory / 'params', params)
  # Written last, so a directory with a config.json holds a complete checkpoint.
  (directory / 'config.json').write_text(
    json.dumps(dataclasses.asdict(model.config), indent=2) + '\n'
  )


def restore(path: PathLike, *, allow_nonfinite: bool = False) -> t5.T5Model:
  """Reads a model written by `save`; arrays come back with the dtypes they were saved with,
  except that a float32 model's bfloat16-stored params (`save(..., storage_dtype=)`) come back
  as float32.

  Args:
    path: the directory `save` wrote.
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.

  Raises:
    FileNotFoundError: `path` is not a directory written by `save`.
    ValueError: orbax cannot read the params (corrupt or truncated files), the params do not fit
      the config, or (unless allowed) a weight is NaN or inf.
  """
  import orbax.checkpoint as ocp

  directory = Path(path).absolute()
  for needed in (directory / 'config.json', directory / 'params'):
    if not needed.exists():
      raise FileNotFoundError(
        f'No checkpoint written by checkpoints.save at {directory}: {needed.name} is missing.'
      )
  config = _config_from_json(directory / 'config.json')
  try:
    with ocp.StandardCheckpointer() as checkpointer:
      params = checkpointer.restore(directory / 'params')
  except Exception as e:  # orbax and tensorstore raise many types on damaged files
    reason = (str(e).strip().splitlines() or [''])[0]
    reason = reason if len(reason) <= 300 else reason[:300] + '...'
    raise ValueError(
      f'Cannot restore the orbax checkpoint at {directory}; its params/ files are damaged or '
      f'incomplete ({type(e).__name__}: {reason}).'
    ) from e
  _check_shapes(_flatten(params), config)
  if config.dtype == 'float32':  # params of a float32 model are float32 (or stored as bfloat16)
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  if not allow_nonfinite:
    _check_finite(params, directory)
  return t5.T5Model(config=config, params=params)


def _config_from_json(file: Path) -> t5.T5Config:
  fields = _read_json(file)
  if not isinstance(fields, Mapping):
    raise ValueError(f'{file}: expected a JSON object of T5Config fields.')
  unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(t5.T5Config)})
  if unknown:
    raise ValueError(f'{file}: unknown T5Config field(s) {unknown}.')
  return t5.T5Config(**fields)
