"""Tests of cache.py: per-row writes and rewinds."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import cache as cache_lib


def _cache(batch=3, slots=6, end_index=(0, 0, 0)):
  kv = jnp.zeros((2, batch, slots, 1, 1))
  return cache_lib.DecoderCache(
    self_k=kv,
    self_v=kv,
    cross_k=kv[:, :, :2],
    cross_v=kv[:, :, :2],
    encoder_mask=jnp.ones((batch, 2), bool),
    end_index=jnp.asarray(end_index, jnp.int32),
  )


@pytest.mark.parametrize('t', [1, 2, 3])
def test_write_puts_each_row_at_its_own_end_index(t):
  end_index = np.array([0, 2, 3])
  kv = np.full((3, 6, 2, 1), -1.0, np.float32)
  new = np.arange(3 * t * 2, dtype=np.float32).reshape(3, t, 2, 1)
  got = np.asarray(cache_lib.write(jnp.asarray(kv), jnp.asarray(new), jnp.asarray(end_index)))
  expected = kv.copy()
  for b, start in enumerate(end_index):
    expected[b, start : start + t] = new[b]
  np.testing.assert_array_equal(got, expected)


def test_write_into_one_layer_of_a_stacked_cache():
  kv = np.zeros((3, 2, 5, 1, 1), np.float32)
  new = np.ones((2, 2, 1, 1), np.float32)
  got = np.asarray(cache_lib.write(jnp.asarray(kv), jnp.asarray(new), jnp.array([1, 3]), layer=1))
  expected = kv.copy()
  expected[1, 0, 1:3] = 1
  expected[1, 1, 3:5] = 1
  np.testing.assert_array_equal(got, expected)


def test_write_drops_positions_past_the_end_and_casts():
  kv = jnp.zeros((1, 4, 1, 1), jnp.bfloat16)
  got = cache_lib.write(kv, jnp.full((1, 3, 1, 1), 2.0), jnp.array([2]))
  assert got.dtype == jnp.bfloat16
  np.testing.assert_array_equal(got[0, :, 0, 0], [0, 0, 2, 2])


@pytest.mark.parametrize('end_index,expected', [([1, 0, 4], [1, 0, 4]), (2, [2, 2, 2])])
def test_rewind_sets_int32_end_index(end_index, expected):
  cache = _cache(end_index=(5, 5, 5))
  rewound = cache_lib.rewind(cache, np.asarray(end_index, np.int64))
  assert rewound.end_index.dtype == jnp.int32
  np.testing.assert_array_equal(rewound.end_index, expected)
  assert rewound.self_k is cache.self_k
  assert jax.tree.structure(rewound) == jax.tree.structure(cache)


def test_max_decode_len():
  assert _cache(slots=7).max_decode_len == 7


@pytest.mark.parametrize('stacked', [False, True])
@pytest.mark.parametrize('start', [0, 2, 4, 6])
def test_one_row_write_of_several_positions_matches_the_scatter(start, stacked):
  # One row and T > 1 through `select_write` (a TPU's path), the same row in a batch of two
  # through `write`'s scatter: both give the reference, positions past the end dropped, NaN and
  # inf in `new` kept to their own slots, the other layers of a stacked cache untouched.
  rng = np.random.default_rng(start)
  kv = rng.normal(size=(2, 7, 2, 3)).astype(np.float32)  # [B, S_max, N, H]
  new = rng.normal(size=(2, 3, 2, 3)).astype(np.float32)
  new[0, 1, 0, 0], new[0, 2, 1, 2] = np.nan, np.inf
  expected = kv[0].copy()
  kept = min(3, 7 - start)
  expected[start : start + kept] = new[0, :kept]
  layer = 1 if stacked else None
  wrap = (lambda x: np.stack([x - 5, x, x + 5])) if stacked else (lambda x: x)
  row = (lambda x: np.asarray(x)[1, 0]) if stacked else (lambda x: np.asarray(x)[0])
  write = lambda fn, rows, ends: fn(
    jnp.asarray(wrap(kv[:rows])), jnp.asarray(new[:rows]), jnp.array(ends), layer=layer
  )
  one, two = write(cache_lib.select_write, 1, [start]), write(cache_lib.write, 2, [start, 0])
  np.testing.assert_array_equal(row(one), expected)
  np.testing.assert_array_equal(row(two), expected)
  if stacked:
    np.testing.assert_array_equal(np.asarray(one)[[0, 2]], wrap(kv[:1])[[0, 2]])


def test_one_row_write_is_a_select_on_a_tpu_and_a_scatter_elsewhere():
  machines = pytest.importorskip('benchmarks.machines')
  from tests import helpers

  kv, new = jnp.zeros((1, 7, 2, 3)), jnp.ones((1, 3, 2, 3))
  args = (kv, new, jnp.zeros((1,), jnp.int32))
  write = jax.jit(cache_lib.write)
  assert 'scatter' in write.lower(*args).as_text(dialect='hlo')
  if not helpers.HAS_LIBTPU:
    pytest.skip("libtpu absent: pip install 'jax[tpu]' to check a TPU's lowering")
  tpu = jax.sharding.SingleDeviceSharding(machines.compile_only_devices('tpu-v4')[0])
  text = jax.jit(cache_lib.write, in_shardings=tpu).lower(*args).as_text(dialect='hlo')
  assert 'scatter' not in text and 'select' in text
