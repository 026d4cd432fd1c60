"""Wall-clock measurement of jitted work: whole calls, and model calls as a decode loop sees them.

Every timed region goes through `timed`, which raises `CompiledWhileTimed` when XLA compiles
anything during it: a region that compiles (a new shape, a device array sliced by a Python length)
measures the compiler, not the work. Each timer runs its programs once untimed first.

A model call timed from Python includes jit dispatch, which the decode loops never pay: they run
inside one jit. `step_seconds` therefore times a model call inside a jitted `fori_loop` and takes
the difference of two loop lengths, which cancels dispatch; the encoder and the cache set-up run
once before, outside the timed programs. The drafter's cost in the loop is measured inside the
loop's own iteration, compiled without its drafter calls, with the loop's gamma of them and
with more of them (`step_costs`): a cost per call (c) and a fixed cost per iteration
(c_fixed). The timed iteration has the decode loop's structure and nothing more: the draft is
the drafter's own drafting entry at a static length, scanned or unrolled as the loop runs it, and
no traced branch or loop decides the drafter's calls. Loops timed together run in turn and the
fastest run of each counts, so that a shared machine's load moves them alike (`step_costs`, which
the main job and the benchmarks use). The timed programs are `timed_loops`' (`repeated_steps`,
`repeated_tree_passes`, `repeated_iterations`). What these timers measured, and why they are
built so: docs/performance.md.

Axis legend: B batch, S source length, T query length.
"""

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax import step_models
from specdec_jax.measure import timed_loops

# What `jax.monitoring` records for each program XLA compiles, or reads from the persistent
# compilation cache (jax._src.dispatch.BACKEND_COMPILE_EVENT; one event per program, with its name
# as `fun_name`).
BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


class CompiledWhileTimed(RuntimeError):
  """XLA compiled a program inside a timed region: the region's seconds are not the work's."""


@contextlib.contextmanager
def compiles() -> Iterator[list[str]]:
  """The names of the programs XLA compiles (or loads from the persistent compilation cache)
  while inside, e.g. ['jit(dynamic_slice)', 'jit(squeeze)'] for `x[0, :n]` of a device array at a
  new n: a list that fills as they happen."""
  names = []

  def listener(event: str, duration: float, **kwargs) -> None:
    del duration
    if event == BACKEND_COMPILE_EVENT:
      names.append(str(kwargs.get('fun_name', '?')))

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield names
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def timed(fn: Callable[[], Any], what: str = 'a timed call') -> tuple[Any, float]:
  """(`fn()`'s result, ready; the seconds it took). Every timed region of the project is this.

  Raises:
    CompiledWhileTimed: XLA compiled a program while `fn` ran (its names in the message). A
      compilation costs milliseconds to seconds, so a time that includes one is wrong by more than
      any difference it was meant to show; run `fn` once untimed first (same shapes), and keep
      host work whose programs depend on values (slicing a device array by a Python length,
      tokenizing, building a batch) out of `fn`.
  """
  with compiles() as compiled:
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    seconds = time.perf_counter() - start
  if compiled:
    shown = ', '.join(compiled[:6]) + (', ...' if len(compiled) > 6 else '')
    raise CompiledWhileTimed(
      f'{what} compiled {len(compiled)} program(s) while timed ({shown}): its time would include '
      'compilation. Warm it up with the same shapes, and move work that compiles per value (e.g. '
      'x[0, :n] of a device array for a new n: gather to the host first) out of the timed call.'
    )
  return out, seconds


