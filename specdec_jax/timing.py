"""Wall-clock measurement of jitted work: whole calls, and model calls as a decode loop sees them.

A model call timed from Python includes jit dispatch (~0.3-0.5 ms for a T5's params pytree on a
small CPU), which the decode loops never pay: they run inside one jit. `step_seconds` therefore
times a model call inside a jitted `fori_loop` and takes the difference of two loop lengths, which
cancels dispatch; the encoder and the cache set-up run once before, outside the timed programs.
The drafter's cost in the loop is measured inside the loop's own iteration, run without its
drafter calls, with them, and with its draft repeated (`drafter_seconds`): a cost per call (c)
and a fixed cost per iteration (c_fixed). Loops timed together run in turn and the fastest
run of each counts, so that a shared machine's load moves them alike (`step_costs`, which the
main job and the benchmarks use).

Axis legend: B batch, S source length, T query length.
"""

import functools
import math
import time
from collections.abc import Callable
from typing import NamedTuple

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
  drafts=1,
):
  """`calls` iterations of the speculative loop's model calls, by the loop's own functions:
  `drafts` drafts of gamma drafter calls each (`decode_steps.draft`, greedy, each from the same
  position) and one (gamma+1)-position target pass, every iteration from `position` [B] of the
  caches. `drafts` is 1 in the loop; 0 skips the drafter (the pass scores fixed drafts), and more
  repeat the draft right after the first, whose calls find the drafter's weights as its own calls
  left them. `calls` and `drafts` are traced: one program for every loop length and draft count,
  as two programs are compiled apart (an iteration compiled without its drafter calls ran faster
  by more than they cost: an n-gram drafter that costs nothing alone read c 0.13 that way)."""
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

    def run_drafter(j, carry):
      last, drafter_cache = carry
      drafts, _, drafter_cache, _ = decode_steps.draft(
        drafter_steps,
        drafter_params,
        drafter_cache,
        (seq + last[:, :1] + j) % 7 + 2,  # a repeat depends on the draft before it
        position,
        jax.random.key(0),  # unused when greedy, as in the loop
        gamma=gamma,
        sampling=None,
        greedy=True,
        target_states=None if states is None else (states, position - 1),
      )
      return drafts, drafter_cache

    drafted, drafter_cache = jax.lax.fori_loop(
      0, drafts, run_drafter, (seq[:, :gamma], drafter_cache)
    )
    logits, states, target_cache = decode_steps.target_pass(
      target_steps,
      target_params,
      jnp.concatenate([pending[:, None], drafted], axis=1),
      target_cache.replace(end_index=position),
      with_states=reads_states,
    )
    return target_cache, drafter_cache, logits, states

  logits = jnp.zeros((batch, gamma + 1, target_steps.vocab_size), jnp.float32)
  carry = (target_cache, drafter_cache, logits, states)
  return jax.lax.fori_loop(0, calls, body, carry)[2]


def _fastest(runs: dict, repeats: int) -> dict:
  """{key: seconds of the fastest of `repeats` runs of `runs[key]()`}: each zero-argument function
  runs once untimed (compiles, warms), then all of them in turn, `repeats` times. In turn, a slow
  spell of a shared machine falls on every one alike; the fastest run of each is the one it
  disturbed least, and unlike the median it does not move with how busy the machine was."""
  for run in runs.values():
    jax.block_until_ready(run())
  best = dict.fromkeys(runs, math.inf)
  for _ in range(repeats):
    for key, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      best[key] = min(best[key], time.perf_counter() - start)
  return best


def _slope(seconds: dict, name, calls: tuple[int, int]) -> float:
  """Seconds per call of a loop from its fastest runs at two lengths, `seconds[name, k]`: the
  difference over the difference of lengths, which cancels dispatch and set-up."""
  short, long = calls
  return max(seconds[name, long] - seconds[name, short], 0.0) / (long - short)


def _per_call(run: Callable[[int], object], calls: tuple[int, int], repeats: int) -> float:
  """Seconds per call of a jitted loop `run(k)` of k calls, from two loop lengths (`_slope`). The
  loop length is a traced argument, so both lengths run one compiled program."""
  runs = {('loop', k): functools.partial(run, k) for k in calls}
  return _slope(_fastest(runs, repeats), 'loop', calls)


