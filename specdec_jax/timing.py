"""Wall-clock measurement of jitted work: whole calls, and model calls as a decode loop sees them.

A model call timed from Python includes jit dispatch (~0.3-0.5 ms for a T5's params pytree on a
small CPU), which the decode loops never pay: they run inside one jit. `step_seconds` therefore
times a model call inside a jitted `fori_loop` and takes the difference of two loop lengths, which
cancels dispatch; the encoder and the cache set-up run once before, outside the timed programs.
Costs of the drafter (c) and of the (gamma+1)-position target pass are measured this way by the main
job and the benchmarks.

Axis legend: B batch, S source length, T query length.
"""

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import decode_steps, step_models


def time_call(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
  """(seconds of the first call, median seconds of `repeats` further calls); waits for results."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return first, float(np.median(times))


@functools.partial(jax.jit, static_argnames=('steps', 'encoder_steps', 'cache_len'))
def _init_cache(steps, params, encoder_steps, encoder_params, input_ids, *, cache_len):
  """A model's decoder cache over an all-real source, built once outside the timed loops: the
  encoder over S positions would otherwise run in both loop lengths, and its noise (tens of ms for
  a 48M target at S 256) swamps the difference of 32 cheap drafter calls."""
  mask = jnp.ones_like(input_ids)
  encoded = encoder_steps.encode(encoder_params, input_ids, mask)
  return steps.init_cache(params, encoded, mask, cache_len)


def _cache(model, target, input_ids, cache_len: int):
  """`model`'s cache over `input_ids` (from `target`'s encoder for a drafter that reads it)."""
  steps, params = step_models.as_step_model(model)
  encoder_steps, encoder_params = step_models.encoder_of(model, target)
  return _init_cache(steps, params, encoder_steps, encoder_params, input_ids, cache_len=cache_len)


@functools.partial(jax.jit, static_argnames=('steps', 'num_tokens'))
def _repeated_steps(steps, params, cache, position, *, num_tokens, calls):
  """`calls` (traced: one program for every loop length) model calls of `num_tokens` positions
  each, every one from `position` [B] of `cache`."""
  batch = position.shape[0]

  # A drafter that reads the target's states gets zeros of their width.
  features = None
  if getattr(steps, 'reads_target_states', False):
    features = jnp.zeros((batch, num_tokens, steps.feature_dim), jnp.float32)

  def body(i, carry):
    cache, logits = carry
    tokens = jnp.full((batch, num_tokens), 2, jnp.int32) + i % 7  # not loop-invariant
    logits, _, cache = decode_steps.drafter_call(
      steps, params, tokens, features, cache.replace(end_index=position)
    )
    return cache, logits

  vocab = steps.vocab_size
  logits = jnp.zeros((batch, num_tokens, vocab), jnp.float32)
  return jax.lax.fori_loop(0, calls, body, (cache, logits))[1]


@functools.partial(jax.jit, static_argnames=('target_steps', 'drafter_steps', 'gamma', 'cache_len'))
def _repeated_iterations(
  target_steps,
  target_params,
  drafter_steps,
  drafter_params,
  target_cache,
  drafter_cache,
  position,
  *,
  gamma,
  cache_len,
  calls,
):
  """`calls` iterations of the speculative loop's model calls, by the loop's own functions: the
  drafter's gamma calls (`decode_steps.draft`, greedy) and one (gamma+1)-position target pass,
  every iteration from `position` [B] of the caches."""
  batch = position.shape[0]
  reads_states = getattr(drafter_steps, 'reads_target_states', False)
  states = None
  if reads_states:
    states = jnp.zeros((batch, gamma + 1, drafter_steps.feature_dim), jnp.float32)

  def body(i, carry):
    target_cache, drafter_cache, logits, states = carry
    # Each iteration's tokens depend on the last pass's logits and every draft is the argmax of
    # the drafter's logits, as in the loop: every logit is needed, so XLA cannot drop an output
    # layer (a loop that discarded the first drafter call's logits let it drop that call's output
    # layer, and c came out 2-4x too low).
    pending = (jnp.argmax(logits[:, -1], -1) + i) % 7 + 2
    seq = jnp.broadcast_to(pending[:, None], (batch, cache_len))
    drafts, _, drafter_cache, _ = decode_steps.draft(
      drafter_steps,
      drafter_params,
      drafter_cache,
      seq,
      position,
      jax.random.key(0),  # unused when greedy, as in the loop
      gamma=gamma,
      sampling=None,
      greedy=True,
      target_states=None if states is None else (states, position - 1),
    )
    logits, states, target_cache = decode_steps.target_pass(
      target_steps,
      target_params,
      jnp.concatenate([pending[:, None], drafts], axis=1),
      target_cache.replace(end_index=position),
      with_states=reads_states,
    )
    return target_cache, drafter_cache, logits, states

  logits = jnp.zeros((batch, gamma + 1, target_steps.vocab_size), jnp.float32)
  carry = (target_cache, drafter_cache, logits, states)
  return jax.lax.fori_loop(0, calls, body, carry)[2]


def _per_call(run: Callable[[int], object], calls: tuple[int, int], repeats: int) -> float:
  """Seconds per call of a jitted loop `run(k)` of k calls: the difference of the median times of
  two loop lengths over the difference of lengths, which cancels dispatch and setup. The loop
  length is a traced argument, so both lengths run one compiled program."""
  short, long = (time_call(lambda k=k: run(jnp.int32(k)), repeats)[1] for k in calls)
  return max(long - short, 0.0) / (calls[1] - calls[0])


def iteration_seconds(
  target,
  drafter,
  *,
  batch_size: int,
  source_length: int,
  gamma: int,
  cache_len: int = 64,
  calls: tuple[int, int] = (4, 36),
  repeats: int = 7,
) -> float:
  """Seconds of one iteration's model calls inside a jitted loop (gamma drafter calls and a
  (gamma+1)-position target pass, each depending on the last), by the difference of two loop
  lengths as `step_seconds`. Unlike the sum of their bare costs, it includes what the calls cost
  each other: the target's pass evicts the drafter's weights from the CPU caches."""
  target_steps, target_params = step_models.as_step_model(target)
  drafter_steps, drafter_params = step_models.as_step_model(drafter)
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  caches = _cache(target, None, ids, cache_len), _cache(drafter, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  run = lambda k: _repeated_iterations(
    target_steps,
    target_params,
    drafter_steps,
    drafter_params,
    *caches,
    position,
    gamma=gamma,
    cache_len=cache_len,
    calls=k,
  )
  return _per_call(run, calls, repeats)


def step_seconds(
  model,
  *,
  batch_size: int,
  source_length: int,
  num_tokens: int = 1,
  cache_len: int = 64,
  calls: tuple[int, int] = (4, 36),
  repeats: int = 7,
  target=None,
) -> float:
  """Seconds of one in-loop model call scoring `num_tokens` positions per row.

  Args:
    model: anything `step_models.as_step_model` takes.
    batch_size: B.
    source_length: S of the (all-real) source.
    num_tokens: T, positions scored per call (1 for a step, gamma + 1 for a target pass).
    cache_len: decoder slots; calls start at position cache_len // 4.
    calls: two loop lengths; the cost is the difference of their median times per extra call.
    repeats: timed runs of each loop length.
    target: the target, for a drafter that reads the target's encoder output (its cache is built
      from the target's `encode`, as the decode loops build it; the encoder is not timed).
  """
  steps, params = step_models.as_step_model(model)
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  cache = _cache(model, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  run = lambda k: _repeated_steps(steps, params, cache, position, num_tokens=num_tokens, calls=k)
  return _per_call(run, calls, repeats)


def step_costs(
  target,
  drafter,
  *,
  batch_size: int,
  source_length: int,
  gamma: int,
  cache_len: int = 64,
  rounds: int = 3,
  num_paths: int = 1,
) -> dict[str, float]:
  """In-loop seconds of a target step (T=1), a (gamma+1)-position target pass, a drafter step
  alone, and a whole iteration's model calls (`iteration_seconds`); and the ratios
  `pass_cost` (pass / target step), `c_alone` (drafter step alone / target step) and `c`, the
  drafter's cost per call *within* an iteration: (iteration - pass) / gamma / target step. `c`
  is what the walltime formula needs: a drafter's weights are evicted by each target pass on a
  CPU, so its calls cost more in the loop than alone (on a TPU the two agree).

  The four are measured one after another, `rounds` times; each ratio is the median of its
  per-round ratios, so a slow spell of a shared machine shifts numerator and denominator together
  instead of skewing one of them.

  With `num_paths` K > 1 (a multi-draft loop, `speculative_generate(..., num_drafts=K)`, which
  runs each row as K rows of both models) the pass, the drafter and the iteration are measured at
  K x batch_size rows and the target step at batch_size rows: the costs of a K-path iteration in
  the autoregressive loop's steps.
  """
  kw = dict(batch_size=batch_size, source_length=source_length, cache_len=cache_len)
  paths_kw = dict(kw, batch_size=batch_size * num_paths)
  rounds_measured = []
  for _ in range(rounds):
    step = step_seconds(target, **kw)
    rounds_measured.append(
      (
        step,
        step_seconds(target, num_tokens=gamma + 1, **paths_kw),
        step_seconds(drafter, target=target, **paths_kw),
        iteration_seconds(target, drafter, gamma=gamma, **paths_kw),
      )
    )
  step, target_pass, drafter_step, iteration = np.asarray(rounds_measured).T
  in_loop = np.maximum(iteration - target_pass, 0.0) / gamma
  return {
    'target_step': float(np.median(step)),
    'target_pass': float(np.median(target_pass)),
    'drafter_step': float(np.median(drafter_step)),
    'iteration': float(np.median(iteration)),
    'c_alone': float(np.median(drafter_step / step)),
    'c': float(np.median(in_loop / step)),
    'pass_cost': float(np.median(target_pass / step)),
  }
