"""`python -m benchmarks.paper_scale --compile_for=tpu-v4|tpu-v5e`: paper_scale's tables 1, 2 and
4 from XLA:TPU's cost model, on any host (nothing runs; the programs compile for one TPU chip of
`machines.compile_only_devices`). Every number is a compiler's estimate (`tpu_costs`), not a timing.

The programs are the timed path's (`timing.step_costs`, docs/method.md section 8), compiled
instead of timed, each a loop over a traced number of iterations whose body's estimated cycles are
one iteration (the loop's own condition included; work XLA hoists out of the loop, e.g. weights
copied to another layout, is reported apart as `outside`, paid once a decode call):

- target step / pass: one `t5.decode` of 1 / gamma + 1 positions a row (`call_cycles`); pass cost
  = pass / step.
- drafter: `c_alone` = its one-position call / the target step. `c` and `c_fixed` from one
  iteration program (`_iterations`: the pending token from the last pass's argmax, the draft as
  `decode_steps.draft` makes it, greedy, `timing.EXTRA_CALLS` more one-token drafter calls as its
  scan makes them, in a loop of static length, then the (gamma+1)-position target pass):
  c = the extra calls' loop / EXTRA_CALLS / step (the timed path's slope), c_fixed = the draft's
  ops (scopes 'drafter' and 'sampling', outside the extra calls) / step - gamma c, not clamped.
  So gamma c + c_fixed is what the draft adds to an iteration, as timed. The timed path takes
  the draft as the difference of iterations with and without it; compiled, that difference also
  measures how differently XLA:TPU compiles the target pass in the two programs (for TPU v5e at
  gamma 7 the iteration with the draft came out 1.6% of a step cheaper than without it), so the
  draft's own ops are read instead.
- bound: a call's bytes (`memory_model.call_cost`, as table 1 of the timed path) over the bytes a
  cycle of the compiler's fastest HBM read (`tpu_costs.calibrate`: an 8-row matmul streaming a
  256 MiB weight), so 'of bound' is how near XLA:TPU's own model puts the call to reading its
  bytes at that rate.
- speedup: the walltime formula, E[tokens] / (gamma c + c_fixed + pass cost) (`speedup`), at the
  paper's alpha (T5-small under T5-XXL on EnDe: 0.75 greedy, 0.62 at T=1), beside the paper's
  measured Table 2 (Leviathan et al. 2023: 3.4x and 2.6x at gamma 7, on TPU-v4) for T5-small.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from benchmarks import memory_model, tpu_costs
from specdec_jax import analysis, decode, decode_steps, machines, sharding
from specdec_jax.measure import tables, timing
from specdec_jax.models import t5

# Leviathan et al. 2023, Table 2, T5-XXL on EnDe with the T5-small drafter on TPU-v4:
# {temperature: (alpha, gamma, measured walltime improvement)}; docs/results.md section 1.
PAPER_TABLE_2 = {0: (0.75, 7, 3.4), 1: (0.62, 7, 2.6)}
PAPER_DRAFTER = 't5-small'


@dataclasses.dataclass(frozen=True)
class LoopCost:
  """One compiled loop: estimated cycles of one iteration (`per_iteration`), of what runs once
  outside it (`outside`), and XLA:TPU's temporaries (bytes)."""

  per_iteration: int
  outside: int
  temp_bytes: int


def abstract_model(config: t5.T5Config, device: jax.Device, dtype: str) -> t5.T5Model:
  """`config` in `dtype` with `jax.ShapeDtypeStruct` params on `device` (nothing allocated)."""
  config = dataclasses.replace(config, dtype=dtype)
  on = jax.sharding.SingleDeviceSharding(device)
  shapes = jax.eval_shape(lambda: t5.init_params(jax.random.key(0), config))
  params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype, sharding=on), shapes)
  return t5.T5Model(config=config, params=params)


def abstract_cache(model: t5.T5Model, device, *, batch: int, source_length: int, cache_len: int):
  """The shapes of `model`'s decoder cache over an all-real source (a drafter without an encoder
  over the target's encoder output, of width `encoder_dim`), on `device`."""
  config = model.config
  width = config.encoder_dim or config.d_model
  encoded = jax.ShapeDtypeStruct((batch, source_length, width), config.dtype)
  mask = jax.ShapeDtypeStruct((batch, source_length), jnp.bool_)
  init = functools.partial(t5.init_cache, config=config, max_decode_len=cache_len)
  on = jax.sharding.SingleDeviceSharding(device)
  place = lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on)
  return jax.tree.map(place, jax.eval_shape(init, model.params, encoded, mask))


