r"""The engine at the paper's scale: public T5 shapes, timed in the loop, against the HBM bound.

  python -m benchmarks.paper_scale --target=t5-11b --drafters=t5-small,one-layer   # on a GPU / TPU
  python -m benchmarks.paper_scale --target=t5-11b --drafters=t5-small --unroll_draft  # unrolled
  python -m benchmarks.paper_scale --compile_for=tpu-v4 --target=t5-11b --drafters=t5-small,one-layer
      # any host: tables 1, 2 and 4 from XLA:TPU's cost model (benchmarks/paper_scale_tpu.py)
  python -m benchmarks.paper_scale --target=t5-small --drafters=one-layer --gammas=3 \
      --loop_gamma=3 --max_new_tokens=32 --source_length=32 --dtype=float32 --rounds=1 \
      --hbm_bandwidth=100 --noeigen_dots                   # on a CPU (a made-up bandwidth)

Models of `t5.CONFIGS` shapes with constant weights (a call's time should not depend on the
values; `--weights=random` checks it: `synthetic.model`), batch 1, one device. A drafter is a
`t5.CONFIGS` name (a T5 with its own encoder, e.g. `t5-small`, the paper's), `one-layer[:NAME]`:
one decoder layer of NAME's width (default t5-small) over the target's encoder, the shape of our
shipped `distilled` drafters, or `block[:NAME]`: a block drafter of NAME's width (one call drafts
gamma tokens: its `c` is 0 and `c fixed` the call, `synthetic.drafter_config`). Four tables (five with
--tree_nodes), every time from the project's timers (`specdec_jax.measure.timing`: model calls
inside a jitted loop, dispatch cancelled):

1. target: the step and the (gamma+1)-position pass at each of --gammas, against the HBM bound,
   the bytes a call reads (`memory_model.call_cost`: decoder weights, the tied embedding, both
   caches) over the chip's bandwidth (`machines.chip_for` `jax.devices()[0].device_kind`;
   `--hbm_bandwidth` for another chip). `pass cost` is pass / step, the paper assumes 1.
2. drafters: each drafter's step alone (`c alone`) and as the loop pays it, inside a chained
   iteration of gamma drafter calls and one target pass (`c` per call and `c fixed` per
   iteration, what the walltime formula needs; all from `timing.step_costs`), and `c at bound`, the drafter's bytes over the target's: what
   c would be if both ran at the HBM bound.
3. loop: the decode loops themselves (`decode.generate`, `decode.speculative_generate`, greedy),
   seconds per iteration from whole calls at --max_new_tokens and at 1 token (the difference
   cancels the encoder, the caches' set-up and dispatch), against the same iteration's model
   calls; `loop share` is the rest, the loop's own work (sampling, verification, bookkeeping and,
   on a GPU, kernel launches between model calls).
4. speedup: the walltime formula (`analysis.walltime_improvement_measured`: measured c and pass
   cost) at each gamma, the best of them, and the paper's formula's best gamma over 1..64 (pass
   cost 1, `analysis.optimal_gamma`; 1..block_size for a block drafter), at the paper's alpha
   (T5-small under T5-XXL on EnDe, 0.75 greedy / 0.62 at T=1) and at our drafters'
   (`memory_model.ALPHAS`, docs/results.md section 3).
5. token trees (--tree_nodes=16,32,64): a target pass over a token tree of N nodes (depth
   --tree_depth, the tree loop's `step_tree`) against a chain pass of N positions, both in target
   steps (`timing.tree_pass_costs`); with --compile_for, XLA:TPU's estimate of each and the layout
   copies a pass runs (`benchmarks.tree_pass_tpu`, which also counts an H100's kernel launches).

Results on an accelerator: docs/results.md section 13 ("T5 11B on a GPU, and transformers
beside us"). A CPU has no HBM bound (--hbm_bandwidth makes one up) and XLA:CPU computes bfloat16 in
float32: use --dtype=float32 there.
`--unroll_draft` runs the draft's `lax.scan` unrolled everywhere a draft is timed (tables 2-4:
`timing.step_costs`, `timing.iteration_seconds`, `speculative_generate(..., unroll_draft=True)`),
fewer kernel launches per iteration on a GPU (`benchmarks.drafter_kernels`); the header says which.
tests/paper_scale_test.py runs it on tiny shapes.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

import benchmarks
from benchmarks import machines, memory_model, paper_scale_tpu, synthetic, tree_pass_tpu
from specdec_jax import analysis, decode
from specdec_jax.measure import tables, timing, translation
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_TARGET = flags.DEFINE_string(
  'target', 't5-11b', 'Target shape: a name in t5.CONFIGS.', flag_values=FLAGS
)
_DRAFTERS = flags.DEFINE_list(
  'drafters',
  ['t5-small', 'one-layer'],
  't5.CONFIGS names, or one-layer[:NAME] (see above).',
  flag_values=FLAGS,
)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'bfloat16', ['bfloat16', 'float32'], 'Params and compute.', flag_values=FLAGS
)
_WEIGHTS = flags.DEFINE_enum(
  'weights', 'constant', ['constant', 'random'], 'Param values.', flag_values=FLAGS
)
_BATCH = flags.DEFINE_integer('batch', 1, 'Rows per call.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 64, 'Source tokens (all real).', flag_values=FLAGS
)
_MAX_NEW = flags.DEFINE_integer(
  'max_new_tokens', 64, 'Sets the decoder caches (and table 3).', flag_values=FLAGS
)
_GAMMAS = flags.DEFINE_list('gammas', ['3', '5', '7'], 'Draft lengths.', flag_values=FLAGS)
_LOOP_GAMMA = flags.DEFINE_integer(
  'loop_gamma', 5, 'Gamma of table 3 (0: skip table 3).', flag_values=FLAGS
)
_ROUNDS = flags.DEFINE_integer(
  'rounds', 3, 'Rounds of `timing.step_costs` (median).', flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer(
  'repeats', 5, 'Timed calls of each loop in table 3 (median).', flag_values=FLAGS
)
_TIMER_REPEATS = flags.DEFINE_integer(
  'timer_repeats',
  7,
  "Runs of each of `timing`'s in-loop timers in turn, the fastest counts (tables 1-3, 5; fewer: "
  'a quicker, noisier run).',
  flag_values=FLAGS,
)
_UNROLL_DRAFT = flags.DEFINE_bool(
  'unroll_draft',
  False,
  "Unroll the draft's lax.scan (decode.LoopSpec.unroll_draft) in the timed iterations and loops.",
  flag_values=FLAGS,
)
_COMPILE_FOR = benchmarks.define_compile_for(
  "One TPU chip (tpu-v4, tpu-v5e): tables 1, 2 and 4 from XLA:TPU's cost model, estimates not "
  'timings (benchmarks/paper_scale_tpu.py).',
  FLAGS,
)
_COMPILE_CACHE = flags.DEFINE_string(
  'compile_cache', None, 'With --compile_for: keep compiled programs here.', flag_values=FLAGS
)
_TREE_NODES = flags.DEFINE_list(
  'tree_nodes',
  [],
  'Table 5: node budgets N of the token-tree passes priced (none: no table).',
  flag_values=FLAGS,
)
_TREE_DEPTH = flags.DEFINE_integer('tree_depth', 8, "Table 5: the trees' depth.", flag_values=FLAGS)
_HBM = flags.DEFINE_float(
  'hbm_bandwidth',
  None,
  'HBM GB/s of this device (default: machines.chip_for its device_kind).',
  flag_values=FLAGS,
)

GREEDY = SamplingConfig(temperature=0.0)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What every timed table of one run shares (the flags', read once by `main`)."""

  batch: int = 1
  source_length: int = 64
  max_new_tokens: int = 64
  dtype: str = 'bfloat16'
  rounds: int = 3  # of `timing.step_costs`
  repeats: int = 5  # timed calls of each loop in table 3
  timer_repeats: int = 7  # runs of each `timing` loop (its default)
  unroll_draft: bool = False

  def shape(self) -> dict:
    return dict(batch_size=self.batch, source_length=self.source_length)

  def cache_len(self, gamma: int) -> int:
    """Decoder slots of a loop at max_new_tokens: the autoregressive one's at gamma 0."""
    return decode.buffer_length(self.max_new_tokens, gamma)


