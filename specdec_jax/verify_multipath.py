"""Verification of K drafted paths: greedy multi-path block verification and recursive rejection.

One multi-draft iteration drafts K paths `X^(k)_1..X^(k)_G` (k = 1..K) from the drafter, scores
every node of the K paths with the target, and keeps the first `tau` tokens of one path plus one
more token `Y`. Both verifiers here are lossless: `X^tau, Y` followed by sampling from the target
is distributed exactly as sampling from the target alone (checked exactly and by chi-square in
tests/verify_multipath_test.py, with negative controls).

- `multipath_block_verify`: greedy multi-path block verification (GBV; Thomas & Pal, arXiv
  2602.16961, as its reference code does it, with one fix: the tie rule of docs/method.md
  section 6): select the lexicographically largest path under one strict token order per node,
  compute the law `q_hat` of that maximum of K i.i.d. paths in closed form, and run block
  verification (`verify.block_verify`) on it with `q_hat` as the draft law. Needs i.i.d. paths:
  one drafter law per node.
- `multipath_token_verify`: recursive rejection sampling over the tree (SpecInfer's multi-step
  speculative sampling with replacement): at each node try every path through it in path order,
  updating the target's residual after each rejection. Needs independent paths only.
- `multipath_greedy_verify`: temperature 0 on ids: the path with the longest prefix equal to the
  target's argmax. Both verifiers reduce to it on one-hot vectors.

With K = 1 the first two are `verify.block_verify` / `verify.token_verify` exactly: the same
outputs for the same key.

Inputs: `q[b, k, i] = Ms(.|c, X^(k)_1..X^(k)_i)` and `p[b, k, i] = Mb(.|c, X^(k)_1..X^(k)_i)`,
the drafter's and the target's rows at the node of path k after i drafted tokens. Paths sharing a
prefix share nodes: those rows must then be equal (they are the same conditional). Rows of a
shared node are read from its lowest-index path, so float noise between copies cannot make two
steps of the verifier see different rows. Inputs must be finite (verify.nonfinite_rows flags rows
that are not; the multi-path kernels do not yet truncate them as `verify` does).

Axes: B batch, K paths, G gamma (drafted tokens per path), V vocab.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling, verify


class MultipathResult(NamedTuple):
  """Outcome of verifying K drafted paths per row.

  Attributes:
    path: i32[B], k in 0..K-1: keep the first `num_accepted` tokens of path k (the lowest-index
      path holding the accepted tokens, so its cache holds exactly that prefix).
    num_accepted: i32[B], tau in 0..G.
    next_token: i32[B], Y, the token emitted after them.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array


