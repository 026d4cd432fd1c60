r"""Table 3 of Leviathan et al. 2022 on our pairs: alpha by drafter and sampling setting.

  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py
  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py:runlocal --workdir=/tmp/x

For every pair (task) of the config, drafter and sampling setting: one speculative run over the
pair's test sentences (token verification, `config.gamma`), whose `DecodeStats.alpha` is the
mean of beta = sum_x min(p, q) over the positions it verified, on contexts distributed as the
target's own samples (the run is lossless); the paper takes the same expectation over 10K tokens
sampled from the target. Each row is printed as it finishes, beside the paper's number for the
matching drafter kind where the paper has one, and appended to alpha_table.csv / .json in
--workdir (default: config.workdir); alpha_table.png at the end.
"""

import dataclasses
import os
import re

import ml_collections
import numpy as np
from matplotlib import figure

from experiments import skeleton
from experiments.configs import common
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import evaluation, tables, translation

# Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding"
# (arXiv:2211.17192 v2, ICML 2023), Table 3: empirical alpha with target T5-XXL (11B), as
# (argmax t=0, standard sampling t=1). The GPT-like (97M) and LaMDA (137B) rows of the table have
# other targets and are not listed; no row of Table 3 uses top-k or top-p with a T5 target (the
# LaMDA t=1 rows go through a top-40 filter).
PAPER_TABLE3 = {
  'EnDe': {
    'unigram': (0.08, 0.07),
    'bigram': (0.20, 0.19),
    'T5-small': (0.75, 0.62),
    'T5-base': (0.80, 0.68),
    'T5-large': (0.82, 0.71),
  },
  'CNNDM': {
    'unigram': (0.13, 0.08),
    'bigram': (0.23, 0.16),
    'T5-small': (0.65, 0.53),
    'T5-base': (0.73, 0.55),
    'T5-large': (0.74, 0.56),
  },
}
PAPER_TASKS = {
  'ende': 'EnDe',
  'ende48m': 'EnDe',
  'debsumm48m': 'CNNDM',
}  # our pair -> the paper's task
# Our drafter -> its kind in the paper. 'small-t5' is an independently trained small T5 of the
# target's family, as T5-small is to T5-XXL; the distilled drafter has no counterpart there.
PAPER_DRAFTERS = {'unigram': 'unigram', 'bigram': 'bigram', 'small-t5': 'T5-small'}

_LABEL = re.compile(r't(?P<t>\d+(?:\.\d*)?)(?:-k(?P<k>\d+))?(?:-p(?P<p>\d*\.?\d+))?')


def parse_sampling(label: str) -> sampling_lib.SamplingConfig:
  """`t<temperature>[-k<top_k>][-p<top_p>]` -> SamplingConfig, e.g. 't1-k5'; ValueError if not."""
  match = _LABEL.fullmatch(str(label))
  if not match:
    raise ValueError(
      f'Bad sampling label {label!r}: use t<temperature>[-k<top_k>][-p<top_p>], e.g. t0, t1, '
      't1-k20, t0.7-p0.9.'
    )
  return sampling_lib.SamplingConfig(
    temperature=float(match['t']),
    top_k=int(match['k'] or 0),
    top_p=float(match['p'] or 1.0),
  )


def paper_alpha(task: str, drafter: str, sampling: sampling_lib.SamplingConfig):
  """(paper's drafter, its Table 3 alpha) for a plain t=0 / t=1 setting, else (None, None)."""
  kind = PAPER_DRAFTERS.get(drafter)
  plain = sampling.top_k == 0 and sampling.top_p == 1.0 and sampling.temperature in (0.0, 1.0)
  if task not in PAPER_TABLE3 or kind not in PAPER_TABLE3[task] or not plain:
    return None, None
  return f'T5-XXL/{kind}', PAPER_TABLE3[task][kind][int(sampling.temperature)]


@dataclasses.dataclass
class Task:
  name: str  # the paper's task name where known, else the pair's
  plan: evaluation.Plan  # the pair, its requested drafters (those it has), the sentences


def prepare(config) -> tuple[list[Task], dict[str, sampling_lib.SamplingConfig]]:
  """Checks every setting and loads every pair before anything is decoded.

  Raises:
    ValueError naming the bad setting (a sampling label, a drafter no pair has, ...).
  """
  samplings = {label: parse_sampling(label) for label in config.samplings}
  if not samplings or not config.pairs or not config.drafters:
    raise ValueError('config.samplings, config.pairs and config.drafters must not be empty.')
  tasks = []
  for pair_name in config.pairs:
    pair_config = ml_collections.ConfigDict(
      dict(
        pretrained=pair_name,
        drafters=('all',),
        num_examples=config.num_examples,
        batch_size=config.batch_size,
        max_source_length=config.max_source_length,
        max_new_tokens=config.max_new_tokens,
        temperatures=tuple(s.temperature for s in samplings.values()),
        gammas=(config.gamma,),
        verifiers=(config.verifier,),
        seed=config.seed,
      )
    )
    plan = evaluation.prepare(pair_config)
    plan.drafters = {n: plan.drafters[n] for n in config.drafters if n in plan.drafters}
    tasks.append(Task(PAPER_TASKS.get(str(pair_name), str(pair_name)), plan))
  found = {n for task in tasks for n in task.plan.drafters}
  missing = [n for n in config.drafters if n not in found]
  if missing:
    raise ValueError(f'Drafter(s) {missing} are in none of the pairs {tuple(config.pairs)}.')
  return tasks, samplings


