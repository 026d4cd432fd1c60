"""Greedy block verification (Sun et al. 2024, Appendix C, as reconstructed in docs/method.md
section 11): the most drafts one iteration can keep, paid for by a residual law carried into the
next iterations.

One iteration of block verification (`verify.block_verify`) must emit a target sample on its own.
Greedy block verification drops that requirement: prefix `X^i` survives with probability
`min(1, w_i)` for the UNCLIPPED ratio `w_i = L(X^i) / Ms(X^i)` of the law `L` the output must follow,
which reaches the per-block optimum `E[tau] = sum_i sum_{x^i} min(L(x^i), Ms(x^i))` (12/9 on Sun et
al.'s toy, against 11/9 for block and 10/9 for token verification). The target mass this leaves
unmatched is owed by the next tokens: after a rejection at `tau` with correction `Y`, the next
`G - tau - 1` tokens follow the residual law `norm((w parent - Ms)_+)`, one "level" of a stack
(docs/method.md section 11 proves the whole output is distributed as the target's).

The carried state, per row: `levels` f32[B, G - 1]. Slot j holds `log w` of the level that governs
the next j + 1 emitted tokens (nodes 0..j of the next draft), `+inf` where there is none (a level
with `w = inf` is its parent law: the identity). Older levels expire first, so slot order is
nesting order: slot 0 is the innermost (its parent is the target), the last active slot the law
the iteration verifies against. Every level has `rem <= G - 1`, so the law at nodes G - 1 and G
is the target's `p_G`, `p_{G+1}`: the drafter rows q_1..q_{G-1} of the draft cover every residual
row, and one target pass per iteration still suffices. An iteration emitting `tau + 1` tokens
shifts the slots down by `tau + 1` (the expired fall off) and pushes its own level at slot
`G - tau - 2` (always free).

Pieces, one formula each (tests assemble negative controls by swapping one): `law_rows` (the
law's rows along the draft), `path_log_weights` (unclipped `log w_i`), `acceptance` (`h~_i`),
`correction` (the law of Y), `advance_levels` (the state after the iteration). The kernel
`greedy_block_verify` samples; `iteration_law` returns the exact law of (tau, Y) from the same
pieces (distribution mode: tests compare it with a rational oracle).

Inputs must be finite (a row with a NaN or inf is verified as if both models were uniform there,
its levels dropped: defined but meaningless; `verify.nonfinite_rows` flags it and the decode loop
raises by default).

Axes: B batch, G gamma, D = G - 1 level slots, V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling, verify

NAME = 'greedy_block'  # the verifier's name in `verifiers.REGISTRY` and the decode loops


class GreedyBlockResult(NamedTuple):
  """Outcome of one greedy block iteration per row.

  Attributes:
    num_accepted: i32[B], tau in 0..G.
    next_token: i32[B], Y.
    levels: f32[B, G - 1], the state for the next iteration (module docstring).
  """

  num_accepted: jax.Array
  next_token: jax.Array
  levels: jax.Array


def empty_levels(batch: int, gamma: int) -> jax.Array:
  """The state of a row that owes nothing (the law is the target): f32[B, G - 1] of +inf."""
  return jnp.full((batch, max(gamma - 1, 0)), jnp.inf, jnp.float32)


@jax.jit
def greedy_block_verify(rng, draft_tokens, draft_probs, target_probs, levels) -> GreedyBlockResult:
  """Greedy block verification of one draft per row, against each row's carried law.

  With the law's rows `L_0..L_G` along the draft (`law_rows`) and `log w_i` (`path_log_weights`),
  sub-block `X^i` is accepted with probability `h~_i` (`acceptance`), independently; `tau` is the
  longest accepted one (0 if none); `Y ~ (w_tau L_tau - q_{tau+1})_+`, or `L_G = p_{G+1}` at
  `tau = G` (`correction`); the levels advance (`advance_levels`).

  Args:
    rng: PRNG key.
    draft_tokens: i32[B, G].
    draft_probs: f32[B, G, V], q_1..q_G.
    target_probs: f32[B, G+1, V], p_1..p_{G+1}.
    levels: f32[B, G - 1], the carried state (`empty_levels` at the first iteration).

  Returns:
    GreedyBlockResult.
  """
  draft_probs, target_probs, levels = _check(draft_tokens, draft_probs, target_probs, levels)
  law, level_log_w = law_rows(draft_tokens, draft_probs, target_probs, levels)
  log_w = path_log_weights(draft_tokens, draft_probs, law)
  eta_rng, next_rng = jax.random.split(rng)
  h = acceptance(log_w, draft_probs, law)
  tau = verify.longest_accepted_block(jax.random.uniform(eta_rng, h.shape) < h)
  gamma = draft_probs.shape[1]
  q_tau = jnp.where((tau < gamma)[:, None], _at(draft_probs, jnp.minimum(tau, gamma - 1)), 0.0)
  y = sampling.sample(next_rng, correction(_at(law, tau), q_tau, _at(log_w, tau)))
  levels = advance_levels(
    draft_probs, target_probs, levels, level_log_w, log_w, law, tau, y.astype(jnp.int32)
  )
  return GreedyBlockResult(tau, y.astype(jnp.int32), levels)


@jax.jit
def iteration_law(draft_tokens, draft_probs, target_probs, levels):
  """Distribution mode: every outcome of `greedy_block_verify` with its exact probability.

  The same pieces as the sampler, without the draws: tau's law from the `h~` values, Y's given
  tau, and the levels each (tau, Y) leaves (tests enumerate iterations with it and compare the
  output's law with a rational oracle).

  Returns:
    (P(tau = t) f32[B, G+1], P(Y = y | tau = t) f32[B, G+1, V], the levels after (t, y)
    f32[B, G+1, V, G-1]).
  """
  draft_probs, target_probs, levels = _check(draft_tokens, draft_probs, target_probs, levels)
  law, level_log_w = law_rows(draft_tokens, draft_probs, target_probs, levels)
  log_w = path_log_weights(draft_tokens, draft_probs, law)
  h = jnp.pad(acceptance(log_w, draft_probs, law), ((0, 0), (1, 0)), constant_values=1.0)
  # P(tau = t) = h_t prod_{j > t} (1 - h_j), h_0 = 1: a reversed cumulative product.
  after = jnp.flip(jnp.cumprod(jnp.flip(1.0 - h, 1), axis=1), 1)
  tau_probs = h * jnp.pad(after[:, 1:], ((0, 0), (0, 1)), constant_values=1.0)
  q = jnp.pad(draft_probs, ((0, 0), (0, 1), (0, 0)))  # q_{G+1} = 0: Y ~ L_G at tau = G
  y = correction(law, q, log_w)
  batch, vocab = draft_tokens.shape[0], draft_probs.shape[-1]

  def levels_after(t, token):
    tau, token = jnp.full((batch,), t, jnp.int32), jnp.full((batch,), token, jnp.int32)
    return advance_levels(draft_probs, target_probs, levels, level_log_w, log_w, law, tau, token)

  every = jax.vmap(jax.vmap(levels_after, (None, 0)), (0, None))
  after_levels = every(jnp.arange(tau_probs.shape[1]), jnp.arange(vocab))  # [G+1, V, B, D]
  return tau_probs, y / jnp.sum(y, -1, keepdims=True), jnp.moveaxis(after_levels, 2, 0)


# ----------------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------------
# The pieces (docs/method.md section 11, one formula each).


def scaled_residual(row, q_row, log_w) -> jax.Array:
  """`(w row - q)_+` up to a positive factor, for `w = exp(log_w)` in [0, inf]: f32[..., V].

  `(min(w, 1) row - min(1, 1/w) q)_+`: no overflow, `w = inf` gives `row`, `w = 0` gives 0.
  log_w f32[...] (no NaN), row / q_row f32[..., V].
  """
  scale_row = jnp.exp(jnp.minimum(log_w, 0.0))[..., None]
  scale_q = jnp.exp(jnp.minimum(-log_w, 0.0))[..., None]
  return jnp.maximum(scale_row * row - scale_q * q_row, 0.0)


def residual_law(row, q_row, log_w) -> jax.Array:
  """`norm((w row - q)_+)`, or `row` where that is zero (a node the law cannot reach): f32[..., V]."""
  r = scaled_residual(row, q_row, log_w)
  mass = jnp.sum(r, axis=-1, keepdims=True)
  return jnp.where(mass > 0, r / jnp.where(mass > 0, mass, 1.0), row)


def law_rows(draft_tokens, draft_probs, target_probs, levels) -> tuple[jax.Array, jax.Array]:
  """The law's next-token rows along the draft, and each level's `log w` along it.

  Level j (slot j) governs nodes 0..j. At node i its row is
  `norm((w_j(i) row_{j-1}(i) - q_{i+1})_+)` with `row_{-1} = p_{i+1}` (the target) and
  `log w_j(i) = levels[j] + sum_{m < i} log(row_{j-1}(m)(X_{m+1}) / q_{m+1}(X_{m+1}))`; past node
  j the level has expired and passes its parent's row through. Nodes G - 1 and G read p alone.

  Args:
    draft_tokens: i32[B, G]; draft_probs: f32[B, G, V]; target_probs: f32[B, G+1, V].
    levels: f32[B, D], D = G - 1.

  Returns:
    (law f32[B, G+1, V] the rows L_0..L_G, level_log_w f32[B, D, D]: [b, j, i] is level j's
    `log w` at node i <= j, +inf past it).
  """
  depth = draft_tokens.shape[1] - 1
  batch = draft_tokens.shape[0]
  if depth == 0:
    return target_probs, jnp.zeros((batch, 0, 0), jnp.float32)
  q, x = draft_probs[:, :depth], draft_tokens[:, :depth, None].astype(jnp.int32)
  log_q_x = jnp.log(jnp.maximum(jnp.take_along_axis(q, x, axis=-1)[..., 0], _tiny(q)))
  rows, log_ws = jnp.asarray(target_probs[:, :depth]), []
  for j in range(depth):
    nodes = j + 1  # level j is active at nodes 0..j
    step = jnp.log(jnp.take_along_axis(rows[:, :j], x[:, :j], axis=-1)[..., 0]) - log_q_x[:, :j]
    start = levels[:, j : j + 1]
    log_w = start + jnp.pad(jnp.cumsum(step, axis=1), ((0, 0), (1, 0)))
    log_w = jnp.where(start == jnp.inf, jnp.inf, log_w)  # no level: stays the identity
    rows = rows.at[:, :nodes].set(residual_law(rows[:, :nodes], q[:, :nodes], log_w))
    log_ws.append(jnp.pad(log_w, ((0, 0), (0, depth - nodes)), constant_values=jnp.inf))
  return jnp.concatenate([rows, target_probs[:, depth:]], axis=1), jnp.stack(log_ws, axis=1)


def path_log_weights(draft_tokens, draft_probs, law) -> jax.Array:
  """`log w_0..log w_G`, `w_i = prod_{j <= i} L_{j-1}(X_j) / q_j(X_j)`, NOT clipped: f32[B, G+1].

  `q_j(X_j)` is clamped to the smallest normal float (a drafted token has q > 0); `L(X) = 0` gives
  `-inf`, and every later weight stays `-inf` (no `+inf` can appear, so no NaN).
  """
  l_x, q_x = verify.probs_of_drafts(draft_tokens, draft_probs, law)
  log_ratio = jnp.log(l_x) - jnp.log(jnp.maximum(q_x, _tiny(q_x)))
  return jnp.pad(jnp.cumsum(log_ratio, axis=1), ((0, 0), (1, 0)))


def acceptance(log_w, draft_probs, law) -> jax.Array:
  """`h~_1..h~_G`: f32[B, G].

  `h~_i = 1` if `w_i >= 1`, else `A_i / (A_i + 1 - w_i)` with `A_i = sum_x (w_i L_i - q_{i+1})_+`
  (1 <= i < G; block verification's `h_i` with `w` unclipped), and `h~_G = min(1, w_G)`.
  """
  w = jnp.exp(jnp.minimum(log_w, 0.0))
  h = verify.block_acceptance(w, draft_probs, law)
  return jnp.where(log_w[:, 1:] >= 0, 1.0, h)


def correction(law_row, q_row, log_w) -> jax.Array:
  """The law of Y after `tau` (unnormalized): `(w_tau L_tau - q_{tau+1})_+`, with `q_{G+1} = 0`
  (so `L_G` at tau = G); `L_tau` where that is zero (p == q there; docs/method.md section 4).
  law_row / q_row f32[..., V], log_w f32[...]."""
  r = scaled_residual(law_row, q_row, log_w)
  return jnp.where(jnp.sum(r, axis=-1, keepdims=True) > 0, r, law_row)


def advance_levels(draft_probs, target_probs, levels, level_log_w, log_w, law, tau, y):
  """The levels after emitting `X^tau, Y`: f32[B, D].

  Every level advances through Y at node tau (`log w += log(parent(Y) / q_{tau+1}(Y))`; its
  advance through `X^tau` is `level_log_w`), the slots shift down by `tau + 1` (levels with
  `j <= tau` expire), and the iteration's own level `log w_tau + log(L_tau(Y) / q_{tau+1}(Y))`
  is pushed at slot `G - tau - 2` when `tau <= G - 2` (it governs the next `G - tau - 1` tokens).
  `q_{tau+1}(Y) = 0` gives `w = inf`: no level (the residual of a subtree the drafter never
  reaches is its parent).

  Args:
    draft_probs: f32[B, G, V]; target_probs: f32[B, G+1, V]; levels: f32[B, D].
    level_log_w: f32[B, D, D] and law f32[B, G+1, V] from `law_rows`; log_w: f32[B, G+1].
    tau, y: i32[B].
  """
  gamma = draft_probs.shape[1]
  depth = gamma - 1
  if depth == 0:
    return levels
  node = jnp.minimum(tau, depth - 1)  # every level surviving Y has tau <= j - 1 <= G - 3
  q_row = _at(draft_probs, jnp.minimum(tau, gamma - 1))
  log_q_y = jnp.log(_at(q_row, y))
  parent, advanced = _at(target_probs, node), []
  for j in range(depth):
    start = _at(level_log_w[:, j], node)
    after = start + jnp.log(_at(parent, y)) - log_q_y
    advanced.append(jnp.where((start == jnp.inf) | (log_q_y == -jnp.inf), jnp.inf, after))
    parent = jnp.where((node <= j)[:, None], residual_law(parent, q_row, start), parent)
  source = jnp.arange(depth) + tau[:, None] + 1  # new slot j takes old slot j + tau + 1
  shifted = jnp.where(
    source < depth,
    jnp.take_along_axis(jnp.stack(advanced, 1), jnp.minimum(source, depth - 1), axis=1),
    jnp.inf,
  )
  own = _at(log_w, tau) + jnp.log(_at(_at(law, tau), y)) - log_q_y
  own = jnp.where(log_q_y == -jnp.inf, jnp.inf, own)
  push = (jnp.arange(depth) == gamma - tau[:, None] - 2) & (tau[:, None] <= gamma - 2)
  return jnp.where(push, own[:, None], shifted)


# ----------------------------------------------------------------------------------------------


def _tiny(x) -> float:
  """The smallest normal number of x's dtype (a drafted token's q is clamped to it)."""
  return float(jnp.finfo(x.dtype).tiny)


def _at(x, index):
  """x[b, index[b]] for each row b: [B, N, ...] -> [B, ...]."""
  index = index.reshape(index.shape + (1,) * (x.ndim - 1))
  return jnp.take_along_axis(x, index, axis=1)[:, 0]


def _check(draft_tokens, draft_probs, target_probs, levels):
  """Checks shapes (as `verify`'s kernels do, and levels [B, G - 1]); rows with a NaN or inf are
  replaced by uniform vectors and their levels dropped (module docstring)."""
  draft_probs, target_probs = verify.check_and_cast(draft_tokens, draft_probs, target_probs)
  batch, gamma = draft_tokens.shape
  if levels.shape != (batch, gamma - 1):
    raise ValueError(f'levels must be [B, G - 1] = {(batch, gamma - 1)}, got {levels.shape}')
  bad = verify.nonfinite_rows(draft_probs, target_probs)
  uniform = 1.0 / draft_probs.shape[-1]
  draft_probs = jnp.where(bad[:, None, None], uniform, draft_probs)
  target_probs = jnp.where(bad[:, None, None], uniform, target_probs)
  levels = jnp.where(bad[:, None] | jnp.isnan(levels), jnp.inf, levels.astype(draft_probs.dtype))
  return draft_probs, target_probs, levels
