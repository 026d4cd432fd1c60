"""Measured speculative decoding on a translation set: the rows of Leviathan et al.'s Table 2.

For each drafter, temperature and gamma: translate the same sources autoregressively and
speculatively (token and block verification), time both with compilation excluded (batch by
batch, alternating, so that the speedup compares them under the same machine load), and report
alpha (measured, mean beta over verified positions), block efficiency, c (drafter call / target
step, measured inside an iteration of the loop's model calls; `c_alone`: the drafter's calls
alone), the walltime speedup, the speedup the paper's formula predicts from
the measured alpha, c and (gamma+1)-position pass cost (the pass cost is a property of the target
and gamma: the median over every drafter's measurement), and BLEU. Then what the loops themselves
cost: `iteration_cost`, a speculative iteration in autoregressive steps, each fitted over the
sentences (`loop_costs`: seconds ~ fixed + per iteration x iterations, the work around the model
calls included), and `predicted_loop` = block efficiency / iteration_cost, the speedup before the
per-call fixed costs (encoder, cache set-up) dilute it. Where `speedup` falls short of
`predicted_speedup`, these two say whether the iteration (loop overhead, the pass) or the tokens
per iteration (alpha's i.i.d. assumption, EOS) is why. No flags here:
experiments/translate.py and notebooks call `prepare` and `rows`.

  plan = evaluation.prepare(config)        # validates the config, loads every model: fails early
  writer = evaluation.ResultsWriter(workdir)
  for row in evaluation.rows(plan):        # each row as soon as it is measured
    writer.add(row)

Axis legend: B batch, S source length, M max_new_tokens.
"""

import contextlib
import csv
import dataclasses
import json
import math
import numbers
import os
import time
from collections.abc import Iterator, Sequence

import jax
import numpy as np
import sacrebleu

from specdec_jax import analysis, decode, pretrained, sharding, timing, verify
from specdec_jax import sampling as sampling_lib
from specdec_jax.data import tokenizer as tokenizer_lib

COLUMNS = (
  'task',
  'drafter',
  'method',
  'temp',
  'gamma',
  'alpha',
  'block_efficiency',
  'c',
  'pass_cost',
  'speedup',
  'predicted_speedup',
  'bleu',
  'seconds',
  'tokens_per_s',
  'c_alone',
  'iteration_cost',
  'predicted_loop',
)


@dataclasses.dataclass
class Run:
  """One decoding method over the whole test set."""

  hypotheses: list[str]
  tokens: int  # tokens emitted
  stats: decode.DecodeStats  # pooled over all rows (`DecodeStats.summed`)
  # Per batch: decoding wall time (compilation excluded) and loop iterations (target calls of
  # its longest row). `loop_costs` fits them.
  batch_seconds: np.ndarray
  batch_iterations: np.ndarray
  # With `translate(..., trace=True)`: tau (drafts accepted) of every iteration in which a row
  # was still emitting, over all rows (int32[iterations]); else None.
  accepted_lengths: np.ndarray | None = None
  # With `translate(..., paired=True)`: the same for the autoregressive decoding of the same
  # batches, each timed just before this method's; else None.
  baseline_batch_seconds: np.ndarray | None = None
  baseline_batch_iterations: np.ndarray | None = None

  @property
  def seconds(self) -> float:
    """Decoding wall time over all batches."""
    return float(np.sum(self.batch_seconds))

  @property
  def baseline_seconds(self) -> float | None:
    """The paired autoregressive decoding's wall time, or None."""
    if self.baseline_batch_seconds is None:
      return None
    return float(np.sum(self.baseline_batch_seconds))


def loop_costs(seconds, iterations) -> tuple[float, float]:
  """(seconds per call before the first iteration, seconds per iteration) of a decode loop, by
  least squares of `seconds ~ fixed + per_iteration * iterations` over its calls (e.g. the
  sentences of a test set). This is what the loop really costs, the work around the model calls
  included; NaN when the calls do not differ in iterations."""
  seconds, iterations = np.asarray(seconds, np.float64), np.asarray(iterations, np.float64)
  if len(iterations) < 2 or np.ptp(iterations) == 0:
    return math.nan, math.nan
  design = np.stack([np.ones_like(iterations), iterations], axis=1)
  (fixed, per_iteration), *_ = np.linalg.lstsq(design, seconds, rcond=None)
  return float(fixed), float(per_iteration)


