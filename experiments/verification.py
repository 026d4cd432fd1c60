r"""Token vs block verification, as Sun et al. 2024 ("Block Verification Accelerates Speculative
Decoding", arXiv 2403.10444) compare them, on the shipped EN->DE pair.

  python -m experiments.verification --config=experiments/configs/verification.py
  python -m experiments.verification --config=experiments/configs/verification.py:runlocal
  python -m experiments.verification --config=experiments/configs/verification.py:batch

The config (experiments/configs/verification.py) lists the parts and what each measures: the
exact accepted-length CCDF on Sun et al.'s two-token toy model (their Figure 3a), the sweep of
drafter x gamma x temperature x seed (Tables 1-2, Figures 4-5; with several batch sizes, App. D.1)
and the accepted-length CCDF on the real pair from the decode loop's trace (Figure 3b). Writes to
--workdir (default: config.workdir), each row as soon as it is measured:

  runs.csv / .json      every timed decoding run: drafter, method, temp, gamma, batch_size, seed,
                        alpha, block_efficiency (tokens per target call), tokens, seconds,
                        tokens_per_s, speedup (autoregressive seconds of the same temperature,
                        batch size and seed / this run's seconds)
  summary.csv / .json   mean and standard deviation over seeds of each (drafter, method, temp,
                        gamma, batch_size), and the relative gain (%) over token verification in
                        block efficiency and speedup (gain of the means; its std over seeds is
                        that of the per-seed paired gains)
  ccdf.csv / .json      P(accepted length >= k), k = 0..gamma: toy model (exact or Monte Carlo)
                        and real pair (trace)
  table.md              the summary as Sun et al.'s Tables 1-2 (token vs each other verifier)
  improvement.png       gain of each verifier over token vs gamma, one line per temperature, one
                        panel per drafter; block efficiency (Fig. 4) and speedup (Fig. 5) rows
  ccdf.png              Figure 3: the toy model's CCDF (exact) and the real pair's
  batch.png             with several batch sizes: tokens/s and block efficiency vs batch size

Seeds: seed s decodes batch i with PRNG key s * 2**20 + 1 + i, so seeds never share a key and
every verifier of one seed sees the same keys (common random numbers: the paired gains are less
noisy than the separate means). Third-party INFO logs only with --verbosity=0.
"""

import dataclasses
import itertools
import numbers
import os
from collections.abc import Iterator

import ml_collections
import numpy as np

from experiments import skeleton
from experiments import verification_report as report
from experiments import verification_toy as toy
from experiments.configs import common
from specdec_jax import decode, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import evaluation, tables, translation

PARTS = ('toy', 'sweep', 'ccdf')
RUN_COLUMNS = (
  'drafter',
  'method',
  'temp',
  'gamma',
  'batch_size',
  'seed',
  'alpha',
  'block_efficiency',
  'tokens',
  'seconds',
  'tokens_per_s',
  'speedup',
)
SUMMARY_COLUMNS = (
  'drafter',
  'method',
  'temp',
  'gamma',
  'batch_size',
  'num_seeds',
  'alpha_mean',
  'block_efficiency_mean',
  'block_efficiency_std',
  'tokens_per_s_mean',
  'tokens_per_s_std',
  'speedup_mean',
  'speedup_std',
  'block_efficiency_gain_pct',
  'block_efficiency_gain_pct_std',
  'speedup_gain_pct',
  'speedup_gain_pct_std',
)
CCDF_COLUMNS = (
  'model',
  'drafter',
  'method',
  'temp',
  'gamma',
  'k',
  'p_at_least_k',
  'exact',
  'mean_accepted',
  'samples',
  'estimate',
)
# Each table's one column spec (its lines are `verification_report.format_rows`' sentences).
TABLES = {
  name: tuple(tables.Column(column) for column in columns)
  for name, columns in (('runs', RUN_COLUMNS), ('summary', SUMMARY_COLUMNS), ('ccdf', CCDF_COLUMNS))
}
_SEED_STRIDE = 1 << 20  # seed s uses PRNG keys s * stride + 0 .. number of batches

# ----------------------------------------------------------------------------------------------
# Checking the config and loading the pair.


def _ints(config, name: str, minimum: int) -> None:
  values = tuple(config[name])
  if not values or any(
    isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < minimum for v in values
  ):
    raise ValueError(f'config.{name} must hold ints >= {minimum}, got {values}.')
  if len(set(values)) != len(values):
    raise ValueError(f'config.{name} has repeated values: {values}.')


