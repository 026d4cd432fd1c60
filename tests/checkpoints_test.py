"""Tests of checkpoints.py: parity with HF transformers' PyTorch T5, T5X (msgpack,
tensorstore/zarr and orbax OCDBT), orbax round trips, and the errors a wrong checkpoint gives."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import tensorstore as ts
import torch
import transformers

from specdec_jax import checkpoints
from specdec_jax.models import t5

# Written by T5X itself and shipped in the repo (origin and license: tests/testdata/README.md).
T5X_TINY = Path(__file__).resolve().parent / 'testdata' / 't5x_tiny' / 'checkpoint_0'
TOL = 1e-4  # float32, ours (XLA) vs HF (PyTorch)

_encode = jax.jit(t5.encode, static_argnames='config')
_forward = jax.jit(t5.forward, static_argnames='config')
_init_cache = jax.jit(t5.init_cache, static_argnames=('config', 'max_decode_len'))
_decode = jax.jit(t5.decode, static_argnames='config')


def _flat(params) -> dict:
  return flax.traverse_util.flatten_dict(params, sep='/')


def _assert_params_equal(got, want):
  """Same names, dtypes and bits."""
  got, want = _flat(got), _flat(want)
  assert sorted(got) == sorted(want)
  for name in want:
    assert np.asarray(got[name]).dtype == np.asarray(want[name]).dtype, name
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def _random_model(name: str, seed: int = 0, dtype: str = 'float32') -> t5.T5Model:
  config = dataclasses.replace(t5.CONFIGS[name], dtype=dtype)
  params = t5.init_params(jax.random.key(seed), config)
  return t5.T5Model(config=config, params=jax.tree.map(lambda x: x.astype(dtype), params))


def _source(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """int64[2, 11] ids and mask; row 1 is padded after 7 tokens."""
  ids = np.random.default_rng(seed).integers(2, vocab, size=(2, 11))
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  return ids * mask, mask


# -------------------------------------------------------------------------------------------------
# Parity with HF transformers (PyTorch): random HF models, saved with save_pretrained, loaded here.

# name -> (HF T5Config fields, how HF stores the output layer).
HF_CASES = {
  # T5 v1.0: ReLU, output layer tied to the embedding (and scaled by D**-0.5). N * H = 32 != D,
  # more decoder than encoder layers, few buckets: 20 decoded positions reach the log buckets.
  'v1.0': (
    dict(
      vocab_size=96,
      d_model=16,
      d_kv=8,
      num_heads=4,
      d_ff=32,
      num_layers=2,
      num_decoder_layers=3,
      relative_attention_num_buckets=8,
      relative_attention_max_distance=12,
      feed_forward_proj='relu',
    ),
    'tied',
  ),
  # T5 v1.1: gated GELU and a separate lm_head. N * H = 12 != D.
  'v1.1': (
    dict(
      vocab_size=80,
      d_model=24,
      d_kv=4,
      num_heads=3,
      d_ff=40,
      num_layers=2,
      feed_forward_proj='gated-gelu',
    ),
    'untied',
  ),
  # HF 5's own random v1.1: lm_head is the embedding tensor (saved once) without the v1.0
  # scaling, i.e. an untied output layer that happens to equal the embedding. N * H == D.
  'v1.1-shared-lm-head': (
    dict(
      vocab_size=64,
      d_model=16,
      d_kv=4,
      num_heads=4,
      d_ff=24,
      num_layers=1,
      num_decoder_layers=2,
      feed_forward_proj='gated-gelu',
    ),
    'shared',
  ),
}


def _hf_model(case: str, seed: int = 0) -> transformers.T5ForConditionalGeneration:
  """A random HF model; its weights are redrawn so that norm scales and biases are not trivial."""
  fields, output_layer = HF_CASES[case]
  torch.manual_seed(seed)
  config = transformers.T5Config(
    **fields,
    tie_word_embeddings=output_layer == 'tied',
    decoder_start_token_id=0,
    dropout_rate=0.0,
  )
  model = transformers.T5ForConditionalGeneration(config).eval()
  if output_layer == 'untied':
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.clone())
  with torch.no_grad():
    for name, p in model.named_parameters():  # tied tensors appear once
      if 'layer_norm' in name:
        p.copy_(1 + 0.2 * torch.randn_like(p))
      elif name == 'shared.weight' or 'relative_attention_bias' in name:
        p.copy_(torch.randn_like(p))
      else:  # Linear [out, in]
        p.copy_(torch.randn_like(p) * p.shape[1] ** -0.5)
  return model


@pytest.fixture(scope='module', params=list(HF_CASES))
def hf_pair(request, tmp_path_factory):
  """(HF model, its save_pretrained directory, the T5Model load_hf_t5 makes of it)."""
  hf_model = _hf_model(request.param)
  path = tmp_path_factory.mktemp(request.param)
  hf_model.save_pretrained(path)
  return hf_model, path, checkpoints.load_hf_t5(path)


def test_hf_cases_cover_every_output_layer_layout(hf_pair):
  hf_model, path, model = hf_pair
  stored = safetensors.numpy.load_file(path / 'model.safetensors')
  shared, lm_head = hf_model.shared.weight, hf_model.lm_head.weight
  if model.config.tie_word_embeddings:  # v1.0
    assert 'lm_head.weight' not in stored and lm_head.data_ptr() == shared.data_ptr()
  elif 'lm_head.weight' in stored:  # v1.1
    assert not torch.equal(lm_head, shared)
  else:  # HF 5's tied-storage v1.1
    assert lm_head.data_ptr() == shared.data_ptr()


def test_hf_config_is_read(hf_pair):
  hf_model, _, model = hf_pair
  hf, ours = hf_model.config, model.config
  assert (ours.vocab_size, ours.d_model, ours.d_kv, ours.d_ff, ours.num_heads) == (
    hf.vocab_size,
    hf.d_model,
    hf.d_kv,
    hf.d_ff,
    hf.num_heads,
  )
  assert (ours.num_encoder_layers, ours.num_decoder_layers) == (
    hf.num_layers,
    hf.num_decoder_layers,
  )
  assert (ours.relative_attention_num_buckets, ours.relative_attention_max_distance) == (
    hf.relative_attention_num_buckets,
    hf.relative_attention_max_distance,
  )
  assert ours.feed_forward == ('relu' if hf.feed_forward_proj == 'relu' else 'gated-gelu')
  assert ours.tie_word_embeddings == hf.scale_decoder_outputs


def test_hf_parity_encoder(hf_pair):
  hf_model, _, model = hf_pair
  ids, mask = _source(model.config.vocab_size)
  with torch.no_grad():
    want = hf_model.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  got = _encode(model.params, jnp.asarray(ids), jnp.asarray(mask), config=model.config)
  real = mask.astype(bool)  # padding rows are unspecified
  np.testing.assert_allclose(
    np.asarray(got)[real], want.last_hidden_state.numpy()[real], atol=TOL, rtol=0
  )


def test_hf_parity_logits(hf_pair):
  """Teacher-forced logits of 8 decoder positions, scored by `decode` in two chunks of 4."""
  hf_model, _, model = hf_pair
  config = model.config
  ids, mask = _source(config.vocab_size)
  targets = np.random.default_rng(1).integers(2, config.vocab_size, size=(2, 8))
  targets[:, 0] = config.decoder_start_token_id
  with torch.no_grad():
    want = hf_model(
      input_ids=torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      decoder_input_ids=torch.tensor(targets),
    ).logits.numpy()
  ids, mask, targets = jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(targets)
  encoded = _encode(model.params, ids, mask, config=config)
  cache = _init_cache(model.params, encoded, mask, config=config, max_decode_len=20)
  first, cache = _decode(model.params, targets[:, :4], cache, config=config)
  rest, _ = _decode(model.params, targets[:, 4:], cache, config=config)
  assert np.abs(want).max() > 1e-2  # not a vacuous comparison
  np.testing.assert_allclose(np.concatenate([first, rest], axis=1), want, atol=TOL, rtol=0)


def _greedy(model: t5.T5Model, ids, mask, steps: int, banned: list[int]) -> np.ndarray:
  """int[B, steps]: our greedy decoding, one token per `decode` call.

  Never emits the `banned` ids nor a token already in the row's decoder input (HF's
  `no_repeat_ngram_size=1`).
  """
  config = model.config
  ids, mask = jnp.asarray(ids), jnp.asarray(mask)
  encoded = _encode(model.params, ids, mask, config=config)
  cache = _init_cache(model.params, encoded, mask, config=config, max_decode_len=steps)
  tokens = jnp.full((ids.shape[0], 1), config.decoder_start_token_id, jnp.int32)
  rows = jnp.arange(ids.shape[0])
  seen = jnp.zeros((ids.shape[0], config.vocab_size), bool).at[:, banned].set(True)
  out = []
  for _ in range(steps):
    seen = seen.at[rows, tokens[:, 0]].set(True)
    logits, cache = _decode(model.params, tokens, cache, config=config)
    tokens = jnp.argmax(jnp.where(seen, -jnp.inf, logits[:, -1]), axis=-1)[:, None]
    out.append(tokens)
  return np.asarray(jnp.concatenate(out, axis=1))


def test_hf_parity_greedy_decoding(hf_pair):
  hf_model, _, model = hf_pair
  config = model.config
  ids, mask = _source(config.vocab_size, seed=2)
  # Random weights would emit EOS at once and then repeat one token (the residual stream
  # carries the input token to the output layer). Suppress pad / EOS and repeats, here and in HF,
  # so every step is an argmax over fresh candidates.
  suppress = [config.pad_token_id, config.eos_token_id]
  # transformers 5.23 sizes the decoder's self-attention cache by the *encoder* depth
  # (num_layers) and fails when num_decoder_layers is larger; a cache that grows avoids it.
  cache = transformers.EncoderDecoderCache(transformers.DynamicCache(), transformers.DynamicCache())
  with torch.no_grad():
    want = hf_model.generate(
      input_ids=torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      max_new_tokens=20,
      do_sample=False,
      num_beams=1,
      suppress_tokens=suppress,
      no_repeat_ngram_size=1,
      decoder_start_token_id=config.decoder_start_token_id,
      past_key_values=cache,
    ).numpy()
  assert want.shape == (2, 21) and (want[:, 0] == config.decoder_start_token_id).all()
  np.testing.assert_array_equal(_greedy(model, ids, mask, 20, suppress), want[:, 1:])


@pytest.mark.parametrize(
  'layout', ['pytorch_model.bin', 'bfloat16 pytorch_model.bin', 'sharded', 'bfloat16']
)
def test_hf_other_weight_layouts_load_the_same(tmp_path, layout):
  """Against float32 model.safetensors of the same values (bfloat16 ones are exact in float32)."""
  hf_model = _hf_model('v1.1')
  if 'bfloat16' in layout:
    hf_model = hf_model.to(torch.bfloat16)
  other = tmp_path / 'other'
  if 'pytorch_model.bin' in layout:
    # transformers 5 always writes safetensors; this is the pickle 4.x wrote with
    # safe_serialization=False (it also holds the encoder/decoder copies of `shared`).
    other.mkdir()
    hf_model.config.save_pretrained(other)
    torch.save(hf_model.state_dict(), other / 'pytorch_model.bin')
  else:
    hf_model.save_pretrained(other, max_shard_size='20KB' if layout == 'sharded' else '5GB')
    assert (other / 'model.safetensors.index.json').is_file() == (layout == 'sharded')
  hf_model.float().save_pretrained(tmp_path / 'reference')
  want = checkpoints.load_hf_t5(tmp_path / 'reference')
  got = checkpoints.load_hf_t5(other)
  assert got.config == want.config
  _assert_params_equal(got.params, want.params)


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])
def test_hf_export_reimports_equal_and_loads_in_hf(tmp_path, name):
  model = _random_model(name)
  checkpoints.save_hf_t5(model, tmp_path)
  again = checkpoints.load_hf_t5(tmp_path)
  assert again.config == model.config
  _assert_params_equal(again.params, model.params)

  hf_model, info = transformers.T5ForConditionalGeneration.from_pretrained(
    tmp_path, output_loading_info=True
  )
  assert not info['missing_keys'] and not info['unexpected_keys'] and not info['mismatched_keys']
  assert hf_model.config.scale_decoder_outputs == model.config.tie_word_embeddings
  hf_state = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  for hf_name, array in checkpoints.params_to_hf_state_dict(model.params, model.config).items():
    np.testing.assert_array_equal(hf_state[hf_name], array, err_msg=hf_name)
  embedding = np.asarray(model.params['token_embedder']['embedding'])
  lm_head = (
    embedding
    if model.config.tie_word_embeddings
    else np.asarray(model.params['decoder']['logits_dense']['kernel']).T
  )
  np.testing.assert_array_equal(hf_state['lm_head.weight'], lm_head)


def test_hf_name_table_covers_exactly_the_model_params():
  for name in ['tiny-v1.0', 'tiny-v1.1', 't5-small', 't5_1_1-xl']:
    config = t5.CONFIGS[name]
    table = checkpoints.hf_names(config)
    assert set(table) == set(checkpoints.param_shapes(config))
    assert len({hf for hf, _ in table.values()}) == len(table)  # one-to-one


# -------------------------------------------------------------------------------------------------
# T5X.


def test_t5x_tiny_checkpoint_loads():
  model = checkpoints.load_t5x(T5X_TINY)
  config = model.config
  # The shapes stated in the test checkpoint's README.
  assert (config.vocab_size, config.d_model, config.num_heads, config.d_kv, config.d_ff) == (
    32128,
    8,
    4,
    3,
    16,
  )
  assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 2)
  assert config.feed_forward == 'gated-gelu' and not config.tie_word_embeddings
  raw = flax.serialization.msgpack_restore(T5X_TINY.read_bytes())['optimizer']['target']
  _assert_params_equal(model.params, raw)


def test_t5x_tiny_checkpoint_in_hf_gives_the_same_logits(tmp_path):
  model = checkpoints.load_t5x(T5X_TINY)
  checkpoints.save_hf_t5(model, tmp_path)
  hf_model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  ids, mask = _source(model.config.vocab_size, seed=3)
  targets = np.random.default_rng(4).integers(2, model.config.vocab_size, size=(2, 6))
  with torch.no_grad():
    want = hf_model(
      input_ids=torch.tensor(ids),
      attention_mask=torch.tensor(mask),
      decoder_input_ids=torch.tensor(targets),
    ).logits.numpy()
  got = _forward(
    model.params, jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(targets), config=model.config
  )
  assert np.abs(want).max() > 1e-3  # not a vacuous comparison
  np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def _chunk_shape(shape: tuple[int, ...], target_elements: int) -> list[int]:
  """T5X's `_choose_chunk_shape`: divisors of each dimension, largest dimension shrunk first."""
  factors = [[i for i in range(1, n + 1) if n % i == 0] for n in shape]
  while math.prod(f[-1] for f in factors) > target_elements:
    max(factors, key=lambda f: f[-1]).pop()
  return [f[-1] for f in factors]


