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
