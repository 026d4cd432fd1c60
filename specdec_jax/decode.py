"""The decoding loops: autoregressive `generate` and `speculative_generate`, each one jit.

Axis legend: B batch, S source length, G gamma, T query length, V vocab, M max_new_tokens.

Both loops are written against step models (`step_models.StepModel`), never against a model, so
fake closures test them and any drafter drives them.

Loop state, per row b:
  seq[b]   the decoder input sequence [start, y_1, ..., y_n, ...]; `n[b]` tokens emitted so far.
  caches   hold decoder positions 0..n-1 (the target's end_index is n); seq[n] is fed next.
The drafter's first call of an iteration always feeds the two tokens seq[n-1:n+1] from position
n - 1. After an iteration that accepted all gamma drafts, the drafter never saw X_gamma = seq[n-1];
otherwise re-writing position n - 1 recomputes what its cache holds. One branch-free program
either way: no `lax.cond` (whose branches copy the cache) and no host round trip.

A drafter that reads the target's states (EAGLE-style, `reads_target_states`) instead re-feeds all
gamma + 1 positions of the last target pass, each with the target's state at the position before:
the accepted ones overwrite what it wrote while drafting from its own predicted states, and the
pending token seq[n] gets the true state it follows. While drafting, its predicted state at each
position stands in for the target's at the next.

At temperature 0 (`sampling.greedy`) the loops take a fast path that never forms a probability
vector: p and q are one-hot, so sampling is an argmax and both verifiers reduce to comparing ids
(`verify.greedy_verify`); the tokens are identical to the general path's, with no [B, G+1, V]
arrays, no cumulative sums over V and no random numbers.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import sampling as sampling_lib
from specdec_jax import step_models, validation, verify
from specdec_jax.decode_stats import (  # noqa: F401 (API)
  DecodeOutput,
  DecodeStats,
  SpeculativeTrace,
  to_host,
)
from specdec_jax.validation import NonFiniteError  # noqa: F401  (raised by the public functions)

PAD_ID = 0


def buffer_length(max_new_tokens: int, gamma: int) -> int:
  """Slots of the token buffer `seq` and of both decoder caches: M + G + 2.

  An iteration writes its G + 1 candidate tokens to seq[n + 1 .. n + G + 1] and the target pass
  writes cache positions n .. n + G. Rows that already finished still run (at n <= M), writing
  past their end where nothing is read, so the last slot touched is M + G + 1.
  """
  return max_new_tokens + gamma + 2


class _State(NamedTuple):
  seq: jax.Array  # int32[B, buffer_length] decoder inputs: start token, then emitted tokens
  n: jax.Array  # int32[B] tokens emitted
  done: jax.Array  # bool[B]
  target_cache: Any
  draft_cache: Any
  stats: DecodeStats
  iteration: jax.Array  # int32[]
  trace: Any  # SpeculativeTrace being filled, or None
  # For a drafter reading the target's states: (f32[B, G + 1, F] the last target pass's states,
  # int32[B] the position of the first); else None.
  target_states: Any = None


def _init_state(
  batch, gamma, max_new_tokens, start_id, target_cache, draft_cache, trace=None, state_dim=None
) -> _State:
  seq = jnp.zeros((batch, buffer_length(max_new_tokens, gamma)), jnp.int32)
  zeros = jnp.zeros((batch,), jnp.int32)
  return _State(
    seq.at[:, 0].set(start_id),
    zeros,
    jnp.zeros((batch,), bool),
    target_cache,
    draft_cache,
    DecodeStats.zeros(batch, gamma),
    jnp.zeros((), jnp.int32),
    trace,
    # Before the first pass: zero states "at position -1", so seq[0] is fed with zeros.
    None
    if state_dim is None
    else (jnp.zeros((batch, gamma + 1, state_dim), jnp.float32), jnp.full((batch,), -1)),
  )


def _row_slice(seq: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """seq[b, start[b] : start[b] + size] for each row: int32[B, size]."""
  return jax.vmap(lambda row, s: jax.lax.dynamic_slice(row, (s,), (size,)))(seq, start)


def _row_update(seq: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
  """Writes block[b] into seq[b] at start[b]."""
  return jax.vmap(lambda row, blk, s: jax.lax.dynamic_update_slice(row, blk, (s,)))(
    seq, block, start
  )


def _emit(seq, n, done, block, num_valid, *, eos_id: int, max_new_tokens: int):
  """Appends block[b, :num_valid[b]] to each unfinished row, stopping at EOS and the token limit.

  Args:
    seq: int32[B, L] decoder inputs; emitted token j (1-based) is at seq[:, j].
    n: int32[B] tokens emitted so far.
    done: bool[B] rows that stopped emitting.
    block: int32[B, K] candidate tokens; positions >= num_valid are ignored.
    num_valid: int32[B] in 1..K.

  Returns:
    (seq, n, done) updated; finished rows are left unchanged.
  """
  k = block.shape[1]
  pos = jnp.arange(k)
  is_eos = (block == eos_id) & (pos < num_valid[:, None])
  # Tokens up to and including the first EOS, capped by the room left.
  first_eos = jnp.argmax(is_eos, axis=1)
  has_eos = is_eos.any(axis=1)
  count = jnp.where(has_eos, first_eos + 1, num_valid)
  count = jnp.minimum(count, max_new_tokens - n)
  count = jnp.where(done, 0, count)
  # Finished rows write to seq too, but only past their end, where nothing is read.
  seq = _row_update(seq, block, n + 1)
  new_n = n + count
  done = done | has_eos | (new_n >= max_new_tokens)
  return seq, new_n, done


def _finish(state: _State, max_new_tokens: int) -> DecodeOutput:
  tokens = state.seq[:, 1 : max_new_tokens + 1]
  tokens = jnp.where(jnp.arange(max_new_tokens) < state.n[:, None], tokens, PAD_ID)
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats, trace=state.trace)


def _draft_token(rng, logits, sampling: sampling_lib.SamplingConfig):
  """Samples one draft token per row: (int32[B], q float32[B, V]) with q the SAME transform p gets."""
  q = sampling_lib.logits_to_probs(logits, sampling)
  return sampling_lib.sample(rng, q), q


def _drafter_call(steps, params, tokens, features, cache):
  """(logits, predicted target states or None, cache): `step`, or `step_features` for a drafter
  that reads the target's states (features not None)."""
  with jax.named_scope('drafter'):
    if features is None:
      logits, cache = steps.step(params, tokens, cache)
      return logits, None, cache
    return steps.step_features(params, tokens, features, cache)