def _scalar(device, dtype=jnp.int32, shape=()):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def _calls(steps, params, cache, position, calls, *, num_tokens):
  """`calls` (traced) model calls of `num_tokens` positions a row from `position`, as
  `timing`'s step loop makes them."""
  batch = position.shape[0]

  def body(i, carry):
    cache, _ = carry
    tokens = jnp.full((batch, num_tokens), 2, jnp.int32) + i % 7
    logits, cache = steps.step(params, tokens, cache.replace(end_index=position))
    return cache, logits

  logits = jnp.zeros((batch, num_tokens, steps.vocab_size), jnp.float32)
  return jax.lax.fori_loop(0, calls, body, (cache, logits))[1]


def _iterations(
  target_params, drafter_params, target_cache, drafter_cache, position, calls, *,
  target_steps, drafter_steps, gamma, cache_len, extra_calls,
):  # fmt: skip
  """`calls` (traced) iterations of the decode loop's model calls: the pending token from the
  last pass's argmax, the draft (`decode_steps.draft`, greedy; none when `drafter_steps` is None:
  the pass scores fixed tokens), `extra_calls` (static) one-token drafter calls as the draft's
  scan makes them, and the (gamma+1)-position target pass."""
  batch = position.shape[0]

  def body(i, carry):
    target_cache, drafter_cache, logits = carry
    pending = (jnp.argmax(logits[:, -1], -1).astype(jnp.int32) + i) % 7 + 2
    seq = jnp.broadcast_to(pending[:, None], (batch, cache_len))
    if drafter_steps is None:
      drafts = seq[:, :gamma]
    else:
      drafts, _, drafter_cache, _ = decode_steps.draft(
        drafter_steps, drafter_params, drafter_cache, seq, position, jax.random.key(0),
        gamma=gamma, sampling=None, greedy=True,
      )  # fmt: skip

    def extra_call(_, carry):
      token, drafter_cache = carry
      cache = drafter_cache.replace(end_index=position + gamma)
      logits, _, drafter_cache = decode_steps.drafter_call(
        drafter_steps, drafter_params, token[:, None], None, cache
      )
      return jnp.argmax(logits[:, 0], -1).astype(jnp.int32), drafter_cache

    last = drafts[:, -1]
    if extra_calls:
      last, drafter_cache = jax.lax.fori_loop(0, extra_calls, extra_call, (last, drafter_cache))
    tokens = jnp.concatenate([pending[:, None], drafts[:, :-1], last[:, None]], axis=1)
    logits, _, target_cache = decode_steps.target_pass(
      target_steps, target_params, tokens, target_cache.replace(end_index=position),
      with_states=False,
    )  # fmt: skip
    return target_cache, drafter_cache, logits

  logits = jnp.zeros((batch, gamma + 1, target_steps.vocab_size), jnp.float32)
  return jax.lax.fori_loop(0, calls, body, (target_cache, drafter_cache, logits))[2]


def loop_cost(compiled: tpu_costs.Compiled) -> LoopCost:
  """`LoopCost` of a program holding one loop of unknown trip count at its top level."""
  program = compiled.program
  loops = [op for op in program.loops() if op.trip_count is None]
  if len(loops) != 1:
    raise ValueError(f'Expected one loop of traced length, found {len(loops)}.')
  (loop,) = loops
  body, condition = loop.runs
  outside = sum(program.op_cycles(op) for op in program.computations[program.entry] if op != loop)
  return LoopCost(program.cycles(body) + program.cycles(condition), outside, compiled.temp_bytes)


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

  def compile(self, fn, *args) -> tpu_costs.Compiled:
    lowered = jax.jit(fn).lower(*args)
    kw = dict(options=dict(self.options), cache_dir=self.cache_dir)
    return tpu_costs.compile_lowered(lowered, tag=self.machine, **kw)

  def position(self):
    """Each row's first position: traced, int32[B]."""
    return _scalar(self.device, shape=(self.batch,))


