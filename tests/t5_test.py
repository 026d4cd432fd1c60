"""Tests of models/t5.py and t5_layers.py: incremental decoding equals teacher forcing, buckets, masking, dtypes."""

import dataclasses
import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import cache as cache_lib
from specdec_jax.measure import timing
from specdec_jax.models import t5, t5_dropout, t5_layers, t5_relpos
from tests import helpers

_decode = jax.jit(t5.decode, static_argnames=('config',))
TINY = ('tiny-v1.0', 'tiny-v1.1', 'tiny-t5x')  # tiny-t5x: num_heads * d_kv != d_model
# Compiling dominates the run time on CPU, so the tests share these shapes (and jit caches):
# sources [3, 9], decoder sequences [3, 16], caches of 16 slots.
_MAX_DECODE_LEN = 16


@functools.cache
def _model(name: str, seed: int = 0):
  """(config, params) of `helpers.tiny_t5(name, seed)`, built once."""
  model = helpers.tiny_t5(name, seed)
  return model.config, model.params


def _source(config, lengths=(9, 4, 6), seed=0):
  """A padded source batch whose rows have the given lengths: (ids int32[B, S], mask bool[B, S])."""
  rng = np.random.default_rng(seed)
  mask = np.arange(max(lengths))[None] < np.asarray(lengths)[:, None]
  ids = rng.integers(2, config.vocab_size, size=mask.shape) * mask
  return jnp.asarray(ids, jnp.int32), jnp.asarray(mask)


@functools.partial(jax.jit, static_argnames=('config', 'max_decode_len'))
def _prefill(params, ids, mask, *, config, max_decode_len=_MAX_DECODE_LEN):
  encoded = t5.encode(params, ids, mask, config=config)
  return t5.init_cache(params, encoded, mask, config=config, max_decode_len=max_decode_len)


def _targets(config, seed=0):
  """Random decoder inputs int32[3, 16] starting with the start token."""
  rng = np.random.default_rng(seed)
  dec = rng.integers(2, config.vocab_size, size=(3, _MAX_DECODE_LEN))
  dec[:, 0] = config.decoder_start_token_id
  return jnp.asarray(dec, jnp.int32)


# ---------------------------------------------------------------------------------------------
# Incremental decoding.

# (rewind every row to at most its current length first, or None; chunk length T). Rows end up at
# different lengths, and rewound positions are rewritten with different tokens.
_SCHEDULE = [
  (None, 5),
  ((2, 5, 0), 3),
  (None, 1),
  ((4, 1, 3), 5),
  (None, 3),
  ((9, 6, 2), 1),
  (None, 5),
  ((15, 11, 6), 1),  # row 0 fills the last slot
]


@pytest.mark.parametrize(
  'name', [n if n == 'tiny-v1.1' else pytest.param(n, marks=pytest.mark.slow) for n in TINY]
)  # the others ~15 CPU-s each: the variants' layers are tested one by one above
def test_chunked_decode_with_rewinds_matches_forward(name):
  config, params = _model(name)
  ids, mask = _source(config)
  batch = ids.shape[0]
  rng = np.random.default_rng(1)
  cache = _prefill(params, ids, mask, config=config)
  # seq[b] is row b's decoder input as the cache holds it (stale tail included; causal masking
  # makes the tail irrelevant to the positions compared).
  seq = np.zeros((batch, _MAX_DECODE_LEN), np.int32)
  end = np.zeros(batch, np.int64)
  for rewind_to, t in _SCHEDULE:
    if rewind_to is not None:
      end = np.asarray(rewind_to)
      cache = cache_lib.rewind(cache, end)
    positions = end[:, None] + np.arange(t)
    old = np.take_along_axis(seq, positions, axis=1)
    tokens = rng.integers(2, config.vocab_size, size=(batch, t))
    tokens = np.where(tokens == old, (tokens + 1) % config.vocab_size, tokens).astype(np.int32)
    logits, cache = _decode(params, jnp.asarray(tokens), cache, config=config)
    np.put_along_axis(seq, positions, tokens, axis=1)
    reference = np.asarray(helpers.forward(params, ids, mask, jnp.asarray(seq), config=config))
    expected = np.take_along_axis(reference, positions[..., None], axis=1)
    np.testing.assert_allclose(logits, expected, atol=1e-5, rtol=0)
    end = end + t
    np.testing.assert_array_equal(cache.end_index, end)


