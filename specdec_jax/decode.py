"""The decoding loops: autoregressive `generate` and `speculative_generate`, each one jit.

Axis legend: B batch, S source length, G gamma, T query length, V vocab, M max_new_tokens.

Both loops are written against step models (`step_models.StepModel`), never against a model, so
fake closures test them and any drafter drives them. Everything static about a loop is one frozen,
hashable `LoopSpec`, the jit's single static argument beside the models' static halves;
`speculative_loop` / `autoregressive_loop` are the jitted loops, `lower_speculative` /
`lower_generate` lower them from abstract inputs. The steps of one iteration (the drafter's
calls, the target pass, verification, emitting) are in `decode_steps`, where `timing` also
measures the model calls as the loop runs them.

Loop state, per row b:
  seq[b]   the decoder input sequence [start, y_1, ..., y_n, ...]; `n[b]` tokens emitted so far.
  caches   hold decoder positions 0..n-1 (the target's end_index is n); seq[n] is fed next.
The drafter's first call of an iteration always feeds the two tokens seq[n-1:n+1] from position
n - 1. After an iteration that accepted all gamma drafts, the drafter never saw X_gamma = seq[n-1];
otherwise re-writing position n - 1 recomputes what its cache holds. One branch-free program
either way: no `lax.cond` (whose branches copy the cache) and no host round trip.

A worked example, one row, gamma = 3, start token s (`.` a slot not yet written):

  before     seq = [s . . . . . . .]  n = 0   target end_index 0, drafter end_index 0
  iteration 1, pending token seq[0] = s:
    draft    the drafter is fed [s, seq[1]] at positions 0, 1 (the second a placeholder whose
             slot stays stale: end_index is set back to n + 1 = 1), drafts X = a, b, c, feeding
             a, b at positions 1, 2: drafter end_index 3 (c drafted, not fed)
    score    the target is fed [s, a, b, c] at positions 0..3: p_1..p_4 (end_index 4)
    verify   a, b accepted, c rejected (tau = 2), corrected token d drawn from p_3
    emit     [a, b, d] written at seq[1..3]: seq = [s a b d . . . .], n = 3
    rewind   target end_index 3 (s, a, b kept; c dropped; d pending); the drafter's stays 3
  iteration 2, pending token seq[3] = d:
    draft    the drafter is fed [b, d] at positions 2, 3 (rewriting b, as its cache held),
             drafts e, f, g, feeding e, f at 4, 5: drafter end_index 6
    score    the target is fed [d, e, f, g] at positions 3..6 (end_index 7)
    verify   all three accepted (tau = 3), bonus token h drawn from p_4
    emit     [e, f, g, h] written at seq[4..7]: seq = [s a b d e f g h], n = 7
    rewind   target end_index 7 (h pending); the drafter never saw g at position 6, which its
             next first call feeds: [g, h] at positions 6, 7

A drafter that reads the target's states (EAGLE-style, `reads_target_states`) instead re-feeds all
gamma + 1 positions of the last target pass, each with the target's state at the position before:
the accepted ones overwrite what it wrote while drafting from its own predicted states, and the
pending token seq[n] gets the true state it follows. While drafting, its predicted state at each
position stands in for the target's at the next.

At temperature 0 (`sampling.greedy`) the loops take a fast path that never forms a probability
vector: p and q are one-hot, so sampling is an argmax and both verifiers reduce to comparing ids
(`verify.greedy_verify`); the tokens are identical to the general path's on the same one-hot
vectors (which `top_k=1` gives at any temperature: the tests compare the two), with no
[B, G+1, V] arrays, no cumulative sums over V and no random numbers. Every verifier is then one
program (`LoopSpec` normalizes it to 'token'; 'greedy_block' reduces to it too: docs/method.md
section 11).
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, decode_tree, step_models, validation, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.decode_stats import (  # noqa: F401 (API)
  DecodeOutput,
  DecodeStats,
  SpeculativeTrace,
  to_host,
)
from specdec_jax.decode_tree import TreeSpec  # noqa: F401 (API)
from specdec_jax.loop_spec import PROPOSALS, LoopSpec, buffer_length  # noqa: F401 (API)
from specdec_jax.validation import NonFiniteError  # noqa: F401  (raised by the public functions)


class _State(NamedTuple):
  """The loop's carry (axes: B rows, L buffer_length; R = B * num_drafts drafter rows)."""

  seq: jax.Array  # int32[B, L] decoder inputs: start token, then emitted tokens
  n: jax.Array  # int32[B] tokens emitted
  done: jax.Array  # bool[B]
  target_cache: Any  # the target's cache (its step model's), R rows
  draft_cache: Any  # the drafter's cache, R rows
  stats: DecodeStats  # per-row counters, [B]
  iteration: jax.Array  # int32[]
  trace: SpeculativeTrace | None  # being filled, or None
  # For a drafter reading the target's states (an EAGLE-style or block drafter), else None.
  target_states: decode_steps.TargetStates | None
  # The verifier's carried state (`Verifier.init_state`, e.g. greedy block verification's levels
  # f32[B, G - 1]), or None.
  verifier_state: Any