def _step_loop(model, *, batch_size, source_length, num_tokens=1, cache_len=64, target=None):
  """`run(k)`: k in-loop calls of `model`, each scoring `num_tokens` positions per row."""
  steps, params = step_models.as_step_model(model)
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  cache = _cache(model, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  return lambda k: _repeated_steps(
    steps, params, cache, position, num_tokens=num_tokens, calls=jnp.int32(k)
  )


def _iteration_loop(target, drafter, *, batch_size, source_length, gamma, cache_len=64):
  """`run(k, drafts=1)`: k iterations of the loop's model calls (`_repeated_iterations`)."""
  target_steps, target_params = step_models.as_step_model(target)
  drafter_steps, drafter_params = step_models.as_step_model(drafter)
  ids = jnp.full((batch_size, source_length), 3, jnp.int32)
  caches = _cache(target, None, ids, cache_len), _cache(drafter, target, ids, cache_len)
  position = jnp.full((batch_size,), cache_len // 4, jnp.int32)
  return lambda k, drafts=1: _repeated_iterations(
    target_steps,
    target_params,
    drafter_steps,
    drafter_params,
    *caches,
    position,
    gamma=gamma,
    cache_len=cache_len,
    calls=jnp.int32(k),
    drafts=jnp.int32(drafts),
  )


class DrafterCost(NamedTuple):
  """What a drafter's gamma calls add to an iteration of the loop: `gamma * per_call + fixed`.

  `per_call` is the slope: a drafter call's cost once the drafter is running (its calls in
  repeated drafts). `fixed` is what the first draft of an iteration costs beyond its gamma calls:
  on a CPU, the reload of the drafter's weights and cache that the target pass evicted (a 5 MB
  drafter beside a 190 MB target: ~0.1 target steps per iteration whatever gamma). A single
  per-call c = (gamma * per_call + fixed) / gamma would read ~40% more at gamma 3 than at 5.
  In seconds or in target steps, as returned.
  """

  per_call: float
  fixed: float


# Repeats of the draft in the run that measures `DrafterCost.per_call`: 4 x gamma extra calls per
# iteration make the slope a difference of ~10% of the run, not of the ~1% of one draft.
EXTRA_DRAFTS = 4


def _drafter_cost(seconds: dict, gamma: int, extra: int, per: float) -> DrafterCost:
  """`DrafterCost` from the fastest runs of one loop length with 0, 1 and 1 + `extra` drafts per
  iteration (`seconds[drafts]`), over `per` (the loop length, or a run of target steps)."""
  per_call = max(seconds[1 + extra] - seconds[1], 0.0) / (extra * gamma) / per
  drafting = max(seconds[1] - seconds[0], 0.0) / per
  return DrafterCost(per_call, max(drafting - gamma * per_call, 0.0))


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
  run = _iteration_loop(
    target, drafter, batch_size=batch_size, source_length=source_length, gamma=gamma,
    cache_len=cache_len,
  )  # fmt: skip
  return _per_call(run, calls, repeats)


def drafter_seconds(
  target,
  drafter,
  *,
  gamma: int,
  calls: int = 36,
  repeats: int = 7,
  extra_drafts: int = EXTRA_DRAFTS,
  **shape,
) -> DrafterCost:
  """Seconds that an iteration's drafter calls add to it, measured where they are spent: the loop
  of `iteration_seconds` (one compiled program; `shape`: its batch_size, source_length and
  cache_len) run for `calls` iterations with 0, 1 and 1 + `extra_drafts` drafts per iteration, in
  turn `repeats` times (`DrafterCost` from the fastest runs).

  The runs differ in the drafter's calls alone: same program, loop length, caches and target pass,
  so dispatch, set-up and the pass cancel, and what remains includes what the calls cost in the
  loop and not alone (the reload of the drafter's weights that each pass evicted: `fixed`).
  """
  run = _iteration_loop(target, drafter, gamma=gamma, **shape)
  counts = (0, 1, 1 + extra_drafts)
  seconds = _fastest({k: functools.partial(run, calls, k) for k in counts}, repeats)
  return _drafter_cost(seconds, gamma, extra_drafts, calls)


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
    calls: two loop lengths; the cost is the difference of their fastest times per extra call.
    repeats: timed runs of each loop length, in turn.
    target: the target, for a drafter that reads the target's encoder output (its cache is built
      from the target's `encode`, as the decode loops build it; the encoder is not timed).
  """
  run = _step_loop(
    model, batch_size=batch_size, source_length=source_length, num_tokens=num_tokens,
    cache_len=cache_len, target=target,
  )  # fmt: skip
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
  calls: tuple[int, int] = (4, 36),
  repeats: int = 7,
  extra_drafts: int = EXTRA_DRAFTS,
) -> dict[str, float]:
  """What the walltime formula needs, in seconds and in target steps, all timed in turn.

  Seconds (each in-loop, from two loop lengths as `step_seconds`): `target_step` (T=1),
  `target_pass` (gamma+1 positions), `drafter_step` (the drafter alone) and `iteration` (a whole
  iteration's model calls, `iteration_seconds`). Ratios, in target steps: `pass_cost` (pass /
  target step), `c` and `c_fixed` (what the drafter adds to an iteration, `gamma * c + c_fixed`,
  measured as `drafter_seconds`: `DrafterCost.per_call` and `.fixed`) and `c_alone` (a drafter
  step alone). `c` and `c_fixed` are what the formula needs: on a CPU each target pass evicts the
  drafter's weights, so its calls cost more in the loop than alone, and the first of them most
  (on a TPU or GPU c is c_alone and c_fixed ~0).

  Every loop runs in turn with the others (`repeats` times; the fastest run of each counts).
  `pass_cost`, `c` and `c_fixed` are ratios of the longer runs alone (`calls[1]` calls each, so
  dispatch is well under 1% of a run of any model worth timing): runs of like length meet a
  shared machine's load alike, where a short run finds it idle more often than a long one and
  skews a difference of the two. `c_alone` is a ratio of slopes: a drafter step alone is too cheap
  to be timed without cancelling dispatch. `rounds` repeats the whole measurement; each value is
  the median over the rounds.

  With `num_paths` K > 1 (a multi-draft loop, `speculative_generate(..., num_drafts=K)`, which
  runs each row as K rows of both models) the pass, the drafter and the iteration are measured at
  K x batch_size rows and the target step at batch_size rows: the costs of a K-path iteration in
  the autoregressive loop's steps.
  """
  kw = dict(source_length=source_length, cache_len=cache_len)
  rows = dict(kw, batch_size=batch_size * num_paths)
  loops = dict(
    target_step=_step_loop(target, batch_size=batch_size, **kw),
    target_pass=_step_loop(target, num_tokens=gamma + 1, **rows),
    drafter_step=_step_loop(drafter, target=target, **rows),
    iteration=_iteration_loop(target, drafter, gamma=gamma, **rows),
  )
  long = calls[1]
  runs = {(name, k): functools.partial(loop, k) for name, loop in loops.items() for k in calls}
  for drafts in (0, 1 + extra_drafts):
    runs['drafts', drafts] = functools.partial(loops['iteration'], long, drafts)
  measured = []
  for _ in range(rounds):
    seconds = _fastest(runs, repeats)
    m = {name: _slope(seconds, name, calls) for name in loops}
    if m['target_step'] <= 0:
      raise RuntimeError(
        f'A target step timed at 0 s ({long - calls[0]} extra calls did not take measurably '
        'longer): the target is too cheap to time here; pass longer `calls`.'
      )
    step_run = seconds['target_step', long]
    drafts = {0: seconds['drafts', 0], 1: seconds['iteration', long]}
    drafts[1 + extra_drafts] = seconds['drafts', 1 + extra_drafts]
    m['c'], m['c_fixed'] = _drafter_cost(drafts, gamma, extra_drafts, step_run)
    m['pass_cost'] = seconds['target_pass', long] / step_run
    m['c_alone'] = m['drafter_step'] / m['target_step']
    measured.append(m)
  names = (*loops, 'c_alone', 'c', 'c_fixed', 'pass_cost')
  return {name: float(np.median([m[name] for m in measured])) for name in names}
