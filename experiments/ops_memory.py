r"""Arithmetic operations and memory reads per emitted token (Leviathan et al. 2022, §3.4, Thm 3.11).

  python -m experiments.ops_memory --config=experiments/configs/ops_memory.py
  python -m experiments.ops_memory --config=experiments/configs/ops_memory.py:runlocal --workdir=/tmp/x

Measured, not modelled: each model call the decode loops make is compiled on its own (batch 1,
the loops' cache length, a source of config.max_source_length tokens) and XLA's cost analysis
gives its 'flops' and 'bytes accessed':
  target step      1 position: autoregressive decoding, one call per token;
  target pass      gamma + 1 positions: one call per speculative iteration;
  drafter calls    per iteration one 2-position call (the catch-up of `decode_steps.draft`) and
                   gamma - 1 one-position steps.
These per-call costs times the call counts of real runs (`DecodeStats.target_calls`,
`DecodeStats.drafted`, tokens emitted; speculative vs autoregressive, same sentences and
sampling) give flops and bytes per emitted token. Against the paper's formulas:
  ops_increase_formula     `analysis.ops_increase(alpha, gamma, c_hat)`, the measured alpha and
                           c_hat = drafter step flops / target step flops;
  reads_reduction_formula  `analysis.expected_tokens(alpha, gamma)`: the target's weights and KV
                           cache are read once per iteration instead of once per token.
The measured increase differs from the formula where the formula idealizes: the drafter scores
gamma + 1 positions per iteration here (its first call catches up one position), not gamma, and
the tokens per call are counted, not `E[tokens]` of i.i.d. betas (EOS also cuts blocks).
Measured reductions of the target's memory reads per token: `reads_reduction` from XLA's 'bytes
accessed' (its cost model counts every operand and result of every op, activations included, and
charges a gather of two or more rows the whole table: the pass's embedding lookup counts the full
8 MB table where the 1-position step's dynamic slice counts one row), `reads_reduction_weights_kv`
from array sizes (`weight_bytes` and the cache, read once per call, as the paper reasons);
`total_reads_reduction` (XLA bytes) also charges the drafter's calls. Sampling, verification and
the encoders (once per sentence) are not counted.

Writes ops_memory.csv / .json (a row per point, printed as it finishes), call_costs.csv / .json
(the per-call costs) and ops_memory.png to --workdir (default: config.workdir).
"""

import functools
import itertools
import os

import jax
import jax.numpy as jnp
from matplotlib import figure

from experiments import skeleton
from experiments.configs import common
from specdec_jax import analysis, decode, step_models
from specdec_jax.measure import evaluation, tables, translation

# call_costs.csv / .json's columns (each cost is printed as a sentence: `format_cost`).
COST_TABLE = tuple(
  tables.Column(name)
  for name in (
    'model',
    'positions',
    'cache_len',
    'flops',
    'bytes_accessed',
    'weight_bytes',
    'cache_bytes',
  )
)


def _nbytes(tree) -> int:
  return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree) if hasattr(x, 'dtype'))


def weight_bytes(model, positions: int) -> int | None:
  """Bytes of the weights a T5 decoder call of `positions` tokens must read: every decoder
  parameter except the cross-attention key/value kernels (applied once, when the cache was
  built), and of the input embedding table the `positions` rows it gathers (all of it when the
  output layer is tied to it). None for a model that is not a T5 (an n-gram table)."""
  config, params = getattr(model, 'config', None), model.params
  if config is None or not isinstance(params, dict) or 'decoder' not in params:
    return None
  total = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params['decoder']):
    names = {getattr(k, 'key', None) for k in path}
    if 'encoder_decoder_attention' in names and names & {'key', 'value'}:
      continue
    total += _nbytes(leaf)
  table = params['token_embedder']['embedding']
  rows = table.shape[0] if config.tie_word_embeddings else positions
  return total + rows * table.shape[1] * table.dtype.itemsize