def _init_state(batch, spec: LoopSpec, start_id, target_cache, draft_cache, state_dim) -> _State:
  """The state before the first iteration; `state_dim` None unless the drafter reads states."""
  seq = jnp.zeros((batch, spec.buffer_length), jnp.int32)
  trace = SpeculativeTrace.zeros(batch, spec.max_new_tokens, spec.gamma) if spec.trace else None
  target_states = None
  if state_dim is not None:
    # Before the first pass: zero states "at position -1", so seq[0] is fed with zeros. One row
    # per path, as the drafter's.
    rows = batch * spec.num_drafts
    states = jnp.zeros((rows, spec.gamma + 1, state_dim), jnp.float32)
    target_states = decode_steps.TargetStates(states, jnp.full((rows,), -1, jnp.int32))
  init = verifiers.get(spec.verifier).init_state if spec.gamma else None
  return _State(
    seq=seq.at[:, 0].set(start_id),
    n=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    target_cache=target_cache,
    draft_cache=draft_cache,
    stats=DecodeStats.zeros(batch, spec.gamma),
    iteration=jnp.zeros((), jnp.int32),
    trace=trace,
    target_states=target_states,
    verifier_state=None if init is None else init(batch, spec.gamma),
  )


def _finish(state: _State, max_new_tokens: int) -> DecodeOutput:
  tokens = state.seq[:, 1 : max_new_tokens + 1]
  tokens = jnp.where(jnp.arange(max_new_tokens) < state.n[:, None], tokens, step_models.PAD_ID)
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats, trace=state.trace)


def _verify(rng, drafts, q, logits, spec: LoopSpec, lengths, verifier_state):
  """Step 3: keep tau drafts, then y from the residual (or from p_{gamma+1} when all were kept).

  Returns (path int32[B] the kept path, or None at K = 1; tau, y int32[B]; beta float32[B, G];
  nonfinite bool[B]; the verifier's carried state, or None).
  """
  if spec.num_drafts > 1:
    return *decode_steps.verify_paths(rng, drafts, q, logits, spec), verifier_state
  return None, *decode_steps.verify_drafts(rng, drafts, q, logits, spec, lengths, verifier_state)


@functools.partial(jax.jit, static_argnames=('target_steps', 'draft_steps', 'spec'))
def speculative_loop(
  target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, rng, *, spec
) -> DecodeOutput:
  """The jitted speculative loop (Leviathan et al. 2023, Algorithm 1, batched), unvalidated.

  Args:
    target_steps, target_params / draft_steps, draft_params: the two step models.
    input_ids, input_mask: int32[B, S].
    rng: PRNG key.
    spec: a `LoopSpec` with gamma >= 1.

  `speculative_generate` validates its arguments and calls this.
  """
  if spec.gamma < 1:
    raise ValueError(f'speculative_loop needs spec.gamma >= 1, got {spec.gamma}.')
  target_steps = step_models.state_source(draft_steps, target_steps)  # the layers it reads
  if spec.tree is not None:
    spec.tree.check_models(target_steps, draft_steps)
    return decode_tree.tree_loop(
      target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, rng,
      spec=spec,
    )  # fmt: skip
  reads_states = getattr(draft_steps, 'reads_target_states', False)
  verifiers.get(spec.verifier).check_drafter(draft_steps)
  target_cache, draft_cache = decode_steps.init_caches(
    target_steps,
    target_params,
    draft_steps,
    draft_params,
    input_ids,
    input_mask,
    spec.buffer_length,
    num_drafts=spec.num_drafts,
    draft_cache_len=spec.buffer_length
    + decode_steps.drafting_of(draft_steps).extra_slots(spec.gamma),
  )
  state = _init_state(
    input_ids.shape[0],
    spec,
    target_steps.start_id,
    target_cache,
    draft_cache,
    state_dim=draft_steps.feature_dim if reads_states else None,
  )
  body = _iteration((target_steps, target_params), (draft_steps, draft_params), rng, spec)
  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, spec.max_new_tokens)