@jax.jit
def multipath_block_verify(
  rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> MultipathResult:
  """Greedy multi-path block verification (GBV), lossless for K i.i.d. drafted paths.

  Token order at node v: `s <_v t` iff `(key_v(s), s) < (key_v(t), t)`, a strict total order
  (ties by token id), with `key_v(t) = log(p_v(t) / q_v(t))` (q_v(t) = 0 counts as the smallest
  normal float; why this key and not the reference code's `min(1, p/q)`: docs/method.md section
  6). The SAME order drives both steps below; the public reference code breaks ties
  differently in each, which is lossy (tests/verify_multipath_test.py keeps it as a control).

  1. Selection: from the root, move to the `<_v`-largest child present among the K paths;
     `X*` is the lexicographically largest path.
  2. Its law: with `A` = drafter mass of the paths ranked below v's subtree and `Q` = Ms(v),
     normalized as `alpha = A / (A + Q)`, `beta = Q / (A + Q)` (alpha = 0, beta = 1 at the root),
     `a_t = alpha + beta * sum_{s <_v t} q_v(s)`, `b_t = a_t + beta q_v(t)`:
     `q_hat_v(t) = (b_t^K - a_t^K) / (1 - alpha^K)
               ∝ q_v(t) b_t^(K-1) sum_{m<K} (a_t / b_t)^m`,
     evaluated in log space with the second form (no cancellation; finite for K <= 8 and any V),
     and then `alpha' = a_X / b_X`, `beta' = beta q_v(X) / b_X` at the selected child X. K = 1
     gives `q_hat = q` (used as is).
  3. `verify.block_verify` on `X*` with `q_hat` as the draft law: `q_hat` in place of `q`
     everywhere (weights, acceptance, residual).

  Args:
    rng: PRNG key.
    draft_tokens: i32[B, K, G], the K drafted paths.
    draft_probs: f32[B, K, G, V], q (module docstring).
    target_probs: f32[B, K, G+1, V], p.

  Returns:
    MultipathResult with i32[B] fields.
  """
  draft_probs, target_probs = _check_and_cast(draft_tokens, draft_probs, target_probs)
  path, selected, q_hat, p_selected = select_path(draft_tokens, draft_probs, target_probs)
  num_accepted, next_token = verify.block_verify(rng, selected, q_hat, p_selected)
  return MultipathResult(path, num_accepted, next_token)


@jax.jit
def multipath_token_verify(
  rng: jax.Array, draft_tokens: jax.Array, draft_probs: jax.Array, target_probs: jax.Array
) -> MultipathResult:
  """Recursive rejection sampling over the K drafted paths (SpecInfer's multi-step sampling).

  At the current node v (the root first), with `p_1 = p_v`, try the paths through v in path order
  k = 1..K, ONE TRIAL PER PATH, repeated tokens included: path k's child `x_k` is accepted with
  probability `min(1, p_j(x_k) / q_k(x_k))`, and on rejection
  `p_{j+1} = norm(max(0, p_j - q_k))` (q_k: path k's drafter row at v). The first accepted child
  becomes the node, the paths through it carry on, and the next depth starts from `p_1 = p_child`.
  If every trial at v is rejected, `Y ~ p_{last}` (the last residual; the row before it if that
  residual is all zero) and the iteration stops; after G accepted nodes `Y ~ p` at the leaf.

  Why lossless: the children of v's paths are drawn independently of each other and of every
  decision so far (those read only shallower tokens), so at v this is multi-draft speculative
  sampling of independent drafts `x_k ~ q_k`: a trial accepts `x` with probability
  `min(q_k(x), p_j(x))` and otherwise leaves exactly `p_j - min(q_k, p_j)`, so by induction over
  the trials the emitted child is `p_v`-distributed, and by induction over depth so is the whole
  output. A repeated token must still be tried: skipping it keeps the next draw from being
  independent of the history, which is lossy (a negative control in the tests). With i.i.d.
  drafts every q_k at v is the same row; with K = 1 this is `verify.token_verify`.

  Args:
    rng: PRNG key.
    draft_tokens: i32[B, K, G].
    draft_probs: f32[B, K, G, V], q; rows may differ between paths (independent drafters).
    target_probs: f32[B, K, G+1, V], p; one row per node.

  Returns:
    MultipathResult with i32[B] fields.
  """
  draft_probs, target_probs = _check_and_cast(draft_tokens, draft_probs, target_probs)
  batch, num_drafts, gamma = draft_tokens.shape
  eta_rng, next_rng = jax.random.split(rng)
  # One uniform per (depth, path); the [B, G * K] draw makes K = 1 use token_verify's numbers.
  uniforms = jax.random.uniform(eta_rng, (batch, gamma * num_drafts), jnp.float32)
  uniforms = uniforms.reshape(batch, gamma, num_drafts)
  alive = jnp.ones((batch, num_drafts), bool)
  stopped = jnp.zeros((batch,), bool)
  num_accepted = jnp.zeros((batch,), jnp.int32)
  next_probs = jnp.zeros((batch, target_probs.shape[-1]), jnp.float32)
  for depth in range(gamma):
    children = draft_tokens[:, :, depth]
    p_node = _node_rows(target_probs[:, :, depth], alive, depth)
    acceptance, residual = node_trials(p_node, draft_probs[:, :, depth], children, alive)
    accepted = uniforms[:, depth] < acceptance
    any_accepted = jnp.any(accepted, axis=1)
    child = jnp.take_along_axis(children, jnp.argmax(accepted, axis=1)[:, None], axis=1)
    stops_here = ~stopped & ~any_accepted
    next_probs = jnp.where(stops_here[:, None], residual, next_probs)
    num_accepted = num_accepted + (~stopped & any_accepted).astype(jnp.int32)
    alive = jnp.where((stopped | stops_here)[:, None], alive, alive & (children == child))
    stopped = stopped | stops_here
  leaf = _node_rows(target_probs[:, :, gamma], alive, gamma)
  next_probs = jnp.where(stopped[:, None], next_probs, leaf)
  next_token = sampling.sample(next_rng, next_probs)
  return MultipathResult(_first(alive), num_accepted, next_token)


@jax.jit
def multipath_greedy_verify(draft_tokens: jax.Array, target_ids: jax.Array) -> MultipathResult:
  """Temperature 0 on ids: the path with the longest prefix equal to the target's argmax.

  With one-hot `p = onehot(a)` and `q = onehot(X)` both verifiers accept a child iff it is the
  target's argmax `a_v` at the node (token: `h = p(x)`; block: the ratio key of `a_v` is the
  largest), so `tau` = the longest prefix any path shares with the argmax chain and
  `Y = a` after it. Ties go to the lowest path index.

  Args:
    draft_tokens: i32[B, K, G].
    target_ids: i32[B, K, G+1], the target's argmax at each node of each path.

  Returns:
    MultipathResult with i32[B] fields.
  """
  if draft_tokens.ndim != 3 or target_ids.shape != draft_tokens.shape[:2] + (
    draft_tokens.shape[2] + 1,
  ):
    raise ValueError(
      f'multipath_greedy_verify needs draft_tokens [B, K, G] and target_ids [B, K, G+1], got '
      f'{draft_tokens.shape} and {target_ids.shape}'
    )
  matches = jnp.cumprod((draft_tokens == target_ids[..., :-1]).astype(jnp.int32), axis=2)
  lengths = jnp.sum(matches, axis=2)
  path = jnp.argmax(lengths, axis=1).astype(jnp.int32)
  num_accepted = jnp.max(lengths, axis=1)
  ids = jnp.take_along_axis(target_ids, path[:, None, None], axis=1)[:, 0]
  next_token = jnp.take_along_axis(ids, num_accepted[:, None], axis=1)[:, 0]
  return MultipathResult(path, num_accepted.astype(jnp.int32), next_token.astype(jnp.int32))


VERIFIERS = {'token': multipath_token_verify, 'block': multipath_block_verify}


# ----------------------------------------------------------------------------------------------
# The kernels' pieces: pure functions on checked float32 arrays, each called through this
# module's namespace (the tests' negative controls swap one while tracing a kernel).


def order_key(p: jax.Array, q: jax.Array) -> jax.Array:
  """`key_v(t) = log(p_v(t) / q_v(t))` of `multipath_block_verify`, f32[..., V]; ties are broken
  by id by the callers.

  q = 0 is read as the smallest normal float, so every key is a number (never NaN): a token the
  drafter cannot draw has no mass in `q_hat` wherever it ranks, and at temperature 0 (one-hot
  rows) the target's argmax still ranks first.
  """
  return jnp.log(p) - jnp.log(jnp.maximum(q, jnp.finfo(jnp.float32).tiny))


def select_child(children, keys, alive) -> jax.Array:
  """The largest present child under `(key, id)`.

  Args:
    children: i32[B, K], each path's child.
    keys: f32[B, V], `order_key` at the node.
    alive: bool[B, K], the paths through the node.

  Returns:
    i32[B].
  """
  child_keys = jnp.take_along_axis(keys, children, axis=1)
  best = jnp.max(jnp.where(alive, child_keys, -jnp.inf), axis=1, keepdims=True)
  return jnp.max(jnp.where(alive & (child_keys == best), children, -1), axis=1)


def select_path(draft_tokens, draft_probs, target_probs):
  """Steps 1 and 2 of `multipath_block_verify`: the selected path and its law.

  Args:
    draft_tokens: i32[B, K, G].
    draft_probs: f32[B, K, G, V].
    target_probs: f32[B, K, G+1, V].

  Returns:
    (path i32[B], selected tokens i32[B, G], q_hat f32[B, G, V], p along the path f32[B, G+1, V]).
  """
  batch, num_drafts, gamma = draft_tokens.shape
  alive = jnp.ones((batch, num_drafts), bool)
  alpha = jnp.zeros((batch,), jnp.float32)
  beta = jnp.ones((batch,), jnp.float32)
  selected, q_hats, p_rows = [], [], []
  for depth in range(gamma):
    children = draft_tokens[:, :, depth]
    p_node = _node_rows(target_probs[:, :, depth], alive, depth)
    q_node = _node_rows(draft_probs[:, :, depth], alive, depth)
    keys = order_key(p_node, q_node)
    child = select_child(children, keys, alive)
    if num_drafts == 1:
      q_hat = q_node  # the maximum of one path is that path: F^1 = F
    else:
      q_hat, alpha, beta = skew_row(q_node, keys, alpha, beta, child, num_drafts)
    alive = alive & (children == child[:, None])
    selected.append(child)
    q_hats.append(q_hat)
    p_rows.append(p_node)
  p_rows.append(_node_rows(target_probs[:, :, gamma], alive, gamma))
  return _first(alive), jnp.stack(selected, 1), jnp.stack(q_hats, 1), jnp.stack(p_rows, 1)


def skew_row(q_row, keys, alpha, beta, child, num_drafts: int):
  """`q_hat_v` and the next `(alpha, beta)` (`multipath_block_verify` step 2).

  Args:
    q_row: f32[B, V], q_v.
    keys: f32[B, V], `order_key` at the node: the order `(key, id)` the law is taken under.
    alpha, beta: f32[B], the node's normalized mass below its subtree and of its subtree.
    child: i32[B], the selected child.
    num_drafts: K.

  Returns:
    (q_hat f32[B, V] normalized, alpha f32[B], beta f32[B]) of the child.
  """
  a = alpha[:, None] + beta[:, None] * _mass_below(keys, q_row)
  b = a + beta[:, None] * q_row  # b >= a: no cancellation anywhere below
  ratio = jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)
  geometric = jnp.ones_like(ratio)
  for _ in range(num_drafts - 1):
    geometric = 1.0 + ratio * geometric  # Horner: sum_{m<K} ratio^m, in [1, K]
  log_weight = jnp.log(q_row) + (num_drafts - 1) * jnp.log(b) + jnp.log(geometric)
  log_weight = jnp.where(q_row > 0, log_weight, -jnp.inf)
  log_total = jax.nn.logsumexp(log_weight, axis=-1, keepdims=True)
  q_hat = jnp.exp(log_weight - jnp.where(jnp.isfinite(log_total), log_total, 0.0))
  a_x = jnp.take_along_axis(a, child[:, None], axis=1)[:, 0]
  b_x = jnp.take_along_axis(b, child[:, None], axis=1)[:, 0]
  q_x = jnp.take_along_axis(q_row, child[:, None], axis=1)[:, 0]
  # b_x = 0 only for a child the drafter cannot draw (one-hot rows at temperature 0): restart the
  # recursion from a root-like state rather than divide by zero.
  positive = b_x > 0
  safe_b = jnp.where(positive, b_x, 1.0)
  return (
    q_hat,
    jnp.where(positive, a_x / safe_b, 0.0),
    jnp.where(positive, beta * q_x / safe_b, 1.0),
  )


