r"""A check of Sun et al. 2024's Appendix C statement (arXiv 2403.10444; its Table 4 could not be
retrieved, so this is no reproduction of it): greedy block verification keeps more drafts per
iteration than block verification, but is slower overall. Token, block and greedy block
verification on our pairs, per iteration and over whole sequences.

  python -m experiments.greedy_block --config=experiments/configs/greedy_block.py
  python -m experiments.greedy_block --config=experiments/configs/greedy_block.py:runlocal

For each task of the config (a main-job config, experiments/configs/<task>.py: its pair, source
and output lengths) and each gamma, at one temperature, with one drafter:
  whole sequences   the main job's timing (`translation.translate_in_turn`, batch `batch_size`):
                    every batch decoded autoregressively, then with each verifier, each call
                    timed; block efficiency (tokens per target call), alpha, speedup (the
                    autoregressive seconds of the same batches / the verifier's), tokens/s, BLEU.
  first iteration   untimed: every test source repeated `first_samples` times, decoded in batches
                    of `first_batch_size` with max_new_tokens = gamma + 1; the mean of
                    `DecodeStats.first_accepted` + 1 over those rows and its standard error. Every
                    verifier starts from the target's own law there, so this is where greedy block
                    verification's per-block optimum shows (docs/method.md section 11).
  paired seeds      untimed whole sequences again, once per seed of `paired_seeds` (batches of
                    `paired_batch_size`), the three verifiers of a seed decoding each batch with
                    the same key: tokens per target call per (seed, verifier), and per
                    gamma the paired differences greedy block - block and greedy block - token
                    over the seeds (mean, spread, and at how many seeds the difference is < 0).
                    `:paired` runs this section alone.
Each row is printed as it finishes and appended to results.csv / .json (paired.csv / .json) in
--workdir (default: config.workdir); table.md (the three verifiers side by side) and paired.md
(the differences) at the end.
"""

import dataclasses
import itertools
import math
import os
import time

import jax
import numpy as np

from experiments import skeleton
from experiments.configs import common, debsumm, ende
from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import evaluation, tables, translation

TASKS = {'ende': ende, 'debsumm': debsumm}  # main-job configs a task can name
# The table's one column spec: results.csv / .json hold every column, its lines the printed.
TABLE = (
  tables.Column('task', width=7, align='<'),
  tables.Column('pair', printed=False),
  tables.Column('drafter', printed=False),
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('method', width=12, align='<'),
  tables.Column('temp', printed=False),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('first_block_efficiency', 'first iter.', '.3f', 11),
  tables.Column('first_block_efficiency_se', '+-', '.3f', 5),
  tables.Column('first_samples', printed=False),
  tables.Column('block_efficiency', 'whole seq.', '.3f', 10),
  tables.Column('speedup', fmt='.2f', suffix='x', width=7),
  tables.Column('tokens_per_s', 'tok/s', '.1f', 7),
  tables.Column('seconds', printed=False),
  tables.Column('baseline_seconds', printed=False),
  tables.Column('bleu', fmt='.2f', width=6),
  tables.Column('sentences', printed=False),
)
# The paired section's rows: one per (task, gamma, seed, verifier).
PAIRED = (
  tables.Column('task', width=7, align='<'),
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('seed', fmt='d', width=4),
  tables.Column('method', width=12, align='<'),
  tables.Column('block_efficiency', 'tok/call', '.3f', 8),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('target_calls', 'calls', 'd', 6),
  tables.Column('temp', printed=False),
  tables.Column('sentences', printed=False),
)


@dataclasses.dataclass
class Task:
  name: str  # the main job's task name (EnDe, DebSumm)
  config: object  # the main-job config the task's rows use
  plan: evaluation.Plan


def task_config(config, task: str):
  """The main job's config of `task` with this experiment's drafter (and no other), gammas,
  temperature, verifiers, sentences, batch size and seed."""
  if task not in TASKS:
    raise ValueError(f'Unknown task {task!r} in config.tasks; choose from {sorted(TASKS)}.')
  c = TASKS[task].get_config()
  c.drafters, c.gammas = (config.drafter,), tuple(config.gammas)
  c.block_drafters = ()  # the main job's block rows: greedy block verification refuses them
  c.temperatures, c.verifiers = (config.temperature,), tuple(config.verifiers)
  c.num_examples, c.batch_size, c.seed = config.num_examples, config.batch_size, config.seed
  return c


def prepare(config) -> list[Task]:
  """Checks every setting and loads every pair before anything is decoded.

  Raises:
    ValueError naming the bad setting.
  """
  if not config.tasks:
    raise ValueError('config.tasks is empty.')
  for name in ('first_samples', 'first_batch_size', 'paired_batch_size'):
    if isinstance(config[name], bool) or not isinstance(config[name], int) or config[name] < 1:
      raise ValueError(f'config.{name} must be an int >= 1, got {config[name]!r}.')
  tasks = []
  for name in config.tasks:
    c = task_config(config, name)
    tasks.append(Task(c.task, c, evaluation.prepare(c)))
  return tasks


