"""The steps of one decode-loop iteration, as `decode.speculative_loop` / `autoregressive_loop`
run them: the drafter's calls (`draft`), the target pass (`target_pass`), verification of one
drafted path or of K paths (`verify_drafts`, `verify_paths`, `follow`), and emitting the kept
tokens (`emit`, `emit_accepted`). Pure functions of arrays and step models; `spec` is the loop's
`decode.LoopSpec`. `timing` measures `draft` and `target_pass` as the loop runs them.

Axis legend: B batch, G gamma, K draft paths, V vocab, L buffer length.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax import sampling as sampling_lib
from specdec_jax import step_models, verifiers, verify, verify_multipath


class TargetStates(NamedTuple):
  """The last target pass's final decoder states, for a drafter that reads them.

  Attributes:
    states: f32[R, G + 1, F] the state at each position of the pass.
    start: int32[R] the position of the first (-1 before the first pass, with zero states).
  """

  states: jax.Array
  start: jax.Array


def row_slice(seq: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """seq[b, start[b] : start[b] + size] for each row: int32[B, size]."""
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (size,)))(seq, start)


def row_update(seq: jax.Array, tokens: jax.Array, start: jax.Array) -> jax.Array:
  """Writes tokens[b] into seq[b] at start[b]."""
  return jax.vmap(lambda row, new, s: jax.lax.dynamic_update_slice(row, new, (s,)))(
    seq, tokens, start
  )


def emit(seq, n, done, tokens, num_valid, *, eos_id: int, max_new_tokens: int):
  """Appends tokens[b, :num_valid[b]] to each unfinished row, stopping at EOS and the token limit.

  Args:
    seq: int32[B, L] decoder inputs; emitted token j (1-based) is at seq[:, j].
    n: int32[B] tokens emitted so far.
    done: bool[B] rows that stopped emitting.
    tokens: int32[B, K] candidate tokens; positions >= num_valid are ignored.
    num_valid: int32[B] in 1..K.

  Returns:
    (seq, n, done) updated; finished rows are left unchanged.
  """
  k = tokens.shape[1]
  pos = jnp.arange(k)
  is_eos = (tokens == eos_id) & (pos < num_valid[:, None])
  # Tokens up to and including the first EOS, capped by the room left.
  first_eos = jnp.argmax(is_eos, axis=1)
  has_eos = is_eos.any(axis=1)
  count = jnp.where(has_eos, first_eos + 1, num_valid)
  count = jnp.minimum(count, max_new_tokens - n)
  count = jnp.where(done, 0, count)
  # Finished rows write to seq too, but only past their end, where nothing is read.
  seq = row_update(seq, tokens, n + 1)
  new_n = n + count
  done = done | has_eos | (new_n >= max_new_tokens)
  return seq, new_n, done


def draft_token(rng, logits, sampling: sampling_lib.SamplingConfig):
  """Samples one draft token per row: (int32[B], q float32[B, V]) with q the SAME transform p gets."""
  q = sampling_lib.logits_to_probs(logits, sampling)
  return sampling_lib.sample(rng, q), q


def drafter_call(steps, params, tokens, features, cache, logits_at=None):
  """One drafter call as the loop makes it: (logits, predicted target states or None, cache).

  `step`, or `step_features` for a drafter that reads the target's states (`features` not None).
  With `logits_at` (int32[B]) only position logits_at[b] of each row is read: logits [B, 1, V]
  (and predicted states), by the step model's `step_at` where it has one (a T5's output layer
  then runs on one row), else picked from every position's.
  """
  with jax.named_scope('drafter'):
    if logits_at is not None:
      if step_models.capabilities(steps).step_at:
        return steps.step_at(params, tokens, features, cache, logits_at)
      logits, predicted, cache = drafter_call(steps, params, tokens, features, cache)
      rows = logits_at[:, None, None]
      pick = lambda x: None if x is None else jnp.take_along_axis(x, rows, axis=1)
      return pick(logits), pick(predicted), cache
    if features is None:
      logits, cache = steps.step(params, tokens, cache)
      return logits, None, cache
    return steps.step_features(params, tokens, features, cache)


def draft(
  steps,
  params,
  cache,
  seq,
  n,
  rng,
  *,
  gamma,
  sampling,
  greedy,
  target_states=None,
  stop=None,
  unroll_draft: bool = False,
  proposal: str = 'sample',
):
  """Step 1 of an iteration: the drafter proposes gamma tokens after seq[:, :n + 1].

  Args:
    steps, params: the drafter as a step model.
    cache: its cache, holding at least positions 0..n-2 (0..start for `target_states`).
    seq: int32[B, L] the loop's decoder inputs; seq[b, n[b]] is the pending token.
    n: int32[B] tokens emitted so far.
    rng: PRNG key for the draws (unused when greedy).
    gamma: G, tokens to draft.
    sampling: the transform of the drafter's logits (unused when greedy).
    greedy: draft argmax ids and return no probabilities.
    target_states: `TargetStates` of the last target pass, for a drafter that reads them
      (`reads_target_states`); else None. The first call feeds as many positions as there are
      states (`timing` drafts past the pass's G).
    stop: `LoopSpec.draft_stop`, or None.
    unroll_draft: unroll the scan of the gamma - 1 later calls (`LoopSpec.unroll_draft`): the
      same numbers, with no while loop (fewer launches on an accelerator, longer compiles).
    proposal: 'sample' (X_i ~ q_i) or 'argmax' (q_i's most likely token, q_i one-hot) when not
      greedy (`LoopSpec.proposal`).

  Returns:
    (tokens int32[B, G], q float32[B, G, V] or None when greedy, cache, lengths: None without
    `stop`, else int32[B] drafts to verify, the first i whose draft's own probability is below
    `stop`, or G). All G tokens are drafted either way; the cache's end_index is n + G on exit:
    X_G is drafted but not fed.
  """
  logits, predicted, cache = _first_draft_call(steps, params, cache, seq, n, target_states)
  draw = functools.partial(_draw, greedy=greedy, sampling=sampling, stop=stop, proposal=proposal)

  def body(carry, key):
    logits, predicted, cache = carry
    token, q, unsure = draw(key, logits)
    features = None if predicted is None else predicted[:, None]
    logits, predicted, cache = drafter_call(steps, params, token[:, None], features, cache)
    return (logits[:, 0], None if predicted is None else predicted[:, 0], cache), (token, q, unsure)

  keys = jax.random.split(rng, gamma)
  carry = (logits, predicted, cache)
  (logits, _, cache), (tokens, probs, unsure) = jax.lax.scan(
    body, carry, keys[:-1], unroll=bool(unroll_draft)
  )
  last_token, last_q, last_unsure = draw(keys[-1], logits)
  tokens = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)
  lengths = None
  if stop is not None:  # the first unsure draft is the last one kept
    unsure = jnp.concatenate([unsure.T, last_unsure[:, None]], axis=1)
    lengths = jnp.where(unsure.any(1), jnp.argmax(unsure, axis=1) + 1, gamma).astype(jnp.int32)
  if greedy:
    return tokens, None, cache, lengths
  probs = jnp.concatenate([jnp.moveaxis(probs, 0, 1), last_q[:, None]], axis=1)
  return tokens, probs, cache, lengths


def draft_block(
  steps,
  params,
  cache,
  seq,
  n,
  rng,
  *,
  gamma,
  sampling,
  greedy,
  target_states,
  stop=None,
  proposal: str = 'sample',
  unroll_draft: bool = False,
):
  """Step 1 by a block drafter (`block_size`): all gamma drafts from ONE call (`step_block`).

  The call catches the drafter up on what the last iteration kept, as `_first_draft_call` does for
  a drafter reading the target's states, and returns each draft position's logits, conditioned on
  the kept prefix only. Draft i is drawn from its own position's law q_i under the sampling
  transform p gets ('sample'), or is that law's argmax with q_i its one-hot vector ('argmax').
  Either way the drafts' joint law is the product of the q_i, so Q(X_i | prefix, X_<i) = q_i(X_i)
  and every verifier stays exact (docs/method.md, "Block drafting").

  Args and returns: as `draft`'s (`target_states` required; `proposal` 'argmax' or 'sample';
  `unroll_draft` unread: one call, nothing to unroll). The cache's end_index is n + 1 on exit:
  the drafts are not fed.
  """
  del unroll_draft
  logits, cache = block_logits(steps, params, cache, seq, n, target_states, gamma=gamma)
  with jax.named_scope('sampling'):
    if greedy or proposal == 'argmax':
      drafts, q = sampling_lib.argmax(logits), None
      if not greedy:
        q = jax.nn.one_hot(drafts, logits.shape[-1], dtype=jnp.float32)
    else:
      q = sampling_lib.logits_to_probs(logits, sampling)
      drafts = sampling_lib.sample(rng, q)
    lengths = None
    if stop is not None:  # the first unsure draft is the last one kept
      own = jnp.take_along_axis(logits, drafts[..., None], axis=-1)[..., 0]
      unsure = jnp.exp(own - jax.nn.logsumexp(logits, axis=-1)) < stop
      lengths = jnp.where(unsure.any(1), jnp.argmax(unsure, axis=1) + 1, gamma).astype(jnp.int32)
  return drafts, q, cache, lengths


def block_logits(steps, params, cache, seq, n, target_states, *, gamma: int):
  """A block drafter's one call (`step_block`): the logits f32[B, G, V] of the gamma positions
  after each row's pending token seq[b, n[b]], and its cache caught up on the positions the last
  iteration kept (those of `target_states`, the last target pass's, up to n), end_index n + 1."""
  features, state_start = target_states
  start = state_start + 1
  tokens = row_slice(seq, start, features.shape[1])
  num_kept = jnp.clip(n - start + 1, 1, tokens.shape[1])
  with jax.named_scope('drafter'):
    return steps.step_block(
      params, tokens, features, cache.replace(end_index=start), gamma, num_kept
    )


def _first_draft_call(steps, params, cache, seq, n, target_states):
  """The draft's first drafter call: (logits f32[B, V] after seq[n], predicted states [B, F] or
  None, cache with end_index n + 1). It catches the drafter up on what the last iteration kept
  (`draft`'s cache and `target_states`)."""
  if target_states is None:
    # Feed seq[n-1], seq[n] from position n - 1 (position 0 at the start, where the second token
    # is a placeholder written to a slot that stays stale) and keep the logits after seq[n].
    start, features = jnp.maximum(n - 1, 0), None
    tokens = row_slice(seq, start, 2)
  else:
    # Feed seq[start+1 .. start+G+1], each with the target's state before it: the positions of
    # the last pass, of which start+1 .. n are accepted (n - start - 1 <= G). Rows that stopped
    # read a clipped index.
    features, state_start = target_states
    start = state_start + 1
    tokens = row_slice(seq, start, features.shape[1])  # G + 1 in the loop (more: `timing`)
  # Only the logits after seq[n] are read.
  logits_at = jnp.clip(n - start, 0, tokens.shape[1] - 1)
  logits, predicted, cache = drafter_call(
    steps, params, tokens, features, cache.replace(end_index=start), logits_at=logits_at
  )
  logits, predicted = logits[:, 0], None if predicted is None else predicted[:, 0]
  return logits, predicted, cache.replace(end_index=n + 1)


@jax.named_scope('sampling')
def _draw(key, logits, *, greedy, sampling, stop, proposal='sample'):
  """One draft per row from the drafter's logits f32[B, V]: (token int32[B], q f32[B, V] or None
  when greedy, unsure: None without `stop`, else bool[B] the token's own probability < stop)."""
  if greedy:
    token, q = sampling_lib.argmax(logits), None
  elif proposal == 'argmax':
    token = sampling_lib.argmax(logits)
    q = jax.nn.one_hot(token, logits.shape[-1], dtype=jnp.float32)
  else:
    token, q = draft_token(key, logits, sampling)
  if stop is None:
    return token, q, None
  own = jnp.take_along_axis(logits, token[:, None], axis=-1)[:, 0]
  return token, q, jnp.exp(own - jax.nn.logsumexp(logits, axis=-1)) < stop


def target_pass(steps, params, tokens, cache, num_drafted=None, done=None, *, with_states: bool):
  """Step 2 of an iteration: the target scores the pending token and the drafts in one call.

  tokens int32[B, G + 1] fed from the cache's end_index -> (logits f32[B, G + 1, V], its final
  decoder states f32[B, G + 1, state_dim] when `with_states` else None, cache). With
  `num_drafted` (int32[B], from a drafter that stopped early) the pass is `narrow_target_pass`'s,
  sized for the longest row not `done` (bool[B]).
  """
  if num_drafted is not None:
    if done is not None:
      num_drafted = jnp.where(done, 1, num_drafted)
    return narrow_target_pass(steps, params, tokens, cache, num_drafted, with_states=with_states)
  with jax.named_scope('target'):
    if not with_states:
      logits, cache = steps.step(params, tokens, cache)
      return logits, None, cache
    logits, states, cache = steps.step_states(params, tokens, cache)
    return logits, states.astype(jnp.float32), cache


def pass_widths(gamma: int) -> tuple[int, ...]:
  """The target-pass widths compiled for adaptive draft length: 2, 3, 5, 9, ... (one pending token
  plus 1, 2, 4, 8, ... drafts) below G + 1, and G + 1."""
  widths, drafts = [], 1
  while drafts < gamma:
    widths.append(drafts + 1)
    drafts *= 2
  return (*widths, gamma + 1)


def narrow_target_pass(steps, params, tokens, cache, num_drafted, *, with_states: bool):
  """`target_pass` over only as many positions as the longest row needs (adaptive draft length).

  Scores tokens[:, :w] with w the smallest of `pass_widths(G)` >= max(num_drafted) + 1, one
  compiled pass per width chosen by `lax.switch`; the cache advances by w (the rewind after
  verification only reads the kept positions, all < w). Logits (and states) are zero-padded back
  to G + 1 positions, which the verifier never reads (they lie past every row's `num_drafted`).

  Args:
    tokens: int32[B, G + 1], the pending token and the drafts.
    num_drafted: int32[B] drafts each row verifies (>= 1).
  """
  full = tokens.shape[1]
  widths = pass_widths(full - 1)

  def pass_of_width(w):
    def run(tokens, cache):
      logits, states, cache = target_pass(
        steps, params, tokens[:, :w], cache, with_states=with_states
      )
      pad = lambda x: None if x is None else jnp.pad(x, ((0, 0), (0, full - w), (0, 0)))
      return pad(logits), pad(states), cache

    return run

  branch = jnp.searchsorted(jnp.asarray(widths), jnp.max(num_drafted) + 1)
  return jax.lax.switch(branch, [pass_of_width(w) for w in widths], tokens, cache)


def repeat_paths(x, num_drafts: int):
  """Each row (of every leaf, batch-major) repeated once per draft path: [B, ...] -> [B*K, ...]."""
  if num_drafts == 1:
    return x
  return jax.tree.map(lambda leaf: jnp.repeat(leaf, num_drafts, axis=0), x)


@jax.named_scope('encode')
def init_caches(
  target_steps,
  target_params,
  draft_steps,
  draft_params,
  input_ids,
  input_mask,
  cache_len,
  num_drafts=1,
  draft_cache_len=None,
):
  """Both caches, with `num_drafts` rows per source row (each source is encoded once); the
  source is encoded once in all when the drafter reads the target's encoder. The drafter's has
  `draft_cache_len` slots (default `cache_len`; a block drafter's needs more: `Drafting`)."""
  encoded = target_steps.encode(target_params, input_ids, input_mask)
  mask = repeat_paths(input_mask, num_drafts)
  target_cache = target_steps.init_cache(
    target_params, repeat_paths(encoded, num_drafts), mask, cache_len
  )
  if draft_steps is None:
    return target_cache, None
  if not step_models.capabilities(draft_steps).shares_target_encoder:
    encoded = draft_steps.encode(draft_params, input_ids, input_mask)
  return target_cache, draft_steps.init_cache(
    draft_params, repeat_paths(encoded, num_drafts), mask, draft_cache_len or cache_len
  )


def verify_greedy_drafts(drafts, logits, lengths=None):
  """Step 3 at temperature 0: the longest prefix of drafts equal to the target's argmax.

  Args:
    drafts: int32[B, G]; logits: float32[B, G + 1, V] the target pass's.
    lengths: int32[B] drafts to verify per row (a draft cut short), or None for all G.

  Returns:
    (tau int32[B], y int32[B] the target's argmax after the kept drafts, beta float32[B, G] 1
    where the draft is the argmax, nonfinite bool[B]). Only the target's values matter: drafts
    are compared as ids, with no probability vector formed.
  """
  with jax.named_scope('sampling'):
    target_ids = sampling_lib.argmax(logits)
  with jax.named_scope('verify'):
    tau, y = verify.greedy_verify(drafts, target_ids)
    if lengths is not None:  # fewer drafts: the target's argmax after the row's last one
      tau = jnp.minimum(tau, lengths)
      y = jnp.take_along_axis(target_ids, tau[:, None], axis=1)[:, 0]
    beta = (drafts == target_ids[:, : drafts.shape[1]]).astype(jnp.float32)
    return tau, y, beta, ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))


