"""Tests of checkpoints/hf.py (via `checkpoints.load_hf_t5` / `save_hf_t5`): parity with HF
transformers' PyTorch T5 on random HF models, every weight layout, and the errors a wrong
checkpoint gives."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy
import torch
import transformers

from specdec_jax import checkpoints
from specdec_jax.models import t5
from tests import helpers

_encode = jax.jit(t5.encode, static_argnames='config')
_init_cache = jax.jit(t5.init_cache, static_argnames=('config', 'max_decode_len'))
_decode = jax.jit(t5.decode, static_argnames='config')


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
  ids, mask = helpers.checkpoint_source(model.config.vocab_size)
  with torch.no_grad():
    want = hf_model.encoder(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
  got = _encode(model.params, jnp.asarray(ids), jnp.asarray(mask), config=model.config)
  real = mask.astype(bool)  # padding rows are unspecified
  np.testing.assert_allclose(
    np.asarray(got)[real], want.last_hidden_state.numpy()[real], atol=helpers.HF_TOL, rtol=0
  )


def test_hf_parity_logits(hf_pair):
  """Teacher-forced logits of 8 decoder positions, scored by `decode` in two chunks of 4."""
  hf_model, _, model = hf_pair
  config = model.config
  ids, mask = helpers.checkpoint_source(config.vocab_size)
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
  np.testing.assert_allclose(
    np.concatenate([first, rest], axis=1), want, atol=helpers.HF_TOL, rtol=0
  )


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
  ids, mask = helpers.checkpoint_source(config.vocab_size, seed=2)
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
  helpers.assert_params_equal(got.params, want.params)


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])
def test_hf_export_reimports_equal_and_loads_in_hf(tmp_path, name):
  model = helpers.random_t5(name)
  checkpoints.save_hf_t5(model, tmp_path)
  again = checkpoints.load_hf_t5(tmp_path)
  assert again.config == model.config
  helpers.assert_params_equal(again.params, model.params)

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
  checkpoints.save_hf_t5(helpers.random_t5('tiny-v1.1'), tmp_path)
  edit(tmp_path)
  with pytest.raises(ValueError, match=message):
    checkpoints.load_hf_t5(tmp_path)


def test_hf_missing_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='No Hugging Face checkpoint directory'):
    checkpoints.load_hf_t5(tmp_path / 'absent')
  checkpoints.save_hf_t5(helpers.random_t5('tiny-v1.0'), tmp_path)
  (tmp_path / 'model.safetensors').rename(tmp_path / 'weights.bak')
  with pytest.raises(FileNotFoundError, match='expected one of model.safetensors'):
    checkpoints.load_hf_t5(tmp_path)
  (tmp_path / 'weights.bak').rename(tmp_path / 'model.safetensors')
  (tmp_path / 'config.json').unlink()
  with pytest.raises(FileNotFoundError, match='no config.json'):
    checkpoints.load_hf_t5(tmp_path)
  assert checkpoints.load_hf_t5(tmp_path, config=t5.CONFIGS['tiny-v1.0']).config.d_model == 32


@pytest.mark.parametrize('value', [np.nan, np.inf, -np.inf])
def test_hf_nonfinite_weight_names_the_parameter(tmp_path, value):
  checkpoints.save_hf_t5(helpers.random_t5('tiny-v1.1'), tmp_path)
  _edit_weights(tmp_path, lambda w: w.update({WO: helpers.with_value(w[WO], value)}))
  helpers.raises_naming(
    lambda: checkpoints.load_hf_t5(tmp_path),
    f"Parameter 'decoder/layers_2/mlp/wo/kernel' (stored as '{WO}') of {tmp_path} has 1 "
    'non-finite value(s)',
    'allow_nonfinite=True',
  )
  kernel = checkpoints.load_hf_t5(tmp_path, allow_nonfinite=True).params['decoder']['layers_2']
  assert np.sum(~np.isfinite(kernel['mlp']['wo']['kernel'])) == 1


def test_hf_weight_beyond_the_config_dtype_is_nonfinite(tmp_path):
  """3.4e38 is a float32 but rounds to inf in bfloat16 (max 3.39e38): checked after the cast."""
  checkpoints.save_hf_t5(helpers.random_t5('tiny-v1.1'), tmp_path)
  _edit_weights(tmp_path, lambda w: w.update({QUERY: helpers.with_value(w[QUERY], 3.4e38)}))
  config = checkpoints.load_hf_t5(tmp_path).config  # finite as float32
  helpers.raises_naming(
    lambda: checkpoints.load_hf_t5(tmp_path, config=dataclasses.replace(config, dtype='bfloat16')),
    "Parameter 'encoder/layers_0/attention/query/kernel'",
    'as bfloat16',
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
  checkpoints.save_hf_t5(helpers.random_t5('tiny-v1.0'), tmp_path)
  (tmp_path / 'model.safetensors').rename(tmp_path / 'model-00001-of-00001.safetensors')
  file = tmp_path / 'model.safetensors.index.json'
  file.write_text(index if isinstance(index, str) else json.dumps(index))
  helpers.raises_naming(lambda: checkpoints.load_hf_t5(tmp_path), f'{file} ', needle)


def test_hf_storage_dtype_and_urls(tmp_path):
  model = helpers.random_t5('tiny-v1.0')
  checkpoints.save_hf_t5(model, tmp_path)
  stored = checkpoints.load_hf_t5(tmp_path, param_dtype='bfloat16')
  assert stored.config == model.config  # float32 compute
  helpers.assert_params_equal(
    stored.params, jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16)), model.params)
  )
  with pytest.raises(ValueError, match='load_hf_t5 reads local directories'):
    checkpoints.load_hf_t5('gs://bucket/flan-t5-xxl')