def settings_from_flags() -> Settings:
  return Settings(
    batch=_BATCH.value, source_length=_SOURCE_LENGTH.value, max_new_tokens=_MAX_NEW.value,
    dtype=_DTYPE.value, rounds=_ROUNDS.value, repeats=_REPEATS.value,
    timer_repeats=_TIMER_REPEATS.value, unroll_draft=_UNROLL_DRAFT.value,
  )  # fmt: skip


def call_bytes(model: t5.T5Model, run: Settings, *, positions: int, cache_len: int) -> float:
  """HBM bytes one decoder call of `model` reads at `run`'s batch and source length
  (`memory_model.call_bytes`)."""
  return memory_model.call_bytes(
    model.config, batch=run.batch, positions=positions, cache_len=cache_len,
    source_length=run.source_length,
  )  # fmt: skip


def loop_seconds(
  target, drafter, run: Settings, *, gamma: int, max_new_tokens: int
) -> tuple[float, float]:
  """(seconds per iteration of a greedy decode loop, tokens per iteration): `generate` (drafter
  None) or `speculative_generate`, timed whole at `max_new_tokens` and at 1 (one iteration: the
  encoder, the caches, dispatch), the difference over the iterations between."""
  ids = jnp.full((run.batch, run.source_length), 3, jnp.int32)
  mask = jnp.ones_like(ids)
  kw = dict(sampling=GREEDY, rng=jax.random.key(0), check_finite=False)

  def call(m):
    if drafter is None:
      return decode.generate(target, ids, mask, max_new_tokens=m, **kw)
    return decode.speculative_generate(
      target,
      drafter,
      ids,
      mask,
      gamma=gamma,
      max_new_tokens=m,
      unroll_draft=run.unroll_draft,
      **kw,
    )

  lengths = (1, max_new_tokens)
  outs = [call(m) for m in lengths]  # compiles
  seconds = [timing.time_call(lambda m=m: call(m).tokens, run.repeats)[1] for m in lengths]
  iterations = [int(out.stats.target_calls.max()) for out in outs]
  _, per_iteration = translation.loop_costs(seconds, iterations)  # NaN: one iteration either way
  per_iteration = 0.0 if math.isnan(per_iteration) else max(per_iteration, 0.0)
  return per_iteration, int(outs[1].lengths.max()) / iterations[1]