def _mass_below(keys: jax.Array, q_row: jax.Array) -> jax.Array:
  """`sum_{s <_v t} q_v(s)` for every t under the strict order `(key, id)`: f32[B, V].

  A stable ascending sort lists equal keys by id, which is exactly that order.
  """
  perm = jnp.argsort(keys, axis=-1, stable=True)
  sorted_q = jnp.take_along_axis(q_row, perm, axis=-1)
  exclusive = jnp.cumsum(jnp.pad(sorted_q[..., :-1], ((0, 0), (1, 0))), axis=-1)
  return jnp.put_along_axis(jnp.zeros_like(q_row), perm, exclusive, axis=-1, inplace=False)


def node_trials(p_node, q_paths, children, alive):
  """The trials of `multipath_token_verify` at one node, each assuming the earlier ones failed.

  Args:
    p_node: f32[B, V], p_v.
    q_paths: f32[B, K, V], each path's drafter row at v.
    children: i32[B, K], each path's child.
    alive: bool[B, K], the paths through v (others are not tried: h = 0).

  Returns:
    (h f32[B, K]: path k's acceptance probability given trials < k were rejected;
     f32[B, V]: what Y is drawn from when all are rejected, unnormalized).
  """
  residual = p_node
  draw_from = p_node
  acceptances = []
  for k in range(children.shape[1]):
    child = children[:, k : k + 1]
    p_x = jnp.take_along_axis(residual, child, axis=1)[:, 0]
    q_x = jnp.take_along_axis(q_paths[:, k], child, axis=1)[:, 0]
    acceptances.append(jnp.where(alive[:, k], verify.token_acceptance(p_x, q_x), 0.0))
    left = jnp.maximum(residual - q_paths[:, k], 0.0)
    mass = jnp.sum(left, axis=-1, keepdims=True)
    # A zero residual (p_j = q_k) has rejection probability 0; keep p_j for the fallback draw.
    tried = alive[:, k : k + 1]
    draw_from = jnp.where(tried, jnp.where(mass > 0, left, residual), draw_from)
    residual = jnp.where(tried & (mass > 0), left / jnp.where(mass > 0, mass, 1.0), residual)
  return jnp.stack(acceptances, axis=1), draw_from


