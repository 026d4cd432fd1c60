"""Verification of one draft per row: token verification and (optimal) block verification.

One speculative iteration drafts `X_1..X_G` from the drafter, with `q_i = Ms(.|c, X^{i-1})`,
scores all G+1 positions with one target pass, `p_i = Mb(.|c, X^{i-1})`, and keeps `X^tau`
plus one more token `Y`. Both verifiers here are lossless: `X^tau, Y` followed by sampling from
the target is distributed exactly as sampling from the target alone (docs/method.md; checked
exactly in tests/verify_test.py).

- `token_verify`: Leviathan et al. 2023 / Chen et al. 2023. Accept `X_i` with probability
  `min(1, p_i(X_i) / q_i(X_i))` until the first rejection.
- `block_verify`: Sun et al. 2024, Alg. 2. Optimal in expected accepted tokens; never worse
  than token verification.

Everything is vectorized over the batch: no Python loops over B, G or V. Row b's outcome uses
row b's uniforms and row b's residual draw only, so rows are independent.

Non-finite inputs. Call position i (1..G+1) non-finite when `p_i`, or `q_i` for i <= G, holds a
NaN or an infinity anywhere in V (a NaN `q_i` next to a finite `q_i(X_i)` is no less broken). A row
whose first non-finite position is k is verified as if only `X_1..X_{k-1}` had been drafted (a
draft of length g = k-1): no draft at or after position k is accepted, block verification's last
sub-block rule `h_g = w_g` applies at g, and `Y ~ p_k` when tau = g, the bonus draw of a length-g
draft. So a row whose only broken vector is `q_k` is still verified losslessly, with fewer drafts.
Where that `p_k` is itself non-finite there is no distribution to draw from and Y is token 0.
Nothing is ever sampled from a non-finite vector, and the verifiers' results stay in range; rows
this happened to are reported by `nonfinite_rows` so the decode loop can count them.

Shorter drafts on purpose. `lengths[b]` (optional, 0..G) verifies row b as a draft of its first
`lengths[b]` tokens by the same rule: what a drafter that stops early (`decode`'s `draft_stop`)
needs. It is block verification of a drafter that, after its stop, drafts a token the target
never emits with probability 1 (`q = onehot(stop)`, `p(stop) = 0`): then `w_i = 0` past the
stop, `r_g = w_g` gives `h_g = w_g`, and the residual at g is `p_{g+1}`. So it is lossless
whenever the stop depends on the drafter's side only (tests/verify_test.py checks it exactly).

Building blocks. The formulas the kernels are made of are public, one function each, named in
docs/method.md beside the formula: `probs_of_drafts`, `token_acceptance`, `block_weights`,
`block_acceptance`, `accepted_prefix_length`, `longest_accepted_block` and `sample_next` (the
draw of Y). `verify_multipath` builds its recursive rejection on `token_acceptance` and runs
`block_verify` itself on the path it selects; tests assemble verifiers from these pieces to plant
bugs in one of them (negative controls).

Axes: B batch, G gamma (drafted tokens), V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling


class VerifyResult(NamedTuple):
  """Outcome of verifying one draft per row.

  Attributes:
    num_accepted: i32[B], tau in 0..G: the first tau drafted tokens are kept.
    next_token: i32[B], Y: the token emitted after them (from the residual distribution, or from
      `p_{G+1}` when all G drafts were accepted).
  """

  num_accepted: jax.Array
  next_token: jax.Array


@jax.jit
def token_verify(
  rng: jax.Array,
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  lengths: jax.Array | None = None,
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
    lengths: i32[B] in 0..G, drafts per row (a drafter that stopped early); None: all G.

  Returns:
    VerifyResult with i32[B] fields. A row holding a NaN or inf is verified as a shorter draft
    (module docstring); `nonfinite_rows` flags it.
  """
  draft_probs, target_probs = check_and_cast(draft_tokens, draft_probs, target_probs)
  draft_probs, target_probs, in_draft = _replace_outside_draft(draft_probs, target_probs, lengths)
  p_x, q_x = probs_of_drafts(draft_tokens, draft_probs, target_probs)
  eta_rng, next_rng = jax.random.split(rng)
  # h = 0 at a non-finite position or past the draft (module docstring): the prefix stops there.
  accepted = (_uniform_like(eta_rng, p_x) < token_acceptance(p_x, q_x)) & in_draft
  num_accepted = accepted_prefix_length(accepted)
  no_weight = jnp.ones(num_accepted.shape, jnp.float32)
  next_token = sample_next(next_rng, num_accepted, no_weight, draft_probs, target_probs)
  return VerifyResult(num_accepted, next_token)


