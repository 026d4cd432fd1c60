"""`python -m benchmarks.paper_scale --compile_for=tpu-v4|tpu-v5e`: paper_scale's tables 1, 2 and
4 from XLA:TPU's cost model, on any host (nothing runs; the programs compile for one TPU chip of
`machines.compile_only_devices`). Every number is a compiler's estimate (`tpu_costs`), not a timing.

The programs are the timed path's own (`timed_loops.repeated_steps`, `timed_loops.repeated_iterations`,
which `timing.step_costs` times; docs/method.md section 8), compiled instead of timed, each a loop
over a traced number of iterations whose body's estimated cycles are one iteration (the loop's
own condition included; work XLA hoists out of the loop, e.g. weights copied to another layout,
is reported apart as `outside`, paid once a decode call):

- target step / pass: `timed_loops.repeated_steps` of 1 / gamma + 1 positions a row (`call_cycles`);
  pass cost = pass / step.
- drafter: `c_alone` = its one-position call / the target step. `c` and `c_fixed` from the
  iteration program that measures the timed path's c (`timed_loops.repeated_iterations` with a draft
  of gamma + `timing.EXTRA_CALLS` calls, its drafts behind timing's optimization barrier): c = one
  iteration of the draft's scan / step (the timed path's slope over the extra calls), c_fixed =
  the draft's ops (scopes 'drafter' and 'sampling') at gamma calls / step - gamma c, not clamped.
  So gamma c + c_fixed is what the draft adds to an iteration, as timed. The timed path takes the
  draft as the difference of iterations with and without it; compiled, the draft's own ops are
  read, from one program.
- bound: a call's bytes (`memory_model.call_cost`, as table 1 of the timed path) over the bytes a
  cycle of the compiler's fastest HBM read (`tpu_costs.calibrate`: an 8-row matmul streaming a
  256 MiB weight), so 'of bound' is how near XLA:TPU's own model puts the call to reading its
  bytes at that rate.
- speedup: the walltime formula, E[tokens] / (gamma c + c_fixed + pass cost)
  (`analysis.walltime_improvement_measured`), at the
  paper's alpha (T5-small under T5-XXL on EnDe: 0.75 greedy, 0.62 at T=1), beside the paper's
  measured Table 2 (Leviathan et al. 2023: 3.4x and 2.6x at gamma 7, on TPU-v4) for T5-small.
"""

import dataclasses

import jax
import jax.numpy as jnp

from benchmarks import machines, memory_model, synthetic, tpu_costs
from specdec_jax import analysis, decode, step_models
from specdec_jax.measure import tables, timed_loops, timing
from specdec_jax.models import t5

# Leviathan et al. 2023, Table 2, T5-XXL on EnDe with the T5-small drafter on TPU-v4:
# {temperature: (alpha, gamma, measured walltime improvement)}; docs/results.md section 1.
PAPER_TABLE_2 = {0: (0.75, 7, 3.4), 1: (0.62, 7, 2.6)}
PAPER_DRAFTER = 't5-small'


@dataclasses.dataclass(frozen=True)
class LoopCost:
  """One compiled loop: estimated cycles of one iteration (`per_iteration`), of what runs once
  outside it (`outside`), XLA:TPU's temporaries (bytes), and the copies one iteration runs
  (`copies`: layout copies of its body and condition, inner loops counted per trip; a cache
  written in a layout its readers do not share shows here, docs/performance.md)."""

  per_iteration: int
  outside: int
  temp_bytes: int
  copies: int = 0


def _scalar(device, dtype=jnp.int32, shape=()):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def loop_cost(compiled: tpu_costs.Compiled) -> LoopCost:
  """`LoopCost` of a program holding one loop of unknown trip count at its top level."""
  program = compiled.program
  loop = program.traced_loop()
  body, condition = loop.runs
  outside = sum(program.op_cycles(op) for op in program.computations[program.entry] if op != loop)
  copies = sum(
    times for c in (body, condition) for op, times in program.flat(c) if op.opcode == 'copy'
  )
  per_iteration = program.cycles(body) + program.cycles(condition)
  return LoopCost(per_iteration, outside, compiled.temp_bytes, copies)


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every program of one run shares: the device, shapes and compile settings."""

  device: jax.Device
  machine: str
  dtype: str = 'bfloat16'
  batch: int = 1
  source_length: int = 64
  options: tuple = ()
  cache_dir: str | None = None

  def compile(self, program, *args, **static) -> tpu_costs.Compiled:
    """`program` (a jitted function) lowered for `args` and its static arguments, compiled."""
    lowered = program.lower(*args, **static)
    kw = dict(options=dict(self.options), cache_dir=self.cache_dir)
    return tpu_costs.compile_lowered(lowered, tag=self.machine, **kw)

  def position(self):
    """Each row's first position: traced, int32[B]."""
    return _scalar(self.device, shape=(self.batch,))