def _draft(steps, params, cache, seq, n, rng, *, gamma, sampling, greedy, target_states=None):
  """Drafts gamma tokens: (tokens int32[B, G], q float32[B, G, V] or None when greedy, cache).

  On entry the cache holds at least positions 0..n-2 (0..start for `target_states`); on exit it
  ends at n + gamma - 1 (X_gamma is drafted but not fed). `target_states`: (states, start) of
  `_State`, for a drafter that reads them.
  """
  if target_states is None:
    # Feed seq[n-1], seq[n] from position n - 1 (position 0 at the start, where the second token
    # is a placeholder written to a slot that stays stale) and keep the logits after seq[n].
    start, features = jnp.maximum(n - 1, 0), None
    tokens = _row_slice(seq, start, 2)
  else:
    # Feed seq[start+1 .. start+G+1], each with the target's state before it: the positions of
    # the last pass, of which start+1 .. n are accepted (n - start - 1 <= G). Rows that stopped
    # read a clipped index.
    features, state_start = target_states
    start = state_start + 1
    tokens = _row_slice(seq, start, gamma + 1)
  logits, predicted, cache = _drafter_call(
    steps, params, tokens, features, cache.replace(end_index=start)
  )
  index = jnp.clip(n - start, 0, tokens.shape[1] - 1)[:, None, None]
  pick = lambda x: None if x is None else jnp.take_along_axis(x, index, axis=1)[:, 0]
  logits, predicted = pick(logits), pick(predicted)
  cache = cache.replace(end_index=n + 1)

  @jax.named_scope('sampling')
  def draw(key, logits):
    if greedy:
      return sampling_lib.argmax(logits), None
    return _draft_token(key, logits, sampling)

  def body(carry, key):
    logits, predicted, cache = carry
    token, q = draw(key, logits)
    features = None if predicted is None else predicted[:, None]
    logits, predicted, cache = _drafter_call(steps, params, token[:, None], features, cache)
    return (logits[:, 0], None if predicted is None else predicted[:, 0], cache), (token, q)

  keys = jax.random.split(rng, gamma)
  (logits, _, cache), (tokens, probs) = jax.lax.scan(body, (logits, predicted, cache), keys[:-1])
  last_token, last_q = draw(keys[-1], logits)
  tokens = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)
  if greedy:
    return tokens, None, cache
  probs = jnp.concatenate([jnp.moveaxis(probs, 0, 1), last_q[:, None]], axis=1)
  return tokens, probs, cache


