"""The programs the in-loop timers time (`timing`): model calls inside one jitted `fori_loop`, as a
decode loop makes them, its length traced (one program for every loop length).

`repeated_steps` (a model's calls of T positions each), `repeated_tree_passes` (target passes over
a token tree) and `repeated_iterations` (the loop's iteration: a draft by the drafter's own entry
of the drafting registry and one target pass), each from a fixed position of a cache built once
outside them (`model_cache`); `step_loop`, `iteration_loop` and `tree_loop` bind a model and a
made-up all-real source into `run(k)`. `benchmarks.paper_scale_tpu` and `benchmarks.tree_pass_tpu`
compile these very programs for a TPU instead of timing them.

Axis legend: B batch, S source length, T query length.
"""

import functools

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, drafting, loop_spec, step_models, trees
from specdec_jax import draft as draft_lib
from specdec_jax.sampling import SamplingConfig

_GREEDY = SamplingConfig(temperature=0.0)


@functools.partial(jax.jit, static_argnames=('steps', 'encoder_steps', 'cache_len'))
def init_cache(steps, params, encoder_steps, encoder_params, input_ids, *, cache_len):
  """A model's decoder cache over an all-real source, built once outside the timed loops: the
  encoder over S positions would otherwise run in both loop lengths, and its noise can swamp the
  difference of 32 cheap drafter calls."""
  mask = jnp.ones_like(input_ids)
  encoded = encoder_steps.encode(encoder_params, input_ids, mask)
  return steps.init_cache(params, encoded, mask, cache_len)


def model_cache(model, target, input_ids, cache_len: int):
  """`model`'s cache over `input_ids` (from `target`'s encoder for a drafter that reads it);
  `model`, `target`: (steps, params) (`step_models.as_step_model`), target None for a target."""
  steps, params = model
  encoder_steps, encoder_params = step_models.encoder_of(model, target)
  return init_cache(steps, params, encoder_steps, encoder_params, input_ids, cache_len=cache_len)


@functools.partial(jax.jit, static_argnames=('steps', 'num_tokens'))
def repeated_steps(steps, params, cache, position, *, num_tokens, loop_length):
  """`loop_length` (traced: one program for every loop length) model calls of `num_tokens`
  positions each, every one from `position` [B] of `cache`."""
  batch = position.shape[0]

  # A drafter that reads the target's states gets zeros of their width.
  caps = step_models.capabilities(steps)
  features = None
  if caps.reads_target_states:
    features = jnp.zeros((batch, num_tokens, caps.feature_dim), jnp.float32)

  # A block drafter's call as the loop makes it: num_tokens kept positions, then as many drafts
  # less one (`decode_steps.draft_block`).
  block = caps.block_size
  width = num_tokens - 1 if block else num_tokens

  def body(i, carry):
    cache, logits = carry
    tokens = jnp.full((batch, num_tokens), 2, jnp.int32) + i % 7  # not loop-invariant
    cache = cache.replace(end_index=position)
    if block:
      kept = jnp.full((batch,), num_tokens, jnp.int32)
      logits, cache = steps.step_block(params, tokens, features, cache, width, kept)
    else:
      logits, _, cache = decode_steps.drafter_call(steps, params, tokens, features, cache)
    return cache, logits

  vocab = steps.vocab_size
  logits = jnp.zeros((batch, width, vocab), jnp.float32)
  return jax.lax.fori_loop(0, loop_length, body, (cache, logits))[1]


@functools.partial(jax.jit, static_argnames=('steps', 'max_depth'))
def repeated_tree_passes(steps, params, cache, position, tree, *, max_depth, loop_length):
  """`loop_length` (traced) target passes over a token tree (`step_tree`, the tree loop's pass:
  the tree loop's), every one from `position` [B] of `cache`: `repeated_steps` for a tree of N
  nodes (tree: `trees.Tree` [B, N], depth <= max_depth)."""

  def body(i, carry):
    cache, _ = carry
    tokens = tree.tokens + i % 7  # not loop-invariant
    cache = cache.replace(end_index=position)
    logits, cache = steps.step_tree(params, tree._replace(tokens=tokens), cache, max_depth)
    return cache, logits

  logits = jnp.zeros(tree.tokens.shape + (steps.vocab_size,), jnp.float32)
  return jax.lax.fori_loop(0, loop_length, body, (cache, logits))[1]