def _write_t5x_tensorstore_checkpoint(
  state: dict, directory: Path, inline: tuple[str, ...] = (), storage: dict | None = None
):
  """Writes `state` ({'target': params, 'state': ...}) as T5X's Checkpointer does.

  Each array goes to a gzip-compressed zarr directory named by its dotted path
  ('target.encoder.layers_0.attention.key.kernel'), written by tensorstore; the msgpack
  `checkpoint` file holds {'version': 3, 'optimizer': state} with each such array replaced by its
  tensorstore spec, whose path is relative to the checkpoint directory. Scalars and the arrays
  named in `inline` stay in the msgpack, as T5X keeps unpartitioned arrays. `storage` overrides
  zarr metadata fields (dtype, compressor, order, ...) that T5X itself leaves at their defaults.
  """
  directory.mkdir(parents=True)

  def write(path: tuple[str, ...], array: np.ndarray):
    if array.ndim == 0 or '/'.join(path) in inline:
      return array
    spec = {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': '.'.join(path)},
      # T5X aims at 64 MiB chunks; 1024 elements make the larger arrays span several files.
      'metadata': {
        'compressor': {'id': 'gzip'},
        'shape': list(array.shape),
        'chunks': _chunk_shape(array.shape, target_elements=1024),
        **(storage or {}),
      },
    }
    if storage and 'dtype' in storage:
      del spec['dtype']  # the metadata's dtype (e.g. big-endian '>f4') is the stored one
    if array.ndim < 2:
      spec['metadata'].pop('order', None)  # tensorstore refuses 'F' for 1-D arrays (same as 'C')
    absolute = {**spec, 'kvstore': {'driver': 'file', 'path': str(directory / '.'.join(path))}}
    ts.open(absolute, create=True, open=True).result().write(array).result()
    return ts.Spec(spec).to_json()

  flat = flax.traverse_util.flatten_dict(state)
  written = flax.traverse_util.unflatten_dict({p: write(p, a) for p, a in flat.items()})
  contents = flax.serialization.msgpack_serialize({'version': 3, 'optimizer': written})
  (directory / 'checkpoint').write_bytes(contents)