def translate(
  target,
  drafter,
  tokenizer: tokenizer_lib.Tokenizer,
  sources: Sequence[str],
  *,
  method: str,
  gamma: int,
  sampling: sampling_lib.SamplingConfig,
  batch_size: int,
  max_source_length: int,
  max_new_tokens: int,
  seed: int = 0,
  on_batch=None,
  trace: bool = False,
  paired: bool = False,
  mesh=None,
) -> Run:
  """Translates `sources` with `method` ('autoregressive' or a verifier name), timing decoding.

  Every batch is padded to [batch_size, max_source_length], so each method compiles once; a
  warm-up call on the first batch is made before timing. `on_batch(n)` is called after each
  batch of n sources (progress). `trace=True` (speculative methods only) decodes with
  `speculative_generate(..., trace=True)` and fills `Run.accepted_lengths`; the trace's
  bookkeeping is then part of the timed work.

  `paired=True` also decodes every batch autoregressively (same rng), timed just before this
  method's batch, into `Run.baseline_seconds`: the speedup `baseline_seconds / seconds` then
  compares the two under the same machine load, so slow drift on a shared machine cancels out.

  With a `mesh` (the models placed on it, see `pretrained.load`), each batch is split over its
  'data' axis and every process tokenizes only the rows its devices hold; outputs are gathered to
  every process, and each timed call starts after a barrier of all processes.
  """
  if trace and method == 'autoregressive':
    raise ValueError('trace=True needs a speculative method (a verifier name).')
  chunks = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]

  def run_batch(texts, rng, method=method):
    texts = list(texts) + [''] * (batch_size - len(texts))
    encode = lambda rows: tokenizer.encode_batch(
      [texts[i] for i in rows], max_source_length, truncate=True
    )
    if mesh is None:
      ids, mask = encode(range(batch_size))
    else:
      ids, mask = sharding.global_batch(encode, batch_size, mesh)
    kw = dict(sampling=sampling, max_new_tokens=max_new_tokens, rng=rng)
    with on_mesh(mesh):
      if method == 'autoregressive':
        return decode.generate(target, ids, mask, **kw)
      return decode.speculative_generate(
        target, drafter, ids, mask, gamma=gamma, verifier=method, trace=trace, **kw
      )

  def timed(texts, rng, method=method):
    sharding.barrier('translate.timed')
    start = time.perf_counter()
    out = jax.block_until_ready(run_batch(texts, rng, method))
    seconds = time.perf_counter() - start
    return decode.to_host(out), seconds

  if mesh is not None:
    sharding.check_batch(batch_size, mesh)
  jax.block_until_ready(run_batch(chunks[0], jax.random.key(seed)))
  if paired:
    jax.block_until_ready(run_batch(chunks[0], jax.random.key(seed), 'autoregressive'))
  hyps, outputs, accepted = [], [], []
  times, iterations, base_times, base_iterations = [], [], [], []
  for i, chunk in enumerate(chunks):
    rng = jax.random.key(seed + 1 + i)
    if paired:
      base, dt = timed(chunk, rng, 'autoregressive')
      base_times.append(dt)
      base_iterations.append(int(np.max(base.stats.target_calls)))
    out, dt = timed(chunk, rng)
    times.append(dt)
    iterations.append(int(np.max(out.stats.target_calls)))
    n = len(chunk)
    hyps += [tokenizer.decode(row) for row in out.tokens[:n]]
    outputs.append(jax.tree.map(lambda x: x[:n], (out.lengths, out.stats)))
    if trace:  # live iterations: a row still emitting appends at least one token
      live = out.trace.emitted[:n] > 0
      accepted.append(out.trace.num_accepted[:n][live])
    if on_batch:
      on_batch(n)
  lengths = np.concatenate([o[0] for o in outputs])
  stats = jax.tree.map(lambda *x: np.concatenate(x), *[o[1] for o in outputs])
  accepted_lengths = np.concatenate(accepted) if trace else None
  return Run(
    hyps,
    int(lengths.sum()),
    stats.summed(),
    np.asarray(times),
    np.asarray(iterations),
    accepted_lengths,
    np.asarray(base_times) if paired else None,
    np.asarray(base_iterations) if paired else None,
  )