def rows(tasks: list[Task], samplings: dict, config):
  """Yields one row per (task, drafter, sampling) as soon as it is measured."""
  for task in tasks:
    pair = task.plan.pair
    for name, drafter in task.plan.drafters.items():
      for label, sampling in samplings.items():
        run = translation.translate(
          pair.target,
          drafter,
          pair.tokenizer,
          task.plan.sources,
          method=config.verifier,
          gamma=config.gamma,
          sampling=sampling,
          batch_size=config.batch_size,
          max_source_length=config.max_source_length,
          max_new_tokens=config.max_new_tokens,
          seed=config.seed,
        )
        paper_drafter, paper = paper_alpha(task.name, name, sampling)
        yield dict(
          task=task.name,
          drafter=name,
          sampling=label,
          temp=sampling.temperature,
          top_k=sampling.top_k,
          top_p=sampling.top_p,
          gamma=config.gamma,
          alpha=float(run.stats.alpha),
          block_efficiency=float(run.stats.block_efficiency),
          positions=int(run.stats.beta_count),
          tokens=run.tokens,
          paper_drafter=paper_drafter,
          paper_alpha=paper,
        )


# The table's one column spec: alpha_table.csv / .json hold every column, the lines the printed.
TABLE = (
  tables.Column('task', width=7, align='<'),
  tables.Column('drafter', width=10, align='<'),
  tables.Column('sampling', width=9, align='<'),
  tables.Column('temp', printed=False),
  tables.Column('top_k', printed=False),
  tables.Column('top_p', printed=False),
  tables.Column('gamma', printed=False),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('block_efficiency', 'tok/call', '.2f', 8),
  tables.Column('positions', fmt='d', width=9),
  tables.Column('tokens', printed=False),
  tables.Column('paper_drafter', 'paper (Table 3)', width=16, align='<'),
  tables.Column('paper_alpha', 'alpha', '.2f', 5),
)
PAPER_TABLE = (
  tables.Column('drafter', width=10, align='<'),
  tables.Column('t0', 't=0', '.2f', 5),
  tables.Column('t1', 't=1', '.2f', 5),
)


def format_paper(task: str) -> str:
  """The paper's Table 3 rows for `task` (all its T5-XXL drafters), for reference."""
  if task not in PAPER_TABLE3:
    return f'(Table 3 has no {task} rows)'
  paper = [dict(drafter=k, t0=a0, t1=a1) for k, (a0, a1) in PAPER_TABLE3[task].items()]
  return f'Leviathan et al. Table 3, T5-XXL ({task}):\n' + tables.format_table(paper, PAPER_TABLE)


def plot(table: list[dict], path: str) -> None:
  """Grouped bars: alpha per drafter (groups) and sampling (bars), one panel per task; the
  paper's Table 3 value as a black tick on the bars that have one."""
  tasks = list(dict.fromkeys(r['task'] for r in table))
  fig = figure.Figure(figsize=(1.2 + 2.2 * _max_drafters(table), 3.8 * len(tasks)))
  axes = fig.subplots(len(tasks), 1, squeeze=False)[:, 0]
  for ax, task in zip(axes, tasks):
    sub = [r for r in table if r['task'] == task]
    drafters = list(dict.fromkeys(r['drafter'] for r in sub))
    labels = list(dict.fromkeys(r['sampling'] for r in sub))
    width = 0.8 / len(labels)
    for j, label in enumerate(labels):
      by_drafter = {r['drafter']: r for r in sub if r['sampling'] == label}
      x = (
        np.array([i for i, d in enumerate(drafters) if d in by_drafter])
        + (j - 0.5 * (len(labels) - 1)) * width
      )
      ys = [by_drafter[d]['alpha'] for d in drafters if d in by_drafter]
      ax.bar(x, ys, width, label=label)
      for xi, d in zip(x, [d for d in drafters if d in by_drafter]):
        if by_drafter[d]['paper_alpha'] is not None:
          ax.plot([xi - width / 2, xi + width / 2], [by_drafter[d]['paper_alpha']] * 2, 'k-', lw=2)
    if any(r['paper_alpha'] is not None for r in sub):
      ax.plot([], [], 'k-', lw=2, label='paper (T5-XXL, Table 3)')
    ax.set_xticks(range(len(drafters)), drafters)
    ax.set(ylim=(0, 1), ylabel='alpha', title=f'{task}: alpha by drafter and sampling')
    ax.grid(axis='y', alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)


def _max_drafters(table) -> int:
  return max(
    len({r['drafter'] for r in table if r['task'] == t}) for t in {r['task'] for r in table}
  )


def run(config, workdir: str, *, echo=print) -> dict[str, str]:
  """Measures every row of `config`, writing each as it finishes; returns the output paths."""
  tasks, samplings = prepare(config)
  header = [
    f'{task.name}: {len(task.plan.sources)} test sentences of {task.plan.pair.directory}, batch '
    f'{config.batch_size}; drafters {list(task.plan.drafters)} x samplings {list(samplings)}; '
    f'{config.verifier} verification, gamma {config.gamma}'
    for task in tasks
  ]

  def finish(results):
    table = results.rows['alpha_table']
    paths = results.paths('alpha_table')
    if table:
      paths['png'] = os.path.join(workdir, 'alpha_table.png')
      plot(table, paths['png'])
    for task in tasks:
      results.say(format_paper(task.name))
    results.say(f'{len(table)} rows in ' + ', '.join(paths.values()))
    return paths

  return skeleton.run(
    workdir,
    [skeleton.Table('alpha_table', TABLE)],
    header=header,
    measure=lambda results: (('alpha_table', row) for row in rows(tasks, samplings, config)),
    finish=finish,
    echo=echo,
  )


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: run(config, workdir, echo=lambda s: print(s, flush=True))
  )