def first_iteration(plan: evaluation.Plan, c, method: str, gamma: int, config):
  """(mean tokens of the first iteration, its standard error, rows) of `method` over every test
  source repeated `config.first_samples` times (untimed, batches of `config.first_batch_size`)."""
  pair, drafter = plan.pair, plan.drafters[config.drafter]
  sources = [s for s in plan.sources for _ in range(config.first_samples)]
  size = config.first_batch_size
  taus = []
  for i in range(0, len(sources), size):
    texts = sources[i : i + size]
    ids, mask = pair.tokenizer.encode_batch(
      texts + [''] * (size - len(texts)), c.max_source_length, truncate=True
    )
    out = decode.speculative_generate(
      pair.target, drafter, ids, mask, gamma=gamma, verifier=method,
      sampling=sampling_lib.SamplingConfig(temperature=config.temperature),
      max_new_tokens=gamma + 1, rng=jax.random.key(config.seed + 1_000_003 + i),
    )  # fmt: skip
    taus.append(np.asarray(out.stats.first_accepted)[: len(texts)])
  taus = np.concatenate(taus).astype(np.float64)
  return float(taus.mean() + 1), float(taus.std(ddof=1) / math.sqrt(taus.size)), int(taus.size)


def rows(tasks: list[Task], config):
  """Yields one row per (task, gamma, verifier) as soon as it is measured (none unless
  `config.timed`)."""
  for task in tasks if config.timed else ():
    plan, c = task.plan, task.config
    for gamma in config.gammas:
      runs = translation.translate_in_turn(
        drafter=plan.drafters[config.drafter],
        methods=(translation.AUTOREGRESSIVE, *config.verifiers),
        gamma=gamma,
        **plan.decoding(config.temperature),
      )
      baseline = runs[translation.AUTOREGRESSIVE]
      for method in config.verifiers:
        run = runs[method]
        first, first_se, samples = first_iteration(plan, c, method, gamma, config)
        yield dict(
          task=task.name,
          pair=plan.pair.directory.name,
          drafter=config.drafter,
          method=method,
          temp=config.temperature,
          gamma=gamma,
          alpha=float(run.stats.alpha),
          first_block_efficiency=first,
          first_block_efficiency_se=first_se,
          first_samples=samples,
          block_efficiency=float(run.stats.block_efficiency),
          speedup=baseline.seconds / run.seconds,
          tokens_per_s=run.tokens / run.seconds,
          seconds=run.seconds,
          baseline_seconds=baseline.seconds,
          bleu=plan.bleu(run.hypotheses),
          sentences=len(plan.sources),
        )


def paired_rows(tasks: list[Task], config):
  """Yields one row per (task, gamma, seed, verifier): whole sequences, untimed, in batches of
  `paired_batch_size`, the verifiers of a seed decoding every batch with the same key."""
  for task in tasks:
    plan, c = task.plan, task.config
    pair, drafter = plan.pair, plan.drafters[config.drafter]
    size = config.paired_batch_size
    batches = [plan.sources[i : i + size] for i in range(0, len(plan.sources), size)]
    encoded = [
      pair.tokenizer.encode_batch(b + [''] * (size - len(b)), c.max_source_length, truncate=True)
      for b in batches
    ]
    for gamma in config.gammas:
      for seed in config.paired_seeds:
        for method in config.verifiers:
          stats = []
          for n, (texts, (ids, mask)) in enumerate(zip(batches, encoded)):
            out = decode.speculative_generate(
              pair.target, drafter, ids, mask, gamma=gamma, verifier=method,
              sampling=sampling_lib.SamplingConfig(temperature=config.temperature),
              max_new_tokens=c.max_new_tokens, rng=jax.random.key(seed * 1_000_003 + n),
            )  # fmt: skip
            stats.append(jax.tree.map(lambda x, k=len(texts): np.asarray(x)[:k], out.stats))
          pooled = jax.tree.map(lambda *x: np.concatenate(x).sum(0), *stats)
          yield dict(
            task=task.name, gamma=gamma, seed=seed, method=method,
            block_efficiency=float(pooled.block_efficiency), alpha=float(pooled.alpha),
            target_calls=int(pooled.target_calls), temp=config.temperature,
            sentences=len(plan.sources),
          )  # fmt: skip


def paired_differences(results: list[dict], verifiers) -> list[dict]:
  """Per (task, gamma), each verifier's tokens per call over the seeds (mean, sample sd) and the
  paired differences of the last verifier against each other one: per seed, their mean and sample
  sd, and at how many seeds the difference is below 0."""
  groups = {}
  for r in results:
    groups.setdefault((r['task'], r['gamma']), {}).setdefault(r['method'], {})[r['seed']] = r[
      'block_efficiency'
    ]
  last, out = verifiers[-1], []
  for (task, gamma), by in groups.items():
    seeds = sorted(set.intersection(*(set(by.get(m, {})) for m in verifiers)))
    if not seeds:
      continue
    value = {m: np.array([by[m][s] for s in seeds]) for m in verifiers}
    row = dict(task=task, gamma=gamma, seeds=len(seeds))
    for m in verifiers:
      row[m] = (float(value[m].mean()), _sd(value[m]))
    for m in verifiers[:-1]:
      d = value[last] - value[m]
      row[f'{last} - {m}'] = (float(d.mean()), _sd(d), int((d < 0).sum()), d.tolist())
    out.append(row)
  return out