def call_cycles(setup: Setup, model: t5.T5Model, *, positions: int, cache_len: int) -> LoopCost:
  """`LoopCost` of `model`'s calls of `positions` positions a row (`timed_loops.repeated_steps`)."""
  cache = synthetic.abstract_cache(model, setup.device, batch=setup.batch,
                                   source_length=setup.source_length, cache_len=cache_len)  # fmt: skip
  compiled = setup.compile(
    timed_loops.repeated_steps, model.steps, model.params, cache, setup.position(),
    num_tokens=positions, loop_length=_scalar(setup.device),
  )  # fmt: skip
  return loop_cost(compiled)


def iteration_program(setup: Setup, target, drafter, *, gamma: int, cache_len: int, draft_length):
  """`timed_loops.repeated_iterations` compiled: the decode loop's model calls, with a draft of
  `draft_length` drafter calls (0: the pass alone on fixed drafts; gamma; or more, its later
  calls extra ones of the same scan), the draft's scan not unrolled."""
  shape = dict(batch=setup.batch, source_length=setup.source_length, cache_len=cache_len)
  return setup.compile(
    timed_loops.repeated_iterations,
    target.steps,
    target.params,
    drafter.steps,
    drafter.params,
    synthetic.abstract_cache(target, setup.device, **shape),
    synthetic.abstract_cache(drafter, setup.device, **shape),
    setup.position(),
    gamma=gamma,
    draft_length=draft_length,
    cache_len=cache_len,
    unroll_draft=False,
    loop_length=_scalar(setup.device),
  )


@dataclasses.dataclass(frozen=True)
class DraftCost:
  """What the draft costs in one compiled iteration, in cycles, as if it drafted gamma tokens:
  `iteration` (the draft and the pass), `draft` (its ops of the 'drafter' and 'sampling' scopes:
  the gamma calls and their argmaxes) and `per_call` (one iteration of the draft's scan: a
  one-token call as the scan makes it, its argmax and the scan's own work)."""

  iteration: int
  draft: int
  per_call: float


def draft_cost(compiled: tpu_costs.Compiled, *, gamma: int, extra_calls: int) -> DraftCost:
  """`DraftCost` of an `iteration_program` compiled with a draft of gamma + `extra_calls` calls:
  its scan runs gamma + extra_calls - 1 times (the first call is outside it), and the extra calls'
  iterations are taken out of the iteration and of the draft."""
  program = compiled.program
  body, condition = program.traced_loop().runs
  trips = gamma + extra_calls - 1
  scan = [op for op in program.loops(body) if op.trip_count == trips]
  if len(scan) != 1 or not extra_calls:
    raise ValueError(
      f'Expected one draft scan of {trips} iterations in the iteration (gamma {gamma}, '
      f'{extra_calls} extra calls), found {[op.trip_count for op in program.loops(body)]}.'
    )
  scan_body, scan_condition = scan[0].runs
  per_call = program.cycles(scan_body) + program.cycles(scan_condition)
  drafting = lambda ops: sum(
    sub.cycles * times for sub, times in ops if tpu_costs.scope(sub) in ('drafter', 'sampling')
  )
  draft_per_call = drafting(program.flat(scan_body)) + drafting(program.flat(scan_condition))
  draft = drafting(program.flat(body)) - extra_calls * draft_per_call
  iteration = program.cycles(body) + program.cycles(condition) - extra_calls * per_call
  return DraftCost(iteration, draft, per_call)


def block_draft_cost(compiled: tpu_costs.Compiled) -> DraftCost:
  """`DraftCost` of an `iteration_program` of a block drafter: its one call and the draws (no
  scan; `per_call` 0, the call is the iteration's fixed cost)."""
  program = compiled.program
  body, condition = program.traced_loop().runs
  drafting = lambda ops: sum(
    sub.cycles * times for sub, times in ops if tpu_costs.scope(sub) in ('drafter', 'sampling')
  )
  draft = drafting(program.flat(body)) + drafting(program.flat(condition))
  return DraftCost(program.cycles(body) + program.cycles(condition), draft, 0.0)


def drafter_cost(step: float, draft: float, per_call: float, *, gamma: int):
  """(c, c_fixed) in target steps from the cycles of a target step, of the draft in an iteration
  and of one extra call: c = per_call / step, c_fixed = draft / step - gamma c, what the draft adds
  beyond gamma calls as its scan makes them (the first call feeds two positions). Not clamped: a
  first call fused with its neighbours can cost less than a looped one."""
  c = per_call / step
  return c, draft / step - gamma * c