def test_forward_is_independent_of_source_padding():
  config, params = _model('tiny-v1.1')
  ids, mask = _source(config)
  dec = _targets(config)
  padded_ids = jnp.pad(ids, ((0, 0), (0, 4)), constant_values=config.pad_token_id)
  padded_mask = jnp.pad(mask, ((0, 0), (0, 4)))
  np.testing.assert_allclose(
    helpers.forward(params, padded_ids, padded_mask, dec, config=config),
    helpers.forward(params, ids, mask, dec, config=config),
    atol=1e-5,
    rtol=0,
  )


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])
def test_random_model_logits_are_not_degenerate(name):
  config, params = _model(name)
  ids, mask = _source(config)
  logits = np.asarray(helpers.forward(params, ids, mask, _targets(config), config=config))
  assert np.all(np.isfinite(logits))
  assert 0.3 < logits.std() < 3.0
  assert len(np.unique(logits.argmax(-1))) > 5


# ---------------------------------------------------------------------------------------------
# Masking of stale cache slots and of source padding.


@jax.jit
def _with_garbage(cache, where_k, where_cross):
  """`cache` with large garbage in self-attention slots where_k bool[L, B, S_max] and at encoder
  positions where_cross bool[B, S_enc]."""
  rng = jax.random.key(7)
  garbage = lambda x, i: 1e3 * jax.random.normal(jax.random.fold_in(rng, i), x.shape, x.dtype)
  sel_k = where_k[..., None, None]
  sel_cross = where_cross[None, :, :, None, None]
  return cache.replace(
    self_k=jnp.where(sel_k, garbage(cache.self_k, 0), cache.self_k),
    self_v=jnp.where(sel_k, garbage(cache.self_v, 1), cache.self_v),
    cross_k=jnp.where(sel_cross, garbage(cache.cross_k, 2), cache.cross_k),
    cross_v=jnp.where(sel_cross, garbage(cache.cross_v, 3), cache.cross_v),
  )


def test_stale_slots_and_source_padding_are_masked():
  config, params = _model('tiny-v1.1')
  ids, mask = _source(config)
  rng = np.random.default_rng(2)
  cache = _prefill(params, ids, mask, config=config)
  for _ in range(2):  # ten draft positions, then a rejection leaves stale slots behind
    drafts = jnp.asarray(rng.integers(2, config.vocab_size, (3, 5)), jnp.int32)
    _, cache = _decode(params, drafts, cache, config=config)
  cache = cache_lib.rewind(cache, [3, 5, 1])
  tokens = jnp.asarray(rng.integers(2, config.vocab_size, (3, 3)), jnp.int32)
  clean = np.asarray(_decode(params, tokens, cache, config=config)[0])

  def dirty_logits(where_k, where_cross):
    return np.asarray(
      _decode(params, tokens, _with_garbage(cache, where_k, where_cross), config=config)[0]
    )

  shape = (config.num_decoder_layers, 3, _MAX_DECODE_LEN)
  slot = np.arange(_MAX_DECODE_LEN)[None, None, :]
  end = np.asarray(cache.end_index)[None, :, None]
  no_slots, no_source = np.zeros(shape, bool), np.zeros(mask.shape, bool)
  stale = np.broadcast_to(slot >= end, shape)
  np.testing.assert_allclose(dirty_logits(stale, ~np.asarray(mask)), clean, atol=1e-6, rtol=0)
  # Negative controls: the same garbage in the last valid slot, or at a real source position,
  # changes the logits.
  last_valid = np.broadcast_to(slot == end - 1, shape)
  assert np.abs(dirty_logits(last_valid, no_source) - clean).max() > 1e-2
  first_source = no_source.copy()
  first_source[:, 0] = True
  assert np.abs(dirty_logits(no_slots, first_source) - clean).max() > 1e-2


# ---------------------------------------------------------------------------------------------
# Relative position buckets.