def time_call(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
  """(seconds of the first call, compilation included; median seconds of `repeats` further
  calls, each `timed`); waits for results."""
  start = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - start
  return first, float(np.median([timed(fn)[1] for _ in range(repeats)]))


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
      best[key] = min(best[key], timed(run, f'timing loop {key}')[1])
  return best


def _slope(seconds: dict, name, loop_lengths: tuple[int, int]) -> float:
  """Seconds per iteration of a loop from its fastest runs at two lengths, `seconds[name, k]`:
  the difference over the difference of lengths, which cancels dispatch and set-up."""
  short, long = loop_lengths
  return max(seconds[name, long] - seconds[name, short], 0.0) / (long - short)


def _per_iteration(run: Callable[[int], object], loop_lengths: tuple[int, int], repeats: int):
  """Seconds per iteration of a jitted loop `run(k)` of k iterations, from two loop lengths
  (`_slope`). The loop length is a traced argument, so both lengths run one compiled program."""
  runs = {('loop', k): functools.partial(run, k) for k in loop_lengths}
  return _slope(_fastest(runs, repeats), 'loop', loop_lengths)


# Extra one-token drafter calls per iteration in the run that measures c (`step_costs`):
# 16 make the slope a difference of ~10% of the run, not of the ~1% one call is.
EXTRA_CALLS = 16


def _drafter_cost(without, drafting, extra, *, gamma: int, extra_calls: int, per: float):
  """(c, c_fixed) of `step_costs` from the fastest runs of one loop length without the draft,
  with it, and with a draft `extra_calls` longer, over `per` (a run of target steps). c_fixed as
  measured, negative included: a clamp at 0 would bias its noise upward and hide a draft that
  costs less than gamma of its calls. c is a call's cost, >= 0 (the paper's c): a negative slope
  is noise around a drafter that costs nothing, and reads 0."""
  c = max(extra - drafting, 0.0) / extra_calls / per
  return c, (drafting - without) / per - gamma * c


def iteration_seconds(
  target,
  drafter,
  *,
  batch_size: int,
  source_length: int,
  gamma: int,
  cache_len: int = 64,
  loop_lengths: tuple[int, int] = (4, 36),
  repeats: int = 7,
  unroll_draft: bool = False,
) -> float:
  """Seconds of one iteration's model calls inside a jitted loop (gamma drafter calls and a
  (gamma+1)-position target pass, each depending on the last), by the difference of two loop
  lengths as `step_seconds`. Unlike the sum of their bare costs, it includes what the calls cost
  each other: the target's pass evicts the drafter's weights from the CPU caches. `unroll_draft`:
  the draft's scan unrolled, as `speculative_generate(..., unroll_draft=True)` runs it."""
  target, drafter = step_models.as_step_model(target), step_models.as_step_model(drafter)
  run = timed_loops.iteration_loop(
    target, drafter, batch_size=batch_size, source_length=source_length, gamma=gamma,
    cache_len=cache_len, unroll_draft=unroll_draft,
  )  # fmt: skip
  return _per_iteration(run, loop_lengths, repeats)


def step_seconds(
  model,
  *,
  batch_size: int,
  source_length: int,
  num_tokens: int = 1,
  cache_len: int = 64,
  loop_lengths: tuple[int, int] = (4, 36),
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
    loop_lengths: two loop lengths; the cost is the difference of their fastest times per extra
      call.
    repeats: timed runs of each loop length, in turn.
    target: the target, for a drafter that reads the target's encoder output (its cache is built
      from the target's `encode`, as the decode loops build it; the encoder is not timed).
  """
  model = step_models.as_step_model(model)
  target = None if target is None else step_models.as_step_model(target)
  run = timed_loops.step_loop(
    model, batch_size=batch_size, source_length=source_length, num_tokens=num_tokens,
    cache_len=cache_len, target=target,
  )  # fmt: skip
  return _per_iteration(run, loop_lengths, repeats)


def tree_pass_costs(
  target,
  *,
  nodes: int,
  depth: int,
  source_length: int,
  loop_lengths: tuple[int, int] = (4, 36),
  repeats: int = 7,
) -> dict[str, float]:
  """{'chain': a pass of `nodes` positions, 'tree': a pass over a token tree of `nodes` nodes and
  depth <= `depth`}, each in target steps: in-loop seconds at batch 1 (`repeated_steps`,
  `repeated_tree_passes`, timed in turn as `step_seconds`), over the 1-position step's. The tree
  is `trees.best_first_tree` over made-up peaked marginals (`timed_loops.tree_pass_loop`); the
  cache has 2 * nodes + 32 slots, every pass from slot 16. Raises ValueError for nodes < 2."""
  steps, params = model = step_models.as_step_model(target)
  cache_len = 2 * nodes + 32
  cache = timed_loops.model_cache(
    model, None, jnp.full((1, source_length), 5, jnp.int32), cache_len
  )
  position = jnp.array([16], jnp.int32)
  runs = dict(
    chain=functools.partial(
      timed_loops.repeated_steps, steps, params, cache, position, num_tokens=nodes
    ),
    step=functools.partial(
      timed_loops.repeated_steps, steps, params, cache, position, num_tokens=1
    ),
    tree=timed_loops.tree_pass_loop(model, cache, position, nodes=nodes, depth=depth),
  )
  passes = {
    (name, k): functools.partial(run, loop_length=jnp.int32(k))
    for name, run in runs.items()
    for k in loop_lengths
  }
  seconds = _fastest(passes, repeats)
  step = _slope(seconds, 'step', loop_lengths)
  if step <= 0:
    raise RuntimeError(
      'A target step timed at 0 s (the longer loop did not take measurably longer): the target '
      'is too cheap to time here; pass longer `loop_lengths`.'
    )
  return {name: _slope(seconds, name, loop_lengths) / step for name in ('chain', 'tree')}


def _round_costs(loops, seconds, *, loop_lengths, block, gamma, extra_calls) -> dict[str, float]:
  """One round of `step_costs` from its fastest runs, `seconds[name, loop length]`: each loop's
  seconds per call (slopes) and the ratios in target steps."""
  long = loop_lengths[1]
  m = {name: _slope(seconds, name, loop_lengths) for name in loops}
  if m['target_step'] <= 0:
    raise RuntimeError(
      f'A target step timed at 0 s ({long - loop_lengths[0]} extra calls did not take measurably '
      'longer): the target is too cheap to time here; pass longer `loop_lengths`.'
    )
  step_run = seconds['target_step', long]
  if block:  # no call per draft: the one call is the iteration's fixed cost
    m['c'] = 0.0
    m['c_fixed'] = (seconds['iteration', long] - seconds['without_drafter', long]) / step_run
  else:
    m['c'], m['c_fixed'] = _drafter_cost(
      *(seconds[name, long] for name in ('without_drafter', 'iteration', 'extra_calls')),
      gamma=gamma,
      extra_calls=extra_calls,
      per=step_run,
    )
  m['pass_cost'] = seconds['target_pass', long] / step_run
  m['c_alone'] = m['drafter_step'] / m['target_step']
  return m


def _pass_costs(target, tree_nodes, gamma, rows, kw, loop_lengths, rounds, repeats) -> dict:
  """`step_costs` of a drafter that calls no model: the target's step and pass (a chain's of
  gamma + 1 positions or a tree's of `tree_nodes`), the drafter's costs 0 (its on-device work, a
  source match, is not timed)."""
  if tree_nodes is None:
    target_pass = timed_loops.step_loop(target, num_tokens=gamma + 1, **rows)
  else:
    target_pass = timed_loops.tree_loop(target, nodes=tree_nodes, depth=gamma, **rows)
  loops = dict(
    target_step=timed_loops.step_loop(target, batch_size=rows['batch_size'], **kw),
    target_pass=target_pass,
  )
  runs = {
    (name, k): functools.partial(loop, k) for name, loop in loops.items() for k in loop_lengths
  }
  measured = []
  for _ in range(rounds):
    seconds = _fastest(runs, repeats)
    m = {name: _slope(seconds, name, loop_lengths) for name in loops}
    long = loop_lengths[1]
    m['pass_cost'] = seconds['target_pass', long] / seconds['target_step', long]
    measured.append(m)
  costs = {name: float(np.median([m[name] for m in measured])) for name in (*loops, 'pass_cost')}
  return dict(
    costs, drafter_step=0.0, iteration=costs['target_pass'], c_alone=0.0, c=0.0, c_fixed=0.0
  )


def step_costs(
  target,
  drafter,
  *,
  batch_size: int,
  source_length: int,
  gamma: int,
  cache_len: int = 64,
  rounds: int = 3,
  num_drafts: int = 1,
  loop_lengths: tuple[int, int] = (4, 36),
  repeats: int = 7,
  extra_calls: int = EXTRA_CALLS,
  unroll_draft: bool = False,
  tree_nodes: int | None = None,
) -> dict[str, float]:
  """What the walltime formula needs, in seconds and in target steps, all timed in turn.

  Seconds (each in-loop, from two loop lengths as `step_seconds`): `target_step` (T=1),
  `target_pass` (gamma+1 positions), `drafter_step` (the drafter alone) and `iteration` (a whole
  iteration's model calls, `iteration_seconds`). Ratios, in target steps: `pass_cost` (pass /
  target step), `c_alone` (a drafter step alone), and `c` and `c_fixed`, what the drafter adds to
  an iteration: `gamma * c + c_fixed`. `c` is a one-token call as the draft makes it, scanned or
  unrolled (`unroll_draft`) as the loop runs it: the slope of a draft `extra_calls` longer.
  `c_fixed` is the rest, once per iteration, as measured (negative where the draft costs less
  than gamma such calls, e.g. unrolled): the first call feeds two positions (gamma + 1 for a
  drafter that reads the target's states) and, on a CPU, reloads the weights the pass evicted.
  One c per call, (gamma * c + c_fixed) / gamma, would fall with gamma (docs/results.md section
  1). Both come from the iteration compiled without its draft, with it, and with the longer one:
  the same loop length, caches and pass (its input behind an optimization barrier), so dispatch,
  set-up and the pass cancel, and what remains is what the calls cost in the loop, not alone (on
  a TPU or GPU c is c_alone and c_fixed ~0). A block drafter (`block_size`) makes one call per
  iteration whatever gamma: its c is 0 and c_fixed that call as the loop makes it (drafter_step
  and c_alone: the call alone).

  Every loop runs in turn with the others (`repeats` times; the fastest run of each counts).
  `pass_cost`, `c` and `c_fixed` are ratios of the longer runs alone (`loop_lengths[1]`
  iterations each, so dispatch is well under 1% of a run of any model worth timing): runs of like
  length meet a shared machine's load alike, where a short run finds it idle more often than a
  long one. `c_alone` is a ratio of slopes: a drafter step alone is too cheap to be timed without
  cancelling dispatch. `rounds` repeats the whole measurement; each value is the median over the
  rounds. With `num_drafts` K > 1 (`speculative_generate(..., num_drafts=K)`, which runs each row
  as K rows of both models) the pass, the drafter and the iteration are measured at K x
  batch_size rows and the target step at batch_size rows.

  `tree_nodes` N (a token tree of depth gamma, `speculative_generate(..., tree=)`): `target_pass`
  and `pass_cost` are a pass over a tree of N nodes (`repeated_tree_passes`, a best-first tree)
  instead of gamma + 1 positions; c and c_fixed stay the chain's drafter at gamma (a block
  drafter's one call is the tree's; a top-k tree's expansions over top_k rows per depth and the
  tree's build are not in them).
  """
  target, drafter = step_models.as_step_model(target), step_models.as_step_model(drafter)
  kw = dict(source_length=source_length, cache_len=cache_len)
  rows = dict(kw, batch_size=batch_size * num_drafts)
  caps = step_models.capabilities(drafter[0])
  block = caps.block_size
  if not caps.draft_calls:  # no model to time (a source lookup): c, c_fixed, c_alone are 0
    return _pass_costs(target, tree_nodes, gamma, rows, kw, loop_lengths, rounds, repeats)
  if tree_nodes is None:
    target_pass = timed_loops.step_loop(target, num_tokens=gamma + 1, **rows)
  elif num_drafts != 1:
    raise ValueError(f'A token tree is one per row: num_drafts must be 1, got {num_drafts}.')
  else:
    target_pass = timed_loops.tree_loop(target, nodes=tree_nodes, depth=gamma, **rows)
  loops = dict(
    target_step=timed_loops.step_loop(target, batch_size=batch_size, **kw),
    target_pass=target_pass,
    # A block drafter's step is its one call of the loop: gamma + 1 kept positions, gamma drafts.
    drafter_step=timed_loops.step_loop(
      drafter, target=target, num_tokens=gamma + 1 if block else 1, **rows
    ),
    iteration=timed_loops.iteration_loop(
      target, drafter, gamma=gamma, unroll_draft=unroll_draft, **rows
    ),
  )
  long = loop_lengths[1]
  runs = {
    (name, k): functools.partial(loop, k) for name, loop in loops.items() for k in loop_lengths
  }
  runs['without_drafter', long] = functools.partial(loops['iteration'], long, 0)
  if not block:
    runs['extra_calls', long] = functools.partial(loops['iteration'], long, gamma + extra_calls)
  round_costs = functools.partial(
    _round_costs,
    loops,
    loop_lengths=loop_lengths,
    block=block,
    gamma=gamma,
    extra_calls=extra_calls,
  )
  measured = [round_costs(_fastest(runs, repeats)) for _ in range(rounds)]
  names = (*loops, 'c_alone', 'c', 'c_fixed', 'pass_cost')
  return {name: float(np.median([m[name] for m in measured])) for name in names}