def tables_from_compiler(
  setup: Setup, target_config, drafter_configs: dict, *, gammas, max_new_tokens: int, log=print
) -> dict:
  """Tables 1, 2 and 4 of paper_scale as rows (dicts), from XLA:TPU's cost model, and the
  calibration: {'calibration', 'target', 'drafters', 'speedup'}. `log` gets a line a program."""
  cache_len = lambda g: decode.buffer_length(max_new_tokens, g)
  calibration = tpu_costs.calibrate(
    setup.device, options=dict(setup.options), cache_dir=setup.cache_dir
  )
  abstract = lambda c: synthetic.abstract_model(
    dataclasses.replace(c, dtype=setup.dtype), setup.device
  )
  target = abstract(target_config)
  drafters = {n: abstract(c) for n, c in drafter_configs.items()}
  shape = dict(batch=setup.batch, source_length=setup.source_length)

  def bound(model, positions, g):
    nbytes = memory_model.call_bytes(
      model.config, positions=positions, cache_len=cache_len(g), **shape
    )
    return nbytes, nbytes / calibration.matmul

  step = call_cycles(setup, target, positions=1, cache_len=cache_len(0))
  log(f'target step: {step.per_iteration:,} cycles')
  nbytes, bound_cycles = bound(target, 1, 0)
  rows = [_target_row('step', 1, step, step, nbytes, bound_cycles)]
  passes = {}
  for g in gammas:
    passes[g] = call_cycles(setup, target, positions=g + 1, cache_len=cache_len(g))
    log(f'target pass, gamma {g}: {passes[g].per_iteration:,} cycles')
    rows.append(_target_row(f'pass-{g + 1}', g + 1, passes[g], step, *bound(target, g + 1, g)))
  target_rows = rows

  costs, rows = {}, []
  step_bytes = bound(target, 1, 0)[0]
  for g in gammas:
    for name, drafter in drafters.items():
      # A block drafter's call (`block_size`): gamma + 1 kept positions and gamma drafts, once an
      # iteration, so c is 0 and c_fixed the call (as `timing.step_costs` measures it).
      block = step_models.capabilities(drafter.steps).block_size
      alone = call_cycles(setup, drafter, positions=g + 1 if block else 1, cache_len=cache_len(g))
      extra = 0 if block else timing.EXTRA_CALLS
      iteration = iteration_program(
        setup, target, drafter, gamma=g, cache_len=cache_len(g), draft_length=g + extra
      )
      if block:
        cost = block_draft_cost(iteration)
        c, c_fixed = 0.0, cost.draft / step.per_iteration
      else:
        cost = draft_cost(iteration, gamma=g, extra_calls=extra)
        c, c_fixed = drafter_cost(step.per_iteration, cost.draft, cost.per_call, gamma=g)
      costs[name, g] = dict(
        c=c, c_fixed=c_fixed, pass_cost=passes[g].per_iteration / step.per_iteration
      )
      log(f'{name}, gamma {g}: c {c:.4f}, c_fixed {c_fixed:.4f}')
      rows.append(
        dict(
          drafter=name,
          params=t5.param_count(drafter.params) / 1e6,
          gamma=g,
          step=alone.per_iteration / 1e6,
          c_alone=alone.per_iteration / step.per_iteration,
          c=c,
          c_fixed=c_fixed,
          c_bound=bound(drafter, 1, g)[0] / step_bytes,
          iteration=cost.iteration / 1e6,
        )
      )
  return dict(
    calibration=calibration,
    target=target_rows,
    drafters=rows,
    speedup=speedup_rows(costs, list(drafters), gammas),
  )


def _target_row(call, positions, cost: LoopCost, step: LoopCost, nbytes, bound_cycles) -> dict:
  return dict(
    call=call,
    positions=positions,
    mcycles=cost.per_iteration / 1e6,
    pass_cost=cost.per_iteration / step.per_iteration,
    mbytes=nbytes / 1e6,
    bound=bound_cycles / 1e6,
    of_bound=100 * bound_cycles / cost.per_iteration,
    outside=cost.outside / 1e6,
    temp=cost.temp_bytes / machines.GiB,
  )


def speedup_rows(costs: dict, drafters: list[str], gammas: list[int]) -> list[dict]:
  """Table 4: the formula at each gamma's c, c_fixed and pass cost, at the paper's alpha, the
  best gamma, and beside it the paper's measured speedup for its drafter."""
  rows = []
  label, *alphas = memory_model.ALPHAS[0]
  for name in drafters:
    for temperature, alpha in enumerate(alphas):
      by_gamma = {
        g: float(
          analysis.walltime_improvement_measured(
            alpha, g, costs[name, g]['c'], costs[name, g]['pass_cost'], costs[name, g]['c_fixed']
          )
        )
        for g in gammas
      }
      best = max(by_gamma, key=by_gamma.get)
      paper = PAPER_TABLE_2[temperature][2] if name == PAPER_DRAFTER else None
      rows.append(
        dict(
          drafter=name,
          temp=temperature,
          alpha=alpha,
          **{f'gamma_{g}': s for g, s in by_gamma.items()},
          best_gamma=best,
          best=by_gamma[best],
          paper=paper,
        )
      )
  return rows