def _sd(x: np.ndarray) -> float:
  return float(x.std(ddof=1)) if x.size > 1 else float('nan')


def format_paired(summary: list[dict], verifiers) -> str:
  """`paired_differences` as markdown: tokens per call mean +- sd over the seeds, and each paired
  difference as mean +- sd [below 0 at k of n seeds] (per-seed values)."""
  last = verifiers[-1]
  diffs = [f'{last} - {m}' for m in verifiers[:-1]]
  lines = [
    f'| task | gamma | seeds | tokens per call: {" / ".join(verifiers)} | '
    + ' | '.join(diffs)
    + ' |',
    '|---|---:|---:|---|' + '---|' * len(diffs),
  ]
  for r in summary:
    cells = ' / '.join(f'{r[m][0]:.3f} +- {r[m][1]:.3f}' for m in verifiers)
    ds = [
      f'{mean:+.3f} +- {sd:.3f} [< 0 at {below} of {r["seeds"]}] '
      f'({", ".join(f"{v:+.3f}" for v in values)})'
      for mean, sd, below, values in (r[d] for d in diffs)
    ]
    lines.append(
      f'| {r["task"]} | {r["gamma"]} | {r["seeds"]} | {cells} | ' + ' | '.join(ds) + ' |'
    )
  return '\n'.join(lines)


def format_table4(results: list[dict], verifiers) -> str:
  """Per task and gamma, first-iteration and whole-sequence block efficiency and speedup of each
  verifier side by side (markdown)."""
  names = ' / '.join(verifiers)
  lines = [
    f'| task | gamma | first iteration: {names} | whole sequences: {names} | speedup: {names} |',
    '|---|---:|---|---|---|',
  ]
  groups = {}
  for r in results:
    groups.setdefault((r['task'], r['gamma']), {})[r['method']] = r
  for (task, gamma), by in groups.items():
    cell = lambda key, fmt: ' / '.join(
      format(by[m][key], fmt) if m in by and by[m][key] is not None else '-' for m in verifiers
    )
    first = ' / '.join(
      f'{by[m]["first_block_efficiency"]:.3f} +- {by[m]["first_block_efficiency_se"]:.3f}'
      if m in by
      else '-'
      for m in verifiers
    )
    lines.append(
      f'| {task} | {gamma} | {first} | {cell("block_efficiency", ".3f")} | '
      f'{cell("speedup", ".2f")} |'
    )
  return '\n'.join(lines)


def run(config, workdir: str, *, echo=print) -> dict[str, str]:
  """Every row of `config`, printed and written to `workdir` as it finishes; table.md at the end
  (also after an interruption). Returns the paths written."""
  tasks = prepare(config)  # fails here, before anything is decoded or written
  header = (
    f'tasks {[t.name for t in tasks]} ({[t.plan.pair.directory.name for t in tasks]}), '
    f'{config.num_examples} sentences each, drafter {config.drafter}, gammas '
    f'{tuple(config.gammas)}, temperature {config.temperature}, verifiers '
    f'{tuple(config.verifiers)}, batch {config.batch_size}; first iteration: '
    f'{config.first_samples} samples per sentence; timed section {"on" if config.timed else "off"}'
    f'; paired seeds {tuple(config.paired_seeds)} (batch {config.paired_batch_size})'
  )
  start = time.perf_counter()

  def finish(results):
    table = results.rows['results']
    paths = results.paths('results')
    if table:
      paths['table.md'] = os.path.join(workdir, 'table.md')
      with open(paths['table.md'], 'w') as f:
        f.write(format_table4(table, tuple(config.verifiers)) + '\n')
      results.say(format_table4(table, tuple(config.verifiers)))
    paired = results.rows['paired']
    if paired:
      paths.update(results.paths('paired', prefix='paired.'))
      paths['paired.md'] = os.path.join(workdir, 'paired.md')
      text = format_paired(paired_differences(paired, tuple(config.verifiers)), config.verifiers)
      with open(paths['paired.md'], 'w') as f:
        f.write(text + '\n')
      results.say(text)
    results.say(f'{time.perf_counter() - start:.0f} s after loading')
    return paths

  return skeleton.run(
    workdir,
    [skeleton.Table('results', TABLE), skeleton.Table('paired', PAIRED)],
    header=header,
    measure=lambda _: itertools.chain(
      (('results', row) for row in rows(tasks, config)),
      (('paired', row) for row in paired_rows(tasks, config)),
    ),
    finish=finish,
    echo=echo,
  )


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: print(
      'Wrote', ', '.join(p for p in run(config, workdir).values() if os.path.exists(p)), flush=True
    )
  )