def call_cost(model, *, positions: int, cache_len: int, source_length: int, target=None) -> dict:
  """XLA's cost analysis of one compiled model call scoring `positions` tokens (batch 1).

  Returns flops and bytes_accessed (XLA's counts for the compiled call), weight_bytes
  (`weight_bytes`) and cache_bytes (the arrays of the decoder cache, KV and cross-attention
  keys/values, which the call reads in full). A drafter that reads the target's encoder output
  needs `target=`.
  """
  steps, params = step_models.as_step_model(model)
  encoder_steps, encoder_params = step_models.encoder_of(
    (steps, params), None if target is None else step_models.as_step_model(target)
  )
  ids = jnp.full((1, source_length), 3, jnp.int32)
  mask = jnp.ones_like(ids)
  encoded = jax.jit(encoder_steps.encode)(encoder_params, ids, mask)
  cache = jax.jit(steps.init_cache, static_argnums=3)(params, encoded, mask, cache_len)
  tokens = jnp.full((1, positions), 2, jnp.int32)
  cost = jax.jit(steps.step).lower(params, tokens, cache).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):  # older jax: one dict per computation
    cost = cost[0]
  return dict(
    flops=float(cost['flops']),
    bytes_accessed=float(cost['bytes accessed']),
    weight_bytes=weight_bytes(model, positions),
    cache_bytes=_nbytes(cache),
  )


class CallCosts:
  """`call_cost` of each (model, positions, cache length), computed once; `rows` for the CSV."""

  def __init__(self, target, source_length: int, on_new=None):
    self.target, self.source_length, self.on_new = target, source_length, on_new
    self.costs: dict[tuple, dict] = {}

  def __call__(self, name: str, model, positions: int, cache_len: int) -> dict:
    key = (name, positions, cache_len)
    if key not in self.costs:
      cost = call_cost(
        model,
        positions=positions,
        cache_len=cache_len,
        source_length=self.source_length,
        target=self.target,
      )
      self.costs[key] = dict(model=name, positions=positions, cache_len=cache_len, **cost)
      if self.on_new:
        self.on_new(self.costs[key])
    return self.costs[key]


def measure(plan: evaluation.Plan, *, on_cost=None):
  """Yields the autoregressive row of each temperature, then a row per (drafter, gamma,
  temperature), each as soon as it is measured."""
  c, pair = plan.config, plan.pair
  costs = CallCosts(pair.target, c.max_source_length, on_cost)
  step = costs('target', pair.target, 1, decode.buffer_length(c.max_new_tokens, 0))
  baseline = {}
  for temperature in c.temperatures:
    row, baseline[temperature] = _autoregressive_row(plan, step, temperature)
    yield row
  for name, drafter in plan.drafters.items():
    for gamma in c.gammas:
      iteration = _iteration_costs(costs, name, drafter, gamma, c.max_new_tokens)
      for temperature, verifier in itertools.product(c.temperatures, c.verifiers):
        r = _translate(plan, drafter, verifier, gamma, temperature)
        point = dict(task=plan.task, drafter=name, method=verifier, temp=temperature, gamma=gamma)
        yield point | _speculative_costs(r, gamma, iteration, baseline[temperature])


def _translate(plan: evaluation.Plan, drafter, method: str, gamma: int, temperature: float):
  """`translation.translate` of the plan's sources by one method at one temperature."""
  return translation.translate(
    drafter=drafter, method=method, gamma=gamma, **plan.decoding(temperature)
  )


def _autoregressive_row(plan: evaluation.Plan, step: dict, temperature: float):
  """(the autoregressive row at `temperature`, its costs per token: the other rows' baseline);
  `step` is the target's 1-position `call_cost`."""
  r = _translate(plan, None, 'autoregressive', 1, temperature)
  calls = int(r.stats.target_calls)
  base = dict(
    flops_per_token=calls * step['flops'] / r.tokens,
    bytes_per_token=calls * step['bytes_accessed'] / r.tokens,
    weights_kv_per_token=calls * (step['weight_bytes'] + step['cache_bytes']) / r.tokens,
  )
  row = dict(
    task=plan.task,
    drafter='-',
    method='autoregressive',
    temp=temperature,
    gamma=0,
    tokens_per_call=r.tokens / calls,
    ops_increase=1.0,
    reads_reduction=1.0,
    reads_reduction_weights_kv=1.0,
    total_reads_reduction=1.0,
    flops_per_token=base['flops_per_token'],
    bytes_per_token=base['bytes_per_token'],
    target_calls=calls,
    drafter_calls=0,
    tokens=r.tokens,
  )
  return row, base


