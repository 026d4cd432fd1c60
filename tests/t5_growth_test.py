"""Growing a T5 keeps its function exactly: same logits from a wider, deeper model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax.models import t5, t5_growth
from tests import helpers


def _logits(model, ids, mask, dec):
  return helpers.forward(model.params, ids, mask, dec, config=model.config)


SMALL = dataclasses.replace(
  t5.CONFIGS['tiny-v1.1'], d_model=16, d_kv=8, num_heads=2, d_ff=32, num_encoder_layers=2,
  num_decoder_layers=2,
)  # fmt: skip
GROWN = dataclasses.replace(
  SMALL, d_model=32, num_heads=3, d_ff=48, num_encoder_layers=3, num_decoder_layers=5
)


def _batch():
  rng = np.random.default_rng(0)
  mask = np.arange(7)[None] < np.array([7, 4])[:, None]
  ids = (rng.integers(2, SMALL.vocab_size, (2, 7)) * mask).astype(np.int32)
  dec = rng.integers(2, SMALL.vocab_size, (2, 6)).astype(np.int32)
  return ids, mask, dec


@pytest.mark.parametrize(
  'grown',
  [
    pytest.param(GROWN, marks=pytest.mark.slow),  # wider and deeper: ~30 CPU-s
    dataclasses.replace(SMALL, num_decoder_layers=4),
  ],
)
def test_grown_model_computes_the_same_logits(grown):
  small = helpers.tiny_t5(SMALL)
  # Non-trivial weights: a trained model's norm scales and position tables are not the init's.
  small = dataclasses.replace(
    small,
    params=jax.tree.map(
      lambda x: x * (1 + 0.3 * jnp.sin(jnp.arange(x.size).reshape(x.shape))), small.params
    ),
  )
  big = t5_growth.grow(small, grown, jax.random.key(1))
  assert big.config == grown
  shapes = jax.tree.map(jnp.shape, t5.init_params(jax.random.key(0), grown))
  assert jax.tree.map(jnp.shape, big.params) == shapes
  ids, mask, dec = _batch()
  want = _logits(small, ids, mask, dec)
  np.testing.assert_allclose(_logits(big, ids, mask, dec), want, rtol=1e-4, atol=1e-4)
  # The copies of a read kernel differ (zero-sum noise), so training can tell them apart.
  if grown.d_model > SMALL.d_model:
    q = big.params['decoder']['layers_0']['self_attention']['query']['kernel']
    assert not np.allclose(q[: SMALL.d_model], q[SMALL.d_model :])


def test_growth_without_dividing_the_read_rows_changes_the_function():
  # Negative control: copying read rows instead of splitting them doubles every pre-activation.
  small = helpers.tiny_t5(SMALL)
  big = t5_growth.grow(small, GROWN, jax.random.key(1), noise=0.0)
  d = SMALL.d_model
  doubled = jax.tree_util.tree_map_with_path(
    lambda path, x: x * 2
    if x.ndim == 2 and x.shape[0] == 2 * d and 'embedding' not in str(path)
    else x,
    big.params,
  )
  ids, mask, dec = _batch()
  got = _logits(dataclasses.replace(big, params=doubled), ids, mask, dec)
  assert not np.allclose(got, _logits(small, ids, mask, dec), atol=1e-2)


def test_growth_rejects_what_it_cannot_do_exactly():
  small = helpers.tiny_t5(SMALL)
  with pytest.raises(ValueError, match='d_model 24 is not a multiple of 16.*d_kv differs'):
    t5_growth.grow(small, dataclasses.replace(SMALL, d_model=24, d_kv=4), jax.random.key(0))
  with pytest.raises(ValueError, match=r'num_decoder_layers shrinks \(2 -> 1\)'):
    t5_growth.grow(small, dataclasses.replace(SMALL, num_decoder_layers=1), jax.random.key(0))


DRAFTER = dataclasses.replace(
  SMALL, d_model=8, d_kv=4, num_encoder_layers=0, num_decoder_layers=1, encoder_dim=SMALL.d_model,
  tie_word_embeddings=True,
)  # fmt: skip


@pytest.mark.parametrize('follow', [True, False])
def test_a_drafter_follows_its_grown_target_encoder(follow):
  # A decoder over the target's encoder reads the grown target's encoder output (each dimension
  # copied) as it read the old one; without following (rows copied, not divided: the negative
  # control) its logits change.
  target, drafter = helpers.tiny_t5(SMALL), helpers.tiny_t5(DRAFTER, seed=2)
  big = t5_growth.grow(target, GROWN, jax.random.key(1))
  ids, mask, dec = _batch()
  old = helpers.encode(target.params, ids, mask, config=target.config)
  new = helpers.encode(big.params, ids, mask, config=big.config)
  want = helpers.decode_forward(drafter.params, old, mask, dec, config=DRAFTER)
  if follow:
    moved = t5_growth.follow_grown_encoder(drafter, GROWN.d_model, jax.random.key(3))
  else:
    k = GROWN.d_model // SMALL.d_model
    moved = dataclasses.replace(
      drafter,
      config=dataclasses.replace(DRAFTER, encoder_dim=GROWN.d_model),
      params=jax.tree_util.tree_map_with_path(
        lambda path, x: jnp.tile(x, (k, 1)) if 'encoder_decoder' in str(path) and
        x.shape[0] == SMALL.d_model else x, drafter.params,
      ),
    )  # fmt: skip
  assert moved.config.encoder_dim == GROWN.d_model
  got = helpers.decode_forward(moved.params, new, mask, dec, config=moved.config)
  assert np.allclose(got, want, rtol=1e-4, atol=1e-4) == follow


@pytest.mark.parametrize('follow', [True, False])
def test_a_state_reader_follows_its_grown_target_states(follow):
  # The grown target's final decoder states are the old ones with each dimension copied k times
  # (as its encoder output is); a drafter reading them (EAGLE-style, here with a state predictor)
  # that follows both reads the grown target as it read the old one. Negative control: the
  # feature input's rows copied, not divided.
  target = helpers.tiny_t5(SMALL)
  big = t5_growth.grow(target, GROWN, jax.random.key(1))
  ids, mask, dec = _batch()
  small_encoded = helpers.encode(target.params, ids, mask, config=SMALL)
  big_encoded = helpers.encode(big.params, ids, mask, config=GROWN)
  old = t5.decoder_states(target.params, small_encoded, mask, dec, config=SMALL)
  new = t5.decoder_states(big.params, big_encoded, mask, dec, config=GROWN)
  k = GROWN.d_model // SMALL.d_model
  np.testing.assert_allclose(new, jnp.tile(old, (1, 1, k)), rtol=1e-4, atol=1e-5)

  drafter = t5_growth.add_feature_input(
    helpers.tiny_t5(DRAFTER, seed=2), SMALL.d_model, jax.random.key(4)
  )
  drafter = drafter.replace(
    params=jax.tree.map(lambda x: x + 0.1 * jnp.ones_like(x), drafter.params)
  )  # feature_in != 0

  def run(model, encoded, states):
    out = t5.decoder_states(model.params, encoded, mask, dec, config=model.config, features=states)
    return t5.output_logits(model.params, out, config=model.config), t5.predicted_features(
      model.params, out, config=model.config
    )

  want_logits, want_features = run(drafter, small_encoded, old)
  moved = t5_growth.follow_grown_encoder(drafter, GROWN.d_model, jax.random.key(3))
  if follow:
    moved = t5_growth.follow_grown_states(moved, GROWN.d_model, jax.random.key(5))
  else:
    decoder = dict(
      moved.params['decoder'],
      feature_in={'kernel': jnp.tile(moved.params['decoder']['feature_in']['kernel'], (k, 1))},
    )
    moved = t5.T5Model(
      config=dataclasses.replace(moved.config, feature_dim=GROWN.d_model),
      params={**moved.params, 'decoder': decoder},
    )
  got_logits, got_features = run(moved, big_encoded, new)
  assert moved.config.feature_dim == GROWN.d_model
  assert np.allclose(got_logits, want_logits, rtol=1e-3, atol=1e-3) == follow
  if follow:  # the state predictor predicts the grown target's (copied) states
    np.testing.assert_allclose(
      got_features, jnp.tile(want_features, (1, 1, k)), rtol=1e-4, atol=1e-4
    )
  with pytest.raises(ValueError, match='feature_dim None -> 32'):
    t5_growth.follow_grown_states(helpers.tiny_t5(DRAFTER), GROWN.d_model, jax.random.key(0))
  taps = dataclasses.replace(drafter.config, feature_dim=2 * drafter.config.feature_dim,
                             feature_layers=(0, 1))  # fmt: skip
  with pytest.raises(ValueError, match=r'reads several .*feature_layers \(0, 1\)'):
    t5_growth.follow_grown_states(helpers.tiny_t5(taps), 2 * GROWN.d_model, jax.random.key(0))


def test_follow_grown_encoder_rejects_a_model_with_its_own_encoder():
  with pytest.raises(ValueError, match=r'num_encoder_layers=2, encoder_dim None -> 32'):
    t5_growth.follow_grown_encoder(helpers.tiny_t5(SMALL), 32, jax.random.key(0))
  with pytest.raises(ValueError, match=r'encoder_dim 16 -> 24'):
    t5_growth.follow_grown_encoder(helpers.tiny_t5(DRAFTER), 24, jax.random.key(0))


@pytest.mark.parametrize('identity', [True, False])
def test_a_tied_drafter_over_the_target_encoder_grows_deeper(identity):
  # A distilled drafter (tied output layer, no encoder of its own) gains decoder layers, heads
  # and d_ff and computes the same logits. Negative control: a new layer that writes to the
  # residual stream (its `out` / `wo` not zeroed) changes them.
  drafter = helpers.tiny_t5(DRAFTER, seed=2)
  deeper = dataclasses.replace(DRAFTER, num_decoder_layers=3, num_heads=3, d_ff=48)
  big = t5_growth.grow(drafter, deeper, jax.random.key(1))
  assert jax.tree.map(jnp.shape, big.params) == jax.tree.map(
    jnp.shape, t5.init_params(jax.random.key(0), deeper)
  )
  if not identity:
    fresh = t5.init_params(jax.random.key(5), deeper)['decoder']['layers_1']
    big.params['decoder']['layers_1'] = fresh
  ids, mask, dec = _batch()
  encoded = helpers.encode(helpers.tiny_t5(SMALL).params, ids, mask, config=SMALL)
  want = helpers.decode_forward(drafter.params, encoded, mask, dec, config=DRAFTER)
  got = helpers.decode_forward(big.params, encoded, mask, dec, config=deeper)
  assert np.allclose(got, want, rtol=1e-4, atol=1e-4) == identity


def test_a_tied_drafter_does_not_grow_wider():
  with pytest.raises(ValueError, match='wider d_model with tied word embeddings'):
    t5_growth.grow(
      helpers.tiny_t5(DRAFTER), dataclasses.replace(DRAFTER, d_model=16), jax.random.key(0)
    )
  with pytest.raises(ValueError, match="encoder added to a decoder over another model's encoder"):
    t5_growth.grow(
      helpers.tiny_t5(DRAFTER),
      dataclasses.replace(DRAFTER, num_encoder_layers=1),
      jax.random.key(0),
    )


def test_add_feature_input_keeps_the_function():
  """Made EAGLE-style, a decoder computes what it computed, whatever the features it reads."""
  small = helpers.tiny_t5(SMALL)
  eagle = t5_growth.add_feature_input(small, 10, jax.random.key(2))
  assert eagle.config == dataclasses.replace(SMALL, feature_dim=10)
  ids, mask, dec = _batch()
  encoded = helpers.encode(small.params, ids, mask, config=SMALL)
  features = jax.random.normal(jax.random.key(3), dec.shape + (10,))
  states = t5.decoder_states(
    eagle.params, encoded, mask, dec, config=eagle.config, features=features
  )
  want = _logits(small, ids, mask, dec)
  got = t5.output_logits(eagle.params, states, config=eagle.config)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='already reads features'):
    t5_growth.add_feature_input(eagle, 10, jax.random.key(2))


# --- The shipped 48M target grown, as the main job grows it (`pretrained.grow_pair`). ---------


def _shipped_batch(pair, n: int):
  sources = [s for s, _ in pair.test_pairs()[:n]]
  return pair.tokenizer.encode_batch(sources, 64, truncate=True)


@pytest.mark.slow  # 110 s under load
@helpers.needs_pair('ende48m')
def test_the_grown_shipped_target_keeps_its_logits_and_greedy_outputs():
  """ende48m's target twice as wide (d_model 1024) and deeper, built by the jitted `grow_placed`
  in float32: the logits on shipped test sentences within float tolerance, and
  the same greedy outputs (the 733M t5_1_1-large build is the main job's `:large`)."""
  from specdec_jax import decode, pretrained
  from specdec_jax.sampling import SamplingConfig

  pair = pretrained.load('ende48m')
  small = pair.target
  grown = dataclasses.replace(
    small.config, d_model=1024, num_heads=9, d_ff=1100, num_encoder_layers=5, num_decoder_layers=9
  )
  big = t5_growth.grow_placed(small, grown, jax.random.key(1))
  assert big.config == grown and big.rules == small.rules
  ids, mask = _shipped_batch(pair, 3)
  dec = np.asarray(ids)[:, :12]
  want = _logits(small, ids, mask, dec)
  np.testing.assert_allclose(_logits(big, ids, mask, dec), want, rtol=2e-4, atol=2e-4)
  options = dict(sampling=SamplingConfig(), max_new_tokens=24, rng=jax.random.key(0))
  outs = [decode.to_host(decode.generate(m, ids, mask, **options)) for m in (small, big)]
  np.testing.assert_array_equal(outs[1].lengths, outs[0].lengths)
  np.testing.assert_array_equal(outs[1].tokens, outs[0].tokens)


def test_grown_config_names_the_shapes_a_model_reaches():
  target = dataclasses.replace(
    t5.CONFIGS['t5_1_1-small'], vocab_size=8000, d_ff=1024, num_heads=8, **dict.fromkeys(
      ('num_encoder_layers',), 4), num_decoder_layers=8,
  )  # fmt: skip
  xxl = t5_growth.grown_config(target, 't5_1_1-xxl')
  assert (xxl.d_model, xxl.num_heads, xxl.d_ff, xxl.num_decoder_layers) == (4096, 64, 10240, 24)
  assert xxl.vocab_size == 8000 and xxl.max_source_length == target.max_source_length
  assert set(t5_growth.reachable(target)) >= {'t5_1_1-large', 't5_1_1-xl', 't5_1_1-xxl'}
  # 768 is not a multiple of 512; t5-11b's heads are 128 wide.
  with pytest.raises(ValueError, match=r'd_model 768 is not a multiple of 512.*grows to: t5-large'):
    t5_growth.grown_config(target, 't5_1_1-base')
  with pytest.raises(ValueError, match='d_kv differs'):
    t5_growth.grown_config(target, 't5-11b')
  with pytest.raises(ValueError, match="Unknown T5 shape 'xxl'"):
    t5_growth.grown_config(target, 'xxl')


def test_grow_placed_casts_and_places_on_a_mesh():
  """On a (1-device) mesh in bfloat16: every param where `sharding.param_shardings` puts it, in
  bfloat16, with the values of `grow`'s float32 params (the same key, the same program)."""
  from specdec_jax import sharding

  small, wider = helpers.tiny_t5(SMALL), dataclasses.replace(SMALL, d_model=32)
  mesh = sharding.make_mesh(1, 1)
  big = t5_growth.grow_placed(small, wider, jax.random.key(1), mesh=mesh, param_dtype='bfloat16')
  want = t5_growth.grow(small, wider, jax.random.key(1)).params
  placed = sharding.param_shardings(big.params, mesh)
  for got, ref, where in zip(*map(jax.tree.leaves, (big.params, want, placed))):
    assert got.dtype == jnp.bfloat16 and got.sharding == where
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=1e-2, atol=1e-2)


