r"""Block drafting measured: tokens per target call, acceptance at each block position, and what
one block call costs against gamma calls of an autoregressive drafter (issue 45).

  python -m experiments.block_drafting --config=experiments/configs/block_drafting.py
  python -m experiments.block_drafting --config=experiments/configs/block_drafting.py:runlocal

For each pair, drafter, temperature, proposal ('argmax': each position's most likely token with a
one-hot q; 'sample': independent draws from each position's law; an autoregressive drafter is
measured with its own 'sample') and gamma: one speculative run over the pair's test sentences
(token verification, batches of `batch_size`: nothing is timed there), giving tokens per target
call (block efficiency), alpha, and the acceptance at each draft position (drafts at position j
accepted per target call: `DecodeStats.accepted_per_position`). Then, at batch 1 in the loop's
own iteration (`timing.step_costs`): the drafting cost of one iteration, `gamma * c + c_fixed`
target steps (one call for a block drafter; gamma for an autoregressive one), the pass cost, and
the formula's speedup at the measured tokens per call. Rows are printed as they finish and
written to block_drafting.csv / .json in --workdir.
"""

import numpy as np

from experiments import skeleton
from experiments.configs import common
from specdec_jax import analysis, decode, step_models
from specdec_jax.measure import evaluation, job_config, tables, timing, translation

TABLE = (
  tables.Column('task', width=10),
  tables.Column('drafter', width=9),
  tables.Column('temp', fmt='g', width=4),
  tables.Column('proposal', width=8),
  tables.Column('gamma', width=5),
  tables.Column('tokens_per_call', 'tok/call', fmt='.3f', width=8),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('accepted', 'accepted at position 1..gamma (per call)', width=44),
  tables.Column('num_calls', printed=False),
  tables.Column('pair', printed=False),  # a config.pairs entry (two may share a task)
)
COST_TABLE = (
  tables.Column('task', width=10),
  tables.Column('drafter', width=9),
  tables.Column('gamma', width=5),
  tables.Column('calls', width=5),
  tables.Column('draft_cost', 'draft/iter', fmt='.3f', width=10),
  tables.Column('c', fmt='.4f', width=7),
  tables.Column('c_fixed', fmt='.4f', width=7),
  tables.Column('pass_cost', 'pass', fmt='.3f', width=6),
  tables.Column('pair', printed=False),
)


def _plan(config, pair: str) -> evaluation.Plan:
  """The main job's plan for `pair` (its config: `debsumm.py`'s lengths for a debsumm pair,
  `ende.py`'s otherwise) with this experiment's drafters, sentences and gammas."""
  from experiments.configs import debsumm, ende

  main = (debsumm if 'debsumm' in str(pair) else ende).get_config()
  main.pretrained, main.drafters = pair, tuple(config.drafters)
  main.num_examples, main.batch_size = config.num_examples, config.batch_size
  main.gammas, main.block_gammas = tuple(config.gammas), tuple(config.block_gammas)
  return evaluation.prepare(main)


def _is_block(drafter) -> bool:
  return job_config.is_block(step_models.as_step_model(drafter)[0])


def acceptance_rows(plan: evaluation.Plan, config):
  """A row per (drafter, temperature, proposal, gamma): tokens per call and per-position
  acceptance over the plan's sentences."""
  for name, gamma in plan.groups:
    drafter = plan.drafters[name]
    proposals = config.proposals if _is_block(drafter) else ('sample',)
    for temperature in config.temperatures:
      for proposal in proposals if temperature > 0 else ('argmax',):
        run = translation.translate(
          drafter=drafter, method='token', gamma=gamma, proposal=proposal,
          **plan.decoding(temperature),
        )  # fmt: skip
        calls = int(run.stats.target_calls)
        accepted = np.asarray(run.stats.accepted_per_position) / max(calls, 1)
        yield dict(
          task=plan.task,
          drafter=name,
          temp=temperature,
          proposal=proposal,
          gamma=gamma,
          tokens_per_call=float(run.stats.block_efficiency),
          alpha=float(run.stats.alpha),
          accepted=' '.join(f'{a:.2f}' for a in accepted),
          num_calls=calls,
        )


def cost_rows(plan: evaluation.Plan, config):
  """A row per (drafter, gamma): the draft's cost per iteration in target steps at batch 1."""
  for name, gamma in plan.groups:
    drafter = plan.drafters[name]
    cost = timing.step_costs(
      plan.pair.target,
      drafter,
      batch_size=1,
      source_length=plan.config.max_source_length,
      gamma=gamma,
      cache_len=decode.buffer_length(plan.config.max_new_tokens, gamma),
      rounds=config.timing_rounds,
      repeats=config.timing_repeats,
    )
    yield dict(
      task=plan.task,
      drafter=name,
      gamma=gamma,
      calls=1 if _is_block(drafter) else gamma,
      draft_cost=gamma * cost['c'] + cost['c_fixed'],
      c=cost['c'],
      c_fixed=cost['c_fixed'],
      pass_cost=cost['pass_cost'],
    )


def predicted(acceptance: list[dict], costs: list[dict]) -> list[str]:
  """The formula's speedup at each measured tokens-per-call, by the costs of its pair's drafter at
  its gamma."""
  key = lambda row: (row['pair'], row['drafter'], row['gamma'])
  by = {key(c): c for c in costs}
  lines = []
  for row in acceptance:
    cost = by.get(key(row))
    if cost is not None:
      speedup = analysis.iteration_speedup(
        row['tokens_per_call'], row['gamma'], cost['c'], cost['pass_cost'], cost['c_fixed']
      )
      lines.append(
        f'{row["task"]} {row["drafter"]} T={row["temp"]:g} {row["proposal"]} '
        f'gamma {row["gamma"]}: {row["tokens_per_call"]:.3f} tokens / '
        f'{row["gamma"] * cost["c"] + cost["c_fixed"] + cost["pass_cost"]:.3f} steps '
        f'= {float(speedup):.2f}x'
      )
  return lines


def run(config, workdir: str, *, echo=print) -> dict:
  costs = lambda row: tables.format_line(row, COST_TABLE)  # under its header, after the pair's rows

  def measure(results):
    for pair in config.pairs:
      plan = _plan(config, pair)
      results.say(
        f'{plan.inputs_summary()}; drafters {sorted(plan.drafters)} at temperatures '
        f'{tuple(config.temperatures)}: gammas {tuple(config.gammas)} (block drafters '
        f'{tuple(config.block_gammas)}, proposals {tuple(config.proposals)}), token verification'
      )
      rows = acceptance_rows(plan, config)
      yield from (('block_drafting', dict(row, pair=str(pair))) for row in rows)
      if config.timing_rounds:
        results.say(tables.format_header(COST_TABLE))
        rows = cost_rows(plan, config)
        yield from (('block_drafting_costs', dict(row, pair=str(pair))) for row in rows)

  def finish(results):
    for line in predicted(results.rows['block_drafting'], results.rows['block_drafting_costs']):
      results.say(line)
    return {**results.paths('block_drafting'), **results.paths('block_drafting_costs', 'costs_')}

  tables_ = [
    skeleton.Table('block_drafting', TABLE),
    skeleton.Table('block_drafting_costs', COST_TABLE, line=costs),
  ]
  return skeleton.run(workdir, tables_, header=None, measure=measure, finish=finish, echo=echo)


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: run(config, workdir, echo=lambda s: print(s, flush=True))
  )
