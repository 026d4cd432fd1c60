"""Tests of models/t5_fused.py: the fused decoder layout computes the T5X layout's function from
fewer dots, round-trips exactly, decodes the same greedy tokens (on one device and sharded over a
simulated 2x4 mesh, where each device holds the same heads' q, k and v), and is written to
checkpoints in the T5X layout."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints, decode, sharding
from specdec_jax.models import t5, t5_fused
from specdec_jax.sampling import SamplingConfig
from tests import helpers

_forward = jax.jit(t5.forward, static_argnames=('config',))
_GREEDY = dict(sampling=SamplingConfig(temperature=0.0), max_new_tokens=12, rng=None)


def _batch(config, seed=0):
  """A padded source batch [3, 9] and teacher-forced decoder inputs [3, 16]."""
  rng = np.random.default_rng(seed)
  mask = np.arange(9)[None] < np.asarray([9, 4, 6])[:, None]
  ids = rng.integers(2, config.vocab_size, size=mask.shape) * mask
  dec = rng.integers(2, config.vocab_size, size=(3, 16))
  dec[:, 0] = config.decoder_start_token_id
  return jnp.asarray(ids, jnp.int32), jnp.asarray(mask), jnp.asarray(dec, jnp.int32)


def _dots(model, *args) -> int:
  compiled = _forward.lower(model.params, *args, config=model.config).compile().as_text()
  return len(re.findall(r' dot\(', compiled))


@pytest.mark.parametrize('name', ['tiny-v1.1', 'tiny-v1.0'])
def test_the_fused_layout_gives_the_same_logits_from_fewer_dots(name):
  # One [D, 3, N H] dot for q/k/v and one [D, 2, F] for a gated MLP's wi_0 / wi_1, per decoder
  # layer. Control: the kernels stacked in the wrong order (key first) give other logits, so the
  # comparison can fail.
  model = helpers.tiny_t5(name)
  fused = t5_fused.fuse_projections(model)
  config, args = model.config, _batch(model.config)
  want = _forward(model.params, *args, config=config)
  np.testing.assert_allclose(_forward(fused.params, *args, config=config), want, atol=2e-5)

  gated = config.feed_forward == 'gated-gelu'
  assert _dots(model, *args) - _dots(fused, *args) == config.num_decoder_layers * (2 + gated)
  layer = fused.params['decoder']['layers_0']
  assert layer['self_attention']['qkv']['kernel'].shape == (32, 3, 32)
  assert ('wi_fused' in layer['mlp']) == gated and 'query' not in layer['self_attention']
  assert 'query' in model.params['decoder']['layers_0']['self_attention']  # the input kept

  swapped = jax.tree.map(lambda x: x, fused.params)
  for i in range(config.num_decoder_layers):
    qkv = swapped['decoder'][f'layers_{i}']['self_attention']['qkv']
    qkv['kernel'] = qkv['kernel'][:, jnp.array([1, 0, 2])]
  wrong = _forward(swapped, *args, config=config)
  assert np.abs(np.asarray(wrong) - np.asarray(want)).max() > 1e-2


def test_fusing_round_trips_exactly_and_checkpoints_keep_the_t5x_layout(tmp_path):
  model = helpers.tiny_t5('tiny-v1.1')
  fused = t5_fused.fuse_projections(model)
  assert t5_fused.is_fused(fused.params) and not t5_fused.is_fused(model.params)
  assert t5_fused.fuse_projections(fused) is fused  # already fused: as it is
  back = t5_fused.unfuse_projections(fused)
  assert jax.tree.structure(back.params) == jax.tree.structure(model.params)
  jax.tree.map(np.testing.assert_array_equal, back.params, model.params)
  # Abstract params: the same layout by `jax.eval_shape`; the sharding rules name both kernels.
  shapes = jax.eval_shape(t5_fused.fused_params, model.params)
  assert jax.tree.map(lambda s: s.shape, shapes) == jax.tree.map(jnp.shape, fused.params)
  axes = sharding.param_logical_axes(shapes)['decoder']['layers_0']
  assert tuple(axes['self_attention']['qkv']['kernel']) == ('embed', 'fused', 'joined_kv')
  assert tuple(axes['mlp']['wi_fused']['kernel']) == ('embed', 'fused', 'mlp')

  checkpoints.save(fused, tmp_path / 'orbax')
  restored = checkpoints.restore(tmp_path / 'orbax')
  jax.tree.map(np.testing.assert_array_equal, restored.params, model.params)


def test_a_fused_pair_decodes_greedy_as_the_t5x_layout():
  # Speculative decoding with a fused target (and a fused drafter) keeps generate's tokens.
  target = helpers.tiny_t5('tiny-v1.1')
  drafter = helpers.tiny_t5('tiny-v1.1', seed=1)
  ids, mask, _ = _batch(target.config)
  want = decode.generate(target, ids, mask, **_GREEDY).tokens
  fused_target = t5_fused.fuse_projections(target)
  out = decode.speculative_generate(
    fused_target, t5_fused.fuse_projections(drafter), ids, mask, gamma=3, **_GREEDY
  )
  np.testing.assert_array_equal(out.tokens, want)
  np.testing.assert_array_equal(decode.generate(fused_target, ids, mask, **_GREEDY).tokens, want)


# On a (data=2, model=4) mesh of 8 CPU devices: the target sharded by the default rules and
# fused keeps its placement (qkv [D, 3, N H] split on N H: each device holds the same heads' q, k
# and v, the slices the T5X kernels' shards hold); the drafter, replicated, stays whole on every
# device. Greedy speculative and autoregressive decoding on the mesh give the one-device T5X
# tokens. Control: the old flat [D, 3 N H] layout split the same way puts other heads' columns on
# a device, which the check of the shards catches.
_MESH_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from specdec_jax import decode, sharding
from specdec_jax.models import t5_fused
from specdec_jax.sampling import SamplingConfig
from tests import helpers

assert jax.device_count() == 8, jax.devices()
mesh = sharding.make_mesh(data=2, model=4)
target, drafter = helpers.tiny_t5('tiny-v1.1'), helpers.tiny_t5('tiny-v1.0', seed=1)
rng = np.random.default_rng(0)
ids = jnp.asarray(rng.integers(2, 128, size=(4, 7)), jnp.int32)
mask = jnp.ones_like(ids, bool)
kw = dict(sampling=SamplingConfig(temperature=0.0), max_new_tokens=10, rng=None)
want = decode.generate(target, ids, mask, **kw).tokens

placed = target.replace(params=jax.device_put(target.params, sharding.param_shardings(target.params, mesh)))
rules = sharding.REPLICATED_RULES
whole = drafter.replace(rules=rules, params=jax.device_put(drafter.params, sharding.param_shardings(drafter.params, mesh, rules)))
fused, fused_drafter = t5_fused.fuse_projections(placed), t5_fused.fuse_projections(whole)

def same_heads(shards, parts):
  # Each device's [D, K, w] block holds, at k, its columns of the k-th T5X kernel.
  return all(
    np.array_equal(data[:, k], np.asarray(part)[:, cols])
    for data, cols in shards for k, part in enumerate(parts)
  )

stacked = lambda kernel: [(np.asarray(s.data), s.index[-1]) for s in kernel.addressable_shards]
layer, plain = fused.params['decoder']['layers_1'], target.params['decoder']['layers_1']
qkv = layer['self_attention']['qkv']['kernel']
assert qkv.sharding.spec == P(None, None, 'model'), qkv.sharding
parts = [plain['self_attention'][n]['kernel'] for n in ('query', 'key', 'value')]
assert same_heads(stacked(qkv), parts)
wi = layer['mlp']['wi_fused']['kernel']
assert wi.sharding.spec == P(None, None, 'model'), wi.sharding
assert same_heads(stacked(wi), [plain['mlp'][n]['kernel'] for n in ('wi_0', 'wi_1')])
q = fused_drafter.params['decoder']['layers_0']['self_attention']['qkv']['kernel']
assert q.sharding.is_fully_replicated, q.sharding
# Control: the flat [D, 3 N H] layout split over 'model' holds other columns on a device.
flat = jax.device_put(jnp.concatenate(parts, axis=1), NamedSharding(mesh, P(None, 'model')))
blocks = [(np.asarray(s.data).reshape(32, 3, 8), slice(s.index[-1].start // 3, s.index[-1].start // 3 + 8)) for s in flat.addressable_shards]
assert not same_heads(blocks, parts)

rows = sharding.batch_sharding(mesh)
sharded_ids, sharded_mask = jax.device_put(ids, rows), jax.device_put(mask, rows)
with jax.set_mesh(mesh):
  ar = decode.generate(fused, sharded_ids, sharded_mask, **kw).tokens
  spec = decode.speculative_generate(fused, fused_drafter, sharded_ids, sharded_mask, gamma=3, **kw).tokens
np.testing.assert_array_equal(np.asarray(ar), np.asarray(want))
np.testing.assert_array_equal(np.asarray(spec), np.asarray(want))
print('FUSED_MESH_OK')
"""


def test_the_fused_layout_on_a_2x4_mesh():
  helpers.run_on_cpu_devices(_MESH_SCRIPT, 'FUSED_MESH_OK')
