"""The decoding loops: autoregressive `generate` and `speculative_generate`, each one jit.

Axis legend: B batch, S source length, G gamma, T query length, V vocab, M max_new_tokens.

Both loops are written against *step models*, never against T5 itself (see `StepModel`), so they
can be tested with fake closures and driven by any drafter. A step model is a hashable static half
(`steps`) plus a params pytree; `as_step_model` turns a `T5Model` or an n-gram drafter into one.

Loop state, per row b:
  seq[b]   the decoder input sequence [start, y_1, ..., y_n, ...]; `n[b]` tokens emitted so far.
  caches   hold decoder positions 0..n-1 (end_index == n); the pending token seq[n] is fed next.
After an iteration that accepted all gamma drafts the drafter has not seen X_gamma (it never ran on
it); its cache then ends at n - 1 and the next iteration's first drafter call feeds the two tokens
seq[n-1:n+1] in one multi-token step ("catching up"), with no host round trip.
"""

from typing import Any, NamedTuple, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import drafters, sampling as sampling_lib, verify
from specdec_jax.models import t5

PAD_ID = 0


class StepModel(Protocol):
  """The static half of a model as the decode loops see it (hashable: a jit static argument).

  Every cache is a `flax.struct.dataclass` with an `end_index: int32[B]` field: the number of valid
  decoder positions per row. `step` writes T positions starting at `end_index` and advances it by T;
  the loops rewind a row by `cache.replace(end_index=...)`.
  """

  vocab_size: int
  start_id: int  # the decoder's first input token
  eos_id: int

  def init_cache(self, params, input_ids, input_mask, max_decode_len: int) -> Any:
    ...

  def step(self, params, tokens: jax.Array, cache) -> tuple[jax.Array, Any]:
    """tokens int32[B, T] -> (logits float32[B, T, V], cache advanced by T)."""


def as_step_model(model) -> tuple[StepModel, Any]:
  """(static steps, params) of a `T5Model`, an n-gram drafter, or anything with .steps/.params."""
  if isinstance(model, t5.T5Model):
    return drafters.T5Steps(model.config), model.params
  if hasattr(model, 'steps') and hasattr(model, 'params'):
    return model.steps, model.params
  raise TypeError(f'Cannot decode with a {type(model).__name__}: expected a T5Model, an n-gram '
                  'drafter, or an object with .steps and .params.')


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters of one decoding call (all shaped [B] unless stated).

  Attributes:
    target_calls: int32[B] target forward passes while the row was still emitting.
    drafted: int32[B] draft tokens proposed (gamma per target call).
    accepted: int32[B] draft tokens accepted by the verifier.
    accepted_per_position: int32[B, G] times the draft at position i (0-based) was accepted.
    beta_sum: float32[B] sum of beta = sum_x min(p, q) over verified positions (i <= tau + 1).
    beta_count: int32[B] number of verified positions.
  """

  target_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  accepted_per_position: jax.Array
  beta_sum: jax.Array
  beta_count: jax.Array

  @property
  def block_efficiency(self) -> jax.Array:
    """float32[B]: mean tokens emitted per target call, (accepted + calls) / calls."""
    calls = jnp.maximum(self.target_calls, 1)
    return (self.accepted + self.target_calls) / calls

  @property
  def alpha(self) -> jax.Array:
    """float32[B]: measured acceptance rate, the mean of beta over verified positions."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)


@flax.struct.dataclass
class DecodeOutput:
  """tokens int32[B, M] (PAD after the end), lengths int32[B] (EOS included), stats."""

  tokens: jax.Array
  lengths: jax.Array
  stats: DecodeStats


class _State(NamedTuple):
  seq: jax.Array  # int32[B, M + G + 3] decoder inputs: start token, then emitted tokens
  n: jax.Array  # int32[B] tokens emitted
  done: jax.Array  # bool[B]
  target_cache: Any
  draft_cache: Any
  stats: DecodeStats
  iteration: jax.Array  # int32[]


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
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats)