def timed_tables(
  target_config,
  drafter_configs: dict,
  run: Settings,
  *,
  gammas,
  loop_gamma: int,
  weights: str,
  hbm_bandwidth: float | None = None,
  target_name: str = '',
  tree_nodes=(),
  tree_depth: int = 8,
) -> None:
  """Tables 1-4 (and 5 for `tree_nodes`) on this host's first device, timed (`timing`), printed:
  the library call of `main` without --compile_for. `hbm_bandwidth`: GB/s of the HBM bound
  (default: the chip's, `machines.chip_for`)."""
  kind = jax.devices()[0].device_kind
  bandwidth, hbm = _bandwidth(kind, hbm_bandwidth)
  models = dict(dtype=run.dtype, weights=weights)
  target = synthetic.model(target_config, seed=0, **models)
  found = {
    name: synthetic.model(config, seed=i + 1, **models)
    for i, (name, config) in enumerate(drafter_configs.items())
  }
  print(
    f'device: {kind} ({hbm}), jax {jax.__version__}; target {target_name} '
    f'{t5.param_count(target.params) / 1e6:.1f}M params, {run.dtype}, {weights} '
    f'weights; batch {run.batch}, source {run.source_length}, {run.max_new_tokens} new tokens; '
    f'timing.step_costs rounds {run.rounds}, timer repeats {run.timer_repeats}; draft scan '
    f'{"unrolled" if run.unroll_draft else "looped"} (--unroll_draft)',
    flush=True,
  )
  costs = {
    (name, g): timing.step_costs(
      target,
      drafter,
      gamma=g,
      cache_len=run.cache_len(g),
      rounds=run.rounds,
      repeats=run.timer_repeats,
      unroll_draft=run.unroll_draft,
      **run.shape(),
    )
    for g in gammas
    for name, drafter in found.items()
  }
  # The target's pass costs, pooled over the drafters' measurements.
  pass_cost = {g: float(np.median([costs[n, g]['pass_cost'] for n in found])) for g in gammas}
  step_bytes = call_bytes(target, run, positions=1, cache_len=run.cache_len(0))
  rows = _target_rows(target, costs, pass_cost, bandwidth, run)
  tables.print_table(
    '1. target calls (ms; HBM bound: bytes read / bandwidth)', rows, TARGET_COLUMNS
  )
  tables.print_table(
    '2. drafters (ms; c in target steps)', _drafter_rows(costs, found, step_bytes, run),
    DRAFTER_COLUMNS,
  )  # fmt: skip

  if loop_gamma:
    title = f'3. decode loops, greedy, gamma {loop_gamma} (ms per iteration)'
    tables.print_table(title, _loop_rows(target, found, loop_gamma, run), LOOP_COLUMNS)

  rows = _speedup_rows(costs, pass_cost, found, gammas)
  gamma_columns = tuple(_Col(f'gamma_{g}', f'gamma {g}', '.2f', 7, suffix='x') for g in gammas)
  columns = SPEEDUP_COLUMNS[:4] + gamma_columns + SPEEDUP_COLUMNS[4:]
  title = (
    '4. speedup by the formula (measured c, pass cost); paper: pass cost 1, best gamma 1..64 '
    '(1..block_size for a block drafter)'
  )
  tables.print_table(title, rows, columns)
  if tree_nodes:
    rows = [
      _tree_row(n, timing.tree_pass_costs(
        target, nodes=n, depth=tree_depth, source_length=run.source_length,
        repeats=run.timer_repeats,
      ))
      for n in tree_nodes
    ]  # fmt: skip
    title = f'5. token trees of depth {tree_depth}: a pass over N nodes against N positions (steps)'
    tables.print_table(title, rows, TREE_COLUMNS)