def _t5x_state(params) -> dict:
  """A T5X optimizer state dict: the params as `target`, plus Adafactor-like state to skip."""
  params = jax.tree.map(np.asarray, params)
  slots = jax.tree.map(lambda x: {'v_row': np.zeros((1,), x.dtype)}, params)
  return {'target': params, 'state': {'step': np.int32(7), 'param_states': slots}}


def _t5x_source(name: str) -> tuple[dict, t5.T5Config | None]:
  """(params, the config they were made with, or None for the README-described T5X file)."""
  if name == 't5x_tiny':
    return flax.serialization.msgpack_restore(T5X_TINY.read_bytes())['optimizer']['target'], None
  model = _random_model(name, seed=5)
  return jax.tree.map(np.asarray, model.params), model.config


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1', 't5x_tiny'])
@pytest.mark.parametrize('layout', ['msgpack', 'tensorstore'])
def test_t5x_checkpoint_formats_load(tmp_path, name, layout):
  params, config = _t5x_source(name)
  written = tmp_path / 'checkpoint_7'
  if layout == 'msgpack':
    written.mkdir()
    contents = {'version': 3, 'optimizer': _t5x_state(params)}
    (written / 'checkpoint').write_bytes(flax.serialization.msgpack_serialize(contents))
  else:
    _write_t5x_tensorstore_checkpoint(
      _t5x_state(params), written, inline=('target/encoder/encoder_norm/scale',)
    )
    assert (written / 'target.encoder.layers_0.attention.query.kernel' / '.zarray').is_file()
  moved = shutil.move(written, tmp_path / 'elsewhere')  # zarr paths are relative: still loads
  for path in (moved, Path(moved) / 'checkpoint'):
    model = checkpoints.load_t5x(path)
    _assert_params_equal(model.params, params)
  if config is not None:
    # max_distance is not in the weights: inference gives T5's 128.
    inferred = dataclasses.replace(model.config, relative_attention_max_distance=128)
    assert inferred == dataclasses.replace(config, relative_attention_max_distance=128)
    _assert_params_equal(checkpoints.load_t5x(moved, config=config).params, params)