def _init_state(batch, gamma, max_new_tokens, start_id, target_cache, draft_cache):
  seq = jnp.zeros((batch, max_new_tokens + gamma + 3), jnp.int32).at[:, 0].set(start_id)
  zeros = jnp.zeros((batch,), jnp.int32)
  stats = DecodeStats(
    target_calls=zeros,
    drafted=zeros,
    accepted=zeros,
    accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
    beta_sum=jnp.zeros((batch,), jnp.float32),
    beta_count=zeros,
  )
  return _State(seq, zeros, jnp.zeros((batch,), bool), target_cache, draft_cache, stats,
                jnp.zeros((), jnp.int32))


def _draft_token(rng, logits, sampling: sampling_lib.SamplingConfig):
  """Samples one draft token per row: (int32[B], q float32[B, V]) with q the SAME transform p gets."""
  q = sampling_lib.logits_to_probs(logits, sampling)
  return sampling_lib.sample(rng, q), q


def _draft(steps: StepModel, params, cache, seq, n, rng, *, gamma, sampling):
  """Drafts gamma tokens: (draft_tokens int32[B, G], draft_probs float32[B, G, V], cache).

  On entry cache.end_index is n, or n - 1 for rows that must catch up on seq[n - 1].
  On exit it is n + gamma - 1: X_gamma is sampled but not fed.
  """
  start = cache.end_index

  def catch_up(cache):
    logits, cache = steps.step(params, _row_slice(seq, start, 2), cache)
    logits = jnp.take_along_axis(logits, (n - start)[:, None, None], axis=1)[:, 0]
    return logits, cache.replace(end_index=n + 1)

  def plain(cache):
    logits, cache = steps.step(params, _row_slice(seq, n, 1), cache)
    return logits[:, 0], cache

  logits, cache = jax.lax.cond(jnp.any(start < n), catch_up, plain, cache)
  keys = jax.random.split(rng, gamma)

  def body(carry, key):
    logits, cache = carry
    token, q = _draft_token(key, logits, sampling)
    logits, cache = steps.step(params, token[:, None], cache)
    return (logits[:, 0], cache), (token, q)

  (logits, cache), (tokens, probs) = jax.lax.scan(body, (logits, cache), keys[:-1])
  last_token, last_q = _draft_token(keys[-1], logits, sampling)
  tokens = jnp.concatenate([tokens.T, last_token[:, None]], axis=1)
  probs = jnp.concatenate([jnp.moveaxis(probs, 0, 1), last_q[:, None]], axis=1)
  return tokens, probs, cache


