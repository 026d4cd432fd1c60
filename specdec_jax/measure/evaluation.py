"""The main job's measurement: speculative decoding against autoregressive decoding on the test
set of a (source -> output) task, EN->DE translation or debsumm summarization: the rows of
Leviathan et al.'s Table 2.

For each temperature, drafter and gamma: decode the test set batch by batch, each batch
autoregressively and then with each verifier in turn (token, block), every call timed with
compilation excluded, so that one autoregressive baseline serves both verifiers and every speedup
compares methods under the same machine load (and with `config.tree_nodes`, each drafter's token
tree of N nodes, one target pass over them, decoded in turn with its own autoregressive baseline:
method 'tree', gamma its depth, `job_config.tree_spec`; `config.trees`: named trees alone). Each
row (`Row`) reports alpha (measured, mean beta over verified positions), block efficiency, c and
c_fixed (what the drafter adds to an iteration of the loop's model calls, `gamma * c + c_fixed`
target steps, `timing.step_costs`; `c_alone`: a call alone), the walltime speedup, the speedup the
paper's formula predicts from the measured alpha, c, c_fixed and (gamma+1)-position pass cost (the
pass cost is a property of the target and gamma: the median over every drafter's measurement),
and BLEU. Then what the loops themselves cost: `iteration_cost`, a speculative iteration in
autoregressive steps, each fitted over the batches (`translation.loop_costs`: seconds ~ fixed +
per iteration x iterations, the work around the model calls included), and `predicted_loop` =
block efficiency / iteration_cost, the speedup before the per-call fixed costs (encoder, cache
set-up) dilute it. Where `speedup` falls short of `predicted_speedup`, these two say whether the
iteration (loop overhead, the pass) or the tokens per iteration (alpha's i.i.d. assumption, EOS)
is why. `prepare` checks a config (`job_config`) and loads what it names; no flags here:
experiments/translate.py and notebooks call `prepare` and `rows`.

  plan = evaluation.prepare(config)        # checks the config, loads every model: fails early
  writer = results_io.ResultsWriter(workdir)
  print(tables.format_header(evaluation.TABLE))
  for row in evaluation.rows(plan):        # each Row as soon as it is measured
    writer.add(row)
    print(tables.format_line(row, evaluation.TABLE))

Axis legend: B batch, S source length, M max_new_tokens.
"""

import dataclasses
from collections.abc import Iterator, Sequence

import jax
import numpy as np
import sacrebleu

from specdec_jax import (
  analysis,
  decode,
  draft_lookup,
  pretrained,
  sharding,
  step_models,
)
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import job_config, tables, timing, translation
from specdec_jax.models import t5, t5_fused


@dataclasses.dataclass(frozen=True, kw_only=True)
class Row:
  """One row of the main job's table: one method at one temperature. None: not measured (an
  autoregressive row's alpha and costs; a loop cost the batches cannot fit). Fields in the order
  of results.csv's columns (`COLUMNS`)."""

  task: str  # the task's name: config.task, else the pair directory's name
  drafter: str  # the drafter's name; '-' for autoregressive decoding
  method: str  # 'autoregressive' or the verifier's name ('token', 'block', 'greedy_block')
  temp: float  # sampling temperature; 0 is greedy
  gamma: int  # drafts per iteration; 0 for autoregressive decoding
  num_drafts: int | None = None  # K draft paths per iteration (config.num_drafts); None for AR
  draft_stop: float | None = None  # adaptive draft length threshold (config.draft_stop), or None
  # A token-tree row's N node slots, one target pass over them (config.tree_nodes; method 'tree',
  # gamma its depth); None: a chain (or K paths).
  tree_nodes: int | None = None
  alpha: float | None = None  # mean beta = sum_x min(p, q) over verified positions (None: a tree)
  block_efficiency: float  # tokens emitted per target call; 1.0 for autoregressive decoding
  c: float | None = None  # a drafter call / a target step, in the loop (`timing.step_costs`)
  # What the drafter costs per iteration beyond its gamma calls, in target steps (on a CPU: its
  # first call's reload of the weights the pass evicted; `timing.step_costs`).
  c_fixed: float | None = None
  pass_cost: float | None = None  # a (gamma+1)-position pass / a target step (median of drafters)
  speedup: float  # its baseline's seconds (same batches, timed in turn) / its own seconds
  # The paper's formula at alpha, gamma, c, pass_cost and c_fixed; with K > 1 paths or a draft
  # stop (no closed form in alpha), the measured block efficiency / (c gamma + c_fixed + pass_cost)
  # (`analysis.iteration_speedup`; the drafter makes its gamma calls either way).
  predicted_speedup: float | None = None
  bleu: float  # corpus BLEU of the outputs against the references
  seconds: float  # decoding wall time over the test set, compilation excluded
  tokens_per_s: float  # tokens emitted / seconds
  c_alone: float | None = None  # a drafter call alone / a target step
  iteration_cost: float | None = None  # a speculative iteration in autoregressive steps (fitted)
  predicted_loop: float | None = None  # block_efficiency / iteration_cost
  # predicted_speedup for whole calls: each method's fitted fixed seconds per call (the encoder,
  # the caches' set-up: `translation.loop_costs`) added to the loops (`analysis.call_speedup`).
  predicted_call: float | None = None