def on_mesh(mesh):
  """`jax.set_mesh(mesh)` (turns on the models' activation constraints), or nothing for None."""
  return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


@dataclasses.dataclass
class Plan:
  """A validated run: the pair, the drafters to compare, the test set, the settings."""

  config: object
  pair: pretrained.Pair
  drafters: dict
  sources: list[str]
  references: list[str]
  truncated: int  # sources longer than max_source_length (cut to it)
  mesh: object = None  # the device mesh the models are placed on; None: one device

  @property
  def task(self) -> str:
    """The task name of the rows: `config.task`, else the pair directory's name."""
    return self.config.get('task') or self.pair.directory.name

  @property
  def num_methods(self) -> int:
    c = self.config
    return len(c.temperatures) * (1 + len(self.drafters) * len(c.gammas) * len(c.verifiers))

  def summary(self) -> str:
    c = self.config
    where = 'one device' if self.mesh is None else f'mesh {dict(self.mesh.shape)}'
    return (
      f'{len(self.sources)} test sentences of {self.pair.directory}, batch {c.batch_size}, on '
      f'{where} ({jax.process_count()} process(es), {jax.devices()[0].platform}); '
      f'{self.truncated} source(s) longer than {c.max_source_length} tokens truncated; '
      f'{self.num_methods} methods: autoregressive and drafters {sorted(self.drafters)} x '
      f'gammas {tuple(c.gammas)} x verifiers {tuple(c.verifiers)}, at temperatures '
      f'{tuple(c.temperatures)}'
    )


def _positive_int(config, name: str) -> None:
  value = config[name]
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f'config.{name} must be an int >= 1, got {value!r}.')


def prepare(config) -> Plan:
  """Checks every setting and loads the pair and the test set, before anything is decoded.

  `config` fields: pretrained (pair name or directory), task (the rows' task name; optional),
  drafters (names, or ('all',)),
  num_examples, batch_size, max_source_length, max_new_tokens, temperatures, gammas, verifiers,
  seed.

  Raises:
    ValueError (or FileNotFoundError for a missing pair) naming the bad setting.
  """
  for name in ('num_examples', 'batch_size', 'max_source_length', 'max_new_tokens'):
    _positive_int(config, name)
  for name in ('temperatures', 'gammas', 'verifiers'):
    if not config[name]:
      raise ValueError(f'config.{name} is empty.')
  for t in config.temperatures:
    sampling_lib.SamplingConfig(temperature=t)  # raises on a bad temperature
  for g in config.gammas:
    if isinstance(g, bool) or not isinstance(g, numbers.Integral) or g < 1:
      raise ValueError(f'config.gammas must hold ints >= 1, got {tuple(config.gammas)}.')
  unknown = set(config.verifiers) - set(verify.VERIFIERS)
  if unknown:
    raise ValueError(
      f'Unknown verifier(s) {sorted(unknown)} in config.verifiers; choose from '
      f'{sorted(verify.VERIFIERS)}.'
    )
  mesh = make_mesh(config)
  pair = load_pair(config, mesh)
  if config.get('target') or tuple(config.drafters) == ('all',):
    names = list(pair.drafters)  # a pair given by checkpoints has its one drafter
  else:
    names = list(config.drafters)
  missing = [n for n in names if n not in pair.drafters]
  if missing:
    raise ValueError(
      f'Drafter(s) {missing} are not in {pair.directory}; it has {sorted(pair.drafters)}.'
    )
  if config.max_new_tokens > pair.target.config.max_target_length:
    raise ValueError(
      f"config.max_new_tokens={config.max_new_tokens} exceeds the target's "
      f'max_target_length={pair.target.config.max_target_length}.'
    )
  test = pair.test_pairs()
  if config.num_examples > len(test):
    raise ValueError(
      f'config.num_examples={config.num_examples} but {pair.directory} has only '
      f'{len(test)} test pairs.'
    )
  test = test[: config.num_examples]
  sources = [s for s, _ in test]
  truncated = sum(len(pair.tokenizer.encode(s)) > config.max_source_length for s in sources)
  return Plan(
    config,
    pair,
    {n: pair.drafters[n] for n in names},
    sources,
    [t for _, t in test],
    truncated,
    mesh,
  )


