"""The decode loops: ONE `lax.while_loop` body for every speculative decode (a chain, K paths, a
token tree), and the autoregressive loop. Each is one jit with a `LoopSpec` as its static
argument; `decode` validates the public arguments and calls them.

One speculative iteration, whatever the draft's shape (`draft`):
  keys    draft_key, verify_key = split(fold_in(rng, iteration))
  draft   the drafting entry (`drafting.of(spec, ...)`: the drafter's way, or the tree builder)
          proposes a `Draft` from a `DraftView` of the loop: a chain [pending, X_1..X_G] (K
          chains on K model rows per row), or a tree rooted at the pending token
  score   one target pass over the draft's nodes, by its shape (`scoring.SHAPES`)
  verify  the rule for (rule, shape) (`rules.get`: 'greedy' at T = 0, a tree's exact rule, or
          the named verifier) keeps tau drafts and a token y (`draft.Outcome`)
  commit  the kept path's cache entries and states by the shape (K paths: every copy of the row
          moves onto the kept one; a tree: the path's keys and values move after the root)
  emit    X_1..X_tau, y appended, the target's cache rewound to the new n; stats and trace.

`decode_steps` documents the caches' positions (the drafter's catch-up rule and the worked
example of a chain iteration); `scoring` the passes; `rules` the verifiers; `drafting` the drafts.

Axes: B batch, R = B * K model rows, L buffer length, G gamma, F state width, M max_new_tokens.
"""

import functools

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, drafting, rules, scoring, step_models, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.decode_stats import DecodeOutput, DecodeStats, SpeculativeTrace
from specdec_jax.draft import DraftView
from specdec_jax.loop_spec import LoopSpec
from specdec_jax.step_models import Cache


@flax.struct.dataclass(kw_only=True)
class LoopState:
  """The loop's carry. Loop invariants (params, rng, the source) are closed over, never carried.

  Attributes:
    seq: i32[B, L] the start token, then the emitted tokens; seq[b, n[b]] is the pending token.
    n: i32[B] tokens emitted.
    done: bool[B] rows finished (EOS or max_new_tokens).
    iteration: i32[] iterations run; the keys are split(fold_in(rng, iteration)).
    target_cache: the target's cache, R rows; end_index == repeat(n, K) between iterations.
    drafter_cache: the drafter's cache, R rows, L + the entry's extra slots; None: no drafter
      model (autoregressive decoding, a drafting entry that calls none).
    target_states: the last target pass's states at the last root and its kept path,
      f32[R, G + 1, F] from position `start` i32[R] (-1 before the first pass, zero states), for
      a drafter reading them; else None.
    drafter_state: the drafting entry's carried state (`Drafting.init_state`: the top-k tree's
      last root i32[B]), or None.
    verifier_state: the verifier's carried state (`verifiers.Verifier.init_state`: greedy block
      verification's levels f32[B, G - 1]), or None.
    stats: per-row counters `DecodeStats` [B] (gamma: the draft's depth).
    trace: the `SpeculativeTrace` being filled, or None (spec.trace off).
  """

  seq: jax.Array
  n: jax.Array
  done: jax.Array
  iteration: jax.Array
  target_cache: Cache
  drafter_cache: Cache | None = None
  target_states: decode_steps.TargetStates | None = None
  drafter_state: jax.Array | None = None
  verifier_state: jax.Array | None = None
  stats: DecodeStats
  trace: SpeculativeTrace | None = None

  @property
  def batch(self) -> int:
    return self.n.shape[0]

  @property
  def pending(self) -> jax.Array:
    """i32[B] each row's pending token seq[b, n[b]]."""
    return decode_steps.row_slice(self.seq, self.n, 1)[:, 0]


def _start(batch, spec: LoopSpec, start_id, target_cache, **fields) -> LoopState:
  """The state before the first iteration."""
  return LoopState(
    seq=jnp.zeros((batch, spec.buffer_length), jnp.int32).at[:, 0].set(start_id),
    n=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    iteration=jnp.zeros((), jnp.int32),
    target_cache=target_cache,
    stats=DecodeStats.zeros(batch, spec.gamma),
    **fields,
  )


def _finish(state: LoopState, max_new_tokens: int) -> DecodeOutput:
  tokens = state.seq[:, 1 : max_new_tokens + 1]
  tokens = jnp.where(jnp.arange(max_new_tokens) < state.n[:, None], tokens, step_models.PAD_ID)
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats, trace=state.trace)


def _while(state: LoopState, body) -> LoopState:
  return jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)


def check_models(spec: LoopSpec, target_steps, draft_steps) -> drafting.Drafting:
  """The loop's drafting entry for these models, after its checks and the verifier's: one
  ValueError naming what the models lack (`drafting.Drafting.needs`,
  `verifiers.Verifier.check_drafter`)."""
  drafter_caps = step_models.capabilities(draft_steps)
  target_steps = step_models.state_source(draft_steps, target_steps)
  entry = drafting.of(spec, drafter_caps, step_models.capabilities(target_steps))
  verifiers.get(spec.verifier).check_drafter(drafter_caps)
  return entry