COLUMNS = tuple(f.name for f in dataclasses.fields(Row))  # results.csv's columns
# The printed table: Table 2's columns, the loop's fitted iteration cost and its prediction, BLEU.
TABLE = (
  tables.Column('task', width=6, align='<'),
  tables.Column('drafter', width=9, align='<'),
  tables.Column('method', width=14, align='<'),
  tables.Column('temp', fmt='g', width=4),
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('num_drafts', 'K', 'd', width=2),
  tables.Column('tree_nodes', 'N', 'd', width=3),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('block_efficiency', 'block_eff', '.2f'),
  tables.Column('c', fmt='.3f', width=6),
  tables.Column('c_fixed', fmt='.3f', width=7),
  tables.Column('pass_cost', fmt='.2f'),
  tables.Column('speedup', fmt='.2f', suffix='x', width=7),
  tables.Column('predicted_speedup', 'predicted', '.2f'),
  tables.Column('predicted_call', 'pred_call', '.2f'),
  tables.Column('iteration_cost', 'iter_cost', '.2f'),
  tables.Column('predicted_loop', 'pred_loop', '.2f'),
  tables.Column('bleu', fmt='.2f', width=6),
)


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
  # Drafters loaded for their named trees alone (`config.trees`): no chain rows of their own.
  tree_only: tuple[str, ...] = ()

  @property
  def task(self) -> str:
    """The task name of the rows: `config.task`, else the pair directory's name."""
    return self.config.get('task') or self.pair.directory.name

  def gammas(self, name: str) -> tuple[int, ...]:
    """The gammas of drafter `name`'s rows: `config.block_gammas` for a block drafter (one call
    drafts them all, so its gammas may be larger), else `config.gammas`."""
    c = self.config
    steps, _ = step_models.as_step_model(self.drafters[name])
    return (
      tuple(c.get('block_gammas') or c.gammas) if job_config.is_block(steps) else tuple(c.gammas)
    )

  @property
  def chain_drafters(self) -> list[str]:
    """The drafters of the chain rows (all but those loaded for their named trees alone)."""
    return [name for name in self.drafters if name not in self.tree_only]

  @property
  def groups(self) -> list[tuple[str, int]]:
    """Every (drafter name, gamma) of the chain rows, in order."""
    return [(name, gamma) for name in self.chain_drafters for gamma in self.gammas(name)]

  @property
  def tree_groups(self) -> list[tuple[str, int, decode.TreeSpec]]:
    """Every (drafter name, depth, tree) of the token-tree rows, in order (`job_config`): each
    chain drafter's tree of N nodes for each N of `config.tree_nodes`, then the named trees of
    `config.trees` whose drafter the plan has, each (drafter, N) once."""
    steps = lambda name: step_models.as_step_model(self.drafters[name])[0]
    return [
      (name, *job_config.tree_spec(steps(name), nodes))
      for name, nodes in job_config.tree_rows(self.config, self.chain_drafters, self.drafters)
      if step_models.capabilities(steps(name)).draft_calls
    ]

  @property
  def num_methods(self) -> int:
    """Rows: autoregressive at each temperature, every drafter x gamma x verifier, and every
    drafter x tree."""
    c = self.config
    return len(c.temperatures) * (1 + len(self.groups) * len(c.verifiers) + len(self.tree_groups))

  @property
  def num_passes(self) -> int:
    """Decodings of the whole test set: per temperature and (drafter, gamma), one
    autoregressive (the verifiers' paired baseline) and one per verifier; per tree, one
    autoregressive and the tree's."""
    c = self.config
    trees = len(self.tree_groups)
    groups = max(1, len(self.groups) + trees)  # no drafters: autoregressive alone
    return len(c.temperatures) * (groups + len(self.groups) * len(c.verifiers) + trees)

  def decoding(self, temperature: float) -> dict:
    """The arguments of `translation.translate` / `translate_in_turn` every row of the plan shares: the
    pair's target and tokenizer, the test sources, the sampling at `temperature`, and the
    config's batch size, lengths and seed."""
    c = self.config
    return dict(
      target=self.pair.target,
      tokenizer=self.pair.tokenizer,
      sources=self.sources,
      sampling=sampling_lib.SamplingConfig(temperature=temperature),
      batch_size=c.batch_size,
      max_source_length=c.max_source_length,
      max_new_tokens=c.max_new_tokens,
      seed=c.seed,
    )

  @property
  def block_gammas(self) -> tuple[int, ...]:
    return tuple(self.config.get('block_gammas') or self.config.gammas)

  def bleu(self, hypotheses: Sequence[str]) -> float:
    """Corpus BLEU of `hypotheses` against the references."""
    return sacrebleu.corpus_bleu(list(hypotheses), [self.references]).score

  def inputs_summary(self) -> str:
    """What is decoded, and where: the sentences, pair, batch and devices (an experiment that
    runs rows of its own says them after this)."""
    c = self.config
    where = 'one device' if self.mesh is None else f'mesh {dict(self.mesh.shape)}'
    grown = self.pair.target.config
    target = f' (target grown to {c.grow_to}: {grown.d_model} wide, ' if c.get('grow_to') else ''
    if target:
      target += f'{grown.num_encoder_layers}+{grown.num_decoder_layers} layers)'
    fused = isinstance(self.pair.target, t5.T5Model) and t5_fused.is_fused(self.pair.target.params)
    target += ' (decoder projections fused)' if fused else ''
    return (
      f'{len(self.sources)} test sentences of {self.pair.directory}{target}, batch '
      f'{c.batch_size}, on '
      f'{where} ({jax.process_count()} process(es), {jax.devices()[0].platform}); '
      f'{self.truncated} source(s) longer than {c.max_source_length} tokens truncated'
    )

  def _trees_summary(self) -> str:
    trees = [f'{name} {tree.num_nodes}' for name, _, tree in self.tree_groups]
    return f', and token trees (drafter nodes): {", ".join(trees)}' if trees else ''

  def summary(self) -> str:
    """`inputs_summary` and the main job's rows."""
    c = self.config
    steps = lambda name: step_models.as_step_model(self.drafters[name])[0]
    blocks = any(job_config.is_block(steps(name)) for name in self.chain_drafters)
    return (
      f'{self.inputs_summary()}; {self.num_methods} rows: autoregressive and drafters '
      f'{sorted(self.chain_drafters)} x '
      f'gammas {tuple(c.gammas)}'
      + (f' (block drafters {self.block_gammas})' if blocks else '')
      + ' x verifiers '
      f'{tuple(c.verifiers)} ({job_config.num_drafts(c)} draft '
      f'path(s) per iteration, draft stop {c.get("draft_stop")})'
      f'{self._trees_summary()}, at temperatures '
      f'{tuple(c.temperatures)}; {self.num_passes} passes over the test set (each drafter and '
      'gamma, and each tree: every batch autoregressively, then with each verifier or the tree, '
      'timed in turn)'
    )