def _speculative_loop(target_steps: StepModel, target_params, draft_steps: StepModel,
                      draft_params, input_ids, input_mask, rng, *, gamma: int, verifier: str,
                      sampling: sampling_lib.SamplingConfig, max_new_tokens: int, start_id: int,
                      eos_id: int) -> DecodeOutput:
  batch = input_ids.shape[0]
  cache_len = max_new_tokens + gamma + 2
  state = _init_state(
    batch, gamma, max_new_tokens, start_id,
    target_steps.init_cache(target_params, input_ids, input_mask, cache_len),
    draft_steps.init_cache(draft_params, input_ids, input_mask, cache_len),
  )
  verify_fn = verify.VERIFIERS[verifier]

  def body(state: _State) -> _State:
    n, active = state.n, ~state.done
    draft_rng, verify_rng = jax.random.split(jax.random.fold_in(rng, state.iteration))
    drafts, q, draft_cache = _draft(draft_steps, draft_params, state.draft_cache, state.seq, n,
                                    draft_rng, gamma=gamma, sampling=sampling)
    # One target pass scores the pending token and all gamma drafts: p_1 .. p_{gamma+1}.
    target_in = jnp.concatenate([_row_slice(state.seq, n, 1), drafts], axis=1)
    logits, target_cache = target_steps.step(target_params, target_in, state.target_cache)
    p = sampling_lib.logits_to_probs(logits, sampling)
    tau, y = verify_fn(verify_rng, drafts, q, p)

    block = jnp.where(jnp.arange(gamma + 1) < tau[:, None],
                      jnp.pad(drafts, ((0, 0), (0, 1))), y[:, None])
    seq, new_n, done = _emit(state.seq, n, state.done, block, tau + 1, eos_id=eos_id,
                             max_new_tokens=max_new_tokens)
    # Rewind: both caches keep [.., seq[n], X_1..X_tau]; the drafter never saw X_gamma.
    target_cache = target_cache.replace(end_index=n + tau + 1)
    draft_cache = draft_cache.replace(end_index=jnp.minimum(n + tau + 1, n + gamma))

    verified = jnp.arange(gamma) <= tau[:, None]  # positions whose p_i was compared with q_i
    beta = jnp.minimum(p[:, :gamma], q).sum(-1)
    a = active.astype(jnp.int32)
    s = state.stats
    stats = DecodeStats(
      target_calls=s.target_calls + a,
      drafted=s.drafted + gamma * a,
      accepted=s.accepted + tau * a,
      accepted_per_position=s.accepted_per_position
      + (jnp.arange(gamma) < tau[:, None]) * a[:, None],
      beta_sum=s.beta_sum + jnp.where(verified & active[:, None], beta, 0.0).sum(-1),
      beta_count=s.beta_count + (verified.sum(-1) * a),
    )
    return _State(seq, new_n, done, target_cache, draft_cache, stats, state.iteration + 1)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_new_tokens)


def _autoregressive_loop(steps: StepModel, params, input_ids, input_mask, rng, *,
                         sampling: sampling_lib.SamplingConfig, max_new_tokens: int,
                         start_id: int, eos_id: int) -> DecodeOutput:
  batch = input_ids.shape[0]
  cache = steps.init_cache(params, input_ids, input_mask, max_new_tokens + 1)
  state = _init_state(batch, 0, max_new_tokens, start_id, cache, None)

  def body(state: _State) -> _State:
    logits, cache = steps.step(params, _row_slice(state.seq, state.n, 1), state.target_cache)
    probs = sampling_lib.logits_to_probs(logits[:, 0], sampling)
    token = sampling_lib.sample(jax.random.fold_in(rng, state.iteration), probs)
    seq, n, done = _emit(state.seq, state.n, state.done, token[:, None],
                         jnp.ones_like(state.n), eos_id=eos_id, max_new_tokens=max_new_tokens)
    stats = state.stats.replace(target_calls=state.stats.target_calls + ~state.done)
    return _State(seq, n, done, cache, None, stats, state.iteration + 1)

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, max_new_tokens)


_speculative_jit = jax.jit(
  _speculative_loop,
  static_argnames=('target_steps', 'draft_steps', 'gamma', 'verifier', 'sampling',
                   'max_new_tokens', 'start_id', 'eos_id'),
)
_autoregressive_jit = jax.jit(
  _autoregressive_loop,
  static_argnames=('steps', 'sampling', 'max_new_tokens', 'start_id', 'eos_id'),
)


def _check_inputs(model, input_ids, input_mask, max_new_tokens: int):
  if max_new_tokens < 1:
    raise ValueError(f'max_new_tokens must be >= 1, got {max_new_tokens}.')
  if input_ids.ndim != 2 or input_ids.shape != input_mask.shape:
    raise ValueError('input_ids and input_mask must both be [batch, length], got shapes '
                     f'{input_ids.shape} and {input_mask.shape}.')
  if isinstance(model, t5.T5Model):
    cfg = model.config
    if input_ids.shape[1] > cfg.max_source_length:
      raise ValueError(f'Inputs of length {input_ids.shape[1]} exceed the model\'s '
                       f'max_source_length={cfg.max_source_length}.')
    if max_new_tokens > cfg.max_target_length:
      raise ValueError(f'max_new_tokens={max_new_tokens} exceeds the model\'s '
                       f'max_target_length={cfg.max_target_length}.')


