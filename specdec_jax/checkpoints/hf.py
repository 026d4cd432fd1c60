"""Hugging Face T5 checkpoints (T5ForConditionalGeneration, `save_pretrained` layout): one name
table (`hf_names`) used in both directions. `checkpoints.load_hf_t5` / `save_hf_t5` are these.

safetensors files are read a slice at a time (`safe_open(...).get_slice(name)[index]`), so a
loader given a mesh reads only the slices its devices hold; a pickled `pytorch_model.bin` is read
whole (torch has no partial reads of it).

Axis legend: V vocab, D model dim, N heads, H head dim (d_kv), F d_ff, K relative-position buckets.
HF `nn.Linear` weights are [out, in] where our kernels are [in, out], and HF's relative-position
table is [K, N] where ours is [N, K]: both are stored transposed.
"""

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy
from jax.sharding import Mesh

from specdec_jax import sharding
from specdec_jax.checkpoints import common
from specdec_jax.models import t5, t5_fused

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


def hf_names(config: t5.T5Config) -> common.NameTable:
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


def params_to_hf_state_dict(params: common.Params, config: t5.T5Config) -> dict[str, np.ndarray]:
  """Our params as an HF T5ForConditionalGeneration state dict (numpy, C-contiguous).

  A tied model has no `lm_head.weight`: HF ties it to `shared.weight` when loading.
  """
  names = hf_names(config)
  flat = common.flatten(params)
  common.check_shapes(flat, config, names)
  state_dict = {}
  for ours, (name, transposed) in names.items():
    array = np.asarray(flat[ours])
    state_dict[name] = np.ascontiguousarray(array.T if transposed else array)
  return state_dict


def hf_state_dict_to_params(
  state_dict: Mapping[str, Any],
  config: t5.T5Config,
  *,
  param_dtype: str | None = None,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> common.Params:
  """Our params (jax arrays) from an HF T5ForConditionalGeneration state dict.

  Args:
    state_dict: HF name -> array (numpy, torch, or a `common.LazyArray`).
    config: the model config.
    param_dtype: the dtype of the params (None: `config.dtype`).
    mesh: shard the params over this mesh, reading only this process's slices of lazy arrays.
    rules: the logical-axis rules for `mesh`.

  Raises:
    ValueError: a parameter is missing, has a shape `config` does not imply, or is left over; or
      the config ties the output layer to the embedding but `lm_head.weight` differs from it.
  """
  state_dict = dict(state_dict)
  lm_head = state_dict.pop('lm_head.weight', None)
  shared = state_dict.get('shared.weight')
  if config.tie_word_embeddings:
    # Reads both whole (a tied model is T5 v1.0: its embedding is at most 131 MB in float32).
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
  names = hf_names(config)
  flat = common.rename(state_dict, names, ignored=_HF_IGNORED)
  return common.place_params(flat, config, names=names, dtype=param_dtype, mesh=mesh, rules=rules)


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
    index = common.read_json(file)
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


def _open_weights(file: Path) -> dict[str, common.LazyArray | np.ndarray]:
  """One HF weight file's tensors: lazy (read by slice) for safetensors, else read whole.

  A pickled PyTorch state dict is read whole into numpy (float32 for bfloat16 tensors: float32
  holds every bfloat16 exactly, and torch's `.numpy()` has no bfloat16).
  """
  if file.suffix == '.safetensors':
    try:
      # BF16 too: importing ml_dtypes taught numpy the dtype name 'bfloat16'.
      handle = safetensors.safe_open(file, framework='numpy')
    except Exception as e:  # SafetensorError and OSError on damaged headers
      raise ValueError(f'{file} is not a readable safetensors file ({e}).') from e
    return {name: _safetensors_array(handle, name) for name in handle.keys()}
  import torch  # only pickled PyTorch checkpoints need torch

  state_dict = torch.load(file, map_location='cpu', weights_only=True)
  return {
    name: (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()
    for name, t in state_dict.items()
  }


def _safetensors_array(handle: Any, name: str) -> common.LazyArray:
  shape = tuple(handle.get_slice(name).get_shape())
  return common.LazyArray(shape, lambda index: read_safetensors_slice(handle, name, index))


def read_safetensors_slice(handle: Any, name: str, index: common.Index) -> np.ndarray:
  """`name`[index] of an open safetensors file: reads only that slice of the file."""
  return handle.get_slice(name)[index]


def load_hf_t5(
  path: common.PathLike,
  *,
  config: t5.T5Config | None = None,
  allow_nonfinite: bool = False,
  mesh: Mesh | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  dtype: str | None = None,
  param_dtype: str | None = None,
) -> t5.T5Model:
  """Loads an HF T5ForConditionalGeneration checkpoint directory (save_pretrained layout).

  Args:
    path: a local directory with config.json and model.safetensors (or pytorch_model.bin, or
      sharded *.index.json variants of either).
    config: overrides config.json (which then need not exist).
    allow_nonfinite: load weights holding NaN or inf instead of raising ValueError.
    mesh: build every param sharded over this mesh (`sharding.param_shardings` with `rules`),
      each process reading only the slices its devices hold; None: whole, on the default device.
    rules: the logical-axis rules for `mesh`.
    dtype: the compute dtype (`T5Config.dtype`), replacing the config's; None keeps it.
    param_dtype: the dtype the params are stored in on device; None: the compute dtype.

  Returns:
    The model; params are jax arrays of `param_dtype`.
  """
  common.check_dtype('dtype', dtype)
  common.check_dtype('param_dtype', param_dtype)
  if common.is_url(path):
    raise ValueError(
      f'load_hf_t5 reads local directories, got the URL {path!r}: copy the checkpoint to local '
      'disk first (e.g. `gcloud storage cp -r`).'
    )
  directory = Path(path)
  if not directory.is_dir():
    raise FileNotFoundError(f'No Hugging Face checkpoint directory at {directory}.')
  if config is None:
    config_file = directory / 'config.json'
    if not config_file.is_file():
      raise FileNotFoundError(f'{directory} has no config.json (or pass config=).')
    config = config_from_hf(common.read_json(config_file))
  if dtype is not None:
    config = dataclasses.replace(config, dtype=dtype)
  state_dict = {}
  for file in _hf_weight_files(directory):
    state_dict.update(_open_weights(file))
  params = hf_state_dict_to_params(
    state_dict, config, param_dtype=param_dtype, mesh=mesh, rules=rules
  )
  if not allow_nonfinite:
    common.check_finite(params, directory, hf_names(config))
  return t5.T5Model(config=config, params=params)


def save_hf_t5(model: t5.T5Model, path: common.PathLike) -> None:
  """Writes config.json and model.safetensors that HF's `from_pretrained` loads as this model.

  Weights are written as float32 (exact for bfloat16 params); a fused decoder layout as T5X's.
  """
  model = t5_fused.unfuse_projections(model)
  directory = Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  state_dict = params_to_hf_state_dict(model.params, model.config)
  safetensors.numpy.save_file(
    {name: array.astype(np.float32) for name, array in state_dict.items()},
    directory / 'model.safetensors',
    metadata={'format': 'pt'},  # transformers refuses safetensors files without it
  )
  (directory / 'config.json').write_text(json.dumps(config_to_hf(model.config), indent=2) + '\n')