def test_a_drafter_beside_a_target_of_another_encoder_width_fails_before_any_work():
  """One ValueError naming both widths, from the loop's checks and the pair's, before a cache is
  built; after `follow_grown_encoder` the pair decodes."""
  from specdec_jax import decode, pretrained, step_models
  from specdec_jax.sampling import SamplingConfig

  target, drafter = helpers.tiny_t5(SMALL), helpers.tiny_t5(DRAFTER, seed=2)
  big = t5_growth.grow(target, GROWN, jax.random.key(1))
  ids, mask, _ = _batch()
  options = dict(gamma=2, sampling=SamplingConfig(), max_new_tokens=4, rng=jax.random.key(0))
  match = r'encoder_dim=16, but the target.s encoder gives width 32'
  with pytest.raises(ValueError, match=match):
    decode.speculative_generate(big, drafter, ids, mask, **options)
  with pytest.raises(ValueError, match=match):
    step_models.encoder_of(step_models.as_step_model(drafter), step_models.as_step_model(big))
  with pytest.raises(ValueError, match="Drafter 'distilled': .*" + match):
    pretrained.check_pair(big, {'distilled': drafter})
  moved = t5_growth.follow_grown_encoder(drafter, GROWN.d_model, jax.random.key(3))
  step_models.check_encoder_reader(moved.steps, big.steps)