def _iteration_costs(costs: CallCosts, name: str, drafter, gamma: int, max_new_tokens: int):
  """The calls of one speculative iteration at `gamma`: {'target_pass', 'target_step': call
  costs at the loop's cache length; 'drafter': flops and bytes_accessed of one 2-position call
  and gamma - 1 steps; 'c_hat': drafter step flops / target step flops}."""
  target = costs.target
  cache_len = decode.buffer_length(max_new_tokens, gamma)
  target_pass = costs('target', target, gamma + 1, cache_len)
  target_step = costs('target', target, 1, cache_len)
  catch_up = costs(name, drafter, 2, cache_len)
  draft_step = costs(name, drafter, 1, cache_len)
  return dict(
    target_pass=target_pass,
    target_step=target_step,
    drafter={k: catch_up[k] + (gamma - 1) * draft_step[k] for k in ('flops', 'bytes_accessed')},
    c_hat=draft_step['flops'] / target_step['flops'],
  )


def _speculative_costs(r, gamma: int, iteration: dict, base: dict) -> dict:
  """A speculative row's measured columns: run `r`'s call counts times `iteration`'s per-call
  costs, against the autoregressive `base` (`_autoregressive_row`) and the paper's formulas."""
  target_pass, target_step, c_hat = (iteration[k] for k in ('target_pass', 'target_step', 'c_hat'))
  calls, alpha = int(r.stats.target_calls), float(r.stats.alpha)
  per_token = calls / r.tokens  # iterations per emitted token
  flops = per_token * (target_pass['flops'] + iteration['drafter']['flops'])
  target_bytes = per_token * target_pass['bytes_accessed']
  total_bytes = target_bytes + per_token * iteration['drafter']['bytes_accessed']
  weights_kv = per_token * (target_pass['weight_bytes'] + target_pass['cache_bytes'])
  return dict(
    alpha=alpha,
    tokens_per_call=r.tokens / calls,
    expected_tokens=float(analysis.expected_tokens(alpha, gamma)),
    c_hat=c_hat,
    pass_flops_ratio=target_pass['flops'] / target_step['flops'],
    pass_bytes_ratio=target_pass['bytes_accessed'] / target_step['bytes_accessed'],
    ops_increase=flops / base['flops_per_token'],
    ops_increase_formula=float(analysis.ops_increase(alpha, gamma, c_hat)),
    reads_reduction=base['bytes_per_token'] / target_bytes,
    reads_reduction_weights_kv=base['weights_kv_per_token'] / weights_kv,
    reads_reduction_formula=float(analysis.expected_tokens(alpha, gamma)),
    total_reads_reduction=base['bytes_per_token'] / total_bytes,
    flops_per_token=flops,
    bytes_per_token=total_bytes,
    target_calls=calls,
    drafter_calls=int(r.stats.drafted),
    tokens=r.tokens,
  )


# The table's one column spec: ops_memory.csv / .json hold every column, its lines the printed.
TABLE = (
  *skeleton.ROW_KEY,
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('tokens_per_call', 'tok/call', '.2f', 8),
  tables.Column('expected_tokens', printed=False),
  tables.Column('c_hat', fmt='.3f', width=6),
  tables.Column('pass_flops_ratio', printed=False),
  tables.Column('pass_bytes_ratio', printed=False),
  tables.Column('ops_increase', 'ops x', '.2f', 6),
  tables.Column('ops_increase_formula', 'formula', '.2f', 7),
  tables.Column('reads_reduction', 'reads /', '.2f', 7),
  tables.Column('reads_reduction_weights_kv', 'W+KV /', '.2f', 6),
  tables.Column('reads_reduction_formula', 'formula', '.2f', 7),
  tables.Column('total_reads_reduction', 'all /', '.2f', 6),
  tables.Column('flops_per_token', 'MFLOP/tok', '.2f', 9, scale=1e-6),
  tables.Column('bytes_per_token', 'MB/tok', '.2f', 7, scale=1e-6),
  tables.Column('target_calls', printed=False),
  tables.Column('drafter_calls', printed=False),
  tables.Column('tokens', printed=False),
)


def _mb(v) -> str:
  return '-' if v is None else f'{v / 1e6:.2f} MB'


def format_cost(cost: dict) -> str:
  """A log line for a per-call cost as it is measured (between the table's lines, so a sentence,
  not a table of its own; call_costs.csv has the table)."""
  return (
    f'  cost of {cost["model"]:<10s} {cost["positions"]:2d} position(s), cache {cost["cache_len"]:3d}'
    f': {cost["flops"] / 1e6:8.3f} MFLOP, {cost["bytes_accessed"] / 1e6:7.2f} MB accessed '
    f'(weights {_mb(cost["weight_bytes"])}, cache {_mb(cost["cache_bytes"])})'
  )


