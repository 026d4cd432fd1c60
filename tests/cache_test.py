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