def call_cycles(setup: Setup, model: t5.T5Model, *, positions: int, cache_len: int) -> LoopCost:
  """`LoopCost` of `model`'s calls of `positions` positions a row (`_calls`)."""
  cache = abstract_cache(model, setup.device, batch=setup.batch, source_length=setup.source_length,
                         cache_len=cache_len)  # fmt: skip
  fn = functools.partial(_calls, model.steps, num_tokens=positions)
  return loop_cost(setup.compile(fn, model.params, cache, setup.position(), _scalar(setup.device)))


def iteration_program(setup: Setup, target, drafter, *, gamma: int, cache_len: int, extra_calls=0):
  """`_iterations` compiled: the decode loop's model calls (drafter None: the pass alone on fixed
  drafts), with `extra_calls` more drafter calls an iteration."""
  shape = dict(batch=setup.batch, source_length=setup.source_length, cache_len=cache_len)
  drafter_cache = None if drafter is None else abstract_cache(drafter, setup.device, **shape)
  fn = functools.partial(
    _iterations,
    target_steps=target.steps,
    drafter_steps=None if drafter is None else drafter.steps,
    gamma=gamma,
    cache_len=cache_len,
    extra_calls=extra_calls,
  )
  args = (
    target.params,
    None if drafter is None else drafter.params,
    abstract_cache(target, setup.device, **shape),
    drafter_cache,
    setup.position(),
    _scalar(setup.device),
  )
  return setup.compile(fn, *args)


@dataclasses.dataclass(frozen=True)
class DraftCost:
  """What the draft costs in one compiled iteration (`_iterations` with extra calls), in cycles:
  `iteration` (the draft and the pass, without the extra calls), `draft` (its ops of the
  'drafter' and 'sampling' scopes: the gamma calls and their argmaxes) and `per_call` (one extra
  one-token call and its argmax: the extra calls' loop over their count)."""

  iteration: int
  draft: int
  per_call: float


def draft_cost(compiled: tpu_costs.Compiled, *, gamma: int, extra_calls: int) -> DraftCost:
  """`DraftCost` of an iteration program compiled with `extra_calls` extra drafter calls."""
  program = compiled.program
  (loop,) = [op for op in program.loops() if op.trip_count is None]
  body, condition = loop.runs
  extra = [op for op in program.loops(body) if op.trip_count == extra_calls]
  if len(extra) != 1 or gamma - 1 == extra_calls:
    raise ValueError(
      f'Expected one loop of {extra_calls} extra calls in the iteration (gamma {gamma}), found '
      f'{[op.trip_count for op in program.loops(body)]}.'
    )
  (extra,) = extra
  extra_cycles = program.op_cycles(extra)
  draft = sum(
    sub.cycles * times
    for op in program.computations[body]
    if op is not extra
    for sub, times in program.flat_op(op)
    if tpu_costs.scope(sub) in ('drafter', 'sampling')
  )
  iteration = program.cycles(body) + program.cycles(condition) - extra_cycles
  return DraftCost(iteration, draft, extra_cycles / extra_calls)


def drafter_cost(step: float, draft: float, per_call: float, *, gamma: int):
  """(c, c_fixed) in target steps from the cycles of a target step, of the draft in an iteration
  and of one extra call: c = per_call / step, c_fixed = draft / step - gamma c, what the draft adds
  beyond gamma calls as its scan makes them (the first call feeds two positions). Not clamped: a
  first call fused with its neighbours can cost less than a looped one."""
  c = per_call / step
  return c, draft / step - gamma * c


def call_bytes(model: t5.T5Model, *, batch: int, positions: int, cache_len: int, source_length):
  """HBM bytes one decoder call reads (`memory_model.call_cost` on one device)."""
  mesh = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
  abstract = memory_model.abstract_model(
    model.config, mesh, param_dtype=model.config.dtype, shard=False
  )
  return memory_model.call_cost(
    abstract, mesh, batch=batch, positions=positions, buffer_len=cache_len,
    source_length=source_length,
  ).bytes  # fmt: skip