# Table 5 timed: a tree pass against a chain pass of its width (with --compile_for:
# `tree_pass_tpu.TABLE`, which adds the temporaries and the copies).
TREE_COLUMNS = tree_pass_tpu.TABLE[:4]


def _tree_row(nodes: int, costs: dict) -> dict:
  return dict(nodes=nodes, **costs, ratio=costs['tree'] / costs['chain'])


def main(argv):
  """Flags in; one library call: `paper_scale_tpu.run` (--compile_for) or `timed_tables`."""
  del argv
  benchmarks.start()  # before JAX starts
  gammas = sorted({int(g) for g in _GAMMAS.value})
  tree_nodes = [int(n) for n in _TREE_NODES.value]
  if min(gammas) < 1 or _LOOP_GAMMA.value < 0:
    raise ValueError(
      f'--gammas must be >= 1 and --loop_gamma >= 0, got {gammas}, {_LOOP_GAMMA.value}.'
    )
  if tree_nodes and (min(tree_nodes) < 2 or _TREE_DEPTH.value < 1):
    raise ValueError(
      f'--tree_nodes must be >= 2 and --tree_depth >= 1, got {tree_nodes}, {_TREE_DEPTH.value}.'
    )
  target_config = synthetic.shape(_TARGET.value)
  drafter_configs = {
    name: synthetic.drafter_config(name, target_config) for name in _DRAFTERS.value
  }
  run = settings_from_flags()
  compile_for = benchmarks.compile_for(_COMPILE_FOR, one_chip=True)
  if compile_for and machines.get(compile_for).platform != 'tpu':
    raise app.UsageError(f"--compile_for={compile_for}: the cost model read is XLA:TPU's.")
  if compile_for:
    paper_scale_tpu.run(
      compile_for,
      target_config,
      drafter_configs,
      gammas=gammas,
      max_new_tokens=run.max_new_tokens,
      dtype=run.dtype,
      batch=run.batch,
      source_length=run.source_length,
      cache_dir=_COMPILE_CACHE.value,
    )
    if tree_nodes:
      title = f'5. token trees of depth {_TREE_DEPTH.value}: XLA:TPU cycles per pass over a step'
      rows = tree_pass_tpu.rows(
        compile_for, _TARGET.value, dtype=run.dtype, nodes=tree_nodes, depth=_TREE_DEPTH.value,
        source_length=run.source_length, cache_len=run.cache_len(max(tree_nodes)),
      )  # fmt: skip
      tables.print_table(title, list(rows), tree_pass_tpu.TABLE)
    return
  timed_tables(
    target_config, drafter_configs, run, gammas=gammas, loop_gamma=_LOOP_GAMMA.value,
    weights=_WEIGHTS.value, hbm_bandwidth=_HBM.value, target_name=_TARGET.value,
    tree_nodes=tree_nodes, tree_depth=_TREE_DEPTH.value,
  )  # fmt: skip