def _reference_bucket(relative_position, bidirectional, num_buckets, max_distance):
  """HF / Mesh TF `_relative_position_bucket` for one int, in float32 as torch computes it."""
  bucket = 0
  if bidirectional:
    num_buckets //= 2
    bucket += num_buckets if relative_position > 0 else 0
    n = abs(relative_position)
  else:
    n = max(-relative_position, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return bucket + n
  log_ratio = np.log(np.float32(n) / np.float32(max_exact)) / np.float32(
    math.log(max_distance / max_exact)
  )
  return bucket + min(
    max_exact + int(log_ratio * np.float32(num_buckets - max_exact)), num_buckets - 1
  )


# (6, 81), (16, 289) and (128, 100) have distances whose float32 logarithm sits on a bucket
# boundary: computing the formula with XLA's log instead of tabulating it gets those wrong.
@pytest.mark.parametrize(
  'num_buckets,max_distance',
  [(32, 128), (8, 12), (16, 20), (64, 256), (6, 81), (16, 289), (128, 100)],
)
@pytest.mark.parametrize('bidirectional', [True, False])
def test_relative_position_bucket_matches_reference(num_buckets, max_distance, bidirectional):
  relative = np.arange(-400, 401)
  got = t5_relpos.relative_position_bucket(
    relative, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
  )
  expected = [_reference_bucket(int(r), bidirectional, num_buckets, max_distance) for r in relative]
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
  'bidirectional,expected',
  [
    (True, {0: 0, 1: 17, -1: 1, 7: 23, -7: 7, -8: 8, -200: 15, 200: 31}),
    (False, {0: 0, 5: 0, -1: 1, -15: 15, -16: 16, -1000: 31}),
  ],
)
def test_relative_position_bucket_known_values(bidirectional, expected):
  relative = np.array(list(expected))
  got = t5_relpos.relative_position_bucket(
    relative, bidirectional=bidirectional, num_buckets=32, max_distance=128
  )
  np.testing.assert_array_equal(got, list(expected.values()))


@pytest.mark.parametrize('bidirectional', [True, False])
def test_relpos_bias_looks_up_key_minus_query(bidirectional):
  config = t5.CONFIGS['tiny-v1.1']
  heads, buckets = config.num_heads, config.relative_attention_num_buckets
  table = np.arange(heads * buckets, dtype=np.float32).reshape(heads, buckets)
  q_pos = np.array([[0, 3, 17], [5, 6, 40]])
  k_pos = np.arange(45)
  got = t5_layers.relpos_bias(
    jnp.asarray(table),
    jnp.asarray(q_pos),
    jnp.asarray(k_pos),
    bidirectional=bidirectional,
    config=config,
  )
  expected = np.zeros((2, heads, 3, 45), np.float32)
  for b, t, s in np.ndindex(2, 3, 45):
    bucket = _reference_bucket(
      int(k_pos[s] - q_pos[b, t]), bidirectional, buckets, config.relative_attention_max_distance
    )
    expected[b, :, t, s] = table[:, bucket]
  np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------------------------------------
# Compilation, dtypes, API details.


def test_decode_compiles_once():
  traces = []

  def counted_decode(params, tokens, cache, *, config):
    traces.append(tokens.shape)
    return t5.decode(params, tokens, cache, config=config)

  decode = jax.jit(counted_decode, static_argnames=('config',))
  config, params = _model('tiny-v1.0')
  ids, mask = _source(config)
  cache = _prefill(params, ids, mask, config=config)
  rng = np.random.default_rng(3)
  with timing.compiles() as compiled:
    for rewind_to in [None, [1, 0, 2], np.array([3, 3, 1], np.int64), 2]:
      if rewind_to is not None:
        cache = cache_lib.rewind(cache, rewind_to)
      tokens = jnp.asarray(rng.integers(2, config.vocab_size, (3, 2)), jnp.int32)
      _, cache = decode(params, tokens, cache, config=config)
  assert len(traces) == 1
  assert [n for n in compiled if 'counted_decode' in n] == ['jit(counted_decode)'], compiled


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])
def test_bfloat16_is_close_to_float32(name):
  config, params = _model(name)
  bf16 = dataclasses.replace(config, dtype='bfloat16')
  ids, mask = _source(config)
  dec = _targets(config)
  reference = np.asarray(helpers.forward(params, ids, mask, dec, config=config))
  atol = 0.1 * reference.std()
  logits = helpers.forward(params, ids, mask, dec, config=bf16)
  assert logits.dtype == jnp.float32
  np.testing.assert_allclose(logits, reference, atol=atol, rtol=0)
  if name == 'tiny-v1.1':  # params stored in bfloat16, incremental decoding
    params_bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    cache = _prefill(params_bf16, ids, mask, config=bf16)
    assert cache.self_k.dtype == cache.cross_k.dtype == jnp.bfloat16
    stepped, _ = _decode(params_bf16, dec, cache, config=bf16)
    np.testing.assert_allclose(stepped, reference, atol=atol, rtol=0)