def _target_pass(steps, params, tokens, cache, *, with_states: bool):
  """The target's (gamma+1)-position call: (logits, f32 states or None, cache)."""
  with jax.named_scope('target'):
    if not with_states:
      logits, cache = steps.step(params, tokens, cache)
      return logits, None, cache
    logits, states, cache = steps.step_states(params, tokens, cache)
    return logits, states.astype(jnp.float32), cache


@jax.named_scope('encode')
def _init_caches(
  target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, cache_len
):
  """Both caches; the source is encoded once when the drafter reads the target's encoder."""
  encoded = target_steps.encode(target_params, input_ids, input_mask)
  target_cache = target_steps.init_cache(target_params, encoded, input_mask, cache_len)
  if draft_steps is None:
    return target_cache, None
  if not getattr(draft_steps, 'shares_target_encoder', False):
    encoded = draft_steps.encode(draft_params, input_ids, input_mask)
  return target_cache, draft_steps.init_cache(draft_params, encoded, input_mask, cache_len)


def _speculative_loop(
  target_steps,
  target_params,
  draft_steps,
  draft_params,
  input_ids,
  input_mask,
  rng,
  *,
  gamma: int,
  verifier: str,
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  greedy_fast_path: bool = True,
  trace: bool = False,
) -> DecodeOutput:
  batch = input_ids.shape[0]
  greedy = sampling.greedy and greedy_fast_path
  target_cache, draft_cache = _init_caches(
    target_steps,
    target_params,
    draft_steps,
    draft_params,
    input_ids,
    input_mask,
    buffer_length(max_new_tokens, gamma),
  )
  record = None
  if trace:
    per_iteration = lambda *shape: jnp.zeros((batch, max_new_tokens) + shape, jnp.int32)
    record = SpeculativeTrace(
      per_iteration(gamma), per_iteration(), per_iteration(), per_iteration()
    )
  reads_states = getattr(draft_steps, 'reads_target_states', False)
  state = _init_state(
    batch,
    gamma,
    max_new_tokens,
    target_steps.start_id,
    target_cache,
    draft_cache,
    record,
    state_dim=draft_steps.feature_dim if reads_states else None,
  )
  verify_fn = verify.VERIFIERS[verifier]

  def body(state: _State) -> _State:
    n, active = state.n, ~state.done
    draft_rng, verify_rng = jax.random.split(jax.random.fold_in(rng, state.iteration))
    drafts, q, draft_cache = _draft(
      draft_steps,
      draft_params,
      state.draft_cache,
      state.seq,
      n,
      draft_rng,
      gamma=gamma,
      sampling=sampling,
      greedy=greedy,
      target_states=state.target_states,
    )
    # One pass scores the pending token and all gamma drafts: p_1 .. p_{gamma+1}.
    target_in = jnp.concatenate([_row_slice(state.seq, n, 1), drafts], axis=1)
    logits, states, target_cache = _target_pass(
      target_steps, target_params, target_in, state.target_cache, with_states=reads_states
    )
    if greedy:
      with jax.named_scope('sampling'):
        target_ids = sampling_lib.argmax(logits)
      with jax.named_scope('verify'):
        tau, y = verify.greedy_verify(drafts, target_ids)
        beta = (drafts == target_ids[:, :gamma]).astype(jnp.float32)
        # Only the target's values matter at temperature 0: drafts are compared as ids.
        nonfinite = ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
    else:
      with jax.named_scope('sampling'):
        p = sampling_lib.logits_to_probs(logits, sampling)
      with jax.named_scope('verify'):
        tau, y = verify_fn(verify_rng, drafts, q, p)
        beta = jnp.minimum(p[:, :gamma], q).sum(-1)
        nonfinite = verify.nonfinite_rows(q, p)
    with jax.named_scope('emit'):
      block = jnp.where(
        jnp.arange(gamma + 1) < tau[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), y[:, None]
      )
      seq, new_n, done = _emit(
        state.seq,
        n,
        state.done,
        block,
        tau + 1,
        eos_id=target_steps.eos_id,
        max_new_tokens=max_new_tokens,
      )
      # Rewind: the target keeps [.., seq[n], X_1..X_tau] (positions < new_n); the drafter
      # rewinds itself at its next call.
      target_cache = target_cache.replace(end_index=new_n)
      stats = state.stats.accumulate(active, tau, beta, nonfinite)
      record = state.trace
      if record is not None:
        at = lambda field, value: field.at[:, state.iteration].set(value)
        record = SpeculativeTrace(
          at(record.drafts, drafts),
          at(record.num_accepted, tau),
          at(record.next_token, y),
          at(record.emitted, new_n - n),
        )
    return _State(
      seq,
      new_n,
      done,
      target_cache,
      draft_cache,
      stats,
      state.iteration + 1,
      record,
      None if states is None else (states, n),
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_new_tokens)


