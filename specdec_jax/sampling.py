"""Standardized sampling: every decoding rule becomes a probability vector, then one draw.

Speculative decoding is lossless with respect to a probability vector, so argmax, temperature,
top-k and top-p are all expressed as a transform `logits -> probs` that is applied identically to
the drafter's and the target's logits (docs/method.md, "Standardized sampling"). `sample` then
draws from such a vector.

Axes: V vocab; `...` any leading shape (e.g. B batch, G gamma).
"""

import dataclasses
import functools
import math
import numbers

import jax
import jax.numpy as jnp

# The smallest positive temperature and top_p: the smallest normal float32, ~1.18e-38. The
# transforms run in float32, where a smaller value is subnormal (XLA:CPU flushes it to 0) or
# rounds to 0, giving 0/0 = NaN. Nothing else breaks above it: `logits - max` is <= 0 with the max
# exactly 0, so for finite logits of any magnitude `shifted / T` is 0 at the max and <= 0 (or
# -inf, probability 0) elsewhere, and the softmax stays finite; `1 / T` <= 8.5e37 is finite too,
# should XLA divide by multiplying with the reciprocal.
_SMALLEST_POSITIVE = float(jnp.finfo(jnp.float32).tiny)


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How logits become a probability vector. Hashable, so it can be a static jit argument.

  Attributes:
    temperature: 0, or >= ~1.18e-38 (the smallest normal float32). 0 means greedy: one-hot on
      the argmax, lowest id on ties.
    top_k: >= 0. Keep the k most probable tokens; 0 disables.
    top_p: in [~1.18e-38, 1]. Keep the smallest set of most probable tokens whose mass reaches
      top_p; 1 disables.
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0

  def __post_init__(self):
    if not _is_real(self.temperature) or not math.isfinite(self.temperature):
      raise ValueError(f'temperature must be a finite number, got {self.temperature!r}')
    if self.temperature < 0:
      raise ValueError(f'temperature must be >= 0, got {self.temperature}')
    if 0 < self.temperature < _SMALLEST_POSITIVE:
      raise ValueError(
        f'temperature must be 0 or >= {_SMALLEST_POSITIVE:.4g} (the smallest normal float32), '
        f'got {self.temperature}: the logits are divided by it in float32, where a smaller '
        'temperature rounds or flushes to 0 and the softmax becomes NaN. Use temperature=0 for '
        'greedy decoding.'
      )
    if not isinstance(self.top_k, numbers.Integral) or isinstance(self.top_k, bool):
      raise ValueError(f'top_k must be an int, got {self.top_k!r}')
    if self.top_k < 0:
      raise ValueError(f'top_k must be >= 0 (0 disables), got {self.top_k}')
    if not _is_real(self.top_p) or not 0 < self.top_p <= 1:
      raise ValueError(f'top_p must be in (0, 1] (1 disables), got {self.top_p!r}')
    if self.top_p < _SMALLEST_POSITIVE:
      raise ValueError(
        f'top_p must be >= {_SMALLEST_POSITIVE:.4g} (the smallest normal float32), got '
        f'{self.top_p}: top-p compares float32 masses with it, and a smaller top_p rounds or '
        'flushes to 0, keeps no token and gives NaN probabilities. Any top_p below the largest '
        'probability keeps just the most probable token: use top_k=1 for that.'
      )

  @property
  def greedy(self) -> bool:
    return self.temperature == 0


def _is_real(x) -> bool:
  return isinstance(x, numbers.Real) and not isinstance(x, bool)


def argmax(x: jax.Array) -> jax.Array:
  """`np.argmax(x, axis=-1)` as int32 (lowest index on ties; the first NaN if there is one, as
  `jnp.argmax` on CPU; on XLA:GPU `jnp.argmax` skips NaNs), computed as a max and a min over
  indices where x hits it. XLA:CPU runs `jnp.argmax` as a two-operand (value, index) reduction
  that does not vectorize, and the greedy loops take an argmax every iteration (a measurement:
  docs/performance.md, "Small ops on XLA:CPU")."""
  top = jnp.max(x, axis=-1, keepdims=True)
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  hit = (x == top) | jnp.isnan(x)  # NaN anywhere makes `top` NaN: then the first NaN wins
  return jnp.min(jnp.where(hit, index, x.shape[-1] - 1), axis=-1)


@functools.partial(jax.jit, static_argnames=('config',))
def logits_to_probs(logits: jax.Array, config: SamplingConfig) -> jax.Array:
  """Applies temperature, then top-k, then top-p, and renormalizes.

  Ties are broken towards the lowest token id everywhere: the argmax at temperature 0, and which
  of several equally probable tokens fill the last top-k / top-p slots. So exactly `top_k` tokens
  survive top-k, and exactly the smallest number of tokens whose mass reaches `top_p` survive
  top-p. The most probable token always survives.

  Args:
    logits: f32[..., V]. `-inf` entries (masked tokens) get probability 0; at least one entry
      per row must be finite.
    config: the transform.

  Returns:
    f32[..., V] probability vectors (non-negative, summing to 1).
  """
  logits = jnp.asarray(logits, jnp.float32)
  vocab = logits.shape[-1]
  if config.greedy:
    return jax.nn.one_hot(argmax(logits), vocab, dtype=jnp.float32)

  # Shift before scaling: the max becomes exactly 0, so a tiny temperature sends every other
  # entry to -inf instead of overflowing to inf - inf = nan.
  # The max is then 0, so exp cannot overflow and softmax's own max pass is not needed.
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  probs = _renormalize(jnp.exp(shifted / config.temperature))
  if 0 < config.top_k < vocab:
    # lax.top_k lists equal values lowest index first, which is the tie rule we want.
    top = jax.lax.top_k(probs, config.top_k)[1]
    keep = jnp.put_along_axis(jnp.zeros_like(probs), top, 1.0, axis=-1, inplace=False)
    probs = _renormalize(probs * keep)
  if config.top_p < 1:
    probs = _renormalize(probs * _top_p_mask(probs, config.top_p))
  return probs