@pytest.mark.parametrize(
  'storage',
  [
    {'compressor': None, 'dimension_separator': '/'},
    {'compressor': {'id': 'zlib'}, 'order': 'F', 'dtype': '>f4'},
    {'compressor': {'id': 'bz2'}, 'dtype': 'bfloat16'},
    {'compressor': {'id': 'blosc'}, 'order': 'F', 'dimension_separator': '/', 'dtype': '<f4'},
  ],
  ids=['raw', 'zlib-F-big-endian', 'bz2-bfloat16', 'blosc-F-slash'],
)
def test_t5x_zarr_storage_variants_load_exactly(tmp_path, storage):
  """Every compressor, order, separator and dtype tensorstore writes; unwritten chunks.

  fill_value 1 leaves the all-ones layer norm scales without chunk files: they read as the fill.
  """
  config = t5.CONFIGS['tiny-v1.0']
  params = jax.tree.map(np.asarray, _random_model('tiny-v1.0', seed=5).params)
  dtype = ts.bfloat16.numpy_dtype if storage.get('dtype') == 'bfloat16' else np.float32
  stored = jax.tree.map(lambda x: x.astype(dtype), params)
  written = tmp_path / 'checkpoint_7'
  _write_t5x_tensorstore_checkpoint(
    _t5x_state(stored), written, storage={'dtype': '<f4', **storage, 'fill_value': 1.0}
  )
  scale = written / 'target.encoder.encoder_norm.scale'
  assert [f.name for f in scale.iterdir()] == ['.zarray']
  model = checkpoints.load_t5x(written, config=config)
  _assert_params_equal(model.params, jax.tree.map(lambda x: x.astype(np.float32), stored))