def _draft(
  drafter, drafter_cache, pending, position, states, *, gamma, draft_length, cache_len, unroll_draft
):
  """The drafts an iteration's target pass scores, int32[B, gamma], and the drafter's cache.

  `draft_length` 0: no drafter call (tokens made from `pending`). Else the drafter's own entry of
  the drafting registry (`drafting.get(capabilities.drafting)`, what the loop drafts with), greedy,
  its scan looped or unrolled (`unroll_draft`) as the loop runs it, for `draft_length` >= gamma
  tokens (a block drafter: gamma, its one call whatever the length); past gamma its later tokens
  are extra one-token calls of the same scan, and the last one's argmax takes the place of the
  gamma-th draft, so that every call's logits are read (a loop that discarded the first drafter
  call's logits let XLA drop that call's output layer, and c came out 2-4x too low). Either way
  the drafts pass through an optimization barrier, so that XLA cannot shape the target pass by
  how they were made."""
  steps, params = drafter
  batch = pending.shape[0]
  if draft_length == 0:
    drafts = (pending[:, None] + jnp.arange(gamma, dtype=jnp.int32)) % 7 + 2
    return jax.lax.optimization_barrier(drafts), drafter_cache
  caps = step_models.capabilities(steps)
  length = gamma if caps.block_size else draft_length
  spec = loop_spec.LoopSpec(
    sampling=_GREEDY, max_new_tokens=1, gamma=length, unroll_draft=unroll_draft
  )
  view = draft_lib.DraftView(
    seq=jnp.broadcast_to(pending[:, None], (batch, cache_len)),
    n=position,
    done=jnp.zeros((batch,), bool),
    cache=drafter_cache,
    state=None,
    target_states=None if states is None else decode_steps.TargetStates(states, position - 1),
    source_ids=None,  # read by no entry that calls a model
    source_mask=None,
  )
  entry = drafting.get(caps.drafting)
  # The key is unused when greedy, as in the loop.
  out, drafter_cache, _ = entry.draft(drafting.Model(steps, params), view, jax.random.key(0), spec)
  drafts = out.tokens[:, 1:]  # after the pending token
  if length > gamma:
    drafts = jnp.concatenate([drafts[:, : gamma - 1], drafts[:, -1:]], axis=1)
  return jax.lax.optimization_barrier(drafts), drafter_cache


@functools.partial(
  jax.jit,
  static_argnames=(
    'target_steps', 'drafter_steps', 'gamma', 'draft_length', 'cache_len', 'unroll_draft'
  ),
)  # fmt: skip
def repeated_iterations(
  target_steps,
  target_params,
  drafter_steps,
  drafter_params,
  target_cache,
  drafter_cache,
  position,
  *,
  gamma,
  draft_length,
  cache_len,
  unroll_draft,
  loop_length,
):
  """`loop_length` iterations of the speculative loop's model calls, by the loop's own functions:
  a draft of `draft_length` drafter calls (`_draft`: 0, the loop's gamma, or more) and one
  (gamma+1)-position target pass, every iteration from `position` [B] of the caches, each
  iteration's tokens from the last pass's logits. `loop_length` is traced: one program for every
  loop length, a while loop as the decode loop's. Everything else is static: the program holds
  no branch or loop the decode loop lacks (a traced `lax.cond` or trip count would wait for the
  host on a GPU, every iteration)."""
  batch = position.shape[0]
  caps = step_models.capabilities(drafter_steps)
  reads_states = caps.reads_target_states
  target_steps = step_models.state_source(drafter_steps, target_steps)  # the layers it reads
  states = None
  if reads_states:
    states = jnp.zeros((batch, gamma + 1, caps.feature_dim), jnp.float32)
  shape = dict(
    gamma=gamma, draft_length=draft_length, cache_len=cache_len, unroll_draft=unroll_draft
  )

  def body(i, carry):
    target_cache, drafter_cache, logits, states = carry
    pending = (jnp.argmax(logits[:, -1], -1) + i) % 7 + 2  # not loop-invariant
    drafter = (drafter_steps, drafter_params)
    drafts, drafter_cache = _draft(drafter, drafter_cache, pending, position, states, **shape)
    logits, states, target_cache = decode_steps.target_pass(
      target_steps,
      target_params,
      jnp.concatenate([pending[:, None].astype(jnp.int32), drafts], axis=1),
      target_cache.replace(end_index=position),
      with_states=reads_states,
    )
    return target_cache, drafter_cache, logits, states

  logits = jnp.zeros((batch, gamma + 1, target_steps.vocab_size), jnp.float32)
  carry = (target_cache, drafter_cache, logits, states)
  return jax.lax.fori_loop(0, loop_length, body, carry)[2]