# ----------------------------------------------------------------------------------------------
# Shared helpers.


def _first(alive: jax.Array) -> jax.Array:
  """The lowest index with alive True: bool[B, K] -> i32[B] (one always is).

  A min over indices rather than `jnp.argmax`: XLA:CPU runs argmax as a two-operand reduction
  that does not vectorize (sampling.argmax)."""
  index = jax.lax.broadcasted_iota(jnp.int32, alive.shape, 1)
  return jnp.min(jnp.where(alive, index, alive.shape[1] - 1), axis=1)


def _node_rows(rows: jax.Array, alive: jax.Array, depth: int) -> jax.Array:
  """The current node's row, read from its lowest-index path: f32[B, K, V] -> f32[B, V].

  At the root every path is alive: row 0, without a reduction over the constant all-True mask
  (XLA constant-folds that reduction at compile time, slowly at large B: docs/performance.md).
  """
  if depth == 0:
    return rows[:, 0]
  return jnp.take_along_axis(rows, _first(alive)[:, None, None], axis=1)[:, 0]


def _check_and_cast(draft_tokens, draft_probs, target_probs):
  """Raises ValueError on inconsistent shapes; returns float32 probs."""
  if draft_tokens.ndim != 3:
    raise ValueError(f'draft_tokens must be [B, K, G], got shape {draft_tokens.shape}')
  batch, num_drafts, gamma = draft_tokens.shape
  if num_drafts < 1 or gamma < 1:
    raise ValueError(f'need K >= 1 paths of G >= 1 tokens, got K = {num_drafts}, G = {gamma}')
  if draft_probs.ndim != 4 or draft_probs.shape[:3] != (batch, num_drafts, gamma):
    raise ValueError(
      f'draft_probs must be [B, K, G, V] = [{batch}, {num_drafts}, {gamma}, V], got '
      f'{draft_probs.shape}'
    )
  vocab = draft_probs.shape[3]
  if target_probs.shape != (batch, num_drafts, gamma + 1, vocab):
    raise ValueError(
      f'target_probs must be [B, K, G+1, V] = {(batch, num_drafts, gamma + 1, vocab)}, got '
      f'{target_probs.shape}'
    )
  return jnp.asarray(draft_probs, jnp.float32), jnp.asarray(target_probs, jnp.float32)