def plot(table: list[dict], path: str) -> None:
  """Left: operations increase vs gamma (measured markers, formula lines). Right: reduction of
  the target's memory reads per token (XLA bytes: markers; weights + KV: crosses; E[tokens]:
  lines). Filled markers temperature 0, hollow temperature 1."""
  spec = [r for r in table if r['method'] != 'autoregressive']
  drafters = list(dict.fromkeys(r['drafter'] for r in spec))
  temps = sorted({r['temp'] for r in spec})
  fig = figure.Figure(figsize=(11, 4.4), layout='constrained')
  ax_ops, ax_mem = fig.subplots(1, 2)
  for i, d in enumerate(drafters):
    color = f'C{i}'
    for temp, style in zip(temps, ('-', '--', ':', '-.')):
      pts = sorted((r for r in spec if r['drafter'] == d and r['temp'] == temp),
                   key=lambda r: r['gamma'])  # fmt: skip
      if not pts:
        continue
      g = [r['gamma'] for r in pts]
      face = color if temp == 0 else 'none'
      label = f'{d}, temp {temp:g}'
      ax_ops.plot(
        g, [r['ops_increase_formula'] for r in pts], style, marker='_', ms=14, color=color, lw=1
      )
      ax_ops.scatter(g, [r['ops_increase'] for r in pts], edgecolors=color, facecolors=face,
                     label=label)  # fmt: skip
      ax_mem.plot(
        g, [r['reads_reduction_formula'] for r in pts], style, marker='_', ms=14, color=color, lw=1
      )
      ax_mem.scatter(g, [r['reads_reduction'] for r in pts], edgecolors=color, facecolors=face,
                     label=label)  # fmt: skip
      ax_mem.scatter(g, [r['reads_reduction_weights_kv'] for r in pts], marker='x', color=color)
  ax_ops.plot(
    [], [], 'k-', marker='_', ms=14, lw=1, label='formula (Thm 3.11), measured alpha, c_hat'
  )
  ax_ops.set(xlabel='gamma', ylabel='arithmetic operations per token (x autoregressive)',
             title='Operations increase: measured (XLA flops x call counts)')  # fmt: skip
  ax_mem.plot([], [], 'k-', marker='_', ms=14, lw=1, label='formula: E[tokens] (Eq. 1)')
  ax_mem.scatter([], [], marker='o', color='grey', label="measured: XLA 'bytes accessed'")
  ax_mem.scatter([], [], marker='x', color='grey', label='measured: weights + KV cache')
  ax_mem.axhline(1.0, color='grey', lw=0.8)
  ax_mem.set(xlabel='gamma', ylabel="target's memory reads per token (reduction, x)",
             title='Memory reads of the target: reduction per token')  # fmt: skip
  for ax in (ax_ops, ax_mem):
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  fig.savefig(path, dpi=110)


def run(config, workdir: str, *, echo=print) -> dict[str, str]:
  """Measures every point of `config`, writing each as it finishes; returns the output paths."""
  plan = evaluation.prepare(config)
  c = config
  header = (
    f'{len(plan.sources)} test sentences of {plan.pair.directory}, batch {c.batch_size} (counts '
    f'per row); drafters {list(plan.drafters)} x gammas {tuple(c.gammas)} x temperatures '
    f'{tuple(c.temperatures)}, verifiers {tuple(c.verifiers)}; per-call costs: XLA cost analysis, '
    'batch 1'
  )

  def measure_rows(results):
    on_cost = functools.partial(results.add, 'call_costs')
    for row in measure(plan, on_cost=on_cost):
      yield 'ops_memory', {col.name: row.get(col.name) for col in TABLE}

  def finish(results):
    table = results.rows['ops_memory']
    paths = {**results.paths('ops_memory'), **results.paths('call_costs', 'costs_')}
    if any(r['method'] != 'autoregressive' for r in table):
      paths['png'] = os.path.join(workdir, 'ops_memory.png')
      plot(table, paths['png'])
    results.say(f'{len(table)} rows in ' + ', '.join(paths.values()))
    return paths

  return skeleton.run(
    workdir,
    [
      skeleton.Table('ops_memory', TABLE),
      skeleton.Table('call_costs', COST_TABLE, line=format_cost),
    ],
    header=header,
    measure=measure_rows,
    finish=finish,
    echo=echo,
  )


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: run(config, workdir, echo=lambda s: print(s, flush=True))
  )