# -------------------------------------------------------------------------------------------------
# orbax.


@pytest.mark.parametrize('name, dtype', [('tiny-v1.0', 'float32'), ('tiny-v1.1', 'bfloat16')])
def test_orbax_round_trip_is_bit_exact(tmp_path, name, dtype):
  model = _random_model(name, dtype=dtype)
  checkpoints.save(model, tmp_path / 'model')
  restored = checkpoints.restore(tmp_path / 'model')
  assert restored.config == model.config
  _assert_params_equal(restored.params, model.params)


def test_orbax_bfloat16_storage_restores_float32_rounded_weights(tmp_path):
  model = _random_model('tiny-v1.1', dtype='float32')
  checkpoints.save(model, tmp_path / 'full')
  checkpoints.save(model, tmp_path / 'half', storage_dtype='bfloat16')
  size = lambda d: sum(f.stat().st_size for f in (d / 'params').rglob('*') if f.is_file())
  assert size(tmp_path / 'half') < 0.75 * size(tmp_path / 'full')
  restored = checkpoints.restore(tmp_path / 'half')
  assert restored.config == model.config
  rounded = jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.params)
  _assert_params_equal(restored.params, rounded)  # float32 arrays, bfloat16 values
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(restored.params))
  with pytest.raises(ValueError, match='storage_dtype is for float32 models'):
    checkpoints.save(
      _random_model('tiny-v1.1', dtype='bfloat16'), tmp_path / 'x', storage_dtype='bfloat16'
    )
  with pytest.raises(ValueError, match="storage_dtype must be None or 'bfloat16'"):
    checkpoints.save(model, tmp_path / 'y', storage_dtype='int8')


# -------------------------------------------------------------------------------------------------
# Errors.


def _edit_weights(path: Path, edit):
  weights = safetensors.numpy.load_file(path / 'model.safetensors')
  edit(weights)
  safetensors.numpy.save_file(weights, path / 'model.safetensors', metadata={'format': 'pt'})


def _edit_config(path: Path, **changes):
  config = json.loads((path / 'config.json').read_text())
  (path / 'config.json').write_text(json.dumps({**config, **changes}))


