"""Tests of checkpoints/t5x.py (via `checkpoints.load_t5x`): T5X's own test checkpoint, the
msgpack, tensorstore/zarr and orbax OCDBT layouts, tensorstore URLs, and the errors a wrong
checkpoint gives."""

import dataclasses
import shutil
from pathlib import Path

import flax.serialization
import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorstore as ts
import torch
import transformers

from specdec_jax import checkpoints
from specdec_jax.models import t5
from tests import helpers

_forward = jax.jit(t5.forward, static_argnames='config')

# -------------------------------------------------------------------------------------------------
# T5X.


def test_t5x_tiny_checkpoint_loads():
  model = checkpoints.load_t5x(helpers.T5X_TINY)
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
  raw = flax.serialization.msgpack_restore(helpers.T5X_TINY.read_bytes())['optimizer']['target']
  helpers.assert_params_equal(model.params, raw)


def test_t5x_tiny_checkpoint_in_hf_gives_the_same_logits(tmp_path):
  model = checkpoints.load_t5x(helpers.T5X_TINY)
  checkpoints.save_hf_t5(model, tmp_path)
  hf_model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path).eval()
  ids, mask = helpers.checkpoint_source(model.config.vocab_size, seed=3)
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
  np.testing.assert_allclose(got, want, atol=helpers.HF_TOL, rtol=0)


def _t5x_source(name: str) -> tuple[dict, t5.T5Config | None]:
  """(params, the config they were made with, or None for the README-described T5X file)."""
  if name == 't5x_tiny':
    raw = flax.serialization.msgpack_restore(helpers.T5X_TINY.read_bytes())
    return raw['optimizer']['target'], None
  model = helpers.random_t5(name, seed=5)
  return jax.tree.map(np.asarray, model.params), model.config


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1', 't5x_tiny'])
@pytest.mark.parametrize('layout', ['msgpack', 'tensorstore'])
def test_t5x_checkpoint_formats_load(tmp_path, name, layout):
  params, config = _t5x_source(name)
  written = tmp_path / 'checkpoint_7'
  if layout == 'msgpack':
    written.mkdir()
    contents = {'version': 3, 'optimizer': helpers.t5x_state(params)}
    (written / 'checkpoint').write_bytes(flax.serialization.msgpack_serialize(contents))
  else:
    helpers.write_t5x_tensorstore_checkpoint(
      helpers.t5x_state(params), written, inline=('target/encoder/encoder_norm/scale',)
    )
    assert (written / 'target.encoder.layers_0.attention.query.kernel' / '.zarray').is_file()
  moved = shutil.move(written, tmp_path / 'elsewhere')  # zarr paths are relative: still loads
  for path in (moved, Path(moved) / 'checkpoint'):
    model = checkpoints.load_t5x(path)
    helpers.assert_params_equal(model.params, params)
  if config is not None:
    # max_distance is not in the weights: inference gives T5's 128.
    inferred = dataclasses.replace(model.config, relative_attention_max_distance=128)
    assert inferred == dataclasses.replace(config, relative_attention_max_distance=128)
    helpers.assert_params_equal(checkpoints.load_t5x(moved, config=config).params, params)


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
  params = jax.tree.map(np.asarray, helpers.random_t5('tiny-v1.0', seed=5).params)
  dtype = ts.bfloat16.numpy_dtype if storage.get('dtype') == 'bfloat16' else np.float32
  stored = jax.tree.map(lambda x: x.astype(dtype), params)
  written = tmp_path / 'checkpoint_7'
  helpers.write_t5x_tensorstore_checkpoint(
    helpers.t5x_state(stored), written, storage={'dtype': '<f4', **storage, 'fill_value': 1.0}
  )
  scale = written / 'target.encoder.encoder_norm.scale'
  assert [f.name for f in scale.iterdir()] == ['.zarray']
  model = checkpoints.load_t5x(written, config=config)
  helpers.assert_params_equal(model.params, jax.tree.map(lambda x: x.astype(np.float32), stored))


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

  model = helpers.random_t5('tiny-v1.1')
  written = tmp_path / 'checkpoint_7'
  helpers.write_t5x_tensorstore_checkpoint(helpers.t5x_state(model.params), written)
  wrong = dataclasses.replace(model.config, d_ff=40)
  with pytest.raises(
    ValueError, match=r"'(en|de)coder/layers_0/mlp/wi_0/kernel'.*\(32, 40\).*\(32, 48\)"
  ):
    checkpoints.load_t5x(written, config=wrong)
  with pytest.raises(ValueError, match=r"missing parameter 'decoder/logits_dense/kernel'"):
    flat = helpers.flat_params(model.params)
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
  helpers.write_t5x_tensorstore_checkpoint(
    helpers.t5x_state(helpers.random_t5('tiny-v1.0').params), written
  )
  array = written / 'target.decoder.layers_1.mlp.wo.kernel'
  metadata = (array / '.zarray').read_text()
  (array / '.zarray').write_text(metadata[:20])
  helpers.raises_naming(
    lambda: checkpoints.load_t5x(written),
    "T5X parameter 'decoder/layers_1/mlp/wo/kernel': cannot read the array at",
    str(array),
  )
  (array / '.zarray').write_text(metadata)
  for chunk in array.iterdir():
    if chunk.name != '.zarray':
      chunk.write_bytes(b'not gzip')
  helpers.raises_naming(
    lambda: checkpoints.load_t5x(written), "T5X parameter 'decoder/layers_1/mlp/wo/kernel'"
  )