@functools.partial(jax.jit, static_argnames=('target_steps', 'draft_steps', 'spec'))
def speculative_loop(
  target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, rng, *, spec
) -> DecodeOutput:
  """The jitted speculative loop (Leviathan et al. 2023, Algorithm 1, batched; module
  docstring), unvalidated: `decode.speculative_generate` validates its arguments and calls it.

  Args:
    target_steps, target_params / draft_steps, draft_params: the two step models.
    input_ids, input_mask: int32[B, S].
    rng: PRNG key.
    spec: a `LoopSpec` with gamma >= 1.
  """
  if spec.gamma < 1:
    raise ValueError(f'speculative_loop needs spec.gamma >= 1, got {spec.gamma}.')
  entry = check_models(spec, target_steps, draft_steps)
  drafter_caps = step_models.capabilities(draft_steps)
  target_steps = step_models.state_source(draft_steps, target_steps)  # the layers it reads
  verifier = verifiers.get(spec.verifier)
  shape = rules.shape_of(spec, entry)
  verify = rules.get(rules.rule_of(spec, entry), shape)
  k, batch = spec.num_drafts, input_ids.shape[0]
  reads_states = drafter_caps.reads_target_states

  target_cache, drafter_cache = decode_steps.init_caches(
    target_steps, target_params, draft_steps, draft_params, input_ids, input_mask,
    spec.buffer_length, num_drafts=k,
    draft_cache_len=spec.buffer_length + entry.extra_slots(spec.gamma),
  )  # fmt: skip
  target_states = None
  if reads_states:  # zero states "at position -1": seq[0] is fed with zeros; one row per path
    states = jnp.zeros((batch * k, spec.gamma + 1, drafter_caps.feature_dim), jnp.float32)
    target_states = decode_steps.TargetStates(states, jnp.full((batch * k,), -1, jnp.int32))
  state = _start(
    batch, spec, target_steps.start_id, target_cache,
    drafter_cache=drafter_cache,
    target_states=target_states,
    drafter_state=None if entry.init_state is None else entry.init_state(batch),
    verifier_state=None if verifier.init_state is None else verifier.init_state(batch, spec.gamma),
    trace=SpeculativeTrace.zeros(batch, spec.max_new_tokens, spec.gamma) if spec.trace else None,
  )  # fmt: skip
  target = drafting.Model(target_steps, target_params)
  drafter = drafting.Model(draft_steps, draft_params)
  source = (decode_steps.repeat_paths(input_ids, k), decode_steps.repeat_paths(input_mask, k))
  emit_accepted = functools.partial(
    decode_steps.emit_accepted,
    eos_id=target_steps.eos_id,
    max_new_tokens=spec.max_new_tokens,
    num_drafts=k,
  )

  def body(s: LoopState) -> LoopState:
    draft_key, verify_key = jax.random.split(jax.random.fold_in(rng, s.iteration))
    # 1. Draft: with K paths every row runs as K rows of both models (the identity at K = 1).
    view = DraftView(
      seq=decode_steps.repeat_paths(s.seq, k),
      n=decode_steps.repeat_paths(s.n, k),
      done=decode_steps.repeat_paths(s.done, k),
      cache=s.drafter_cache,
      state=s.drafter_state,
      target_states=s.target_states,
      source_ids=source[0],
      source_mask=source[1],
    )
    draft, drafter_cache, drafter_state = entry.draft(drafter, view, draft_key, spec)
    # 2. One target pass scores the pending token and every draft.
    scored = scoring.SHAPES[shape].score(target, draft, s.target_cache, s.done, spec, reads_states)
    # 3. Keep tau drafts and y; 4. commit the kept path, then emit and rewind.
    outcome, verifier_state = verify(verify_key, draft, scored.logits, spec, s.verifier_state)
    drafts, target_cache, drafter_cache, states = scoring.SHAPES[shape].commit(
      outcome, draft, scored, drafter_cache, target, spec
    )
    seq, n, done, target_cache = emit_accepted(
      s.seq, s.n, s.done, target_cache, drafts, outcome.tau, outcome.y
    )
    with jax.named_scope('emit'):
      trace = s.trace
      if trace is not None:
        trace = trace.record(s.iteration, drafts, outcome.tau, outcome.y, n - s.n)
      stats = s.stats.accumulate(
        ~s.done, outcome.tau, outcome.beta, outcome.nonfinite, draft.lengths
      )
      return s.replace(
        seq=seq,
        n=n,
        done=done,
        iteration=s.iteration + 1,
        target_cache=target_cache,
        drafter_cache=drafter_cache,
        target_states=None
        if states is None
        else decode_steps.TargetStates(states, decode_steps.repeat_paths(s.n, k)),
        drafter_state=drafter_state,
        verifier_state=verifier_state,
        stats=stats,
        trace=trace,
      )

  return _finish(_while(state, body), spec.max_new_tokens)


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
  state = _start(batch, spec, steps.start_id, cache)
  no_drafts = jnp.zeros((batch, 0), jnp.float32)

  def body(s: LoopState) -> LoopState:
    with jax.named_scope('target'):
      logits, cache = steps.step(params, decode_steps.row_slice(s.seq, s.n, 1), s.target_cache)
    with jax.named_scope('sampling'):
      nonfinite = ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
      if spec.greedy:
        token = sampling_lib.argmax(logits[:, 0])
      else:
        probs = sampling_lib.logits_to_probs(logits[:, 0], spec.sampling)
        token = sampling_lib.sample(jax.random.fold_in(rng, s.iteration), probs)
    with jax.named_scope('emit'):
      seq, n, done = decode_steps.emit(
        s.seq, s.n, s.done, token[:, None], jnp.ones_like(s.n),
        eos_id=steps.eos_id, max_new_tokens=spec.max_new_tokens,
      )  # fmt: skip
      stats = s.stats.accumulate(~s.done, jnp.zeros_like(n), no_drafts, nonfinite)
    return s.replace(
      seq=seq, n=n, done=done, target_cache=cache, stats=stats, iteration=s.iteration + 1
    )

  return _finish(_while(state, body), spec.max_new_tokens)