WO = 'decoder.block.2.layer.2.DenseReluDense.wo.weight'
QUERY = 'encoder.block.0.layer.0.SelfAttention.q.weight'
HF_ERRORS = {  # tiny-v1.1: D 32, N * H 32, F 48, 2 encoder and 3 decoder layers, untied
  'missing parameter': (
    lambda p: _edit_weights(p, lambda w: w.pop(WO)),
    f"missing parameter '{WO}'",
  ),
  'wrong shape': (
    lambda p: _edit_weights(p, lambda w: w.update({QUERY: np.zeros((33, 32), np.float32)})),
    rf"parameter '{QUERY}': the config implies \(32, 32\), got \(33, 32\)",
  ),
  'config with fewer layers': (
    lambda p: _edit_config(p, num_layers=1),
    r"config does not, e.g. \['encoder\.block\.1\.",
  ),
  'config with more layers': (
    lambda p: _edit_config(p, num_decoder_layers=4),
    r"missing parameter 'decoder\.block\.3\.",
  ),
  'config with another d_ff': (
    lambda p: _edit_config(p, d_ff=50),
    r"parameter '(en|de)coder\.block\.0\.layer\.[12]\.DenseReluDense\.wi_0\.weight'.*"
    r'\(50, 32\).*\(48, 32\)',
  ),
  'config with another activation': (
    lambda p: _edit_config(p, feed_forward_proj='relu'),
    r"missing parameter 'encoder\.block\.0\.layer\.1\.DenseReluDense\.wi\.weight'",
  ),
  'config tied, weights not': (
    lambda p: _edit_config(p, tie_word_embeddings=True, scale_decoder_outputs=True),
    "'lm_head.weight' differs from 'shared.weight'",
  ),
  'unsupported activation': (
    lambda p: _edit_config(p, feed_forward_proj='gated-silu'),
    "feed_forward_proj 'gated-silu'",
  ),
  'unsupported model type': (lambda p: _edit_config(p, model_type='umt5'), "model_type 'umt5'"),
}


@pytest.mark.parametrize('case', list(HF_ERRORS))
def test_hf_mismatched_checkpoint_names_the_problem(tmp_path, case):
  edit, message = HF_ERRORS[case]
  checkpoints.save_hf_t5(_random_model('tiny-v1.1'), tmp_path)
  edit(tmp_path)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_hf_t5(tmp_path)


def test_hf_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='No Hugging Face checkpoint directory'):
    checkpoints.load_hf_t5(tmp_path / 'absent')
  checkpoints.save_hf_t5(_random_model('tiny-v1.0'), tmp_path)
  (tmp_path / 'model.safetensors').rename(tmp_path / 'weights.bak')
  with pytest.raises(FileNotFoundError, match='expected one of model.safetensors'):
    checkpoints.load_hf_t5(tmp_path)
  (tmp_path / 'weights.bak').rename(tmp_path / 'model.safetensors')
  (tmp_path / 'config.json').unlink()
  with pytest.raises(FileNotFoundError, match='no config.json'):
    checkpoints.load_hf_t5(tmp_path)
  assert checkpoints.load_hf_t5(tmp_path, config=t5.CONFIGS['tiny-v1.0']).config.d_model == 32


def test_t5x_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='No T5X checkpoint'):
    checkpoints.load_t5x(tmp_path / 'absent')
  with pytest.raises(FileNotFoundError, match='has no `checkpoint` file'):
    checkpoints.load_t5x(tmp_path)
  (tmp_path / 'garbage').write_bytes(b'\xc1 not msgpack')
  with pytest.raises(ValueError, match='not a T5X checkpoint'):
    checkpoints.load_t5x(tmp_path / 'garbage')
  (tmp_path / 'no_target').write_bytes(flax.serialization.msgpack_serialize({'version': 3}))
  with pytest.raises(ValueError, match=r'no optimizer/target params'):
    checkpoints.load_t5x(tmp_path / 'no_target')

  model = _random_model('tiny-v1.1')
  written = tmp_path / 'checkpoint_7'
  _write_t5x_tensorstore_checkpoint(_t5x_state(model.params), written)
  wrong = dataclasses.replace(model.config, d_ff=40)
  with pytest.raises(
    ValueError, match=r"'(en|de)coder/layers_0/mlp/wi_0/kernel'.*\(32, 40\).*\(32, 48\)"
  ):
    checkpoints.load_t5x(written, config=wrong)
  with pytest.raises(ValueError, match=r"missing parameter 'decoder/logits_dense/kernel'"):
    flat = _flat(model.params)
    del flat['decoder/logits_dense/kernel']
    (tmp_path / 'untied').write_bytes(
      flax.serialization.msgpack_serialize(
        {'optimizer': {'target': flax.traverse_util.unflatten_dict(flat, sep='/')}}
      )
    )
    checkpoints.load_t5x(tmp_path / 'untied', config=model.config)
  shutil.rmtree(written / 'target.decoder.layers_1.mlp.wo.kernel')
  with pytest.raises(FileNotFoundError, match='target.decoder.layers_1.mlp.wo.kernel'):
    checkpoints.load_t5x(written)


def test_t5x_damaged_zarr_array_names_the_parameter(tmp_path):
  written = tmp_path / 'checkpoint_7'
  _write_t5x_tensorstore_checkpoint(_t5x_state(_random_model('tiny-v1.0').params), written)
  array = written / 'target.decoder.layers_1.mlp.wo.kernel'
  metadata = (array / '.zarray').read_text()
  (array / '.zarray').write_text(metadata[:20])
  _raises_naming(
    lambda: checkpoints.load_t5x(written),
    "T5X parameter 'decoder/layers_1/mlp/wo/kernel': cannot read the array at",
    str(array),
  )
  (array / '.zarray').write_text(metadata)
  for chunk in array.iterdir():
    if chunk.name != '.zarray':
      chunk.write_bytes(b'not gzip')
  _raises_naming(
    lambda: checkpoints.load_t5x(written), "T5X parameter 'decoder/layers_1/mlp/wo/kernel'"
  )