def _autoregressive_loop(
  steps,
  params,
  input_ids,
  input_mask,
  rng,
  *,
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  greedy_fast_path: bool = True,
) -> DecodeOutput:
  batch = input_ids.shape[0]
  cache, _ = _init_caches(
    steps, params, None, None, input_ids, input_mask, buffer_length(max_new_tokens, 0)
  )
  state = _init_state(batch, 0, max_new_tokens, steps.start_id, cache, None)
  no_drafts = jnp.zeros((batch, 0), jnp.float32)

  def body(state: _State) -> _State:
    with jax.named_scope('target'):
      logits, cache = steps.step(params, _row_slice(state.seq, state.n, 1), state.target_cache)
    with jax.named_scope('sampling'):
      nonfinite = ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
      if sampling.greedy and greedy_fast_path:
        token = sampling_lib.argmax(logits[:, 0])
      else:
        probs = sampling_lib.logits_to_probs(logits[:, 0], sampling)
        token = sampling_lib.sample(jax.random.fold_in(rng, state.iteration), probs)
    with jax.named_scope('emit'):
      seq, n, done = _emit(
        state.seq,
        state.n,
        state.done,
        token[:, None],
        jnp.ones_like(state.n),
        eos_id=steps.eos_id,
        max_new_tokens=max_new_tokens,
      )
      stats = state.stats.accumulate(~state.done, jnp.zeros_like(n), no_drafts, nonfinite)
    return _State(seq, n, done, cache, None, stats, state.iteration + 1, None)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_new_tokens)


_speculative_jit = jax.jit(
  _speculative_loop,
  static_argnames=(
    'target_steps',
    'draft_steps',
    'gamma',
    'verifier',
    'sampling',
    'max_new_tokens',
    'greedy_fast_path',
    'trace',
  ),
)
_autoregressive_jit = jax.jit(
  _autoregressive_loop,
  static_argnames=('steps', 'sampling', 'max_new_tokens', 'greedy_fast_path'),
)


def _autoregressive_call(model, input_ids, input_mask, *, sampling, max_new_tokens):
  """Validates `generate`'s arguments: (steps, params, ids, mask, static kwargs) of the jit."""
  steps, params = step_models.as_step_model(model)
  validation.check_sampling(sampling)
  ids, mask, max_new_tokens = validation.check_inputs(steps, input_ids, input_mask, max_new_tokens)
  return (steps, params, ids, mask), dict(sampling=sampling, max_new_tokens=max_new_tokens)


def _speculative_call(
  target, drafter, input_ids, input_mask, *, gamma, verifier, sampling, max_new_tokens, trace
):
  """Validates `speculative_generate`'s arguments: (positional args before rng, static kwargs)."""
  gamma = validation.as_int('gamma', gamma, 1)
  if not isinstance(verifier, str) or verifier not in verify.VERIFIERS:
    raise ValueError(f'Unknown verifier {verifier!r}; choose one of {sorted(verify.VERIFIERS)}.')
  validation.check_sampling(sampling)
  target_steps, target_params = step_models.as_step_model(target)
  draft_steps, draft_params = step_models.as_step_model(drafter)
  if draft_steps.vocab_size != target_steps.vocab_size:
    raise ValueError(
      f'Drafter and target vocabularies differ: drafter vocab_size='
      f'{draft_steps.vocab_size}, target vocab_size={target_steps.vocab_size}.'
    )
  step_models.check_state_reader(draft_steps, target_steps)
  ids, mask, max_new_tokens = validation.check_inputs(
    target_steps, input_ids, input_mask, max_new_tokens, drafter=draft_steps
  )
  args = (target_steps, target_params, draft_steps, draft_params, ids, mask)
  static = dict(
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=bool(trace),
  )
  return args, static


_ABSTRACT_KEY = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)