# Published parameter counts (HF model cards / the T5 and T5 v1.1 releases).
@pytest.mark.parametrize(
  'name,count',
  [
    ('t5-small', 60_506_624),
    ('t5-base', 222_903_552),
    ('t5-large', 737_668_096),
    ('t5-3b', 2_851_598_336),
    ('t5-11b', 11_307_321_344),
    ('t5_1_1-small', 76_961_152),
    ('t5_1_1-base', 247_577_856),
    ('t5_1_1-large', 783_150_080),
    ('t5_1_1-xl', 2_849_757_184),
    ('t5_1_1-xxl', 11_135_332_352),
  ],
)
def test_config_shapes_give_published_param_counts(name, count):
  config = t5.CONFIGS[name]
  shapes = jax.eval_shape(lambda rng: t5.init_params(rng, config), jax.random.key(0))
  assert t5.param_count(shapes) == count


def test_params_layout():
  config, params = _model('tiny-t5x')
  layer = params['decoder']['layers_1']
  assert set(layer) == {
    'pre_self_attention_layer_norm',
    'self_attention',
    'pre_cross_attention_layer_norm',
    'encoder_decoder_attention',
    'pre_mlp_layer_norm',
    'mlp',
  }
  assert layer['self_attention']['query']['kernel'].shape == (8, 12)
  assert layer['encoder_decoder_attention']['out']['kernel'].shape == (12, 8)
  assert set(layer['mlp']) == {'wi_0', 'wi_1', 'wo'}
  assert params['encoder']['relpos_bias']['rel_embedding'].shape == (4, 32)
  assert params['decoder']['logits_dense']['kernel'].shape == (8, 32128)
  _, tied = _model('tiny-v1.0')
  assert 'logits_dense' not in tied['decoder']
  assert set(tied['encoder']['layers_0']['mlp']) == {'wi', 'wo'}


@pytest.mark.parametrize(
  'kwargs',
  [
    dict(feed_forward='gelu'),
    dict(dtype='float16'),
    dict(d_model=0),
    dict(num_heads=2.0),
    dict(relative_attention_num_buckets=2),
    dict(relative_attention_max_distance=16),
    dict(eos_token_id=32128),
    dict(layer_norm_epsilon=0.0),
    dict(block_attention='full'),
    dict(feature_layers=(0,)),  # no feature_dim
    dict(feature_dim=96, feature_layers=(0, 0)),
    dict(feature_dim=96, feature_layers=(0, -1)),
    dict(feature_dim=97, feature_layers=(0, 1)),  # not 2 x a width
    dict(feature_dim=64, feature_layers=()),
  ],
)
def test_config_validation(kwargs):
  with pytest.raises(ValueError):
    t5.T5Config(**kwargs)


def test_config_is_hashable_and_model_is_a_pytree():
  config, params = _model('tiny-v1.0')
  assert hash(config) == hash(dataclasses.replace(config))
  model = t5.T5Model(config=config, params=params)
  assert jax.tree.structure(model.params) == jax.tree.structure(params)
  assert len(jax.tree.leaves(model)) == len(jax.tree.leaves(params))
  doubled = jax.jit(lambda m: jax.tree.map(lambda x: 2 * x, m))(model)
  assert doubled.config == config


def test_decode_rejects_a_chunk_longer_than_the_cache():
  config, params = _model('tiny-v1.0')
  ids, mask = _source(config)
  cache = _prefill(params, ids, mask, config=config)
  with pytest.raises(ValueError, match='slots'):
    t5.decode(params, jnp.zeros((3, _MAX_DECODE_LEN + 1), jnp.int32), cache, config=config)


def test_shift_right():
  targets = jnp.array([[5, 6, 7], [8, 1, 0]])
  np.testing.assert_array_equal(t5.shift_right(targets, 0), [[0, 5, 6], [0, 8, 1]])