def check(config) -> None:
  """Checks the fields this experiment adds to the main job's (evaluation.prepare checks those).

  Raises:
    ValueError naming the bad setting.
  """
  unknown = set(config.parts) - set(PARTS)
  if not config.parts or unknown:
    raise ValueError(f'config.parts must name some of {PARTS}, got {tuple(config.parts)}.')
  if not config.verifiers:
    raise ValueError('config.verifiers must name at least one verifier.')
  for name in config.verifiers:
    verifiers.check_verifier(name)
  _ints(config, 'seeds', 0)
  _ints(config, 'batch_sizes', 1)
  _ints(config, 'num_drafts', 1)
  for stop in config.draft_stops:
    try:
      stop = float(stop)  # not a number: 'none', or text
    except (TypeError, ValueError):
      raise ValueError(f'config.draft_stops must hold numbers, got {config.draft_stops}.') from None
    decode.LoopSpec(  # raises on a draft stop outside (0, 1)
      sampling=sampling_lib.SamplingConfig(temperature=1.0),
      max_new_tokens=1,
      gamma=1,
      draft_stop=stop,
    )
  _ints(config, 'toy_gammas', 1)
  if max(config.toy_gammas) > 12:
    raise ValueError('config.toy_gammas must be <= 12 (V**gamma draft blocks are enumerated).')
  if 'ccdf' in config.parts:
    _ints(config, 'ccdf_gammas', 1)
    for t in config.ccdf_temperatures:
      sampling_lib.SamplingConfig(temperature=t)
    if not config.ccdf_temperatures:
      raise ValueError('config.ccdf_temperatures is empty.')
  if isinstance(config.toy_samples, bool) or config.toy_samples < 1:
    raise ValueError(f'config.toy_samples must be an int >= 1, got {config.toy_samples!r}.')


def prepare(config) -> evaluation.Plan | None:
  """Checks the config and loads the pair and test sources (None when only 'toy' runs), before
  anything is decoded: `evaluation.prepare` on the settings the decoding parts use."""
  check(config)
  if not {'sweep', 'ccdf'} & set(config.parts):
    return None
  ccdf = 'ccdf' in config.parts
  view = ml_collections.ConfigDict(
    dict(
      pretrained=config.pretrained,
      drafters=tuple(config.drafters),
      num_examples=config.num_examples,
      batch_size=max(config.batch_sizes),
      max_source_length=config.max_source_length,
      max_new_tokens=config.max_new_tokens,
      temperatures=tuple(config.temperatures) + (tuple(config.ccdf_temperatures) if ccdf else ()),
      gammas=tuple(config.gammas) + (tuple(config.ccdf_gammas) if ccdf else ()),
      verifiers=tuple(config.verifiers),
      seed=config.seeds[0],
    )
  )
  plan = evaluation.prepare(view)
  if config.sort_by_length:
    encode = plan.pair.tokenizer.encode
    order = sorted(range(len(plan.sources)), key=lambda i: len(encode(plan.sources[i])))
    plan = dataclasses.replace(
      plan,
      sources=[plan.sources[i] for i in order],
      references=[plan.references[i] for i in order],
    )
  return plan


def num_sentences(config, plan) -> int:
  """Sentences the decoding parts translate (timed or traced), for a progress bar."""
  if plan is None:
    return 0
  c, total = config, 0
  if 'sweep' in c.parts:
    methods = 1 + len(plan.drafters) * len(c.gammas) * len(sweep_methods(c))
    total += len(c.temperatures) * len(c.batch_sizes) * len(c.seeds) * methods
  if 'ccdf' in c.parts:
    total += len(plan.drafters) * len(c.ccdf_gammas) * len(c.ccdf_temperatures) * len(c.verifiers)
  return total * len(plan.sources)


# ----------------------------------------------------------------------------------------------
# The parts: each yields (table name, rows) as soon as the rows are measured.


def sweep_methods(config) -> list[str]:
  """The sweep's decoding methods: each verifier as is ('token'), then with each K > 1 of
  `num_drafts` draft paths ('token/K2': verify_multipath's verifier of that name) and with each
  draft stop of `draft_stops` ('block/stop0.5': adaptive draft length)."""
  out = []
  for verifier in config.verifiers:
    out.append(verifier)
    out += [f'{verifier}/K{k}' for k in config.num_drafts if k > 1]
    out += [f'{verifier}/stop{float(stop):g}' for stop in config.draft_stops]
  return out