@jax.jit
def block_verify(
  rng: jax.Array,
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  lengths: jax.Array | None = None,
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
    lengths: i32[B] in 0..G, drafts per row (a drafter that stopped early); None: all G.

  Returns:
    VerifyResult with i32[B] fields. A row holding a NaN or inf is verified as a shorter draft
    (module docstring); `nonfinite_rows` flags it.
  """
  draft_probs, target_probs = check_and_cast(draft_tokens, draft_probs, target_probs)
  draft_probs, target_probs, in_draft = _replace_outside_draft(draft_probs, target_probs, lengths)
  p_x, q_x = probs_of_drafts(draft_tokens, draft_probs, target_probs)
  weights = block_weights(p_x, q_x)
  eta_rng, next_rng = jax.random.split(rng)
  acceptance = _truncated_block_acceptance(
    block_acceptance(weights, draft_probs, target_probs),
    weights,
    accepted_prefix_length(in_draft),
  )
  accepted = _uniform_like(eta_rng, p_x) < acceptance
  num_accepted = longest_accepted_block(accepted)
  weight = jnp.take_along_axis(weights, num_accepted[:, None], axis=1)[:, 0]
  next_token = sample_next(next_rng, num_accepted, weight, draft_probs, target_probs)
  return VerifyResult(num_accepted, next_token)


# The verifiers whose one iteration is lossless on its own, all of one signature. The decode loops
# run the verifiers of `verifiers.REGISTRY` (these two, and greedy block verification).
VERIFIERS = {'token': token_verify, 'block': block_verify}


@jax.jit
def nonfinite_rows(draft_probs: jax.Array, target_probs: jax.Array) -> jax.Array:
  """Rows that `token_verify` / `block_verify` verified with non-finite inputs.

  A row is flagged when any of its `q_1..q_G`, `p_1..p_{G+1}` holds a NaN or an infinity. Its
  outcome is then defined (module docstring: a shorter draft, or token 0 when the distribution Y
  needs is non-finite) but it is not what a healthy model would have given, so callers should
  count or surface these rows. Reads the same sums over V as the verifiers: jitted together
  with one, XLA computes them once.

  Args:
    draft_probs: f32[B, G, V], q_1..q_G.
    target_probs: f32[B, G+1, V], p_1..p_{G+1}.

  Returns:
    bool[B], True where the row had a non-finite probability vector.
  """
  if draft_probs.ndim != 3 or target_probs.shape != (
    draft_probs.shape[0],
    draft_probs.shape[1] + 1,
    draft_probs.shape[2],
  ):
    raise ValueError(
      f'nonfinite_rows needs draft_probs [B, G, V] and target_probs [B, G+1, V], got '
      f'{draft_probs.shape} and {target_probs.shape}'
    )
  return ~jnp.all(_finite_positions(draft_probs, target_probs), axis=1)


@jax.jit
def greedy_verify(draft_tokens: jax.Array, target_ids: jax.Array) -> VerifyResult:
  """Both verifiers at temperature 0, on token ids: no probability vectors, no randomness.

  With one-hot `p_i = onehot(a_i)` (`a_i` the target's argmax) and `q_i = onehot(X_i)`, token
  verification accepts `X_i` iff `X_i == a_i` (h = 1 or 0) and its residual at the first mismatch
  is `onehot(a_{tau+1})`; block verification's weights are 1 up to the first mismatch and 0 after
  it, so `h_i = 1` exactly at `i = tau` (r = 1, w = 1) and the same residual follows. Both give:
  `tau` = the longest prefix with `X_i == a_i`, and `Y = a_{tau+1}` (docs/method.md).

  Args:
    draft_tokens: i32[B, G], X_1..X_G (the drafter's argmax ids).
    target_ids: i32[B, G+1], a_1..a_{G+1}, the target's argmax at each position.

  Returns:
    VerifyResult with i32[B] fields, equal to `token_verify` / `block_verify` on the one-hot
    vectors of the same ids.
  """
  if draft_tokens.ndim != 2 or target_ids.shape != (
    draft_tokens.shape[0],
    draft_tokens.shape[1] + 1,
  ):
    raise ValueError(
      f'greedy_verify needs draft_tokens [B, G] and target_ids [B, G+1], got '
      f'{draft_tokens.shape} and {target_ids.shape}'
    )
  num_accepted = accepted_prefix_length(draft_tokens == target_ids[:, :-1])
  next_token = jnp.take_along_axis(target_ids, num_accepted[:, None], axis=1)[:, 0]
  return VerifyResult(num_accepted, next_token.astype(jnp.int32))


# ----------------------------------------------------------------------------------------------
# Building blocks: each implements one formula of docs/method.md sections 3-4, on arrays whose
# shapes the kernels above have checked. `verify_multipath`'s recursive rejection and the tests'
# negative controls are built from them.


def probs_of_drafts(draft_tokens, draft_probs, target_probs) -> tuple[jax.Array, jax.Array]:
  """Returns `p_i(X_i)` and `q_i(X_i)`, each f32[B, G]."""
  index = draft_tokens[..., None].astype(jnp.int32)
  p_x = jnp.take_along_axis(target_probs[:, :-1], index, axis=-1)[..., 0]
  q_x = jnp.take_along_axis(draft_probs, index, axis=-1)[..., 0]
  return p_x, q_x


def token_acceptance(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
  """`h_i = min(1, p_i(X_i) / q_i(X_i))`, f32[B, G].

  A draft with `q_i(X_i) = 0` cannot have been drafted; it gets h = 1 unless the target also
  gives it zero probability (a token the target cannot emit is never accepted).
  """
  below_one = q_x > p_x
  ratio = p_x / jnp.where(below_one, q_x, 1.0)
  return jnp.where(below_one, ratio, jnp.where(p_x > 0, 1.0, 0.0))


def block_weights(p_x: jax.Array, q_x: jax.Array) -> jax.Array:
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


def block_acceptance(weights, draft_probs, target_probs) -> jax.Array:
  """`h_1..h_G` of block verification, f32[B, G].

  Args:
    weights: f32[B, G+1], `w_0..w_G` from `block_weights`.
    draft_probs: f32[B, G, V].
    target_probs: f32[B, G+1, V].
  """
  w_inner = weights[:, 1:-1]  # w_1..w_{G-1}
  residual_mass = jnp.sum(
    jnp.maximum(w_inner[..., None] * target_probs[:, 1:-1] - draft_probs[:, 1:], 0.0), axis=-1
  )
  denominator = residual_mass + (1.0 - w_inner)
  h_inner = residual_mass / jnp.where(denominator > 0, denominator, 1.0)  # 0/0 counts as 0
  # r / (r + 1 - w) <= 1 exactly, but XLA:GPU's division is not correctly rounded (r / r can
  # read 1.0000001: docs/performance.md, "On a GPU"), so the clamp keeps h a probability.
  h_inner = jnp.minimum(h_inner, 1.0)
  return jnp.concatenate([h_inner, weights[:, -1:]], axis=1)


def accepted_prefix_length(accepted: jax.Array) -> jax.Array:
  """Number of leading True entries per row: bool[B, G] -> i32[B]."""
  return jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)


def longest_accepted_block(accepted: jax.Array) -> jax.Array:
  """Largest i (1-based) with accepted[:, i-1], or 0: bool[B, G] -> i32[B]."""
  lengths = jnp.arange(1, accepted.shape[1] + 1, dtype=jnp.int32)
  return jnp.max(jnp.where(accepted, lengths, 0), axis=1)


def sample_next(rng, num_accepted, weight, draft_probs, target_probs) -> jax.Array:
  """Draws Y from `norm(max(0, w p_{tau+1} - q_{tau+1}))`, with `q_{G+1} = 0`.

  At `tau == G` this is `p_{G+1}`. A residual that is zero everywhere (`p == q` there) falls back
  to `p_{tau+1}`, as docs/method.md prescribes for tau = 0; every positive residual entry has
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


# ----------------------------------------------------------------------------------------------
# Private helpers: input checks, non-finite and shortened rows, the uniforms.


def check_and_cast(draft_tokens, draft_probs, target_probs) -> tuple[jax.Array, jax.Array]:
  """Raises ValueError on inconsistent shapes; returns the probabilities as float32, or float64
  where they are and x64 is on (tests compare a kernel with an exact law there; every
  single-draft verifier checks its inputs here, verify_greedy too)."""
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
  dtype = jnp.promote_types(jnp.result_type(draft_probs, target_probs), jnp.float32)
  dtype = jax.dtypes.canonicalize_dtype(dtype)  # float64 only with x64 on
  return jnp.asarray(draft_probs, dtype), jnp.asarray(target_probs, dtype)


def _finite_positions(draft_probs, target_probs) -> jax.Array:
  """Whether `p_i` and `q_i` (`q_{G+1}` does not exist) are finite everywhere, i = 1..G+1.

  A NaN or inf anywhere in the vector counts, not just at X_i. Tested as `isfinite(sum(x))`: NaN
  and inf propagate through the sum (inf - inf is NaN), and only finite entries summing beyond
  3.4e38, which no probability vector has, would also count. A float sum is a vectorized
  reduction on XLA:CPU, faster than `all(isfinite(x))` over V (docs/performance.md,
  "Small ops on XLA:CPU").

  Args:
    draft_probs: f32[B, G, V].
    target_probs: f32[B, G+1, V].

  Returns:
    bool[B, G+1].
  """
  return _combine(_is_finite_vector(target_probs), _is_finite_vector(draft_probs))


def _replace_nonfinite(draft_probs, target_probs) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Replaces non-finite vectors so that a truncated row draws Y as the module docstring says.

  A non-finite `q_i` becomes zeros, the convention for the absent `q_{G+1}`: at tau = g the
  residual `max(0, w p_{g+1} - 0)` is then the bonus draw `p_{g+1}`. A non-finite `p_i` becomes
  a one-hot on token 0, so a draw at position i gives 0. No draft at a replaced position is
  accepted (the callers mask it), so only Y ever reads a replacement. The selects fuse into the
  gathers and reductions that read the vectors; finite vectors pass through unchanged.

  Args:
    draft_probs: f32[B, G, V].
    target_probs: f32[B, G+1, V].

  Returns:
    (draft_probs, target_probs, finite): the replaced vectors, and `_finite_positions`.
  """
  p_finite = _is_finite_vector(target_probs)
  q_finite = _is_finite_vector(draft_probs)
  token_zero = jnp.arange(target_probs.shape[-1]) == 0
  target_probs = jnp.where(p_finite[..., None], target_probs, token_zero.astype(jnp.float32))
  draft_probs = jnp.where(q_finite[..., None], draft_probs, 0.0)
  return draft_probs, target_probs, _combine(p_finite, q_finite)


def _replace_outside_draft(draft_probs, target_probs, lengths):
  """`_replace_nonfinite`, then the same for drafts past each row's `lengths` (None: none).

  Returns (draft_probs, target_probs, in_draft bool[B, G]): position i <= G is in the draft iff
  it and every position before it is finite and i <= lengths. Past the draft q is zeros, so Y at
  the draft's end is the bonus draw (module docstring).
  """
  draft_probs, target_probs, finite = _replace_nonfinite(draft_probs, target_probs)
  in_draft = jnp.cumprod(finite[:, :-1], axis=1).astype(bool)
  if lengths is not None:
    in_draft &= jnp.arange(draft_probs.shape[1]) < jnp.asarray(lengths)[:, None]
    draft_probs = jnp.where(in_draft[..., None], draft_probs, 0.0)
  return draft_probs, target_probs, in_draft


def _combine(p_finite, q_finite) -> jax.Array:
  """Position i is finite iff `p_i` and `q_i` are: bool[B, G+1], bool[B, G] -> bool[B, G+1]."""
  return p_finite & jnp.pad(q_finite, ((0, 0), (0, 1)), constant_values=True)


def _is_finite_vector(x: jax.Array) -> jax.Array:
  """Whether each vector is finite everywhere (`_finite_positions`): f32[..., V] -> bool[...]."""
  return jnp.isfinite(jnp.sum(x, axis=-1))


def _uniform_like(rng, x: jax.Array) -> jax.Array:
  """U[0, 1) draws shaped like x. Accept iff `eta < h`: h = 0 never accepts, h = 1 always does."""
  return jax.random.uniform(rng, x.shape, jnp.float32)


def _truncated_block_acceptance(acceptance, weights, lengths) -> jax.Array:
  """Block verification of each row's first `lengths` drafts only, f32[B, G].

  A draft of length g has `h_g = w_g` and no sub-blocks (prefixes `X^i`) beyond g; `h_i` for
  i < g reads positions up to g only, so it is unchanged. A full row (g = G) is returned as is
  (`h_G = w_G` already). The entries replaced are the ones that read a vector
  `_replace_nonfinite` replaced.

  Args:
    acceptance: f32[B, G], `h_1..h_G` from `block_acceptance`.
    weights: f32[B, G+1], `w_0..w_G`.
    lengths: i32[B], g in 0..G.
  """
  sub_block = jnp.arange(1, acceptance.shape[1] + 1)
  g = lengths[:, None]
  return jnp.where(sub_block < g, acceptance, jnp.where(sub_block == g, weights[:, 1:], 0.0))
