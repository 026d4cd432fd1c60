r"""Token trees measured (issue 48): tokens per target call of a tree, a chain and K paths at an
equal node budget (positions one target pass scores), and what a tree pass of N nodes costs
against a chain pass of N positions.

  python -m experiments.token_trees --config=experiments/configs/token_trees.py
  python -m experiments.token_trees --config=experiments/configs/token_trees.py:runlocal

For each pair, temperature and node budget B, one speculative run over the pair's test sentences
per row (nothing timed there; tokens per call and alpha are exact counts); the block drafter is
the pair's drafter named `block_drafter` ('block' by default; ende48m also ships 'wide'):
  block chain     the block drafter, gamma = min(B - 1, block_size): gamma + 1 positions;
  block tree      the block drafter's best-first tree of B nodes, depth gamma (one drafter call);
  block sampled   its tree drawn without replacement, (B - 1) // 4 children at the root and one
                  per node below, depth 4 (T > 0 only, rule 1a; at T = 0 it is a top-k tree);
  distilled chain the autoregressive drafter, gamma = B - 1;
  distilled paths K = B // 4 paths of gamma 3 (K x 4 positions; T > 0 only: at T = 0 the K
                  paths are one argmax path);
  distilled topk  its top-2 tree of depth (B - 1) // 2 (1 + 2 depth nodes).
Then at batch 1 (`pass_nodes`): a target pass of N positions as a chain (`step`) and as a tree
(`step_tree` over a best-first tree of N nodes), each in target steps (a 1-position step = 1).
Rows are printed as they finish and written to token_trees.csv / token_trees_passes.csv in
--workdir.
"""

from experiments import skeleton
from experiments.configs import common
from specdec_jax import decode, trees
from specdec_jax.measure import evaluation, tables, timing, translation

TABLE = (
  tables.Column('task', width=10),
  tables.Column('temp', fmt='g', width=4),
  tables.Column('budget', width=6),
  tables.Column('method', width=16),
  tables.Column('drafter', width=9),
  tables.Column('gamma', width=5),
  tables.Column('positions', 'pass', width=4),
  tables.Column('tokens_per_call', 'tok/call', fmt='.3f', width=8),
  tables.Column('num_calls', 'calls', width=6),
)
PASS_TABLE = (
  tables.Column('task', width=10),
  tables.Column('nodes', width=5),
  tables.Column('chain', 'chain pass', fmt='.2f', width=10),
  tables.Column('tree', 'tree pass', fmt='.2f', width=9),
)
DEPTH = 8  # of the trees whose passes are timed


def _plan(config, pair: str) -> evaluation.Plan:
  """The main job's plan for `pair` (configs/debsumm.py's lengths for a debsumm pair, ende.py's
  otherwise) with this experiment's drafters and sentences."""
  from experiments.configs import debsumm, ende

  main = (debsumm if 'debsumm' in str(pair) else ende).get_config()
  main.pretrained, main.drafters = pair, ('all',)  # rows of a drafter the pair lacks are skipped
  main.num_examples, main.batch_size = config.num_examples, config.batch_size
  return evaluation.prepare(main)


def methods(budget: int, block_size: int, temperature: float, block: str = 'block'):
  """(name, drafter, gamma, keyword arguments, positions per pass) of a budget's rows; `block`
  names the block drafter."""
  gamma = min(budget - 1, block_size)
  yield 'block chain', block, gamma, {}, gamma + 1
  yield 'block tree', block, gamma, {'tree': decode.TreeSpec(budget)}, budget
  if temperature > 0 and budget >= 9:
    branching = ((budget - 1) // 4, 1, 1, 1)
    sampled = decode.TreeSpec(trees.full_tree_size(branching), 'sampled', branching=branching)
    yield 'block sampled', block, 4, {'tree': sampled}, sampled.num_nodes
  yield 'distilled chain', 'distilled', budget - 1, {}, budget
  if temperature > 0 and budget >= 8:
    k = budget // 4
    yield f'distilled {k} paths', 'distilled', 3, {'num_drafts': k}, 4 * k
  depth = (budget - 1) // 2
  topk = decode.TreeSpec(1 + 2 * depth, builder='topk', top_k=2)
  yield 'distilled topk', 'distilled', depth, {'tree': topk}, 1 + 2 * depth


def planned(config, drafters: dict, budget: int, temperature: float):
  """`methods`' rows that `config.methods` names ('': all) and whose drafter the pair has."""
  name = config.block_drafter
  block = drafters.get(name)
  block_size = block.steps.block_size if block is not None else 1
  wanted = [m for m in config.methods if m]
  for row in methods(budget, block_size, temperature, name):
    if (not wanted or row[0] in wanted) and row[1] in drafters:
      yield row


def acceptance_rows(plan: evaluation.Plan, config):
  for temperature in config.temperatures:
    for budget in config.budgets:
      for name, drafter, gamma, kw, positions in planned(
        config, plan.drafters, budget, temperature
      ):
        run = translation.translate(
          drafter=plan.drafters[drafter], method='token', gamma=gamma,
          **plan.decoding(temperature), **kw,
        )  # fmt: skip
        yield dict(
          task=plan.task,
          temp=temperature,
          budget=budget,
          method=name,
          drafter=drafter,
          gamma=gamma,
          positions=positions,
          tokens_per_call=float(run.stats.block_efficiency),
          num_calls=int(run.stats.target_calls),
        )


def pass_rows(plan: evaluation.Plan, config):
  """A row per N: the chain and tree passes of N positions at batch 1, in target steps
  (`timing.tree_pass_costs`, loops of 2 and 10 passes)."""
  for nodes in config.pass_nodes:
    costs = timing.tree_pass_costs(
      plan.pair.target, nodes=nodes, depth=DEPTH, source_length=plan.config.max_source_length,
      loop_lengths=(2, 10), repeats=config.repeats,
    )  # fmt: skip
    yield dict(task=plan.task, nodes=nodes, **costs)


def run(config, workdir: str, *, echo=print) -> dict:
  passes = lambda row: tables.format_line(row, PASS_TABLE)  # under its header, after the rows

  def measure(results):
    for pair in config.pairs:
      plan = _plan(config, pair)
      results.say(
        f'{plan.inputs_summary()}; budgets {tuple(config.budgets)} at temperatures '
        f'{tuple(config.temperatures)}, rows {[m for m in config.methods if m] or "all"}, '
        'token verification'
      )
      yield from (('token_trees', row) for row in acceptance_rows(plan, config))
      if config.pass_nodes:
        results.say(tables.format_header(PASS_TABLE))
        yield from (('token_trees_passes', row) for row in pass_rows(plan, config))

  tables_ = [
    skeleton.Table('token_trees', TABLE),
    skeleton.Table('token_trees_passes', PASS_TABLE, line=passes),
  ]
  finish = lambda results: {
    **results.paths('token_trees'),
    **results.paths('token_trees_passes', 'passes_'),
  }
  return skeleton.run(workdir, tables_, header=None, measure=measure, finish=finish, echo=echo)


if __name__ == '__main__':
  common.run_experiment(
    lambda config, workdir: run(config, workdir, echo=lambda s: print(s, flush=True))
  )