def test_dropper_zeroes_a_fraction_and_rescales_the_rest():
  x = jnp.ones((200, 500))
  y = np.asarray(t5_dropout.dropper((jax.random.key(0), 0.3), stream=0)(x, 1))
  assert abs((y == 0).mean() - 0.3) < 0.01
  np.testing.assert_allclose(y[y != 0], 1 / 0.7, rtol=1e-6)
  assert t5_dropout.dropper(None, stream=0)(x, 1) is x
  with pytest.raises(ValueError, match=r'dropout rate must be in \[0, 1\), got 1.0'):
    t5_dropout.dropper((jax.random.key(0), 1.0), stream=0)


def test_forward_dropout_is_off_at_rate_0_and_keyed_otherwise():
  config, params = _model('tiny-v1.1')
  ids = jnp.array([[5, 6, 7, 1], [8, 9, 1, 0]])
  mask, dec = ids > 0, jnp.array([[0, 3, 4], [0, 5, 6]])
  forward = functools.partial(t5.forward, params, ids, mask, dec, config=config)
  plain = jax.jit(forward)()
  # Jitted, one program per rate (the rate is checked in Python, so it is not an argument).
  run = {rate: jax.jit(lambda key, rate=rate: forward(dropout=(key, rate))) for rate in (0.0, 0.2)}
  np.testing.assert_array_equal(run[0.0](jax.random.key(0)), plain)
  a, b = run[0.2](jax.random.key(0)), run[0.2](jax.random.key(1))
  np.testing.assert_array_equal(run[0.2](jax.random.key(0)), a)
  assert not np.allclose(a, plain, atol=1e-3) and not np.allclose(a, b, atol=1e-3)


@pytest.mark.slow  # ~35 CPU-s; the EAGLE drafter's decode loop tests (decode_test) run by default
def test_feature_reading_decoder_chunks_match_teacher_forcing():
  """An EAGLE-style decoder (feature_dim): chunked incremental decoding with per-position
  features gives the teacher-forced states, logits and predicted features; different features
  give different logits (they are read); it refuses to run without them."""
  model = helpers.tiny_t5('tiny-v1.1', seed=3, feature_dim=12)
  config, params = model.config, model.params
  ids, mask = _source(config)
  dec = _targets(config)
  features = jax.random.normal(jax.random.key(4), dec.shape + (12,))
  encoded = helpers.encode(params, ids, mask, config=config)
  states = t5.decoder_states(params, encoded, mask, dec, config=config, features=features)
  cache = t5.init_cache(params, encoded, mask, config=config, max_decode_len=_MAX_DECODE_LEN)
  got_logits, got_states = [], []
  for start, stop in [(0, 5), (5, 6), (6, 16)]:
    logits, chunk_states, cache = t5.decode(
      params,
      dec[:, start:stop],
      cache,
      config=config,
      features=features[:, start:stop],
      return_states=True,
    )
    got_logits.append(logits)
    got_states.append(chunk_states)
  np.testing.assert_allclose(jnp.concatenate(got_states, 1), states, atol=1e-5)
  np.testing.assert_allclose(
    jnp.concatenate(got_logits, 1), t5.output_logits(params, states, config=config), atol=1e-5
  )
  assert t5.predicted_features(params, states, config=config).shape == features.shape
  other = t5.decoder_states(params, encoded, mask, dec, config=config, features=features * 0)
  assert not np.allclose(other, states, atol=1e-3)
  with pytest.raises(ValueError, match='features must be given exactly when'):
    t5.decoder_states(params, encoded, mask, dec, config=config)
  np.testing.assert_array_equal(t5.shift_states(features)[:, 1:], features[:, :-1])
  np.testing.assert_array_equal(t5.shift_states(features)[:, 0], 0)


@pytest.mark.parametrize('feature_dim', [None, 12])
def test_step_at_scores_one_position_per_row(feature_dim):
  """`T5Steps.step_at` (the draft's first call) gives `step`'s logits (and predicted features) at
  tokens[b, logits_at[b]] of each row and the same cache; a wrong position's logits differ from
  them."""
  model = helpers.tiny_t5('tiny-v1.0', seed=2, feature_dim=feature_dim)  # v1.0: a tied output
  config, params, steps = model.config, model.params, model.steps
  ids, mask = _source(config)
  cache = _prefill(params, ids, mask, config=config).replace(end_index=jnp.array([3, 0, 5]))
  tokens = _targets(config)[:, :2]
  features = None
  if feature_dim:
    features = jax.random.normal(jax.random.key(1), tokens.shape + (feature_dim,))
    full, predicted, full_cache = steps.step_features(params, tokens, features, cache)
  else:
    (full, full_cache), predicted = steps.step(params, tokens, cache), None
  logits_at = jnp.array([1, 0, 1])
  logits, got_predicted, got_cache = steps.step_at(params, tokens, features, cache, logits_at)
  assert logits.shape == (3, 1, config.vocab_size)
  pick = lambda x: np.take_along_axis(np.asarray(x), np.asarray(logits_at)[:, None, None], axis=1)
  np.testing.assert_allclose(logits, pick(full), atol=1e-5, rtol=0)
  assert np.abs(np.asarray(logits) - pick(full[:, ::-1])).max() > 1e-2  # the other position's
  if feature_dim:
    np.testing.assert_allclose(got_predicted, pick(predicted), atol=1e-5, rtol=0)
  else:
    assert got_predicted is None
  for got, want in zip(jax.tree.leaves(got_cache), jax.tree.leaves(full_cache)):
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)