def _bandwidth(device_kind: str, gb_per_s: float | None) -> tuple[float | None, str]:
  """(HBM bytes/s or None, what the header says of it): `gb_per_s` (--hbm_bandwidth), else the
  chip's."""
  chip = machines.chip_for(device_kind)
  if gb_per_s:
    return gb_per_s * 1e9, f'HBM {gb_per_s:g} GB/s (--hbm_bandwidth)'
  if chip:
    return chip.hbm_bandwidth, f'HBM {chip.hbm_bandwidth / 1e9:.0f} GB/s ({chip.name})'
  return None, 'HBM bandwidth unknown: --hbm_bandwidth'


def _target_rows(target, costs: dict, pass_cost: dict, bandwidth, run: Settings) -> list[dict]:
  """Table 1: the target's step and each gamma's pass (their seconds pooled over the drafters'
  measurements), against the HBM bound."""
  step = float(np.median([c['target_step'] for c in costs.values()]))
  step_bytes = call_bytes(target, run, positions=1, cache_len=run.cache_len(0))
  rows = [_bound_row('step', 1, step, 1.0, step_bytes, bandwidth)]
  for g in pass_cost:
    passes = float(np.median([c['target_pass'] for (_, gamma), c in costs.items() if gamma == g]))
    pass_bytes = call_bytes(target, run, positions=g + 1, cache_len=run.cache_len(g))
    rows.append(_bound_row(f'pass-{g + 1}', g + 1, passes, pass_cost[g], pass_bytes, bandwidth))
  return rows


def _drafter_rows(costs: dict, found: dict, step_bytes: float, run: Settings) -> list[dict]:
  """Table 2: each drafter's costs at each gamma, and c at the HBM bound (its bytes over the
  target step's)."""
  return [
    dict(
      drafter=name,
      params=t5.param_count(found[name].params) / 1e6,
      gamma=g,
      step=c['drafter_step'] * 1e3,
      c_alone=c['c_alone'],
      c=c['c'],
      c_fixed=c['c_fixed'],
      c_bound=call_bytes(found[name], run, positions=1, cache_len=run.cache_len(g)) / step_bytes,
      iteration=c['iteration'] * 1e3,
    )
    for (name, g), c in costs.items()
  ]


def _loop_rows(target, found: dict, gamma: int, run: Settings) -> list[dict]:
  """Table 3: each loop's seconds per iteration against its model calls."""
  kw = dict(gamma=gamma, max_new_tokens=run.max_new_tokens)
  seconds, tokens = loop_seconds(target, None, run, **kw)
  timer = dict(repeats=run.timer_repeats, **run.shape())
  calls = timing.step_seconds(target, cache_len=run.cache_len(0), **timer)
  rows = [_loop_row('autoregressive', seconds, calls, tokens)]
  for name, drafter in found.items():
    seconds, tokens = loop_seconds(target, drafter, run, **kw)
    calls = timing.iteration_seconds(
      target,
      drafter,
      gamma=gamma,
      cache_len=run.cache_len(gamma),
      unroll_draft=run.unroll_draft,
      **timer,
    )
    rows.append(_loop_row(name, seconds, calls, tokens))
  return rows