def prepare(config) -> Plan:
  """Checks every setting (`job_config`), then places the pair on its mesh and reads the test
  set, before anything is decoded.

  `config` fields: pretrained (pair name or directory), task (the rows' task name; optional),
  drafters (names, or ('all',)), num_examples, batch_size, max_source_length, max_new_tokens,
  temperatures, gammas, verifiers, seed; optional: num_drafts (K draft paths per iteration,
  default 1), draft_stop (adaptive draft length threshold, default None), block_drafters,
  block_gammas, tree_nodes, trees ('NAME:N': a drafter's token tree alone), mesh
  ('DATAxMODEL' or 'auto'), drafter_sharding, and a pair given by checkpoints: target, drafter,
  tokenizer, test_file (all four), source_prefix, param_dtype.

  Raises:
    ValueError (or FileNotFoundError for a missing pair) naming the bad setting.
  """
  job_config.check_config(config)
  mesh = sharding.mesh_from_spec(config.get('mesh', 'auto'), config.batch_size)
  mesh = None if mesh.size == 1 else mesh  # one device: the loops run unsharded
  pair = job_config.load_pair(config, mesh)
  if config.get('target') or tuple(config.drafters) == ('all',):
    names = list(pair.drafters)  # a pair given by checkpoints has its one drafter
  else:
    names = list(config.drafters)
    # Block drafters join the rows where the pair ships them (the summary lists the drafters).
    names += [n for n in config.get('block_drafters', ()) if n in pair.drafters and n not in names]
  missing = [n for n in names if n not in pair.drafters]
  if missing:
    raise ValueError(
      f'Drafter(s) {missing} are not in {pair.directory}; it has {sorted(pair.drafters)}.'
    )
  # A named tree's drafter joins for its trees alone where the pair ships it (as block drafters).
  tree_only = tuple(
    dict.fromkeys(
      n for n, _ in job_config.named_trees(config) if n in pair.drafters and n not in names
    )
  )
  drafters = {n: pair.drafters[n] for n in (*names, *tree_only)}
  if config.get('lookup'):  # the source-lookup drafter's rows (no model: built on the target)
    drafters['lookup'] = draft_lookup.source_lookup(pair.target)
  if not drafters:
    raise ValueError(
      'No drafter to run: config.drafters is empty, and no block drafter, named tree or lookup '
      f'(config.lookup) of {pair.directory} joins the rows.'
    )
  job_config.check_drafters(config, pair.target, drafters, tree_only)
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
    drafters,
    sources,
    [t for _, t in test],
    truncated,
    mesh,
    tree_only,
  )