@pytest.mark.parametrize('layer', [1, 0])
def test_a_drafter_from_the_target_starts_as_its_layers_on_the_tokens(layer):
  # EAGLE's construction (t5_growth.drafter_from_target): the target's embeddings, one of its
  # decoder layers, final norm and output layer, reading its states through a zero projection,
  # computes what a one-layer target of that layer computes, whatever the states. Negative
  # control: the other layer of the target is not the same function.
  target = helpers.tiny_t5(SMALL)
  config = dataclasses.replace(
    SMALL, num_encoder_layers=0, num_decoder_layers=1, encoder_dim=16, feature_dim=16
  )
  drafter = t5_growth.drafter_from_target(target, config, (layer,), jax.random.key(1))
  assert jax.tree.map(jnp.shape, drafter.params) == jax.tree.map(
    jnp.shape, t5.init_params(jax.random.key(0), config)
  )
  ids, mask, dec = _batch()
  encoded = helpers.encode(target.params, ids, mask, config=SMALL)
  states = jax.random.normal(jax.random.key(3), dec.shape + (16,))
  out = t5.decoder_states(drafter.params, encoded, mask, dec, config=config, features=states)
  got = t5.output_logits(drafter.params, out, config=config)
  one_layer = dataclasses.replace(SMALL, num_decoder_layers=1)
  decoder = {k: v for k, v in target.params['decoder'].items() if k != 'layers_1'}
  want = helpers.decode_forward({**target.params, 'decoder': decoder}, encoded, mask, dec,
                                config=one_layer)  # fmt: skip
  assert np.allclose(got, want, rtol=1e-4, atol=1e-4) == (layer == 0)
  block = t5_growth.drafter_from_target(
    target, dataclasses.replace(config, block_size=4), (layer,), jax.random.key(1)
  )
  assert block.params['decoder']['block_queries']['embedding'].shape == (3, 16)
  assert 'feature_out' not in block.params['decoder']


def test_a_drafter_from_the_target_must_have_its_shape():
  target = helpers.tiny_t5(SMALL)
  config = dataclasses.replace(
    SMALL, num_encoder_layers=0, num_decoder_layers=1, encoder_dim=16, feature_dim=16
  )
  with pytest.raises(ValueError, match=r'd_model 32 \(the target: 16\)'):
    t5_growth.drafter_from_target(
      target, dataclasses.replace(config, d_model=32), (0,), jax.random.key(0)
    )
  with pytest.raises(ValueError, match=r"layers \(0, 2\): 1 of the target's decoder layers 0..1"):
    t5_growth.drafter_from_target(target, config, (0, 2), jax.random.key(0))
  with pytest.raises(ValueError, match=r"feature_dim None \(it reads the target's states"):
    t5_growth.drafter_from_target(
      target, dataclasses.replace(config, feature_dim=None), (0,), jax.random.key(0)
    )
  with pytest.raises(ValueError, match=r'num_encoder_layers 2, encoder_dim None'):
    t5_growth.drafter_from_target(
      target, dataclasses.replace(SMALL, feature_dim=16), (0, 1), jax.random.key(0)
    )