def print_tables(result: dict, *, header: str, gammas) -> None:
  """The three tables, under `header`, with the calibration line."""
  cal = result['calibration']
  print(header)
  print(
    'XLA:TPU cost model (estimated cycles of compiled programs; nothing ran: estimates, not '
    f'timings). Calibration: x*2 stream {cal.stream:.0f} bytes/cycle moved; 8-row matmul '
    f'{cal.matmul:.0f} weight bytes/cycle (the bound below); 1-row matmul (multiply+reduce) '
    f'{cal.gemv:.0f}.',
    flush=True,
  )
  tables.print_table('1. target calls (Mcycles a call; bound: bytes read / matmul rate)', result['target'],
         TARGET_COLUMNS)  # fmt: skip
  tables.print_table(
    '2. drafters (Mcycles; c in target steps)', result['drafters'], DRAFTER_COLUMNS
  )
  gamma_columns = tuple(tables.Column(f'gamma_{g}', f'gamma {g}', '.2f', 7, suffix='x')
                        for g in gammas)  # fmt: skip
  columns = SPEEDUP_COLUMNS[:3] + gamma_columns + SPEEDUP_COLUMNS[3:]
  tables.print_table(
    "4. speedup by the formula at the compiler's c, c_fixed and pass cost, paper's alpha; paper: "
    'Leviathan et al. Table 2 (T5-XXL + T5-small, TPU-v4, gamma 7), measured',
    result['speedup'],
    columns,
  )


_Col = tables.Column
TARGET_COLUMNS = (
  _Col('call', align='<', width=10),
  _Col('positions', fmt='d', width=9),
  _Col('mcycles', 'Mcycles', '.3f', 9),
  _Col('pass_cost', 'pass cost', '.3f'),
  _Col('mbytes', 'MB read', '.1f', 10),
  _Col('bound', 'bound Mcycles', '.3f'),
  _Col('of_bound', 'of bound', '.0f', 8, suffix='%'),
  _Col('outside', 'outside Mcycles', '.3f'),
  _Col('temp', 'temp GiB', '.2f', 8),
)


def drafter_columns(unit: str, cost: str, time: str) -> tuple:
  """Table 2's columns (paper_scale's timed, and these compiled): a drafter step and an
  iteration in `unit` printed as `time`, its costs in target steps as `cost`."""
  return (
    _Col('drafter', align='<', width=14),
    _Col('params', 'params M', '.1f', 9),
    _Col('gamma', fmt='d', width=5),
    _Col('step', f'step {unit}', time),
    _Col('c_alone', 'c alone', cost, 8),
    _Col('c', fmt=cost, width=7),
    _Col('c_fixed', 'c fixed', cost, 8),
    _Col('c_bound', 'c at bound', cost),
    _Col('iteration', f'iteration {unit}', time),
  )


DRAFTER_COLUMNS = drafter_columns('Mcycles', '.4f', '.4f')
SPEEDUP_COLUMNS = (
  _Col('drafter', align='<', width=10),
  _Col('temp', 'T', 'd', 2),
  _Col('alpha', fmt='.2f', width=5),
  _Col('best_gamma', 'best gamma', 'd'),
  _Col('best', 'best', '.2f', 6, suffix='x'),
  _Col('paper', 'paper', '.1f', 6, suffix='x'),
)


def run(machine: str, target_config, drafter_configs: dict, *, gammas, max_new_tokens, **setup):
  """Prints the tables for one chip of `machine` ('tpu-v4', 'tpu-v5e'); `setup`: `Setup`'s
  fields (dtype, batch, source_length, options, cache_dir)."""
  device = machines.compile_only_devices(machine)[0]
  kw = dict(setup)
  kw['options'] = tuple(sorted(dict(kw.get('options') or {}).items()))
  s = Setup(device=device, machine=machine, **kw)
  header = (
    f'compiled for: {machine} (one {device.device_kind} chip, compile-only), {tpu_costs.versions()}; '
    f'{s.dtype}, batch {s.batch}, source {s.source_length}, {max_new_tokens} new tokens; '
    f'compiler options {dict(s.options) or "default"}'
  )
  result = tables_from_compiler(
    s, target_config, drafter_configs, gammas=gammas, max_new_tokens=max_new_tokens,
    log=lambda line: print(f'  {line}', flush=True),
  )  # fmt: skip
  print_tables(result, header=header, gammas=gammas)
  return result