# Timed runs of each cost loop per round unless `config.timing_repeats` says otherwise: at
# `timing.step_costs`'s 7, c spread 4.5x as much over trials (`benchmarks.cost_repeats`).
_TIMING_REPEATS = 15


def model_costs(plan: Plan, *, progress: bool = False) -> dict[tuple, dict[str, float]]:
  """c, c_fixed, c_alone and pass_cost of every (drafter name, gamma) of the plan, and every
  (drafter name, depth, nodes) of its trees, measured in the loop (`timing.step_costs`,
  `config.timing_rounds` rounds). The pass cost is the target's, not the drafter's: each gamma's
  (each tree size's) is the median over every drafter's measurement (less noise than one
  drafter's rounds). `progress`: a bar of its own, what it measures and k of n, since on a CPU
  this phase takes minutes before the first sentence is decoded."""
  from tqdm.auto import tqdm  # imported here: only the main job's progress needs it

  c = plan.config
  todo = plan.groups + [(name, gamma, tree.num_nodes) for name, gamma, tree in plan.tree_groups]
  bar = tqdm(
    total=len(todo),
    desc='model costs (c, c_fixed, pass cost; timed in the loop)',
    unit='drafter x gamma' + (' or tree' if plan.tree_groups else ''),
    disable=not progress,
    dynamic_ncols=True,
    mininterval=0.0,
  )
  costs = {}
  with translation.on_mesh(plan.mesh), bar:
    for key in todo:
      name, gamma, *tree = key
      bar.set_postfix_str(f'{name}, gamma {gamma}' + (f', tree of {tree[0]}' if tree else ''))
      costs[key] = timing.step_costs(
        plan.pair.target,
        plan.drafters[name],
        batch_size=c.batch_size,
        source_length=c.max_source_length,
        gamma=gamma,
        cache_len=decode.buffer_length(c.max_new_tokens, max([gamma] + [n - 1 for n in tree])),
        rounds=c.timing_rounds,
        num_drafts=job_config.num_drafts(c),
        repeats=c.get('timing_repeats', _TIMING_REPEATS),
        tree_nodes=tree[0] if tree else None,
      )
      bar.update()
  # A chain's pass is pooled over the drafters of its gamma, a tree's over those of its nodes.
  pass_of = lambda key: key[1] if len(key) == 2 else ('tree', key[2])
  pass_cost = {
    p: float(np.median([v['pass_cost'] for key, v in costs.items() if pass_of(key) == p]))
    for p in {pass_of(key) for key in costs}
  }
  return {
    key: dict(
      c=v['c'], c_fixed=v['c_fixed'], c_alone=v['c_alone'], pass_cost=pass_cost[pass_of(key)]
    )
    for key, v in costs.items()
  }


def autoregressive_row(plan: Plan, temperature: float, run: translation.Run) -> Row:
  """The row of autoregressive decoding at `temperature`."""
  return Row(
    task=plan.task,
    drafter='-',
    method=translation.AUTOREGRESSIVE,
    temp=temperature,
    gamma=0,
    block_efficiency=1.0,
    speedup=1.0,
    bleu=plan.bleu(run.hypotheses),
    seconds=run.seconds,
    tokens_per_s=run.tokens / run.seconds,
  )