def _iteration(target, drafter, rng, spec: LoopSpec):
  """The speculative loop's body: `_State` -> `_State` after one iteration of every row."""
  (target_steps, target_params), (draft_steps, draft_params) = target, drafter
  k = spec.num_drafts
  draft = functools.partial(
    decode_steps.drafting_of(draft_steps).draft,
    draft_steps,
    draft_params,
    gamma=spec.gamma,
    sampling=spec.sampling,
    greedy=spec.greedy,
    stop=spec.draft_stop,
    unroll_draft=spec.unroll_draft,
    proposal=spec.proposal,
  )
  reads_states = getattr(draft_steps, 'reads_target_states', False)
  score = functools.partial(
    decode_steps.target_pass, target_steps, target_params, with_states=reads_states
  )
  emit_accepted = functools.partial(
    decode_steps.emit_accepted,
    eos_id=target_steps.eos_id,
    max_new_tokens=spec.max_new_tokens,
    num_drafts=k,
  )

  def body(state: _State) -> _State:
    draft_rng, verify_rng = jax.random.split(jax.random.fold_in(rng, state.iteration))
    # With K paths every row runs as K rows of both models (the identity at K = 1).
    seq, n = decode_steps.repeat_paths(state.seq, k), decode_steps.repeat_paths(state.n, k)
    # 1. The drafter proposes X_1..X_gamma, with q_1..q_gamma.
    drafts, q, draft_cache, lengths = draft(
      state.draft_cache, seq, n, draft_rng, target_states=state.target_states
    )
    # 2. One target pass scores the pending token and every draft: p_1..p_{gamma+1}.
    pass_tokens = jnp.concatenate([decode_steps.row_slice(seq, n, 1), drafts], axis=1)
    logits, states, target_cache = score(pass_tokens, state.target_cache, lengths, state.done)
    # 3. Keep tau drafts and y; with K paths, of one path, onto which every copy of the row moves.
    path, tau, y, beta, nonfinite, verifier_state = _verify(
      verify_rng, drafts, q, logits, spec, lengths, state.verifier_state
    )
    if path is not None:
      drafts, target_cache, draft_cache, states = decode_steps.follow(
        path, drafts, target_cache, draft_cache, states, k
      )
    # 4. Emit X_1..X_tau, y; rewind the target to what it keeps.
    seq, n, done, target_cache = emit_accepted(
      state.seq, state.n, state.done, target_cache, drafts, tau, y
    )
    with jax.named_scope('emit'):
      trace = state.trace
      if trace is not None:
        trace = trace.record(state.iteration, drafts, tau, y, n - state.n)
      return state._replace(
        seq=seq,
        n=n,
        done=done,
        target_cache=target_cache,
        draft_cache=draft_cache,
        stats=state.stats.accumulate(~state.done, tau, beta, nonfinite, lengths),
        iteration=state.iteration + 1,
        trace=trace,
        target_states=None
        if states is None
        else decode_steps.TargetStates(states, decode_steps.repeat_paths(state.n, k)),
        verifier_state=verifier_state,
      )

  return body


