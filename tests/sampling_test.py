"""Tests for specdec_jax.sampling: transforms against a float64 numpy reference, and `sample`."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sampling
from specdec_jax.measure import timing
from tests import chisquare

SamplingConfig = sampling.SamplingConfig
SIGNIFICANCE = 1e-3


def _reference_probs(logits: np.ndarray, config: SamplingConfig) -> np.ndarray:
  """float64 reference, one row at a time: temperature, top-k, top-p; ties to the lowest id."""
  logits = np.asarray(logits, np.float64)
  out = np.zeros_like(logits)
  for index in np.ndindex(*logits.shape[:-1]):
    row = logits[index]
    if config.temperature == 0:
      out[index][np.argmax(row)] = 1.0
      continue
    probs = np.exp((row - row.max()) / config.temperature)
    probs /= probs.sum()
    order = np.argsort(-probs, kind='stable')  # descending, lowest id first among ties
    if config.top_k:
      probs[order[config.top_k :]] = 0.0
      probs /= probs.sum()
    if config.top_p < 1:
      sorted_probs = probs[order]
      mass_before = np.cumsum(sorted_probs) - sorted_probs
      probs[order[mass_before >= config.top_p]] = 0.0
      probs /= probs.sum()
    out[index] = probs
  return out


CONFIGS = [
  SamplingConfig(),
  SamplingConfig(temperature=0.0),
  SamplingConfig(temperature=0.5),
  SamplingConfig(temperature=2.0),
  SamplingConfig(top_k=1),
  SamplingConfig(top_k=3),
  SamplingConfig(top_k=100),  # > V: no-op
  SamplingConfig(top_p=0.5),
  SamplingConfig(top_p=0.9),
  SamplingConfig(temperature=0.7, top_k=4, top_p=0.8),
  SamplingConfig(temperature=1.5, top_k=5, top_p=0.6),
]


@pytest.mark.parametrize('config', CONFIGS, ids=str)
def test_matches_reference(config):
  logits = np.random.default_rng(0).normal(scale=2.0, size=(4, 3, 7)).astype(np.float32)
  probs = sampling.logits_to_probs(logits, config)
  assert probs.dtype == jnp.float32 and probs.shape == logits.shape
  np.testing.assert_allclose(probs, _reference_probs(logits, config), atol=2e-6)
  np.testing.assert_allclose(np.sum(probs, axis=-1), 1.0, atol=1e-6)


@pytest.mark.parametrize(
  'logits, config, expected',
  [
    # Ties: lowest id wins the argmax and the last top-k / top-p slots.
    ([1.0, 3.0, 3.0, 0.0], SamplingConfig(temperature=0.0), [0, 1, 0, 0]),
    ([0.0, 1.0, 1.0, 1.0], SamplingConfig(top_k=2), [0, 0.5, 0.5, 0]),
    ([2.0, 2.0, 2.0, 2.0], SamplingConfig(top_p=0.5), [0.5, 0.5, 0, 0]),
    ([2.0, 2.0, 2.0, 2.0], SamplingConfig(top_p=0.6), [1 / 3, 1 / 3, 1 / 3, 0]),
    ([2.0, 2.0, 2.0, 2.0], SamplingConfig(top_p=0.9), [0.25, 0.25, 0.25, 0.25]),
    ([5.0, 7.0, 7.0, 1.0], SamplingConfig(top_p=1e-6), [0, 1, 0, 0]),
    # Order: top-k before top-p. [.5, .3, .2] -> top-2 [.625, .375] -> top-p .6 keeps 1 token
    # (top-p first would keep 2).
    (np.log([0.5, 0.3, 0.2]), SamplingConfig(top_k=2, top_p=0.6), [1, 0, 0]),
    # Order: temperature before top-p. At T = 2, [.5, .3, .2] -> [.413, .320, .267]: top-p .45
    # needs 2 tokens (top-p first would keep 1).
    (np.log([0.5, 0.3, 0.2]), SamplingConfig(temperature=2.0, top_p=0.45), [0.5636, 0.4364, 0]),
    # Masked vocabulary and all-equal logits.
    ([-np.inf, 0.0, -np.inf, 0.0], SamplingConfig(), [0, 0.5, 0, 0.5]),
    ([-np.inf, 0.0, -np.inf, 1.0], SamplingConfig(temperature=0.0), [0, 0, 0, 1]),
    ([-np.inf, 0.0, -np.inf, 1.0], SamplingConfig(top_p=0.1, top_k=3), [0, 0, 0, 1]),
    ([3.0, 3.0, 3.0, 3.0], SamplingConfig(temperature=1e-30), [0.25, 0.25, 0.25, 0.25]),
    ([0.0, 1.0, 0.5, 0.0], SamplingConfig(temperature=1e-30), [0, 1, 0, 0]),
  ],
)
def test_hand_computed(logits, config, expected):
  probs = sampling.logits_to_probs(np.asarray(logits, np.float32), config)
  np.testing.assert_allclose(probs, expected, atol=1e-4)
  np.testing.assert_allclose(probs, _reference_probs(np.asarray(logits), config), atol=1e-6)


@pytest.mark.parametrize(
  'config',
  [SamplingConfig(top_k=2), SamplingConfig(top_k=3, top_p=0.7), SamplingConfig(top_p=0.3)],
  ids=str,
)
def test_many_ties_match_reference(config):
  """Rows of small integer logits: ties at the top-k / top-p boundary in most rows."""
  logits = np.random.default_rng(2).integers(0, 3, size=(64, 6)).astype(np.float32)
  probs = sampling.logits_to_probs(logits, config)
  np.testing.assert_allclose(probs, _reference_probs(logits, config), atol=2e-6)


@pytest.mark.parametrize('shape', [(5,), (2, 5), (2, 3, 4, 5)])
def test_leading_shapes_under_jit(shape):
  config = SamplingConfig(temperature=0.8, top_k=3, top_p=0.9)
  logits = np.random.default_rng(1).normal(size=shape).astype(np.float32)
  probs = jax.jit(sampling.logits_to_probs, static_argnames='config')(logits, config)
  assert probs.shape == shape
  np.testing.assert_allclose(probs, _reference_probs(logits, config), atol=2e-6)


def test_config_is_a_static_argument():
  logits = jnp.zeros((2, 3))
  sampling.logits_to_probs(logits, SamplingConfig(top_k=2))
  with timing.compiles() as compiled:
    sampling.logits_to_probs(logits, SamplingConfig(top_k=2))  # equal config: no recompilation
  assert not compiled, compiled
  assert hash(SamplingConfig(top_k=2)) == hash(SamplingConfig(top_k=2))


@pytest.mark.parametrize(
  'kwargs, message',
  [
    (dict(temperature=-0.1), 'temperature must be >= 0'),
    (dict(temperature=float('nan')), 'temperature must be a finite number'),
    (dict(temperature=float('inf')), 'temperature must be a finite number'),
    (dict(temperature='1'), 'temperature must be a finite number'),
    (dict(top_k=-1), 'top_k must be >= 0'),
    (dict(top_k=1.5), 'top_k must be an int'),
    (dict(top_k=True), 'top_k must be an int'),
    (dict(top_p=0.0), r'top_p must be in \(0, 1\]'),
    (dict(top_p=1.5), r'top_p must be in \(0, 1\]'),
    (dict(top_p=float('nan')), r'top_p must be in \(0, 1\]'),
    # Positive but below the smallest normal float32: 0 (or flushed to 0) in float32.
    (dict(temperature=1e-39), r'temperature must be 0 or >= 1\.175e-38.*temperature=0 for greedy'),
    (dict(temperature=1e-300), r'temperature must be 0 or >= 1\.175e-38'),
    (dict(temperature=np.float64(5e-45)), r'temperature must be 0 or >= 1\.175e-38'),
    (dict(top_p=1e-39), r'top_p must be >= 1\.175e-38.*top_k=1'),
    (dict(top_p=1e-300), r'top_p must be >= 1\.175e-38'),
  ],
)
def test_config_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    SamplingConfig(**kwargs)


def test_config_accepts_numpy_scalars():
  config = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(3), top_p=np.float64(0.9))
  assert config.top_k == 3


def test_smallest_temperature_and_top_p_stay_finite():
  """The bound is the smallest normal float32: at it, softmax(shifted / T) and top-p are finite
  for finite logits of any magnitude; a value that is 0 in float32 gives NaN, which is why
  SamplingConfig refuses everything below the bound."""
  smallest = float(np.finfo(np.float32).tiny)
  rng = np.random.default_rng(4)
  for scale in (1.0, 1e4, 3e38):
    logits = (rng.uniform(-1, 1, (16, 50)) * scale).astype(np.float32)
    for config in (
      SamplingConfig(temperature=smallest),
      SamplingConfig(top_p=smallest),
      SamplingConfig(temperature=smallest, top_k=3, top_p=smallest),
    ):
      probs = np.asarray(sampling.logits_to_probs(logits, config))
      assert np.all(np.isfinite(probs)), (scale, config)
      np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-6)
      # Both limits keep just the most probable token (no ties in continuous random logits).
      np.testing.assert_array_equal(probs.argmax(-1), logits.argmax(-1))
  below = SamplingConfig()
  object.__setattr__(below, 'temperature', 1e-46)  # bypasses the check: 0 in float32
  assert np.all(np.isnan(sampling.logits_to_probs(np.zeros((1, 3), np.float32), below)))


_SAMPLE_PROBS = np.array([0.5, 0.25, 0.125, 0.0, 0.0625, 0.0625], np.float32)


def _sample_pvalue(draw_fn) -> float:
  """Chi-square p-value of 100k draws against _SAMPLE_PROBS; a probability-0 draw gives 0."""
  rows = np.broadcast_to(_SAMPLE_PROBS, (100_000, _SAMPLE_PROBS.size))
  counts = np.bincount(np.asarray(draw_fn(jax.random.key(0), rows)).ravel(), minlength=6)
  return chisquare.pvalue(counts, _SAMPLE_PROBS)


def test_sample_distribution():
  pvalue = _sample_pvalue(sampling.sample)
  assert pvalue > SIGNIFICANCE, f'chi-square p = {pvalue:.2e} at significance 1e-3'


def test_sample_negative_control():
  """A plausible bug, probabilities passed as logits, fails the same test."""
  pvalue = _sample_pvalue(jax.jit(lambda rng, probs: jax.random.categorical(rng, probs)))
  assert pvalue < SIGNIFICANCE


def test_sample_shapes_and_zeros():
  probs = np.zeros((2, 3, 5), np.float32)
  probs[..., 3] = 1e-30  # tiny but positive: the only candidate
  probs[0, 0] = [0.0, 0.0, 0.5, 0.0, 0.5]
  tokens = sampling.sample(jax.random.key(1), probs)
  assert tokens.shape == (2, 3) and tokens.dtype == jnp.int32
  assert tokens[0, 0] in (2, 4)
  np.testing.assert_array_equal(np.asarray(tokens).ravel()[1:], 3)


def test_sample_never_draws_trailing_or_leading_zeros():
  """The inverse CDF must not run past the last possible token, nor stop on a leading zero."""
  probs = np.zeros((50_000, 7), np.float32)
  probs[:, 2], probs[:, 4] = 1 / 3, 2 / 3
  counts = np.bincount(np.asarray(sampling.sample(jax.random.key(3), probs)), minlength=7)
  assert counts[[0, 1, 3, 5, 6]].sum() == 0
  assert abs(counts[4] / counts.sum() - 2 / 3) < 0.01


def test_sample_two_level_cdf_odd_vocab_with_zero_blocks():
  """V = 103 (not a square: the last block is padded), whole blocks of zeros and zeros inside
  blocks: 200k draws match the vector (chi-square at 1e-3) and never hit a zero."""
  rng = np.random.default_rng(0)
  probs = rng.random(103).astype(np.float32) * (rng.random(103) < 0.5)
  probs[10:30] = 0.0  # two whole blocks of width 10, and the block boundaries around them
  probs[102] = 0.05  # the lone real entry of the padded last block
  probs /= probs.sum()
  rows = np.broadcast_to(probs, (200_000, probs.size))
  counts = np.bincount(np.asarray(sampling.sample(jax.random.key(5), rows)), minlength=103)
  assert counts[probs == 0].sum() == 0
  assert chisquare.pvalue(counts, probs) > SIGNIFICANCE


@pytest.mark.parametrize('shape', [(7,), (3, 50), (2, 5, 8000)])
def test_argmax_equals_numpy_argmax(shape):
  """Random values, many ties (small integers), -inf rows, and NaNs: the same index as
  `np.argmax` (lowest index on ties; the first NaN when there is one). Not `jnp.argmax`: on
  XLA:GPU it skips NaNs (seen on an H200, jax 0.11.2, 2026-11-26)."""
  rng = np.random.default_rng(0)
  cases = [
    rng.normal(size=shape),
    rng.integers(0, 3, size=shape).astype(np.float32),  # ties everywhere
    np.full(shape, -np.inf),
    np.where(rng.random(shape) < 0.01, np.nan, rng.normal(size=shape)),
    np.where(rng.random(shape) < 0.5, -np.inf, rng.integers(0, 2, size=shape)),
  ]
  for x in cases:
    x = jnp.asarray(x, jnp.float32)
    got = jax.jit(sampling.argmax)(x)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, np.argmax(np.asarray(x), axis=-1))