def generate(
  model,
  input_ids,
  input_mask,
  *,
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  rng: jax.Array,
  check_finite: bool = True,
) -> DecodeOutput:
  """Plain autoregressive decoding: one target call per token, the baseline.

  Args:
    model: a `T5Model` (or any step model, see `step_models.as_step_model`).
    input_ids: int[B, S] source tokens in [0, vocab_size), padded.
    input_mask: bool or 0/1 int[B, S], 1 for real tokens.
    sampling: the standardized sampling transform (temperature 0 is greedy).
    max_new_tokens: M >= 1, the most tokens per row.
    rng: PRNG key (unused when greedy).
    check_finite: raise `NonFiniteError` if the model produced NaN or inf logits (this waits for
      the result); False returns the output with `stats.nonfinite` counts instead.

  Returns:
    DecodeOutput with tokens int32[B, M], lengths int32[B], stats.target_calls.
  """
  args, static = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  out = _autoregressive_jit(*args, rng, **static)
  return validation.raise_if_nonfinite(out, 'The model') if check_finite else out


def speculative_generate(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma: int,
  verifier: str = 'token',
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  rng: jax.Array,
  trace: bool = False,
  check_finite: bool = True,
) -> DecodeOutput:
  """Speculative decoding: output distributed exactly as `generate(target, ...)`.

  Each iteration the drafter proposes gamma tokens (a `lax.scan`), the target scores all gamma + 1
  prefixes in one call, and `verifier` keeps a prefix of the drafts plus one token. The whole loop
  is one `lax.while_loop` inside one jit; rows accept different numbers of drafts and stop
  independently at EOS or `max_new_tokens`. At temperature 0 both verifiers keep the longest
  prefix of drafts equal to the target's argmax, so in float32 the output is greedy `generate`'s,
  token for token. In bfloat16 it is greedy decoding of the target as its (gamma+1)-position
  pass computes it, which rounds differently from `generate`'s 1-position step: near-ties of the
  two most likely tokens can flip (7 of 256 shipped test sentences; tests/bfloat16_test.py).

  Args:
    target: the target `T5Model` (or step model).
    drafter: a `T5Model` sharing the target's vocabulary (one with `num_encoder_layers=0` reads
      the target's encoder output), an n-gram drafter from `drafters`, or the target itself.
    input_ids: int[B, S] source tokens in [0, vocab_size), padded.
    input_mask: bool or 0/1 int[B, S], 1 for real tokens.
    gamma: G >= 1 draft tokens per iteration.
    verifier: a key of `verify.VERIFIERS`: 'token' (Leviathan et al.) or 'block' (Sun et al.).
    sampling: the transform applied identically to target and drafter logits.
    max_new_tokens: M >= 1, the most tokens per row.
    rng: PRNG key (unused when greedy).
    trace: also return a `SpeculativeTrace` (drafts, accepted counts, corrected tokens of every
      iteration) in `out.trace`; off, the loop records nothing.
    check_finite: raise `NonFiniteError` if the target's logits or either model's probabilities
      held NaN or inf; False returns the output with `stats.nonfinite` counts instead.

  Returns:
    DecodeOutput: tokens int32[B, M], lengths int32[B], per-row `DecodeStats`, and the trace.
  """
  args, static = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=trace,
  )
  out = _speculative_jit(*args, rng, **static)
  return validation.raise_if_nonfinite(out, 'The target or the drafter') if check_finite else out


def lower_generate(
  model, input_ids, input_mask, *, sampling: sampling_lib.SamplingConfig, max_new_tokens: int
) -> jax.stages.Lowered:
  """`generate`'s program lowered for these shapes, without running (or allocating) anything.

  `input_ids` / `input_mask` and the leaves of `model.params` may be `jax.ShapeDtypeStruct`s (with
  or without `sharding=`), e.g. `jax.eval_shape` of `t5.init_params` with shardings attached, so
  `.compile()` then `memory_analysis()` / `cost_analysis()` plan a model too large to build here.
  Arguments are validated as `generate` validates them, except the values of abstract inputs.
  """
  args, static = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  return _autoregressive_jit.lower(*args, _ABSTRACT_KEY, **static)


def lower_speculative(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma: int,
  verifier: str = 'token',
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
) -> jax.stages.Lowered:
  """`speculative_generate`'s program lowered for these shapes (trace off), without running it.

  Takes abstract inputs and params as `lower_generate` does; validates as `speculative_generate`.
  """
  args, static = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=False,
  )
  return _speculative_jit.lower(*args, _ABSTRACT_KEY, **static)