def generate(model, input_ids, input_mask, *, sampling: sampling_lib.SamplingConfig,
             max_new_tokens: int, rng: jax.Array) -> DecodeOutput:
  """Plain autoregressive decoding: one target call per token, the baseline.

  Args:
    model: a `T5Model` (or any step model, see `as_step_model`).
    input_ids: int32[B, S] source tokens, padded.
    input_mask: [B, S] 1 for real tokens.
    sampling: the standardized sampling transform (temperature 0 is greedy).
    max_new_tokens: M, the most tokens per row.
    rng: PRNG key.

  Returns:
    DecodeOutput with tokens int32[B, M], lengths int32[B], stats.target_calls.
  """
  _check_inputs(model, input_ids, input_mask, max_new_tokens)
  steps, params = as_step_model(model)
  return _autoregressive_jit(steps, params, jnp.asarray(input_ids, jnp.int32),
                             jnp.asarray(input_mask, jnp.int32), rng, sampling=sampling,
                             max_new_tokens=max_new_tokens, start_id=steps.start_id,
                             eos_id=steps.eos_id)


def speculative_generate(target, drafter, input_ids, input_mask, *, gamma: int,
                         verifier: str = 'token', sampling: sampling_lib.SamplingConfig,
                         max_new_tokens: int, rng: jax.Array) -> DecodeOutput:
  """Speculative decoding: output distributed exactly as `generate(target, ...)`.

  Each iteration the drafter proposes gamma tokens (a `lax.scan`), the target scores all gamma + 1
  prefixes in one call, and `verifier` keeps a prefix of the drafts plus one token. The whole loop
  is one `lax.while_loop` inside one jit; rows accept different numbers of drafts and stop
  independently at EOS or `max_new_tokens`.

  Args:
    target: the target `T5Model` (or step model).
    drafter: a `T5Model` sharing the target's vocabulary, an n-gram drafter from `drafters`, or
      the target itself.
    input_ids: int32[B, S] source tokens, padded.
    input_mask: [B, S] 1 for real tokens.
    gamma: G >= 1 draft tokens per iteration.
    verifier: a key of `verify.VERIFIERS`: 'token' (Leviathan et al.) or 'block' (Sun et al.).
    sampling: the transform applied identically to target and drafter logits.
    max_new_tokens: M, the most tokens per row.
    rng: PRNG key.

  Returns:
    DecodeOutput: tokens int32[B, M], lengths int32[B], and per-row `DecodeStats`.
  """
  if gamma < 1:
    raise ValueError(f'gamma must be >= 1, got {gamma}.')
  if verifier not in verify.VERIFIERS:
    raise ValueError(f'Unknown verifier {verifier!r}; choose one of {sorted(verify.VERIFIERS)}.')
  _check_inputs(target, input_ids, input_mask, max_new_tokens)
  target_steps, target_params = as_step_model(target)
  draft_steps, draft_params = as_step_model(drafter)
  if draft_steps.vocab_size != target_steps.vocab_size:
    raise ValueError(f'Drafter and target vocabularies differ: drafter vocab_size='
                     f'{draft_steps.vocab_size}, target vocab_size={target_steps.vocab_size}.')
  if isinstance(drafter, t5.T5Model) and input_ids.shape[1] > drafter.config.max_source_length:
    raise ValueError(f'Inputs of length {input_ids.shape[1]} exceed the drafter\'s '
                     f'max_source_length={drafter.config.max_source_length}.')
  return _speculative_jit(target_steps, target_params, draft_steps, draft_params,
                          jnp.asarray(input_ids, jnp.int32), jnp.asarray(input_mask, jnp.int32),
                          rng, gamma=gamma, verifier=verifier, sampling=sampling,
                          max_new_tokens=max_new_tokens, start_id=target_steps.start_id,
                          eos_id=target_steps.eos_id)