def method_options(method: str) -> tuple[str, dict]:
  """(verifier or 'autoregressive', speculative_generate's keywords) of a sweep method name."""
  verifier, _, variant = method.partition('/')
  if variant.startswith('K'):
    return verifier, dict(num_drafts=int(variant[1:]))
  if variant.startswith('stop'):
    return verifier, dict(draft_stop=float(variant[4:]))
  return verifier, {}


def _decode(config, plan, drafter, method, gamma, temperature, batch_size, seed, **kw):
  method, options = method_options(method)
  return translation.translate(
    plan.pair.target,
    drafter,
    plan.pair.tokenizer,
    plan.sources,
    method=method,
    gamma=gamma,
    sampling=sampling_lib.SamplingConfig(temperature=temperature),
    batch_size=batch_size,
    max_source_length=config.max_source_length,
    max_new_tokens=config.max_new_tokens,
    seed=seed * _SEED_STRIDE,
    **options,
    **kw,
  )


def sweep_rows(config, plan, on_batch=None) -> Iterator[tuple[str, list[dict]]]:
  """Autoregressive baselines, then every drafter x gamma x temperature x batch size x seed x
  verifier; the summary of a (drafter, gamma, temperature, batch size) once all its seeds ran."""
  c = config
  baseline = {}  # (temp, batch_size, seed) -> seconds

  def row(drafter, method, temp, gamma, batch_size, seed, run):
    speedup = 1.0 if method == 'autoregressive' else baseline[temp, batch_size, seed] / run.seconds
    return dict(
      drafter=drafter,
      method=method,
      temp=temp,
      gamma=gamma,
      batch_size=batch_size,
      seed=seed,
      alpha=None if method == 'autoregressive' else float(run.stats.alpha),
      block_efficiency=float(run.stats.block_efficiency),
      tokens=run.tokens,
      seconds=run.seconds,
      tokens_per_s=run.tokens / run.seconds,
      speedup=speedup,
    )

  for temp, batch_size in itertools.product(c.temperatures, c.batch_sizes):
    group = []
    for seed in c.seeds:
      run = _decode(c, plan, None, 'autoregressive', 1, temp, batch_size, seed, on_batch=on_batch)
      baseline[temp, batch_size, seed] = run.seconds
      group.append(row('-', 'autoregressive', temp, 0, batch_size, seed, run))
      yield 'runs', group[-1:]
    yield 'summary', summarize(group)
  for name, drafter in plan.drafters.items():
    for gamma, temp, batch_size in itertools.product(c.gammas, c.temperatures, c.batch_sizes):
      group = []
      for seed, method in itertools.product(c.seeds, sweep_methods(c)):
        run = _decode(c, plan, drafter, method, gamma, temp, batch_size, seed, on_batch=on_batch)
        group.append(row(name, method, temp, gamma, batch_size, seed, run))
        yield 'runs', group[-1:]
      yield 'summary', summarize(group)


def ccdf_rows(config, plan, on_batch=None) -> Iterator[tuple[str, list[dict]]]:
  """The real pair's accepted-length CCDF from the decode loop's trace (first seed, smallest
  batch size), over every iteration in which a row was still emitting."""
  c = config
  for name, drafter in plan.drafters.items():
    for gamma, temp in itertools.product(c.ccdf_gammas, c.ccdf_temperatures):
      for method in c.verifiers:
        batch_size, seed = min(c.batch_sizes), c.seeds[0]
        run = _decode(
          c, plan, drafter, method, gamma, temp, batch_size, seed, on_batch=on_batch, trace=True
        )
        ccdf = toy.ccdf_of_lengths(run.accepted_lengths, gamma)
        yield (
          'ccdf',
          [
            dict(
              model=f'EnDe ({plan.pair.directory.name})',
              drafter=name,
              method=method,
              temp=temp,
              gamma=gamma,
              k=k,
              p_at_least_k=float(value),
              exact=None,
              mean_accepted=float(ccdf[1:].sum()),
              samples=int(run.accepted_lengths.size),
              estimate='trace',
            )
            for k, value in enumerate(ccdf)
          ],
        )


def _mean_std(values) -> tuple[float | None, float | None]:
  """Mean and sample standard deviation (ddof 1; None for one value) of the non-None values."""
  values = [v for v in values if v is not None]
  if not values:
    return None, None
  std = float(np.std(values, ddof=1)) if len(values) > 1 else None
  return float(np.mean(values)), std