def _top_p_mask(probs: jax.Array, top_p: float) -> jax.Array:
  """Mask of the smallest set of most probable tokens whose mass reaches `top_p`.

  In descending order (ties: lowest id first) a token is kept iff the mass ranked above it is
  below top_p. All kept tokens are >= the smallest kept probability t, the smallest value v with
  `mass(probs > v) < top_p`. t is found by exact bisection over float32 bit patterns (ordered like
  the non-negative floats they encode): 31 masked sums instead of a sort over V, which is slow on
  CPU. Tokens equal to t are kept lowest id first while the mass before them is below top_p.

  Args:
    probs: f32[..., V], normalized.
    top_p: in (0, 1).

  Returns:
    f32[..., V] 0/1 mask.
  """

  def mass_above(bits):
    threshold = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.sum(jnp.where(probs > threshold, probs, 0.0), axis=-1, keepdims=True)

  # Invariant: mass_above(hi) < top_p <= mass_above(lo), unless mass_above(0) < top_p already.
  lo = jnp.zeros(probs.shape[:-1] + (1,), jnp.int32)
  hi = jnp.full_like(lo, jax.lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32))

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    below = mass_above(mid) < top_p
    return jnp.where(below, lo, mid), jnp.where(below, mid, hi)

  _, hi = jax.lax.fori_loop(0, 31, halve, (lo, hi))  # 2**31 > bits(1.0): converged.
  threshold_bits = jnp.where(mass_above(lo) < top_p, lo, hi)
  smallest_kept = jax.lax.bitcast_convert_type(threshold_bits, jnp.float32)
  mass_before_ties = mass_above(threshold_bits)
  tied = probs == smallest_kept
  num_tied = jnp.sum(tied, axis=-1, keepdims=True)

  def kept_among_tied(rank):
    """Whether the rank-th (1-based, by id) token equal to t is still needed."""
    return tied & (mass_before_ties + (rank - 1) * smallest_kept < top_p)

  # Usually every tied token (typically just one) is needed: then skip ranking the ties by id.
  all_tied_needed = mass_before_ties + (num_tied - 1) * smallest_kept < top_p
  tied_kept = jax.lax.cond(
    jnp.all(all_tied_needed),
    lambda: kept_among_tied(num_tied),
    lambda: kept_among_tied(jnp.cumsum(tied, axis=-1)),
  )
  return ((probs > smallest_kept) | tied_kept).astype(probs.dtype)


def _renormalize(probs: jax.Array) -> jax.Array:
  return probs / jnp.sum(probs, axis=-1, keepdims=True)


@jax.jit
def sample(rng: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token per probability vector by inverting its CDF with one uniform per row.

  One uniform per row rather than V Gumbel draws: on a CPU, V random draws per row can cost more
  than a step of a small model (docs/performance.md, "Small ops on XLA:CPU"), and
  the speculative loop samples gamma + 1 times per iteration. The CDF is inverted in two levels, over blocks of ~sqrt(V) tokens and then within the
  chosen block, so no cumulative sum runs over all V entries (a cumsum over V is a slow
  reduce-window on XLA:CPU). A token of probability 0 is never drawn: its CDF interval is empty at
  both levels. Sums are float32, so each token's probability is honoured to ~1e-7 absolute.
  `probs` need not be normalized (only ratios matter).

  Args:
    rng: PRNG key.
    probs: f32[..., V], non-negative with a positive entry in every row.

  Returns:
    i32[...] token ids.
  """
  probs = jnp.asarray(probs, jnp.float32)
  vocab = probs.shape[-1]
  width = max(1, math.isqrt(vocab))
  num_blocks = -(-vocab // width)
  padded = jnp.pad(probs, [(0, 0)] * (probs.ndim - 1) + [(0, num_blocks * width - vocab)])
  blocks = padded.reshape(probs.shape[:-1] + (num_blocks, width))
  block_mass = jnp.sum(blocks, axis=-1)
  block_cdf = jnp.cumsum(block_mass, axis=-1)
  u = jax.random.uniform(rng, probs.shape[:-1] + (1,), jnp.float32) * block_cdf[..., -1:]
  block = _invert(block_cdf, block_mass, u)
  within = jnp.take_along_axis(blocks, block[..., None, None], axis=-2)[..., 0, :]
  mass_before = jnp.take_along_axis(block_cdf - block_mass, block[..., None], axis=-1)
  # u >= the CDF before the chosen block, and float subtraction keeps the sign: u_within >= 0.
  offset = _invert(jnp.cumsum(within, axis=-1), within, u - mass_before)
  return (block * width + offset).astype(jnp.int32)


def _invert(cdf: jax.Array, mass: jax.Array, u: jax.Array) -> jax.Array:
  """The index i with cdf[i-1] <= u < cdf[i], i.e. the count of cdf <= u, capped at the last
  entry of positive mass (u may round up to the total). cdf, mass: f32[..., K]; u: f32[..., 1]."""
  index = jnp.sum(cdf <= u, axis=-1)
  last = mass.shape[-1] - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)
  return jnp.minimum(index, last)