def test_orbax_errors(tmp_path):
  model = _random_model('tiny-v1.0')
  with pytest.raises(FileNotFoundError, match='config.json is missing'):
    checkpoints.restore(tmp_path)
  with pytest.raises(FileExistsError):
    checkpoints.save(model, tmp_path)
  mismatched = t5.T5Model(config=t5.CONFIGS['tiny-v1.1'], params=model.params)
  with pytest.raises(ValueError, match=r"missing parameter 'decoder/layers_0/mlp/wi_0/kernel'"):
    checkpoints.save(mismatched, tmp_path / 'mismatched')
  assert not (tmp_path / 'mismatched').exists()


# -------------------------------------------------------------------------------------------------
# Non-finite weights and damaged files: one ValueError naming the parameter or the file.


def _with_value(array, value, index: int = 3) -> np.ndarray:
  """A copy of `array` with one entry set to `value`."""
  array = np.array(array)
  array.flat[index] = value
  return array


def _raises_naming(call, *needles: str) -> str:
  """Runs `call`, which must raise one ValueError whose one-line message holds every needle."""
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert '\n' not in message
  for needle in needles:
    assert needle in message, (needle, message)
  return message


@pytest.mark.parametrize('value', [np.nan, np.inf, -np.inf])
def test_hf_nonfinite_weight_names_the_parameter(tmp_path, value):
  checkpoints.save_hf_t5(_random_model('tiny-v1.1'), tmp_path)
  _edit_weights(tmp_path, lambda w: w.update({WO: _with_value(w[WO], value)}))
  _raises_naming(
    lambda: checkpoints.load_hf_t5(tmp_path),
    f"Parameter 'decoder/layers_2/mlp/wo/kernel' (stored as '{WO}') of {tmp_path} has 1 "
    'non-finite value(s)',
    'allow_nonfinite=True',
  )
  kernel = checkpoints.load_hf_t5(tmp_path, allow_nonfinite=True).params['decoder']['layers_2']
  assert np.sum(~np.isfinite(kernel['mlp']['wo']['kernel'])) == 1


def test_hf_weight_beyond_the_config_dtype_is_nonfinite(tmp_path):
  """3.4e38 is a float32 but rounds to inf in bfloat16 (max 3.39e38): checked after the cast."""
  checkpoints.save_hf_t5(_random_model('tiny-v1.1'), tmp_path)
  _edit_weights(tmp_path, lambda w: w.update({QUERY: _with_value(w[QUERY], 3.4e38)}))
  config = checkpoints.load_hf_t5(tmp_path).config  # finite as float32
  _raises_naming(
    lambda: checkpoints.load_hf_t5(tmp_path, config=dataclasses.replace(config, dtype='bfloat16')),
    "Parameter 'encoder/layers_0/attention/query/kernel'",
    'as bfloat16',
  )


def test_t5x_nonfinite_weight_names_the_parameter(tmp_path):
  params = jax.tree.map(np.asarray, _random_model('tiny-v1.0', seed=5).params)
  query = params['encoder']['layers_1']['attention']['query']
  query['kernel'] = _with_value(query['kernel'], np.nan)
  (tmp_path / 'checkpoint').write_bytes(
    flax.serialization.msgpack_serialize({'optimizer': _t5x_state(params)})
  )
  _raises_naming(
    lambda: checkpoints.load_t5x(tmp_path),
    f"Parameter 'encoder/layers_1/attention/query/kernel' of {tmp_path / 'checkpoint'} has 1",
  )
  _assert_params_equal(checkpoints.load_t5x(tmp_path, allow_nonfinite=True).params, params)


def test_orbax_nonfinite_weight_names_the_parameter(tmp_path):
  model = _random_model('tiny-v1.0')
  flat = _flat(model.params)
  flat['token_embedder/embedding'] = flat['token_embedder/embedding'].at[5, 1].set(jnp.inf)
  broken = t5.T5Model(config=model.config, params=flax.traverse_util.unflatten_dict(flat, sep='/'))
  checkpoints.save(broken, tmp_path / 'model')
  _raises_naming(
    lambda: checkpoints.restore(tmp_path / 'model'),
    f"Parameter 'token_embedder/embedding' of {tmp_path / 'model'} has 1 non-finite value(s)",
  )
  _assert_params_equal(
    checkpoints.restore(tmp_path / 'model', allow_nonfinite=True).params, broken.params
  )