def test_tapped_layers_incremental_match_teacher_forcing():
  """`T5Steps.tap_states`: step_states gives the normed outputs of the tapped decoder layers,
  concatenated, chunk by chunk as teacher forcing (`decoder_states(state_layers=)`) gives them;
  tapping the last layer gives the final states; logits are the untapped step's."""
  config, params = _model('tiny-v1.1')  # 3 decoder layers
  ids, mask = _source(config)
  dec = _targets(config)[:, :7]
  encoded = t5.encode(params, ids, mask, config=config)
  final, tapped = t5.decoder_states(params, encoded, mask, dec, config=config, state_layers=(2, 0))
  assert tapped.shape == (3, 7, 2 * config.d_model)
  np.testing.assert_allclose(tapped[..., : config.d_model], final, atol=1e-6)  # layer 2: the last
  assert not np.allclose(tapped[..., config.d_model :], final, atol=1e-3)  # layer 0 is not
  steps = t5.T5Steps(config).tap_states((2, 0))
  assert steps.state_dim == 2 * config.d_model
  cache = _prefill(params, ids, mask, config=config)
  plain_cache = cache
  got = []
  for lo, hi in ((0, 6), (6, 7)):  # a chunk, then one token
    logits, states, cache = steps.step_states(params, dec[:, lo:hi], cache)
    plain, plain_cache = t5.T5Steps(config).step(params, dec[:, lo:hi], plain_cache)
    np.testing.assert_allclose(logits, plain, atol=1e-5)
    got.append(states)
  np.testing.assert_allclose(jnp.concatenate(got, 1), tapped, atol=1e-5)
  with pytest.raises(ValueError, match=r'decoder layers \(0, 3\) .* the target has 3'):
    t5.T5Steps(config).tap_states((0, 3))


def test_a_tied_output_layer_reads_a_transposed_copy_on_a_cpu():
  # XLA:CPU's dot on the embedding read transposed ([V, D] contracted on D) is many times slower
  # from two rows on than the same dot on a [D, V] kernel (docs/performance.md, "Few-row dots"):
  # on a CPU the compiled dot contracts the kernel's first dimension; a TPU's program keeps the
  # free transposed read (no barrier); the logits are the plain einsum's.
  config = t5.T5Config(
    vocab_size=256, d_model=32, d_kv=8, d_ff=64, num_heads=4, num_encoder_layers=1,
    num_decoder_layers=1, tie_word_embeddings=True,
  )  # fmt: skip
  embedding = jax.random.normal(jax.random.key(0), (256, 32))
  params = {'token_embedder': {'embedding': embedding}}
  y = jax.random.normal(jax.random.key(1), (1, 4, 32))
  plain = jax.jit(lambda y, e: jnp.einsum('btd,vd->btv', y * 32**-0.5, e))
  ours = jax.jit(lambda p, y: t5_layers.logits(p, y, config))

  def contracted(compiled: str) -> list[str]:  # the rhs dimension each dot contracts
    return re.findall(r' dot\(.*?rhs_contracting_dims=\{(\d)\}', compiled)

  assert contracted(plain.lower(y, embedding).compile().as_text()) == ['1']  # the slow read
  assert contracted(ours.lower(params, y).compile().as_text()) == ['0']
  tpu = ours.trace(params, y).lower(lowering_platforms=('tpu',)).as_text()
  assert 'optimization_barrier' not in tpu
  np.testing.assert_allclose(ours(params, y), plain(y, embedding), rtol=1e-6, atol=1e-6)