def make_mesh(config):
  """The device mesh of `config.mesh` ('DATAxMODEL' or 'auto'), or None for one device (the
  default on CPU: no sharding at all). Raises ValueError if the batch does not split over
  'data' or the mesh needs more devices than there are."""
  data, model = sharding.parse_mesh(config.get('mesh', 'auto'))
  if data * model == 1:
    return None
  mesh = sharding.make_mesh(data, model)
  sharding.check_batch(config.batch_size, mesh)
  return mesh


def load_pair(config, mesh) -> pretrained.Pair:
  """The pair of `config`: `config.target` (+ `drafter`, `tokenizer`, `test_file`) checkpoints of
  any format, or else the pair directory `config.pretrained`; placed on `mesh` as it loads (the
  target sharded, drafters per `config.drafter_sharding`)."""
  how = config.get('drafter_sharding', 'auto')
  if how not in ('model', 'replicated', 'auto'):
    raise ValueError(
      f"config.drafter_sharding must be 'model', 'replicated' or 'auto', got {how!r}."
    )
  if not config.get('target'):
    extra = [k for k in ('drafter', 'tokenizer', 'test_file') if config.get(k)]
    if extra:
      raise ValueError(f'config.{extra[0]} needs config.target (a pair given by checkpoints).')
    pair = pretrained.load(config.pretrained, mesh=mesh, drafter_sharding=how)
    return dataclasses.replace(pair, source_prefix=config.get('source_prefix', ''))
  missing = [k for k in ('drafter', 'tokenizer', 'test_file') if not config.get(k)]
  if missing:
    raise ValueError(f'config.target is set: also set config.{", config.".join(missing)}.')
  return pretrained.from_checkpoints(
    config.target,
    {'drafter': config.drafter},
    tokenizer=config.tokenizer,
    test_file=config.test_file,
    source_prefix=config.get('source_prefix', ''),
    mesh=mesh,
    drafter_sharding=how,
    param_dtype=config.get('param_dtype') or None,
  )