def tables_from_compiler(
  setup: Setup, target_config, drafter_configs: dict, *, gammas, max_new_tokens: int, log=print
) -> dict:
  """Tables 1, 2 and 4 of paper_scale as rows (dicts), from XLA:TPU's cost model, and the
  calibration: {'calibration', 'target', 'drafters', 'speedup'}. `log` gets a line a program."""
  cache_len = lambda g: decode.buffer_length(max_new_tokens, g)
  calibration = tpu_costs.calibrate(
    setup.device, options=dict(setup.options), cache_dir=setup.cache_dir
  )
  target = abstract_model(target_config, setup.device, setup.dtype)
  drafters = {n: abstract_model(c, setup.device, setup.dtype) for n, c in drafter_configs.items()}
  shape = dict(batch=setup.batch, source_length=setup.source_length)

  def bound(model, positions, g):
    nbytes = call_bytes(model, positions=positions, cache_len=cache_len(g), **shape)
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
      alone = call_cycles(setup, drafter, positions=1, cache_len=cache_len(g))
      extra = timing.EXTRA_CALLS
      iteration = iteration_program(
        setup, target, drafter, gamma=g, cache_len=cache_len(g), extra_calls=extra
      )
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


def speedup(alpha: float, gamma: int, *, c: float, c_fixed: float, pass_cost: float) -> float:
  """The walltime formula, E[tokens] / (gamma c + c_fixed + pass cost)
  (`analysis.walltime_improvement_measured`), with the draft's gamma c + c_fixed passed as one
  per-call cost: a compiled draft can cost less than gamma looped calls (c_fixed < 0), which
  `analysis` does not take."""
  draft = gamma * c + c_fixed
  if draft < 0:
    raise ValueError(f'The draft costs {draft} target steps: gamma c + c_fixed must be >= 0.')
  return float(analysis.walltime_improvement_measured(alpha, gamma, draft / gamma, pass_cost))


def speedup_rows(costs: dict, drafters: list[str], gammas: list[int]) -> list[dict]:
  """Table 4: the formula at each gamma's c, c_fixed and pass cost, at the paper's alpha, the
  best gamma, and beside it the paper's measured speedup for its drafter."""
  rows = []
  label, *alphas = memory_model.ALPHAS[0]
  for name in drafters:
    for temperature, alpha in enumerate(alphas):
      by_gamma = {g: speedup(alpha, g, **costs[name, g]) for g in gammas}
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
          ratio=None if paper is None else by_gamma[best] / paper,
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
  _print('1. target calls (Mcycles a call; bound: bytes read / matmul rate)', result['target'],
         TARGET_COLUMNS)  # fmt: skip
  _print('2. drafters (Mcycles; c in target steps)', result['drafters'], DRAFTER_COLUMNS)
  gamma_columns = tuple(tables.Column(f'gamma_{g}', f'gamma {g}', '.2f', 7, suffix='x')
                        for g in gammas)  # fmt: skip
  columns = SPEEDUP_COLUMNS[:3] + gamma_columns + SPEEDUP_COLUMNS[3:]
  _print(
    "4. speedup by the formula at the compiler's c, c_fixed and pass cost, paper's alpha; paper: "
    'Leviathan et al. Table 2 (T5-XXL + T5-small, TPU-v4, gamma 7), measured',
    result['speedup'],
    columns,
  )


def _print(title, rows, columns) -> None:
  first = columns[0]
  width = max([first.width] + [len(str(row[first.name])) for row in rows])
  columns = (dataclasses.replace(first, width=width),) + tuple(columns[1:])
  print(f'\n{title}\n{tables.format_table(rows, columns)}', flush=True)


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
DRAFTER_COLUMNS = (
  _Col('drafter', align='<', width=10),
  _Col('params', 'params M', '.1f', 9),
  _Col('gamma', fmt='d', width=5),
  _Col('step', 'step Mcycles', '.4f'),
  _Col('c_alone', 'c alone', '.4f', 8),
  _Col('c', fmt='.4f', width=7),
  _Col('c_fixed', 'c fixed', '.4f', 8),
  _Col('c_bound', 'c at bound', '.4f'),
  _Col('iteration', 'iteration Mcycles', '.3f'),
)
SPEEDUP_COLUMNS = (
  _Col('drafter', align='<', width=10),
  _Col('temp', 'T', 'd', 2),
  _Col('alpha', fmt='.2f', width=5),
  _Col('best_gamma', 'best gamma', 'd'),
  _Col('best', 'best', '.2f', 6, suffix='x'),
  _Col('paper', 'paper', '.1f', 6, suffix='x'),
  _Col('ratio', 'best / paper', '.2f'),
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