def verify_drafts(rng, drafts, q, logits, spec, lengths=None, state=None):
  """Step 3 at temperature > 0: how many drafts the target keeps, and the token after them.

  Args:
    drafts: int32[B, G]; q: float32[B, G, V] their probabilities.
    logits: float32[B, G + 1, V] the target pass's.
    lengths: int32[B] drafts to verify per row (`spec.draft_stop`), or None for all G.
    state: the verifier's carried state (`verifiers.Verifier.init_state`), or None.

  Returns:
    (tau int32[B] drafts accepted, y int32[B] the corrected or bonus token, beta float32[B, G]
    sum_x min(p, q) per position, nonfinite bool[B], the verifier's state after the iteration).
  """
  with jax.named_scope('sampling'):
    p = sampling_lib.logits_to_probs(logits, spec.sampling)
  with jax.named_scope('verify'):
    tau, y, state = verifiers.get(spec.verifier).verify(rng, drafts, q, p, lengths, state)
    beta = jnp.minimum(p[:, : spec.gamma], q).sum(-1)
    return tau, y, beta, verify.nonfinite_rows(q, p), state


def _per_row(x, k):
  return None if x is None else x.reshape((-1, k) + x.shape[1:])


def verify_greedy_paths(drafts, logits, num_drafts: int):
  """Step 3 at temperature 0 with K = `num_drafts` paths per row, their rows consecutive:
  drafts int32[B*K, G], logits float32[B*K, G + 1, V] -> (path int32[B], tau, y, beta,
  nonfinite) as `verify_paths`'."""
  k, g = num_drafts, drafts.shape[1]
  drafts, logits = _per_row(drafts, k), _per_row(logits, k)
  with jax.named_scope('sampling'):
    target_ids = sampling_lib.argmax(logits)
  with jax.named_scope('verify'):
    path, tau, y = verify_multipath.multipath_greedy_verify(drafts, target_ids)
    beta = (drafts[:, 0] == target_ids[:, 0, :g]).astype(jnp.float32)
    return path, tau, y, beta, ~jnp.isfinite(jnp.sum(logits, axis=(1, 2, 3)))