def summarize(group: list[dict]) -> list[dict]:
  """Summary rows (SUMMARY_COLUMNS) of the run rows of one (drafter, gamma, temp, batch size):
  per method, mean and std over seeds, and the gain (%) over the 'token' method of the group."""
  methods = list(dict.fromkeys(r['method'] for r in group))
  by_method = {m: {r['seed']: r for r in group if r['method'] == m} for m in methods}
  token = by_method.get('token')
  out = []
  for method in methods:
    runs = by_method[method]
    first = next(iter(runs.values()))
    summary = dict(
      drafter=first['drafter'],
      method=method,
      temp=first['temp'],
      gamma=first['gamma'],
      batch_size=first['batch_size'],
      num_seeds=len(runs),
      alpha_mean=_mean_std(r['alpha'] for r in runs.values())[0],
    )
    for key in ('block_efficiency', 'tokens_per_s', 'speedup'):
      summary[f'{key}_mean'], summary[f'{key}_std'] = _mean_std(r[key] for r in runs.values())
    for key in ('block_efficiency', 'speedup'):
      gain = std = None
      if token is not None and method != 'token':
        gain = 100 * (summary[f'{key}_mean'] / _mean_std(r[key] for r in token.values())[0] - 1)
        paired = [100 * (runs[s][key] / token[s][key] - 1) for s in runs if s in token]
        std = _mean_std(paired)[1]
      summary[f'{key}_gain_pct'], summary[f'{key}_gain_pct_std'] = gain, std
    out.append(summary)
  return out


def rows(config, plan, on_batch=None) -> Iterator[tuple[str, list[dict]]]:
  """Every part of the config, in the order of PARTS."""
  if 'toy' in config.parts:
    yield from toy.toy_rows(config)
  if 'sweep' in config.parts:
    yield from sweep_rows(config, plan, on_batch)
  if 'ccdf' in config.parts:
    yield from ccdf_rows(config, plan, on_batch)


# ----------------------------------------------------------------------------------------------
# The whole experiment.


def run(config, workdir: str, *, progress: bool = True, echo=print) -> dict[str, str]:
  """Runs every part of `config`, writing each table row by row into `workdir` and echoing a line
  per finished row (through tqdm.write while the progress bar shows); the figures and table.md at
  the end, also after an interruption. Returns the paths written."""
  from tqdm.auto import tqdm  # imported here: only a progress bar needs it

  plan = prepare(config)  # fails here, before anything is decoded or written
  header = None
  if plan is not None:
    c = config
    header = (
      f'{len(plan.sources)} test sentences of {plan.pair.directory} ({plan.truncated} truncated '
      f'to {c.max_source_length} tokens), drafters {list(plan.drafters)}, verifiers '
      f'{tuple(c.verifiers)}, gammas {tuple(c.gammas)}, temperatures {tuple(c.temperatures)}, '
      f'batch sizes {tuple(c.batch_sizes)}, seeds {tuple(c.seeds)}; parts {tuple(c.parts)}'
    )
  bar = tqdm(
    total=num_sentences(config, plan),
    unit='sentence',
    disable=not progress or plan is None,
    dynamic_ncols=True,
    mininterval=2.0,
  )
  say = tqdm.write if progress else echo

  def measure(results):
    try:
      for table, table_rows in rows(config, plan, on_batch=bar.update):
        for row in table_rows:
          results.add(table, row)
        results.say(report.format_rows(table, table_rows))
    finally:
      bar.close()

  def finish(results):
    paths = {}
    for name in TABLES:
      paths.update(results.paths(name, f'{name}.'))
    summary, ccdf = results.rows['summary'], results.rows['ccdf']
    figures = {
      'improvement.png': lambda p: report.plot_improvement(summary, p),
      'ccdf.png': lambda p: report.plot_ccdf(ccdf, p),
      'batch.png': lambda p: report.plot_batch(summary, p),
    }
    for name, draw in figures.items():
      path = os.path.join(workdir, name)
      if os.path.exists(path):
        os.remove(path)
      if draw(path):
        paths[name] = path
    if summary:
      text = report.format_tables(summary)
      paths['table.md'] = os.path.join(workdir, 'table.md')
      with open(paths['table.md'], 'w') as f:
        f.write(text + '\n')
      echo(text)
    return paths

  return skeleton.run(
    workdir,
    [skeleton.Table(name, columns, printed=False) for name, columns in TABLES.items()],
    header=header,
    measure=measure,
    finish=finish,
    echo=say,
  )


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: print(
      'Wrote', ', '.join(p for p in run(config, workdir).values() if os.path.exists(p)), flush=True
    )
  )