def step_loop(model, *, batch_size, source_length, num_tokens=1, cache_len=64, target=None):
  """`run(k)`: k in-loop calls of `model` ((steps, params), as `target`), each scoring
  `num_tokens` positions per row."""
  steps, params = model
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  cache = model_cache(model, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  return lambda k: repeated_steps(
    steps, params, cache, position, num_tokens=num_tokens, loop_length=jnp.int32(k)
  )


def iteration_loop(
  target, drafter, *, batch_size, source_length, gamma, cache_len=64, unroll_draft=False
):
  """`run(k, draft_length=gamma)`: k iterations of the loop's model calls with a draft of
  `draft_length` drafter calls (`repeated_iterations`; one program per draft length), the draft's
  scan unrolled with `unroll_draft`. `target`, `drafter`: (steps, params)."""
  (target_steps, target_params), (drafter_steps, drafter_params) = target, drafter
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  caches = model_cache(target, None, ids, cache_len), model_cache(drafter, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  return lambda k, draft_length=gamma: repeated_iterations(
    target_steps,
    target_params,
    drafter_steps,
    drafter_params,
    *caches,
    position,
    gamma=gamma,
    draft_length=draft_length,
    cache_len=cache_len,
    unroll_draft=unroll_draft,
    loop_length=jnp.int32(k),
  )


def tree_pass_loop(model, cache, position, *, nodes: int, depth: int):
  """`run(loop_length=k)`: k target passes over a best-first tree of `nodes` nodes and depth <=
  `depth` per row (`repeated_tree_passes`), made from made-up peaked marginals: its shape, not its
  tokens, is what a pass pays for."""
  if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 2:
    raise ValueError(f'A token tree has nodes >= 2 (a root and a draft), got nodes={nodes!r}.')
  steps, params = model
  batch = position.shape[0]
  probs = jax.random.dirichlet(jax.random.key(0), jnp.full((64,), 0.1), (batch, depth))
  tree = trees.best_first_tree(jnp.full((batch,), 5, jnp.int32), probs, nodes)
  return functools.partial(
    repeated_tree_passes, steps, params, cache, position, tree=tree, max_depth=depth
  )


def tree_loop(model, *, batch_size, source_length, nodes, depth, cache_len):
  """`run(k)`: k in-loop target passes over a tree of `nodes` nodes and depth <= `depth` per row
  (`tree_pass_loop`), each from slot cache_len // 4 of an all-real source's cache, as
  `step_loop`'s calls."""
  start = cache_len // 4
  if start + nodes > cache_len:
    raise ValueError(f'cache_len={cache_len} has no room for a pass of {nodes} nodes.')
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  position = jnp.full((batch_size,), start, jnp.int32)
  tree = tree_pass_loop(
    model, model_cache(model, None, ids, cache_len), position, nodes=nodes, depth=depth
  )
  return lambda k: tree(loop_length=jnp.int32(k))