@pytest.mark.parametrize(
  'index, needle',
  [
    ({'metadata': {'total_size': 1}}, 'has no "weight_map"'),
    ({'weight_map': {}}, 'has no "weight_map"'),
    ({'weight_map': {'shared.weight': 3}}, 'has no "weight_map"'),
    ([], 'has no "weight_map"'),
    ('{"weight_map": ', 'is not valid JSON'),
  ],
  ids=['no weight_map', 'empty weight_map', 'file not a string', 'not an object', 'truncated'],
)
def test_hf_sharded_index_without_weight_map(tmp_path, index, needle):
  checkpoints.save_hf_t5(_random_model('tiny-v1.0'), tmp_path)
  (tmp_path / 'model.safetensors').rename(tmp_path / 'model-00001-of-00001.safetensors')
  file = tmp_path / 'model.safetensors.index.json'
  file.write_text(index if isinstance(index, str) else json.dumps(index))
  _raises_naming(lambda: checkpoints.load_hf_t5(tmp_path), f'{file} ', needle)


# After a failed restore orbax's background I/O still calls into its closed asyncio loop; that
# noise is orbax's, and the ValueError is what this test checks.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('damage', ['array data', 'array metadata', 'config.json'])
def test_orbax_damaged_checkpoint_names_the_directory(tmp_path, damage):
  directory = tmp_path / 'model'
  checkpoints.save(_random_model('tiny-v1.0'), directory)
  if damage == 'array data':
    # The ocdbt data files (`.../d/<hash>`) hold the arrays' bytes.
    damaged = [f for f in (directory / 'params').rglob('*') if f.is_file() and f.parent.name == 'd']
    assert damaged
    for file in damaged:
      file.write_bytes(bytes(range(256)) * (file.stat().st_size // 256 + 1))
    needle = f'Cannot restore the orbax checkpoint at {directory};'
  elif damage == 'array metadata':
    (directory / 'params' / '_METADATA').write_text('{"tree_metadata": ')
    needle = f'Cannot restore the orbax checkpoint at {directory};'
  else:
    (directory / 'config.json').write_text('{"vocab_size": 32,')
    needle = f'{directory / "config.json"} is not valid JSON'
  _raises_naming(lambda: checkpoints.restore(directory), needle)


# -------------------------------------------------------------------------------------------------
# T5X orbax checkpoints: `checkpoint_<step>/state/`, one OCDBT key-value store of zarr arrays.


def _write_t5x_ocdbt_checkpoint(state: dict, directory: Path, use_zarr3: bool = False) -> Path:
  """Writes `state` as T5X's OrbaxCheckpointManager does; returns the `state/` directory.

  An orbax PyTreeCheckpointHandler with use_ocdbt=True saves the tree to `<directory>/state/`:
  `manifest.ocdbt` and data files under `d/` and `ocdbt.process_0/d/`, each leaf a zarr (zarr3
  with `use_zarr3`) array under its dotted path ('target.encoder.layers_0.attention.key.kernel').
  """
  import orbax.checkpoint as ocp

  handler = ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_zarr3=use_zarr3)
  with ocp.Checkpointer(handler) as checkpointer:
    checkpointer.save(directory.absolute() / 'state', args=ocp.args.PyTreeSave(state))
  return directory / 'state'


@pytest.mark.parametrize(
  'name, dtype, use_zarr3', [('tiny-v1.0', 'float32', False), ('tiny-v1.1', 'bfloat16', True)]
)
def test_t5x_ocdbt_checkpoint_loads(tmp_path, name, dtype, use_zarr3):
  model = _random_model(name, seed=5, dtype=dtype)
  # T5X saves jax arrays for the params and numpy / scalars for some optimizer state.
  state = {'target': model.params, 'state': _t5x_state(model.params)['state']}
  written = _write_t5x_ocdbt_checkpoint(state, tmp_path / 'checkpoint_7', use_zarr3)
  assert (written / 'manifest.ocdbt').is_file() and not (written.parent / 'checkpoint').exists()
  moved = Path(shutil.move(written.parent, tmp_path / 'elsewhere'))  # OCDBT paths are relative
  for path in (moved, moved / 'state'):
    _assert_params_equal(checkpoints.load_t5x(path, config=model.config).params, model.params)
  inferred = checkpoints.load_t5x(moved).config
  assert inferred == dataclasses.replace(
    model.config, relative_attention_max_distance=128, dtype='float32'
  )


def test_t5x_ocdbt_errors(tmp_path):
  params = _random_model('tiny-v1.0').params
  written = _write_t5x_ocdbt_checkpoint({'params': params}, tmp_path / 'not_t5x')
  _raises_naming(lambda: checkpoints.load_t5x(written.parent), f'{written}: no `target` params')

  written = _write_t5x_ocdbt_checkpoint(_t5x_state(params), tmp_path / 'checkpoint_7')
  for file in written.rglob('*'):
    if file.is_file() and file.parent.name == 'd':
      file.write_bytes(bytes(range(256)) * (file.stat().st_size // 256 + 1))
  _raises_naming(
    lambda: checkpoints.load_t5x(written.parent), f'{written} is not a readable OCDBT checkpoint'
  )