# The paper's formula's best gamma is searched over 1..PAPER_MAX_GAMMA (1..block_size for a
# block drafter).
PAPER_MAX_GAMMA = 64


def _speedup_rows(costs: dict, pass_cost: dict, found: dict, gammas: list[int]) -> list[dict]:
  """Table 4: the formula at each drafter's measured c and the pooled pass cost, per alpha; the
  paper's formula's best gamma over 1..64, or 1..block_size for a block drafter."""
  rows = []
  for name in found:
    for label, *alphas in memory_model.ALPHAS:
      for temperature, alpha in zip((0, 1), alphas):
        by_gamma = {
          g: float(
            analysis.walltime_improvement_measured(
              alpha, g, costs[name, g]['c'], pass_cost[g], costs[name, g]['c_fixed']
            )
          )
          for g in gammas
        }
        best = max(by_gamma, key=by_gamma.get)
        c_best = costs[name, best]['c']
        # A block drafter proposes at most block_size drafts a call, whatever its c.
        most = found[name].config.block_size or PAPER_MAX_GAMMA
        paper_gamma = int(analysis.optimal_gamma(alpha, c_best, max_gamma=most))
        rows.append(
          dict(
            drafter=name,
            alpha_of=label.replace(' ', '-'),
            temp=temperature,
            alpha=alpha,
            **{f'gamma_{g}': s for g, s in by_gamma.items()},
            best_gamma=best,
            best=by_gamma[best],
            paper_gamma=paper_gamma,
            paper=float(analysis.walltime_improvement(alpha, paper_gamma, c_best)),
          )
        )
  return rows


def _bound_row(call, positions, seconds, pass_cost, nbytes, bandwidth) -> dict:
  bound = nbytes / bandwidth if bandwidth else None
  return dict(
    call=call,
    positions=positions,
    ms=seconds * 1e3,
    pass_cost=pass_cost,
    mbytes=nbytes / 1e6,
    bound=None if bound is None else bound * 1e3,
    of_bound=None if bound is None else 100 * bound / seconds if seconds else None,
  )


def _loop_row(name, per_iteration, model_calls, tokens) -> dict:
  share = 100 * (1 - model_calls / per_iteration) if per_iteration else None
  return dict(
    loop=name,
    iteration=per_iteration * 1e3,
    model_calls=model_calls * 1e3,
    loop_share=share,
    tokens=tokens,
  )


_Col = tables.Column
TARGET_COLUMNS = (
  _Col('call', align='<', width=14),
  _Col('positions', fmt='d', width=9),
  _Col('ms', fmt='.4g', width=9),
  _Col('pass_cost', 'pass cost', '.2f'),
  _Col('mbytes', 'MB read', '.1f', 10),
  _Col('bound', 'HBM bound ms', '.4g'),
  _Col('of_bound', 'of bound', '.0f', 8, suffix='%'),
)
DRAFTER_COLUMNS = paper_scale_tpu.drafter_columns('ms', '.4f', '.4g')
LOOP_COLUMNS = (
  _Col('loop', align='<', width=14),
  _Col('iteration', 'loop ms', '.4g'),
  _Col('model_calls', 'model calls ms', '.4g'),
  _Col('loop_share', 'loop share', '.0f', suffix='%'),
  _Col('tokens', 'tokens/iteration', '.2f'),
)
SPEEDUP_COLUMNS = (
  _Col('drafter', align='<', width=14),
  _Col('alpha_of', 'alpha of', align='<', width=24),
  _Col('temp', 'T', 'd', 2),
  _Col('alpha', fmt='.2f', width=5),
  _Col('best_gamma', 'best gamma', 'd'),
  _Col('best', 'best', '.2f', 6, suffix='x'),
  _Col('paper_gamma', 'paper gamma', 'd'),
  _Col('paper', 'paper', '.2f', 6, suffix='x'),
)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
