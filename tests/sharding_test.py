"""Tests of sharding.py: logical axes, rules, and a (data=2, model=4) mesh of 8 CPU devices."""

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from specdec_jax import sharding
from specdec_jax.models import t5

_REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1', 't5_1_1-xl'])
def test_param_logical_axes_cover_every_param(name):
  config = t5.CONFIGS[name]
  shapes = jax.eval_shape(lambda rng: t5.init_params(rng, config), jax.random.key(0))
  axes = sharding.param_logical_axes(shapes)
  assert jax.tree.structure(axes) == jax.tree.structure(shapes)
  for spec, shape in zip(jax.tree.leaves(axes), jax.tree.leaves(shapes)):
    assert len(spec) == shape.ndim
  layer = axes['decoder']['layers_0']
  assert layer['self_attention']['query']['kernel'] == P('embed', 'joined_kv')
  assert layer['encoder_decoder_attention']['out']['kernel'] == P('joined_kv', 'embed')
  assert layer['mlp']['wo']['kernel'] == P('mlp', 'embed')
  assert axes['token_embedder']['embedding'] == P('vocab', 'embed')


def test_param_logical_axes_rejects_unknown_params():
  with pytest.raises(ValueError, match='encoder/extra/kernel'):
    sharding.param_logical_axes({'encoder': {'extra': {'kernel': jnp.zeros((2, 2))}}})


@pytest.mark.parametrize(
  'axes,shape,expected',
  [
    (('batch', 'length', 'vocab'), (4, 7, 128), P('data', None, 'model')),
    (('heads', 'relpos_buckets'), (6, 32), P(None, None)),  # 6 heads do not split 4 ways
    (('batch', 'length', 'heads', 'kv'), (3, 5, 8, 4), P(None, None, 'model', None)),
    (('mlp', 'vocab'), (8, 8), P('model', None)),  # a mesh axis shards one array axis at most
    (('embed', None), (8, 8), P(None, None)),
  ],
)
def test_logical_to_mesh(axes, shape, expected):
  mesh = AbstractMesh((2, 4), ('data', 'model'))
  assert sharding.logical_to_mesh(axes, shape, mesh) == expected


def test_logical_to_mesh_skips_missing_mesh_axes_and_rejects_unknown_names():
  data_only = AbstractMesh((2,), ('data',))
  assert sharding.logical_to_mesh(('batch', 'vocab'), (4, 8), data_only) == P('data', None)
  with pytest.raises(ValueError, match='widgets'):
    sharding.logical_to_mesh(('widgets',), (4,), data_only)


def test_constrain_without_mesh_is_the_identity():
  x = jnp.zeros((2, 3))
  assert sharding.constrain(x, ('batch', 'length')) is x


def test_make_mesh_needs_enough_devices():
  with pytest.raises(ValueError, match='devices'):
    sharding.make_mesh(data=jax.device_count() + 1, model=1)


# Runs in a fresh interpreter: the device count is fixed when jax initialises.
_MULTI_DEVICE_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from specdec_jax import cache as cache_lib, sharding
from specdec_jax.models import t5

assert jax.device_count() == 8, jax.devices()
config = t5.CONFIGS['tiny-v1.1']
rng = np.random.default_rng(0)
# NumPy params with init_params' structure: no per-shape RNG compilations.
shapes = jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))
params = jax.tree_util.tree_map_with_path(
  lambda path, s: (1 + 0.1 * rng.normal(size=s.shape) if 'scale' in str(path[-1])
                   else rng.normal(size=s.shape) / np.sqrt(s.shape[0])).astype(np.float32),
  shapes)
mask = np.arange(7)[None] < np.array([7, 3, 5, 6])[:, None]
ids = (rng.integers(2, config.vocab_size, (4, 7)) * mask).astype(np.int32)
dec = rng.integers(2, config.vocab_size, (4, 8)).astype(np.int32)

def run(params, ids, mask, dec):
  encoded = t5.encode(params, ids, mask, config=config)
  cache = t5.init_cache(params, encoded, mask, config=config, max_decode_len=8)
  first, cache = t5.decode(params, dec[:, :4], cache, config=config)
  cache = cache_lib.rewind(cache, jnp.array([2, 4, 1, 3]))
  second, cache = t5.decode(params, dec[:, 4:], cache, config=config)
  return first, second, cache.self_k

expected = jax.jit(run)(params, ids, mask, dec)
assert 'sharding_constraint' not in str(jax.make_jaxpr(run)(params, ids, mask, dec))

mesh = sharding.make_mesh(data=2, model=4)
sharded = sharding.shard_params(params, mesh)
query = sharded['decoder']['layers_0']['self_attention']['query']['kernel']
assert query.sharding.spec == P(None, 'model'), query.sharding
assert query.addressable_shards[0].data.shape == (32, 8)
assert sharded['token_embedder']['embedding'].sharding.spec == P('model', None)
batch = sharding.shard_batch((ids, mask, dec), mesh)
assert batch[0].sharding.spec == P('data', None)
with jax.set_mesh(mesh):
  assert 'sharding_constraint' in str(jax.make_jaxpr(run)(sharded, *batch))
  got = jax.jit(run)(sharded, *batch)

def check_spec(x, spec):
  assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), (x.sharding, spec)
check_spec(got[0], P('data', None, 'model'))
check_spec(got[2], P(None, 'data', None, 'model', None))
for g, e in zip(got, expected):
  np.testing.assert_allclose(np.asarray(g), np.asarray(e), atol=1e-5, rtol=0)
print('SHARDED_OK')
"""


def test_sharded_decode_matches_one_device():
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS='--xla_force_host_platform_device_count=8')
  result = subprocess.run(
    [sys.executable, '-c', _MULTI_DEVICE_SCRIPT],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0 and 'SHARDED_OK' in result.stdout, result.stderr[-4000:]
