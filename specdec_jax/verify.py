"""Verification of a drafted block: token verification and (optimal) block verification.

One speculative iteration drafts `X_1..X_G` from the drafter, with `q_i = Ms(.|c, X^{i-1})`,
scores all G+1 positions with one target pass, `p_i = Mb(.|c, X^{i-1})`, and keeps `X^tau`
plus one more token `Y`. Both verifiers here are lossless: `X^tau, Y` followed by sampling from
the target is distributed exactly as sampling from the target alone (SPEC.md; checked exactly
in tests/verify_test.py).

- `token_verify`: Leviathan et al. 2022 / Chen et al. 2023. Accept `X_i` with probability
  `min(1, p_i(X_i) / q_i(X_i))` until the first rejection.
- `block_verify`: Sun et al. 2024, Alg. 2. Optimal in expected accepted tokens; never worse
  than token verification.

Everything is vectorized over the batch: no Python loops over B, G or V. Row b's outcome uses
row b's uniforms and row b's residual draw only, so rows are independent.

Axes: B batch, G gamma (drafted tokens), V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling


class VerifyResult(NamedTuple):
  """Outcome of verifying one drafted block per row.

  Attributes:
    num_accepted: i32[B], tau in 0..G: the first tau drafted tokens are kept.
    next_token: i32[B], Y: the token emitted after them (from the residual distribution, or from
      `p_{G+1}` when all G drafts were accepted).
  """

  num_accepted: jax.Array
  next_token: jax.Array


@jax.jit
def token_verify(
  rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> VerifyResult:
  """Token verification: accept drafts one by one, stop at the first rejection.

  `X_i` is accepted with probability `h_i = min(1, p_i(X_i) / q_i(X_i))`; `tau` is the length
  of the accepted prefix; `Y ~ norm(max(0, p_{tau+1} - q_{tau+1}))`, or `Y ~ p_{G+1}` when
  `tau == G`.

  Args:
    rng: PRNG key.
    draft_tokens: i32[B, G], the drafted tokens X_1..X_G.
    draft_probs: f32[B, G, V], q_i = Ms(.|c, X^{i-1}) for i = 1..G.
    target_probs: f32[B, G+1, V], p_i = Mb(.|c, X^{i-1}) for i = 1..G+1.

  Returns:
    VerifyResult with i32[B] fields.
  """
  draft_probs, target_probs = _check_and_cast(draft_tokens, draft_probs, target_probs)
  p_x, q_x = _probs_of_drafts(draft_tokens, draft_probs, target_probs)
  eta_rng, next_rng = jax.random.split(rng)
  accepted = _uniform_like(eta_rng, p_x) < _token_acceptance(p_x, q_x)
  num_accepted = _accepted_prefix_length(accepted)
  no_weight = jnp.ones(num_accepted.shape, jnp.float32)
  next_token = _sample_next(next_rng, num_accepted, no_weight, draft_probs, target_probs)
  return VerifyResult(num_accepted, next_token)


@jax.jit
def block_verify(
  rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> VerifyResult:
  """Block verification (Sun et al. 2024, Alg. 2): the optimal lossless verifier.

  With weights `w_0 = 1`, `w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))` and residual masses
  `r_i = sum_x max(0, w_i p_{i+1}(x) - q_{i+1}(x))`, sub-block `X^i` is accepted with
  probability `h_i = r_i / (r_i + 1 - w_i)` (i < G; 0/0 = 0) and `h_G = w_G`, independently;
  `tau` is the longest accepted sub-block (0 if none), and
  `Y ~ norm(max(0, w_tau p_{tau+1} - q_{tau+1}))`, or `Y ~ p_{G+1}` when `tau == G`.

  Args:
    rng: PRNG key.
    draft_tokens: i32[B, G], the drafted tokens X_1..X_G.
    draft_probs: f32[B, G, V], q_i = Ms(.|c, X^{i-1}) for i = 1..G.
    target_probs: f32[B, G+1, V], p_i = Mb(.|c, X^{i-1}) for i = 1..G+1.

  Returns:
    VerifyResult with i32[B] fields.
  """
  draft_probs, target_probs = _check_and_cast(draft_tokens, draft_probs, target_probs)
  p_x, q_x = _probs_of_drafts(draft_tokens, draft_probs, target_probs)
  weights = _block_weights(p_x, q_x)
  eta_rng, next_rng = jax.random.split(rng)
  accepted = _uniform_like(eta_rng, p_x) < _block_acceptance(weights, draft_probs, target_probs)
  num_accepted = _longest_accepted_block(accepted)
  weight = jnp.take_along_axis(weights, num_accepted[:, None], axis=1)[:, 0]
  next_token = _sample_next(next_rng, num_accepted, weight, draft_probs, target_probs)
  return VerifyResult(num_accepted, next_token)


VERIFIERS = {'token': token_verify, 'block': block_verify}


def _check_and_cast(draft_tokens, draft_probs, target_probs) -> tuple[jax.Array, jax.Array]:
  """Raises ValueError on inconsistent shapes; returns the probabilities as float32."""
  if draft_tokens.ndim != 2:
    raise ValueError(f'draft_tokens must be [B, G], got shape {draft_tokens.shape}')
  batch, gamma = draft_tokens.shape
  if gamma < 1:
    raise ValueError('need at least one drafted token (G >= 1)')
  if draft_probs.ndim != 3 or draft_probs.shape[:2] != (batch, gamma):
    raise ValueError(
      f'draft_probs must be [B, G, V] = [{batch}, {gamma}, V], got {draft_probs.shape}'
    )
  vocab = draft_probs.shape[2]
  if target_probs.shape != (batch, gamma + 1, vocab):
    raise ValueError(
      f'target_probs must be [B, G+1, V] = {(batch, gamma + 1, vocab)}, got {target_probs.shape}'
    )
  return jnp.asarray(draft_probs, jnp.float32), jnp.asarray(target_probs, jnp.float32)


def _probs_of_drafts(draft_tokens, draft_probs, target_probs) -> tuple[jax.Array, jax.Array]:
  """Returns `p_i(X_i)` and `q_i(X_i)`, each f32[B, G]."""
  index = draft_tokens[..., None].astype(jnp.int32)
  p_x = jnp.take_along_axis(target_probs[:, :-1], index, axis=-1)[..., 0]
  q_x = jnp.take_along_axis(draft_probs, index, axis=-1)[..., 0]
  return p_x, q_x


def _uniform_like(rng, x: jax.Array) -> jax.Array:
  """U[0, 1) draws shaped like x. Accept iff `eta < h`: h = 0 never accepts, h = 1 always does."""
  return jax.random.uniform(rng, x.shape, jnp.float32)


def _token_acceptance(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
  """`h_i = min(1, p_i(X_i) / q_i(X_i))`, f32[B, G].

  A draft with `q_i(X_i) = 0` cannot have been drafted; it gets h = 1 unless the target also
  gives it zero probability (a token the target cannot emit is never accepted).
  """
  below_one = q_x > p_x
  ratio = p_x / jnp.where(below_one, q_x, 1.0)
  return jnp.where(below_one, ratio, jnp.where(p_x > 0, 1.0, 0.0))


def _block_weights(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
  """`w_0..w_G` with `w_i = min(1, w_{i-1} p_i(X_i) / q_i(X_i))`, f32[B, G+1].

  In log space `log w_i = S_i - max_{j<=i} S_j` with `S_i = sum_{k<=i} log(p_k(X_k)/q_k(X_k))`
  and `S_0 = 0`: a cumulative sum and a cumulative max instead of a sequential loop.
  """
  # q(X) = 0 cannot happen for a drafted token; clamping keeps the log finite, so the cumulative
  # sum only ever meets -inf (from p(X) = 0) and never inf - inf.
  tiny = jnp.finfo(jnp.float32).tiny
  log_ratio = jnp.log(p_x) - jnp.log(jnp.maximum(q_x, tiny))
  log_ratio = jnp.pad(log_ratio, ((0, 0), (1, 0)))
  partial_sums = jnp.cumsum(log_ratio, axis=1)
  return jnp.exp(partial_sums - jax.lax.cummax(partial_sums, axis=1))


def _block_acceptance(weights, draft_probs, target_probs) -> jax.Array:
  """`h_1..h_G` of block verification, f32[B, G].

  Args:
    weights: f32[B, G+1], `w_0..w_G` from `_block_weights`.
    draft_probs: f32[B, G, V].
    target_probs: f32[B, G+1, V].
  """
  w_inner = weights[:, 1:-1]  # w_1..w_{G-1}
  residual_mass = jnp.sum(
    jnp.maximum(w_inner[..., None] * target_probs[:, 1:-1] - draft_probs[:, 1:], 0.0), axis=-1
  )
  denominator = residual_mass + (1.0 - w_inner)
  h_inner = residual_mass / jnp.where(denominator > 0, denominator, 1.0)  # 0/0 counts as 0
  return jnp.concatenate([h_inner, weights[:, -1:]], axis=1)


def _accepted_prefix_length(accepted: jax.Array) -> jax.Array:
  """Number of leading True entries per row: bool[B, G] -> i32[B]."""
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)


def _longest_accepted_block(accepted: jax.Array) -> jax.Array:
  """Largest i (1-based) with accepted[:, i-1], or 0: bool[B, G] -> i32[B]."""
  lengths = jnp.arange(1, accepted.shape[1] + 1, dtype=jnp.int32)
  return jnp.max(jnp.where(accepted, lengths, 0), axis=1)


def _sample_next(rng, num_accepted, weight, draft_probs, target_probs) -> jax.Array:
  """Draws Y from `norm(max(0, w p_{tau+1} - q_{tau+1}))`, with `q_{G+1} = 0`.

  At `tau == G` this is `p_{G+1}`. A residual that is zero everywhere (`p == q` there) falls back
  to `p_{tau+1}`, as SPEC.md prescribes for tau = 0; every positive residual entry has
  `p_{tau+1}(x) > 0`, so Y is never a token the target gives zero probability.

  Args:
    rng: PRNG key.
    num_accepted: i32[B], tau.
    weight: f32[B], `w_tau` (1 for token verification).
    draft_probs: f32[B, G, V].
    target_probs: f32[B, G+1, V].

  Returns:
    i32[B].
  """
  gamma = draft_probs.shape[1]
  tau = num_accepted[:, None, None]
  p = jnp.take_along_axis(target_probs, tau, axis=1)[:, 0]
  q = jnp.take_along_axis(draft_probs, jnp.minimum(tau, gamma - 1), axis=1)[:, 0]
  q = jnp.where(tau[:, 0] < gamma, q, 0.0)
  weight = jnp.where(num_accepted < gamma, weight, 1.0)
  residual = jnp.maximum(weight[:, None] * p - q, 0.0)
  has_residual = jnp.sum(residual, axis=-1, keepdims=True) > 0
  return sampling.sample(rng, jnp.where(has_residual, residual, p))