def verify_paths(rng, drafts, q, logits, spec):
  """Step 3 at temperature > 0 with K = `spec.num_drafts` > 1 paths per row, rows consecutive.

  Args:
    drafts: int32[B*K, G]; q: float32[B*K, G, V].
    logits: float32[B*K, G + 1, V].

  Returns:
    (path int32[B] the path kept, tau, y, beta, nonfinite) as `verify_drafts`'s, with beta
    measured on path 0 (each path alone is one drafted path, so alpha keeps its meaning).
  """
  k, g = spec.num_drafts, spec.gamma
  drafts, q, logits = _per_row(drafts, k), _per_row(q, k), _per_row(logits, k)
  with jax.named_scope('sampling'):
    p = sampling_lib.logits_to_probs(logits, spec.sampling)
  with jax.named_scope('verify'):
    path, tau, y = verifiers.get(spec.verifier).multipath(rng, drafts, q, p)
    beta = jnp.minimum(p[:, 0, :g], q[:, 0]).sum(-1)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    nonfinite = verify.nonfinite_rows(flat(q), flat(p)).reshape(-1, k).any(axis=1)
    return path, tau, y, beta, nonfinite


def follow(path, drafts, target_cache, draft_cache, states, num_drafts: int):
  """Moves every path row of a source row onto its kept path: (drafts int32[B, G] of the kept
  path, target_cache, draft_cache, states) with each row's K copies equal to the kept one."""
  rows = jnp.arange(path.shape[0]) * num_drafts + path  # the kept path's row, per source row
  every = jnp.repeat(rows, num_drafts)
  take = functools.partial(cache_lib.take_rows, rows=every, same_source=True)
  return (
    drafts[rows],
    take(target_cache),
    take(draft_cache),
    None if states is None else states[every],
  )


@jax.named_scope('emit')
def emit_accepted(
  seq,
  n,
  done,
  target_cache,
  drafts,
  tau,
  y,
  *,
  eos_id: int,
  max_new_tokens: int,
  num_drafts: int = 1,
):
  """Step 4 of an iteration: appends X_1..X_tau, y to each row; rewinds the target's cache.

  Args:
    seq, n, done: the loop's token buffer int32[B, L], tokens emitted int32[B], rows done bool[B]
      (as `emit`'s).
    target_cache: the target's cache after the pass, with `num_drafts` rows per row.
    drafts: int32[B, G]; tau: int32[B] drafts accepted; y: int32[B] the token after them.

  Returns (seq, n, done, target_cache) updated: the target keeps [.., seq[n], X_1..X_tau]
  (positions < the new n, in each of a row's `num_drafts` cache rows); the drafter rewinds itself
  at its next call.
  """
  gamma = drafts.shape[1]
  accepted = jnp.where(
    jnp.arange(gamma + 1) < tau[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), y[:, None]
  )
  seq, n, done = emit(seq, n, done, accepted, tau + 1, eos_id=eos_id, max_new_tokens=max_new_tokens)
  return seq, n, done, target_cache.replace(end_index=repeat_paths(n, num_drafts))