def speculative_row(
  plan: Plan, drafter: str, verifier: str, gamma: int, temperature: float, run: translation.Run,
  baseline: translation.Run, cost: dict[str, float], tree_nodes: int | None = None,
) -> Row:  # fmt: skip
  """The row of `run` (`verifier` with `drafter`; a token tree of `tree_nodes` nodes, depth
  gamma, where given: method 'tree'), timed in turn with the autoregressive `baseline` over the
  same batches; `cost` is its entry of `model_costs`."""
  alpha = float(run.stats.alpha)
  efficiency = float(run.stats.block_efficiency)
  paths, stop = job_config.num_drafts(plan.config), plan.config.get('draft_stop')
  if paths == 1 and stop is None and tree_nodes is None:
    tokens = analysis.expected_tokens(alpha, gamma)
  else:
    tokens = efficiency
  predicted = analysis.iteration_speedup(
    tokens, gamma, cost['c'], cost['pass_cost'], cost['c_fixed']
  )
  # The loops' own costs, fitted over the batches (NaN: batches of one iteration count): an
  # iteration of this run in autoregressive steps of its baseline, and each one's fixed seconds
  # per call, which the formula leaves out.
  fixed, per_iteration = translation.loop_costs(run.batch_seconds, run.batch_iterations)
  baseline_fixed, per_step = translation.loop_costs(
    baseline.batch_seconds, baseline.batch_iterations
  )
  iteration_cost = per_iteration / per_step if per_iteration > 0 and per_step > 0 else None
  calls = len(run.batch_seconds)
  predicted_call = None
  if 0 <= calls * baseline_fixed <= baseline.seconds and fixed >= 0:  # False for NaN
    predicted_call = float(
      analysis.call_speedup(predicted, baseline.seconds, calls * baseline_fixed, calls * fixed)
    )
  return Row(
    task=plan.task,
    drafter=drafter,
    method=verifier if tree_nodes is None else 'tree',
    temp=temperature,
    gamma=gamma,
    num_drafts=paths,
    draft_stop=stop,
    tree_nodes=tree_nodes,
    alpha=alpha if tree_nodes is None else None,  # a tree has no one q per depth
    block_efficiency=efficiency,
    c=cost['c'],
    c_fixed=cost['c_fixed'],
    c_alone=cost['c_alone'],
    pass_cost=cost['pass_cost'],
    speedup=baseline.seconds / run.seconds,
    predicted_speedup=float(predicted),
    bleu=plan.bleu(run.hypotheses),
    seconds=run.seconds,
    tokens_per_s=run.tokens / run.seconds,
    iteration_cost=iteration_cost,
    predicted_loop=None if iteration_cost is None else efficiency / iteration_cost,
    predicted_call=predicted_call,
  )


def rows(plan: Plan, *, progress: bool = True) -> Iterator[Row]:
  """Measures the model costs (`model_costs`), then at each temperature every (drafter, gamma):
  each batch decoded autoregressively and with every verifier in turn (`translation.translate_in_turn`).
  Yields each Row as soon as it is measured: a temperature's autoregressive row is its first
  baseline's. Two progress bars (process 0 alone shows them): the cost measurement's, then one
  with ETA counting decoded sentences, whose clock starts after the costs are measured."""
  from tqdm.auto import tqdm  # imported here: only the main job's progress needs it

  c = plan.config
  show = progress and sharding.is_main_process()
  costs = model_costs(plan, progress=show)
  bar = tqdm(
    total=plan.num_passes * len(plan.sources),
    unit='sentence',
    disable=not show,
    dynamic_ncols=True,
    mininterval=2.0,
  )

  def decode_in_turn(drafter, gamma, temperature, methods, tree=None):
    return translation.translate_in_turn(
      drafter=drafter,
      methods=methods,
      gamma=gamma,
      **plan.decoding(temperature),
      on_batch=bar.update,
      mesh=plan.mesh,
      num_drafts=job_config.num_drafts(c),
      draft_stop=c.get('draft_stop'),
      proposal=c.get('proposal') or 'sample',
      tree=tree,
    )

  auto = translation.AUTOREGRESSIVE
  groups = [(name, gamma, None) for name, gamma in plan.groups] + plan.tree_groups
  for temperature in c.temperatures:
    if not groups:
      (baseline,) = decode_in_turn(None, 1, temperature, (auto,)).values()
      yield autoregressive_row(plan, temperature, baseline)
    for i, (name, gamma, tree) in enumerate(groups):
      methods = c.verifiers if tree is None else ('token',)  # a tree verifies its own way
      runs = decode_in_turn(plan.drafters[name], gamma, temperature, (auto, *methods), tree)
      baseline = runs[auto]
      if i == 0:
        yield autoregressive_row(plan, temperature, baseline)
      nodes = None if tree is None else tree.num_nodes
      key = (name, gamma) if tree is None else (name, gamma, nodes)
      for verifier in methods:
        yield speculative_row(
          plan, name, verifier, gamma, temperature, runs[verifier], baseline, costs[key], nodes
        )
  bar.close()