def test_t5x_nonfinite_weight_names_the_parameter(tmp_path):
  params = jax.tree.map(np.asarray, helpers.random_t5('tiny-v1.0', seed=5).params)
  query = params['encoder']['layers_1']['attention']['query']
  query['kernel'] = helpers.with_value(query['kernel'], np.nan)
  (tmp_path / 'checkpoint').write_bytes(
    flax.serialization.msgpack_serialize({'optimizer': helpers.t5x_state(params)})
  )
  helpers.raises_naming(
    lambda: checkpoints.load_t5x(tmp_path),
    f"Parameter 'encoder/layers_1/attention/query/kernel' of {tmp_path / 'checkpoint'} has 1",
  )
  helpers.assert_params_equal(checkpoints.load_t5x(tmp_path, allow_nonfinite=True).params, params)


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
  model = helpers.random_t5(name, seed=5, dtype=dtype)
  # T5X saves jax arrays for the params and numpy / scalars for some optimizer state.
  state = {'target': model.params, 'state': helpers.t5x_state(model.params)['state']}
  written = _write_t5x_ocdbt_checkpoint(state, tmp_path / 'checkpoint_7', use_zarr3)
  assert (written / 'manifest.ocdbt').is_file() and not (written.parent / 'checkpoint').exists()
  moved = Path(shutil.move(written.parent, tmp_path / 'elsewhere'))  # OCDBT paths are relative
  for path in (moved, moved / 'state'):
    helpers.assert_params_equal(
      checkpoints.load_t5x(path, config=model.config).params, model.params
    )
  inferred = checkpoints.load_t5x(moved).config
  assert inferred == dataclasses.replace(
    model.config, relative_attention_max_distance=128, dtype='float32'
  )


def test_t5x_ocdbt_errors(tmp_path):
  params = helpers.random_t5('tiny-v1.0').params
  written = _write_t5x_ocdbt_checkpoint({'params': params}, tmp_path / 'not_t5x')
  helpers.raises_naming(
    lambda: checkpoints.load_t5x(written.parent), f'{written}: no `target` params'
  )

  written = _write_t5x_ocdbt_checkpoint(helpers.t5x_state(params), tmp_path / 'checkpoint_7')
  for file in written.rglob('*'):
    if file.is_file() and file.parent.name == 'd':
      file.write_bytes(bytes(range(256)) * (file.stat().st_size // 256 + 1))
  helpers.raises_naming(
    lambda: checkpoints.load_t5x(written.parent), f'{written} is not a readable OCDBT checkpoint'
  )


def test_t5x_tensorstore_urls_load(tmp_path):
  """kvstore URLs reach tensorstore untouched (a Path would turn 'file:///x' into 'file:/x')."""
  params, _ = _t5x_source('tiny-v1.1')
  helpers.write_t5x_tensorstore_checkpoint(
    helpers.t5x_state(params), tmp_path / 'zarr', inline=('target/encoder/encoder_norm/scale',)
  )
  (tmp_path / 'msgpack').mkdir()
  (tmp_path / 'msgpack' / 'checkpoint').write_bytes(
    flax.serialization.msgpack_serialize({'optimizer': helpers.t5x_state(params)})
  )
  ocdbt = _write_t5x_ocdbt_checkpoint(helpers.t5x_state(params), tmp_path / 'ocdbt')
  paths = [tmp_path / 'zarr', tmp_path / 'zarr' / 'checkpoint', tmp_path / 'msgpack', ocdbt]
  for path in [*paths, ocdbt.parent]:
    model = checkpoints.load_t5x(path.absolute().as_uri() + '/' * (path == ocdbt))
    helpers.assert_params_equal(model.params, params)
  missing = (tmp_path / 'absent').as_uri()
  with pytest.raises(FileNotFoundError, match=f'No T5X checkpoint at {missing}: no `checkpoint`'):
    checkpoints.load_t5x(missing)
  with pytest.raises(ValueError, match='Cannot read the T5X checkpoint at nosuchscheme://x'):
    checkpoints.load_t5x('nosuchscheme://x/checkpoint_1')


def test_t5x_compute_and_storage_dtypes():
  raw = flax.serialization.msgpack_restore(helpers.T5X_TINY.read_bytes())['optimizer']['target']
  half = jax.tree.map(lambda x: np.asarray(x).astype(jnp.bfloat16), raw)
  stored = checkpoints.load_t5x(helpers.T5X_TINY, param_dtype='bfloat16')  # a float32 model
  assert stored.config.dtype == 'float32'
  helpers.assert_params_equal(stored.params, half)
  computed = checkpoints.load_t5x(
    helpers.T5X_TINY, dtype='bfloat16'
  )  # params follow the compute dtype
  assert computed.config.dtype == 'bfloat16'
  helpers.assert_params_equal(computed.params, half)
  mixed = checkpoints.load_t5x(helpers.T5X_TINY, dtype='bfloat16', param_dtype='float32')
  assert mixed.config.dtype == 'bfloat16'
  helpers.assert_params_equal(mixed.params, raw)
  with pytest.raises(ValueError, match=r"param_dtype must be one of \('float32', 'bfloat16'\)"):
    checkpoints.load_t5x(helpers.T5X_TINY, param_dtype='float16')
  with pytest.raises(ValueError, match='dtype must be one of'):
    checkpoints.load_t5x(helpers.T5X_TINY, dtype='int8')