def rows(plan: Plan, *, progress: bool = True) -> Iterator[dict]:
  """Runs every (drafter, temperature, gamma, verifier) of the plan, yielding each table row as
  soon as it is measured (missing values are None). A progress bar with ETA counts sentences."""
  from tqdm.auto import tqdm  # imported here: only the main job's progress needs it

  c, pair = plan.config, plan.pair
  common = dict(
    batch_size=c.batch_size,
    max_source_length=c.max_source_length,
    max_new_tokens=c.max_new_tokens,
    seed=c.seed,
  )
  bar = tqdm(
    total=plan.num_methods * len(plan.sources),
    unit='sentence',
    disable=not progress or not sharding.is_main_process(),
    dynamic_ncols=True,
    mininterval=2.0,
  )

  def run(drafter, method, gamma, temperature):
    sampling = sampling_lib.SamplingConfig(temperature=temperature)
    return translate(
      pair.target,
      drafter,
      pair.tokenizer,
      plan.sources,
      method=method,
      gamma=gamma,
      sampling=sampling,
      on_batch=bar.update,
      paired=method != 'autoregressive',
      mesh=plan.mesh,
      **common,
    )

  def bleu(hyps):
    return sacrebleu.corpus_bleu(hyps, [plan.references]).score

  for temperature in c.temperatures:
    base = run(None, 'autoregressive', 1, temperature)
    yield dict(
      task=plan.task,
      drafter='-',
      method='autoregressive',
      temp=temperature,
      gamma=0,
      alpha=None,
      block_efficiency=1.0,
      c=None,
      c_alone=None,
      pass_cost=None,
      speedup=1.0,
      predicted_speedup=None,
      bleu=bleu(base.hypotheses),
      seconds=base.seconds,
      tokens_per_s=base.tokens / base.seconds,
      iteration_cost=None,
      predicted_loop=None,
    )
  # Costs first, for every (drafter, gamma): the pass cost does not depend on the drafter, so
  # each gamma's is the median over all of them (less noise than one drafter's rounds).
  with on_mesh(plan.mesh):
    costs = {
      (name, gamma): timing.step_costs(
        pair.target,
        drafter,
        batch_size=c.batch_size,
        source_length=c.max_source_length,
        gamma=gamma,
        cache_len=decode.buffer_length(c.max_new_tokens, gamma),
        rounds=c.timing_rounds,
      )
      for name, drafter in plan.drafters.items()
      for gamma in c.gammas
    }
  pass_cost = {
    g: float(np.median([v['pass_cost'] for (_, gamma), v in costs.items() if gamma == g]))
    for g in c.gammas
  }
  for name, drafter in plan.drafters.items():
    for gamma in c.gammas:
      cost = costs[name, gamma]
      for temperature in c.temperatures:
        for verifier in c.verifiers:
          r = run(drafter, verifier, gamma, temperature)
          alpha = float(r.stats.alpha)
          efficiency = float(r.stats.block_efficiency)
          predicted = analysis.walltime_improvement_measured(
            alpha, gamma, cost['c'], pass_cost[gamma]
          )
          # The loops' own per-iteration costs, fitted over the sentences: an iteration of this
          # run in autoregressive steps of its paired baseline.
          per_iteration = loop_costs(r.batch_seconds, r.batch_iterations)[1]
          per_step = loop_costs(r.baseline_batch_seconds, r.baseline_batch_iterations)[1]
          fitted = per_iteration > 0 and per_step > 0  # False for NaN (too few sentences)
          iteration_cost = per_iteration / per_step if fitted else math.nan
          yield dict(
            task=plan.task,
            drafter=name,
            method=verifier,
            temp=temperature,
            gamma=gamma,
            alpha=alpha,
            block_efficiency=efficiency,
            c=cost['c'],
            c_alone=cost['c_alone'],
            pass_cost=pass_cost[gamma],
            speedup=r.baseline_seconds / r.seconds,
            predicted_speedup=float(predicted),
            bleu=bleu(r.hypotheses),
            seconds=r.seconds,
            tokens_per_s=r.tokens / r.seconds,
            iteration_cost=iteration_cost,
            predicted_loop=efficiency / iteration_cost if fitted else math.nan,
          )
  bar.close()


def run(config) -> list[dict]:
  """All rows of `config` (see `prepare`), as a list."""
  return list(rows(prepare(config), progress=False))


# The printed table: COLUMNS up to BLEU, with the loop's own iteration cost and its prediction.
PRINTED = COLUMNS[:11] + ('iteration_cost', 'predicted_loop', 'bleu')
_HEADERS = {'block_efficiency': 'block_eff', 'predicted_speedup': 'predicted', 'iteration_cost':
            'iter_cost', 'predicted_loop': 'pred_loop'}  # fmt: skip


def format_row(row: dict) -> str:
  """One row of the plain-text table (see `format_table`)."""
  cells = []
  for i, col in enumerate(PRINTED):
    v = row[col]
    if v is None or (isinstance(v, float) and math.isnan(v)):
      text = '-'
    elif isinstance(v, float):
      text = f'{v:.3f}' if col in ('alpha', 'c') else f'{v:.2f}'
      text += 'x' if col == 'speedup' else ''
    else:
      text = str(v)
    cells.append(f'{text:>10s}' if i > 2 else f'{text:<9s}')
  return ' '.join(cells)