@functools.partial(jax.jit, static_argnames=('steps', 'spec'))
def autoregressive_loop(steps, params, input_ids, input_mask, rng, *, spec) -> DecodeOutput:
  """The jitted autoregressive loop (one target call per token), unvalidated: `generate`'s
  program. `spec.gamma` must be 0; verifier and trace are not read."""
  if spec.gamma != 0:
    raise ValueError(f'autoregressive_loop drafts nothing: spec.gamma must be 0, got {spec.gamma}.')
  batch = input_ids.shape[0]
  cache, _ = decode_steps.init_caches(
    steps, params, None, None, input_ids, input_mask, spec.buffer_length
  )
  state = _init_state(batch, spec, steps.start_id, cache, None, state_dim=None)
  no_drafts = jnp.zeros((batch, 0), jnp.float32)

  def body(state: _State) -> _State:
    with jax.named_scope('target'):
      logits, cache = steps.step(
        params, decode_steps.row_slice(state.seq, state.n, 1), state.target_cache
      )
    with jax.named_scope('sampling'):
      nonfinite = ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
      if spec.greedy:
        token = sampling_lib.argmax(logits[:, 0])
      else:
        probs = sampling_lib.logits_to_probs(logits[:, 0], spec.sampling)
        token = sampling_lib.sample(jax.random.fold_in(rng, state.iteration), probs)
    with jax.named_scope('emit'):
      seq, n, done = decode_steps.emit(
        state.seq,
        state.n,
        state.done,
        token[:, None],
        jnp.ones_like(state.n),
        eos_id=steps.eos_id,
        max_new_tokens=spec.max_new_tokens,
      )
      stats = state.stats.accumulate(~state.done, jnp.zeros_like(n), no_drafts, nonfinite)
    return state._replace(
      seq=seq, n=n, done=done, target_cache=cache, stats=stats, iteration=state.iteration + 1
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return _finish(state, spec.max_new_tokens)


def _autoregressive_call(model, input_ids, input_mask, *, sampling, max_new_tokens):
  """Validates `generate`'s arguments: ((steps, params, ids, mask), LoopSpec)."""
  steps, params = step_models.as_step_model(model)
  step_models.check_target(steps)
  validation.check_sampling(sampling)
  ids, mask, max_new_tokens = validation.check_inputs(steps, input_ids, input_mask, max_new_tokens)
  return (steps, params, ids, mask), LoopSpec(sampling=sampling, max_new_tokens=max_new_tokens)


def _speculative_call(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma,
  verifier,
  sampling,
  max_new_tokens,
  trace,
  num_drafts=1,
  draft_stop=None,
  unroll_draft=False,
  proposal='sample',
  tree=None,
):
  """Validates `speculative_generate`'s arguments: (the loop's arguments before rng, LoopSpec)."""
  gamma = validation.as_int('gamma', gamma, 1)
  verifiers.check_verifier(verifier)
  validation.check_sampling(sampling)
  target_steps, target_params = step_models.as_step_model(target)
  draft_steps, draft_params = step_models.as_step_model(drafter)
  step_models.check_target(target_steps)
  if draft_steps.vocab_size != target_steps.vocab_size:
    raise ValueError(
      f'Drafter and target vocabularies differ: drafter vocab_size='
      f'{draft_steps.vocab_size}, target vocab_size={target_steps.vocab_size}.'
    )
  step_models.check_state_reader(draft_steps, target_steps)
  step_models.check_block_drafter(draft_steps, gamma)
  step_models.check_encoder_reader(draft_steps, target_steps)
  ids, mask, max_new_tokens = validation.check_inputs(
    target_steps, input_ids, input_mask, max_new_tokens, drafter=draft_steps
  )
  spec = LoopSpec(
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    gamma=gamma,
    verifier=verifier,
    num_drafts=validation.as_int('num_drafts', num_drafts, 1),
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    trace=bool(trace),
    proposal=proposal,
    tree=tree,
  )
  return (target_steps, target_params, draft_steps, draft_params, ids, mask), spec


# eval_shape: no backend starts at import (jax.distributed.initialize must come first).
_ABSTRACT_KEY = jax.eval_shape(lambda: jax.random.key(0))


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
    input_mask: bool or 0/1 int[B, S], 1 for real tokens. A row with none (all 0, e.g. filling a
      batch) is decoded from an all-padding source: T5's attention then spreads evenly over the
      padding, so the row's output is finite but means nothing.
    sampling: the standardized sampling transform (temperature 0 is greedy).
    max_new_tokens: M >= 1, the most tokens per row.
    rng: a PRNG key, `jax.random.key(seed)`; may be None at temperature 0, where nothing is drawn
      (any other temperature raises ValueError).
    check_finite: raise `NonFiniteError` if the model produced NaN or inf logits (this waits for
      the result); False returns the output with `stats.nonfinite` counts instead.

  Returns:
    DecodeOutput with tokens int32[B, M], lengths int32[B], stats.target_calls.
  """
  args, spec = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  out = autoregressive_loop(*args, validation.check_rng(rng, sampling), spec=spec)
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
  num_drafts: int = 1,
  draft_stop: float | None = None,
  unroll_draft: bool = False,
  trace: bool = False,
  check_finite: bool = True,
  proposal: str = 'sample',
  tree: TreeSpec | None = None,
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
    input_mask: bool or 0/1 int[B, S], 1 for real tokens. An all-0 row is decoded as `generate`
      decodes it (from an all-padding source), and speculative decoding is lossless on it as on
      any row (greedy: the same tokens).
    gamma: G >= 1 draft tokens per iteration.
    verifier: a name of `verifiers.REGISTRY`: 'token' (Leviathan et al.), 'block' (Sun et al.)
      or 'greedy_block' (Sun et al. App. C: more drafts kept per iteration, a residual law
      carried into the next; K = 1, no draft_stop, a drafter whose law depends on the context
      alone: not one reading the target's states, nor a block drafter).
    sampling: the transform applied identically to target and drafter logits.
    max_new_tokens: M >= 1, the most tokens per row.
    rng: a PRNG key, `jax.random.key(seed)`; may be None at temperature 0 (as `generate`'s).
    num_drafts: K >= 1 draft paths per iteration. K > 1: the drafter samples K independent
      paths of gamma tokens per row, one target pass scores all K x (gamma + 1) positions, and
      the verifier's `multipath` kernel keeps a prefix of one path ('block': greedy
      multi-path block verification; 'token': recursive rejection over the paths). Each row
      runs as K rows of both models (K times their caches). At temperature 0 the K paths are the
      drafter's one argmax path, so K > 1 adds work and no tokens.
    draft_stop: adaptive draft length: stop drafting after the first draft whose probability
      under the drafter's own softmax is below this threshold in (0, 1), and verify that shorter
      path (`LoopSpec.draft_stop`); None drafts gamma tokens every iteration. The target pass
      keeps its gamma + 1 positions (its cost does not shrink; the verifier ignores the rest).
    unroll_draft: unroll the draft's `lax.scan` (`LoopSpec.unroll_draft`): the same tokens, the
      drafter's gamma - 1 later calls inlined instead of a while loop, so an accelerator launches
      fewer kernels per iteration; compiling takes longer (the more so the larger gamma).
    trace: also return a `SpeculativeTrace` (drafts, accepted counts, corrected tokens of every
      iteration) in `out.trace`; off, the loop records nothing.
    check_finite: raise `NonFiniteError` if the target's logits or either model's probabilities
      held NaN or inf; False returns the output with `stats.nonfinite` counts instead.
    proposal: at temperature > 0, 'sample' draws each draft from the drafter's law q_i,
      'argmax' proposes q_i's most likely token with a one-hot q_i (both exact; 'sample' accepted
      more on the shipped pairs, block drafters included: docs/results.md section 10).
    tree: a `TreeSpec`, e.g. `TreeSpec(num_nodes=16)`: each iteration drafts a token tree of
      depth gamma (a block drafter's best-first or sampled tree, an autoregressive drafter's top-k),
      scores its nodes in one target pass and keeps one root path (`decode_tree`; docs/method.md
      section 13). Other settings at their defaults; each misfit is one ValueError.

  A block drafter (a step model with `block_size`, e.g. a T5 with `T5Config.block_size`) proposes
  all gamma <= block_size drafts in one call (`decode_steps.draft_block`).

  Returns:
    DecodeOutput: tokens int32[B, M], lengths int32[B], per-row `DecodeStats`, and the trace.
  """
  args, spec = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=trace,
    num_drafts=num_drafts,
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    proposal=proposal,
    tree=tree,
  )
  out = speculative_loop(*args, validation.check_rng(rng, sampling), spec=spec)
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
  args, spec = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  return autoregressive_loop.lower(*args, _ABSTRACT_KEY, spec=spec)


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
  num_drafts: int = 1,
  draft_stop: float | None = None,
  unroll_draft: bool = False,
  proposal: str = 'sample',
  tree: TreeSpec | None = None,
) -> jax.stages.Lowered:
  """`speculative_generate`'s program lowered for these shapes (trace off), without running it.

  Takes abstract inputs and params as `lower_generate` does; validates as `speculative_generate`.
  `unroll_draft` lowers the loop with its draft scan unrolled (`speculative_generate`'s): one
  while loop fewer, more kernels in the loop body's HLO and fewer launched per iteration.
  """
  args, spec = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=False,
    num_drafts=num_drafts,
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    proposal=proposal,
    tree=tree,
  )
  return speculative_loop.lower(*args, _ABSTRACT_KEY, spec=spec)