def format_table(table: list[dict]) -> str:
  """A plain-text table in the form of Leviathan et al. Table 2 (+ block efficiency, c, pass
  cost, the loop's fitted iteration cost and the speedup it predicts, BLEU)."""
  header = ' '.join(
    f'{_HEADERS.get(c, c)[:10]:>10s}' if i > 2 else f'{c:<9s}' for i, c in enumerate(PRINTED)
  )
  return '\n'.join([header] + [format_row(row) for row in table])


class ResultsWriter:
  """Writes results.csv and results.json (strict JSON: null for missing values) after every row,
  so an interrupted run keeps what it measured, and speedup.png at `finish`.

  Another table: `name` gives `<name>.csv` / `<name>.json` and `columns` the CSV's columns; only
  the main job's table (the default columns) has a figure.
  """

  def __init__(self, workdir: str, *, name: str = 'results', columns: Sequence[str] = COLUMNS):
    os.makedirs(workdir, exist_ok=True)
    self.columns = tuple(columns)
    files = [('csv', f'{name}.csv'), ('json', f'{name}.json')]
    if self.columns == COLUMNS:
      files.append(('png', 'speedup.png'))
    self.paths = {k: os.path.join(workdir, f) for k, f in files}
    probe = os.path.join(workdir, '.writable')
    try:
      with open(probe, 'w') as f:
        f.write('')
      os.remove(probe)
    except OSError as e:
      raise ValueError(f'Cannot write results to {workdir}: {e}') from None
    self.rows: list[dict] = []
    for path in (self.paths['csv'], self.paths['json']):
      if os.path.exists(path):
        os.remove(path)

  def add(self, row: dict) -> None:
    row = {
      k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()
    }
    self.rows.append(row)
    new = not os.path.exists(self.paths['csv'])
    with open(self.paths['csv'], 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=list(self.columns))
      if new:
        writer.writeheader()
      writer.writerow({k: ('' if row.get(k) is None else row[k]) for k in self.columns})
    tmp = self.paths['json'] + '.tmp'
    with open(tmp, 'w') as f:
      json.dump(self.rows, f, indent=1, allow_nan=False)
    os.replace(tmp, self.paths['json'])

  def finish(self) -> dict[str, str]:
    """Draws speedup.png (main job's table) from the rows so far; returns the paths."""
    if 'png' in self.paths and any(r['method'] != 'autoregressive' for r in self.rows):
      _plot(self.rows, self.paths['png'])
    return self.paths


def write_results(table: list[dict], workdir: str) -> dict[str, str]:
  """Writes results.csv, results.json and speedup.png into workdir; returns their paths."""
  writer = ResultsWriter(workdir)
  for row in table:
    writer.add(row)
  return writer.finish()


def _plot(table: list[dict], path: str) -> None:
  import matplotlib

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt

  temps = sorted({r['temp'] for r in table})
  fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4), squeeze=False)
  for ax, temp in zip(axes[0], temps):
    spec = [r for r in table if r['temp'] == temp and r['method'] != 'autoregressive']
    for drafter in sorted({r['drafter'] for r in spec}):
      for method, style in (('token', '-o'), ('block', '--s')):
        pts = sorted(
          (r['gamma'], r['speedup'], r['predicted_speedup'])
          for r in spec
          if r['drafter'] == drafter and r['method'] == method
        )
        if pts:
          g, s, p = zip(*pts)
          (line,) = ax.plot(g, s, style, label=f'{drafter} / {method} (measured)')
          ax.plot(
            g,
            p,
            style[1:],
            color=line.get_color(),
            alpha=0.35,
            label=f'{drafter} / {method} (predicted)',
          )
    ax.axhline(1.0, color='gray', lw=0.8)
    task = spec[0]['task'] if spec else ''
    ax.set(title=f'{task}, temperature {temp}', xlabel='gamma', ylabel='walltime speedup vs AR')
    ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
