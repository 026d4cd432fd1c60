r"""A GPU quarter-hour, ready: the figures that await a GPU, measured on one GPU in under 10 minutes,
in one table that replaces the stale ones.

  python -m scripts.gpu_quarter_hour --bundle=.gpu_bundle   # here: what the run carries (<= 64 MiB)
  bash .gpu_bundle/run.sh                                   # on the lent GPU: every stage, <= 570 s
  python -m scripts.gpu_quarter_hour --dry_run              # anywhere: the plan, compiled for an H100

On a lent GPU (the device tool's `run`): carry the bundle (`carry=['.gpu_bundle']`, the folder
ignored in .git/info/exclude) and run `bash .gpu_bundle/run.sh` with timeout_s=600; its table
comes back from $OUT. run.sh (scripts/gpu_bundle.py) installs the pinned wheels (the GPU
machine's image has jax 0.11.2 with CUDA 13, torch and transformers, but not ml_collections, nor
our pins of flax, optax and orbax-checkpoint) into /tmp/site, then runs this script with
--out=$OUT.

Stages (`STAGES`), each its own process under its own time budget, output captured to
`<--out>/<stage>.log`, run in turn until the deadline (--deadline seconds from the start; a stage
starts only with at least half its budget left, and runs under min(budget, time left); the rest
are reported as skipped):

  step_11b      benchmarks.paper_scale: the 11B target's step and (gamma+1)-position pass against
                the HBM bound, each drafter's c, the formula's speedup (tables 1, 2, 4).
  hf_peer_11b   benchmarks.hf_peer --random_weights at 11B: ours against transformers on the same
                weights (without torch.compile's row: its compile alone can take minutes).
  grown_xxl     the main job on --pair (default the 13.5M `ende`: the 48M pairs do not fit in the
                64 MiB a run carries) grown to t5_1_1-xxl shapes (11B, bfloat16), 8 sentences,
                the distilled drafter at gamma 5 with token and block verification and its top-2
                token tree of 5 nodes, T = 0 and 1.
  block_tree    benchmarks.paper_scale with a block drafter at the 11B target: its one call's cost,
                the formula's speedup, and a token-tree pass of 16 nodes against a chain (table 5).
  lookup        the main job's rows of the source-lookup drafter alone on the grown pair (skipped,
                saying why, where `specdec_jax.draft_lookup` registers no drafting entry named
                'lookup': `lookup_status`).

Budgets are estimates (the H100 run of 2026-11-26: a larger paper_scale call took 242 s); no GPU
has run this script yet. XLA:GPU compiled the grown target's build in 382 s on 2 loaded CPU cores
(the dry run): where the GPU machine compiles that slowly, grown_xxl times out. The stages share
one JAX compilation cache (<--workdir>/jax_cache). `--stages` and `--budgets=name=seconds,...` change them. A new stage is
one `StageSpec` in `STAGES`: its command, the figures read from its output, the programs the dry
run compiles, and when it is available.

Writes `<--out>/gpu_quarter_hour.md` (one markdown table: per stage its figures, status, seconds,
the device's `device_kind`, the jax version, the date and the exact command) and
`gpu_quarter_hour.json` beside it, rewritten after every stage. The main job's stages write their
rows to `<--workdir>/<stage>` (results.json; the table reads them there).

`--dry_run` runs nothing: it prints the plan (every stage's command and budget, or why it is
skipped) and compiles each stage's main program for an H100 without one (JAX's compile-only
devices, `benchmarks.machines`; XLA:GPU from the CUDA plugin of this jaxlib: `pip install
--target /tmp/gpu_site jax-cuda13-plugin==V jax-cuda13-pjrt==V`, found there or by --gpu_site),
in bfloat16, greedy, printing each program's memory against the H100's 80 GiB. transformers'
rows cannot be compiled without the device (torch builds its kernels there); the plan says so.

`--bundle=DIR` copies what the run needs into DIR (the package, benchmarks, experiments, scripts,
the pair of --pair and the pairs of --with_pairs with the base checkpoints their int8 deltas
name, and the pinned wheels, downloaded or copied from --wheels_from) and fails if it exceeds
64 MiB. The 48M pairs do not fit: ende48m alone is 85 MB (its target 73 MB), and debsumm48m's
target is a delta on ende48m's.
"""

import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from absl import app, flags

from scripts import gpu_bundle

REPO = pathlib.Path(__file__).resolve().parents[1]
GPU_SITE = '/tmp/gpu_site'  # where `machines.install_line('h100')` puts the CUDA plugin
TABLE = 'gpu_quarter_hour'  # <--out>/gpu_quarter_hour.md and .json
LOOKUP_MODULE = 'specdec_jax.draft_lookup'
# The main job's config items that give the source-lookup drafter's rows alone.
LOOKUP_ITEMS = 'drafters=,trees=,lookup=true'

FLAGS = flags.FlagValues()
_DRY_RUN = flags.DEFINE_bool(
  'dry_run',
  False,
  'Print the plan and compile it for --compile_for; run nothing.',
  flag_values=FLAGS,
)
_BUNDLE = flags.DEFINE_string(
  'bundle', None, 'Copy what a GPU run needs into this folder (<= 64 MiB); run nothing.',
  flag_values=FLAGS,
)  # fmt: skip
_WITH_PAIRS = flags.DEFINE_list(
  'with_pairs', [], 'With --bundle: more pairs of pretrained/ (e.g. ende48m).', flag_values=FLAGS
)
_WHEELS_FROM = flags.DEFINE_string(
  'wheels_from', None, 'With --bundle: take the pinned wheels from this folder, not pip.',
  flag_values=FLAGS,
)  # fmt: skip
_OUT = flags.DEFINE_string(
  'out', '/tmp/gpu_quarter_hour', 'The table and the stage logs.', flag_values=FLAGS
)
_WORKDIR = flags.DEFINE_string(
  'workdir', '/tmp/gpu_quarter_hour_work', "The main job stages' workdirs.", flag_values=FLAGS
)
_DEADLINE = flags.DEFINE_integer(
  'deadline', 570, 'Seconds from the start after which no stage runs.', flag_values=FLAGS
)
_STAGES = flags.DEFINE_list('stages', [], 'Stages to run (default: all).', flag_values=FLAGS)
_BUDGETS = flags.DEFINE_list(
  'budgets', [], "name=seconds items replacing stages' budgets.", flag_values=FLAGS
)
_ALLOW_CPU = flags.DEFINE_bool(
  'allow_cpu', False, 'Run the stages where JAX sees no GPU.', flag_values=FLAGS
)
_COMPILE_FOR = flags.DEFINE_string(
  'compile_for', 'h100', 'With --dry_run: the one-GPU machine compiled for.', flag_values=FLAGS
)
_GPU_SITE = flags.DEFINE_string(
  'gpu_site', GPU_SITE, 'With --dry_run: a folder holding the CUDA plugin.', flag_values=FLAGS
)
_COMPILE_ONLY = flags.DEFINE_bool(
  'compile_only', False, 'Internal: the compile half of --dry_run.', flag_values=FLAGS
)
_TARGET = flags.DEFINE_string('target', 't5-11b', 'The target shape.', flag_values=FLAGS)
_DRAFTER = flags.DEFINE_string(
  'drafter', 't5-small', 'The small T5 drafter (paper_scale, hf_peer).', flag_values=FLAGS
)
_BLOCK = flags.DEFINE_string(
  'block_drafter', 'block', "block_tree's drafter (paper_scale's block[:NAME]).", flag_values=FLAGS
)
_PAIR = flags.DEFINE_string('pair', 'ende', 'The pair the main job grows.', flag_values=FLAGS)
_GROW_TO = flags.DEFINE_string(
  'grow_to', 't5_1_1-xxl', 'The T5 shape the pair grows to.', flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 5, 'Drafts per iteration.', flag_values=FLAGS)
_BLOCK_GAMMA = flags.DEFINE_integer(
  'block_gamma', 8, "The block drafter's gamma.", flag_values=FLAGS
)
_TREE_NODES = flags.DEFINE_integer(
  'tree_nodes', 16, "block_tree's token-tree pass (nodes).", flag_values=FLAGS
)
_MAIN_TREE = flags.DEFINE_integer(
  'main_tree_nodes', 5, "The main job's token tree (nodes, odd).", flag_values=FLAGS
)
_NUM_EXAMPLES = flags.DEFINE_integer(
  'num_examples', 8, "The main job's test sentences.", flag_values=FLAGS
)
_NUM_SENTENCES = flags.DEFINE_integer('num_sentences', 4, "hf_peer's sentences.", flag_values=FLAGS)
_SOURCE = flags.DEFINE_integer('source_length', 64, 'Source tokens.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Token limit.', flag_values=FLAGS)


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the stages' commands and the dry run's programs share (the flags', read once)."""

  target: str = 't5-11b'
  drafter: str = 't5-small'
  block_drafter: str = 'block'
  pair: str = 'ende'
  grow_to: str = 't5_1_1-xxl'
  gamma: int = 5
  block_gamma: int = 8
  tree_nodes: int = 16
  main_tree_nodes: int = 5
  num_examples: int = 8
  num_sentences: int = 4
  source_length: int = 64
  max_new_tokens: int = 64
  workdir: str = '/tmp/gpu_quarter_hour_work'
  python: str = sys.executable
  dtype: str = 'bfloat16'


def settings_from_flags() -> Settings:
  return Settings(
    target=_TARGET.value, drafter=_DRAFTER.value, block_drafter=_BLOCK.value, pair=_PAIR.value,
    grow_to=_GROW_TO.value, gamma=_GAMMA.value, block_gamma=_BLOCK_GAMMA.value,
    tree_nodes=_TREE_NODES.value, main_tree_nodes=_MAIN_TREE.value,
    num_examples=_NUM_EXAMPLES.value, num_sentences=_NUM_SENTENCES.value,
    source_length=_SOURCE.value, max_new_tokens=_MAX_NEW.value, workdir=_WORKDIR.value,
  )  # fmt: skip


def print_flush(*args, **kwargs):
  print(*args, **kwargs, flush=True)


# --- The stages -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageSpec:
  """One stage: its command, what the table reads from its output, what the dry run compiles.

  Attributes:
    name: the stage's name (its log: <out>/<name>.log).
    what: one line of what it measures.
    budget_s: its seconds, at most.
    argv: (settings) -> the command (argv[0] the Python).
    figures: (stdout, settings) -> {figure: value}, with 'text', the table's cell.
    programs: (settings, mesh) -> {name: jax.stages.Lowered}: its main program(s), lowered for
      the dry run on a compile-only one-device mesh; None: nothing to compile.
    not_compiled: what the dry run cannot compile without the device, and why ('' none).
    status: (settings) -> why the stage cannot run yet, or None.
  """

  name: str
  what: str
  budget_s: int
  argv: Callable[[Settings], list[str]]
  figures: Callable[[str, Settings], dict]
  programs: Callable | None = None
  not_compiled: str = ''
  status: Callable[[Settings], str | None] = lambda settings: None


def _paper_scale(s: Settings, drafters: str, gammas: str, rounds: int, *more: str) -> list[str]:
  return [
    s.python, '-m', 'benchmarks.paper_scale', f'--target={s.target}', f'--drafters={drafters}',
    f'--gammas={gammas}', '--loop_gamma=0', f'--rounds={rounds}', f'--dtype={s.dtype}',
    f'--source_length={s.source_length}', f'--max_new_tokens={s.max_new_tokens}', *more,
  ]  # fmt: skip


def _step_argv(s: Settings) -> list[str]:
  return _paper_scale(s, f'{s.drafter},one-layer', str(s.gamma), 2)


def _hf_peer_argv(s: Settings) -> list[str]:
  return [
    s.python, '-m', 'benchmarks.hf_peer', '--random_weights', f'--target={s.target}',
    f'--drafters={s.drafter}', f'--dtype={s.dtype}', f'--num_sentences={s.num_sentences}',
    f'--source_length={s.source_length}', f'--max_new_tokens={s.max_new_tokens}', '--nocompile',
  ]  # fmt: skip


def _main_items(s: Settings, *items: str) -> str:
  """The main job's config for a grown stage: `experiments/configs/ende.py` (`debsumm.py` for a
  debsumm pair) grown to `s.grow_to`, shrunk to a quarter-hour, then `items`."""
  config = 'debsumm' if 'debsumm' in s.pair else 'ende'
  return (
    f'experiments/configs/{config}.py:xxl,pretrained={s.pair},grow_to={s.grow_to},'
    f'num_examples={s.num_examples},gammas={s.gamma},temperatures=0,1,' + ','.join(items)
  )


def _grown_argv(s: Settings) -> list[str]:
  items = _main_items(s, 'drafters=distilled', f'tree_nodes={s.main_tree_nodes}')
  workdir = os.path.join(s.workdir, 'grown_xxl')
  return [s.python, '-m', 'experiments.translate', f'--config={items}', f'--workdir={workdir}']


def _block_argv(s: Settings) -> list[str]:
  return _paper_scale(
    s,
    s.block_drafter,
    ','.join(map(str, sorted({4, s.block_gamma}))),
    1,
    f'--tree_nodes={s.tree_nodes}',
    '--tree_depth=8',
  )


def _lookup_argv(s: Settings) -> list[str]:
  workdir = os.path.join(s.workdir, 'lookup')
  config = _main_items(s, LOOKUP_ITEMS)
  return [s.python, '-m', 'experiments.translate', f'--config={config}', f'--workdir={workdir}']


def lookup_status(s: Settings | None = None) -> str | None:
  """Why the lookup drafter's rows cannot run yet, or None: `LOOKUP_MODULE` must import and
  register a drafting entry named 'lookup' in `specdec_jax.drafting.REGISTRY` (issue 60's "one
  module plus one registration line"). Asked in a fresh CPU-only process: importing the library
  here would start JAX's GPU client in the process that runs the stages."""
  del s
  probe = (
    'import importlib, json\n'
    'try:\n'
    f'  importlib.import_module({LOOKUP_MODULE!r})\n'
    "  drafting = importlib.import_module('specdec_jax.drafting')\n"
    "  print(json.dumps(sorted(getattr(drafting, 'REGISTRY', {}))))\n"
    'except Exception as e:\n'
    "  print(json.dumps(f'{type(e).__name__}: {e}'))\n"
  )
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  done = subprocess.run(
    [sys.executable, '-c', probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
  )
  lines = done.stdout.strip().splitlines()
  if done.returncode or not lines:
    return f'not available yet: asking for it failed ({done.stderr.strip()[-300:]})'
  found = json.loads(lines[-1])
  if isinstance(found, str):
    return f'not available yet: {LOOKUP_MODULE} or its registry does not import ({found})'
  if 'lookup' not in found:
    return (
      f"not available yet: {LOOKUP_MODULE} registers no drafting entry named 'lookup' "
      f'(specdec_jax.drafting.REGISTRY has {", ".join(found) or "nothing"})'
    )
  return None


STAGES = (
  StageSpec(
    'step_11b',
    "the target's step and pass against the HBM bound; each drafter's c",
    90,
    _step_argv,
    lambda out, s: step_figures(out, s),
    programs=lambda s, mesh: _generate_program(s, mesh),
  ),
  StageSpec(
    'hf_peer_11b',
    'ours against transformers on the same random 11B weights, greedy, batch 1',
    120,
    _hf_peer_argv,
    lambda out, s: hf_peer_figures(out),
    programs=lambda s, mesh: _speculative_programs(s, mesh, s.drafter, gamma=4),
    not_compiled="transformers' rows: torch builds its kernels on the device",
  ),
  StageSpec(
    'grown_xxl',
    "the main job's rows on the pair grown to t5_1_1-xxl (11B), with a token tree",
    220,
    _grown_argv,
    lambda out, s: main_job_figures(os.path.join(s.workdir, 'grown_xxl')),
    programs=lambda s, mesh: _grown_programs(s, mesh),
  ),
  StageSpec(
    'block_tree',
    "a block drafter's call and a token-tree pass at the 11B target",
    80,
    _block_argv,
    lambda out, s: block_figures(out, s),
    programs=lambda s, mesh: _block_programs(s, mesh),
  ),
  StageSpec(
    'lookup',
    "the source-lookup drafter's main job rows on the grown pair",
    60,
    _lookup_argv,
    lambda out, s: main_job_figures(os.path.join(s.workdir, 'lookup')),
    programs=lambda s, mesh: _lookup_programs(s, mesh),
    status=lambda s: lookup_status(s),
  ),
)


@dataclasses.dataclass(frozen=True)
class Stage:
  """A planned stage: its spec, command and budget, or why it is skipped."""

  spec: StageSpec
  argv: tuple[str, ...]
  budget_s: int
  skip: str = ''

  @property
  def name(self) -> str:
    return self.spec.name

  def command(self) -> str:
    """The command as typed: `python` for this interpreter."""
    return shlex.join(['python', *self.argv[1:]])


def plan(
  settings: Settings,
  names: Sequence[str] = (),
  budgets: dict[str, int] | None = None,
  *,
  check: bool = True,
) -> list[Stage]:
  """The stages of `names` (default: all), in `STAGES`' order, with `budgets` replacing theirs;
  a stage whose `status` says why not is planned as skipped (`check` False: not asked)."""
  known = [spec.name for spec in STAGES]
  for name in [*names, *(budgets or {})]:
    if name not in known:
      raise ValueError(f'Unknown stage {name!r}; the stages are {", ".join(known)}.')
  stages = []
  for spec in STAGES:
    if names and spec.name not in names:
      continue
    budget = (budgets or {}).get(spec.name, spec.budget_s)
    skip = (spec.status(settings) or '') if check else ''
    stages.append(Stage(spec, tuple(spec.argv(settings)), budget, skip))
  return stages


def parse_budgets(items: Sequence[str]) -> dict[str, int]:
  """['grown_xxl=200'] -> {'grown_xxl': 200}."""
  out = {}
  for item in items:
    name, _, seconds = item.partition('=')
    if not seconds.strip().isdigit():
      raise ValueError(f'--budgets items are name=seconds, got {item!r}.')
    out[name.strip()] = int(seconds)
  return out


# --- The figures each stage's output gives ---------------------------------------------------


def _rows(text: str, title: str) -> list[list[str]]:
  """The whitespace-split rows of the printed table whose title (or header) line starts with
  `title`: the lines after it (a titled table's header skipped) up to a blank line."""
  lines = text.splitlines()
  start = next((i for i, line in enumerate(lines) if line.startswith(title)), None)
  if start is None:
    return []
  first = start + (2 if title[0].isdigit() else 1)  # '1. target calls' has a header line after
  rows = []
  for line in lines[first:]:
    if not line.strip():
      break
    rows.append(line.split())
  return rows


def _float(cell: str) -> float | None:
  try:
    return float(cell.rstrip('x%').replace(',', ''))
  except ValueError:
    return None


def _paper_alpha_rows(text: str) -> dict[str, tuple[int, float]]:
  """Table 4's rows at the paper's alpha, T = 0: {drafter: (best gamma, best speedup)}."""
  out = {}
  for row in _rows(text, '4. speedup'):
    if len(row) >= 8 and row[1].startswith('paper') and row[2] == '0':
      out[row[0]] = (int(row[-4]), _float(row[-3]))
  return out


def step_figures(text: str, s: Settings) -> dict:
  """paper_scale's tables 1, 2 and 4: the step against the HBM bound, the pass, each c."""
  target = {row[0]: row for row in _rows(text, '1. target calls')}
  step, passes = target.get('step'), target.get(f'pass-{s.gamma + 1}')
  if not step:
    return {'text': 'no step row in the output'}
  out = dict(step_ms=_float(step[2]), bound_ms=_float(step[5]), of_bound=step[6])
  text_ = f'{s.target} step {step[2]} ms, {step[6]} of its HBM bound ({step[5]} ms)'
  if passes:
    out['pass_cost'] = _float(passes[3])
    text_ += f'; {s.gamma + 1}-position pass {passes[3]} steps'
  drafters = {row[0]: row for row in _rows(text, '2. drafters')}
  out['c'] = {name: _float(row[5]) for name, row in drafters.items()}
  if out['c']:
    text_ += '; c: ' + ', '.join(f'{name} {row[5]}' for name, row in drafters.items())
  best = _paper_alpha_rows(text)
  out['formula_paper_alpha'] = {name: dict(gamma=g, speedup=x) for name, (g, x) in best.items()}
  if best:
    text_ += "; formula at the paper's alpha 0.75: " + ', '.join(
      f'{name} {x:.2f}x' for name, (g, x) in best.items()
    )
  return dict(out, text=text_)


def block_figures(text: str, s: Settings) -> dict:
  """paper_scale's block drafter (tables 2, 4) and table 5's tree pass."""
  rows = _rows(text, '2. drafters')
  calls = {int(row[2]): _float(row[6]) for row in rows if len(row) >= 7}
  out: dict = dict(call_steps=calls)
  parts = [f'block call {calls[g]:.3f} steps at gamma {g}' for g in sorted(calls) if calls[g]]
  best = _paper_alpha_rows(text)
  for name, (g, x) in best.items():
    out['formula_paper_alpha'] = dict(gamma=g, speedup=x)
    parts.append(f"formula at the paper's alpha 0.75: {x:.2f}x (gamma {g})")
  trees = _rows(text, '5. token trees')
  out['tree'] = {
    int(r[0]): dict(chain=_float(r[1]), tree=_float(r[2])) for r in trees if len(r) > 3
  }
  for r in trees:
    parts.append(f'tree pass of {r[0]} nodes {r[2]} steps (chain {r[1]})')
  return dict(out, text='; '.join(parts) or 'no block or tree rows in the output')


def hf_peer_figures(text: str) -> dict:
  """hf_peer's table: ms a token and the ratio to transformers' greedy, per method."""
  out, parts = {}, []
  for row in _rows(text, 'system'):
    if len(row) < 8:
      continue
    system, method, drafter, _, ms, _, vs_hf, identical = row[:8]
    key = f'{system} {method}' + (f' {drafter}' if drafter != '-' else '')
    out[key] = dict(ms_per_token=_float(ms), vs_hf_greedy=_float(vs_hf), identical=identical)
    if ms != '-':
      parts.append(f'{key} {ms} ms/token' + (f' ({vs_hf} HF greedy)' if system == 'ours' else ''))
    else:
      parts.append(f'{key}: {" ".join(row[8:])[:80] or "no figure"}')
  return dict(methods=out, text='; '.join(parts) or 'no table in the output')


def main_job_figures(workdir: str) -> dict:
  """The main job's rows (its results.json): per temperature the autoregressive tokens/s and
  every other row's speedup."""
  path = pathlib.Path(workdir) / 'results.json'
  if not path.exists():
    return {'text': f'no rows ({path} absent)'}
  rows = json.loads(path.read_text())
  parts = []
  for temp in sorted({r['temp'] for r in rows}):
    at = [r for r in rows if r['temp'] == temp]
    ar = [r for r in at if r['method'] == 'autoregressive']
    cells = [f'AR {ar[0]["tokens_per_s"]:.1f} tok/s'] if ar else []
    for r in at:
      if r['method'] == 'autoregressive':
        continue
      shape = f'N{r["tree_nodes"]}' if r.get('tree_nodes') else f'g{r["gamma"]}'
      alpha = f', alpha {r["alpha"]:.2f}' if r.get('alpha') is not None else ''
      cells.append(
        f'{r["drafter"]} {r["method"]} {shape} {r["speedup"]:.2f}x '
        f'({r["block_efficiency"]:.2f} tok/call{alpha})'
      )
    parts.append(f'T={temp:g}: ' + ', '.join(cells))
  return dict(rows=rows, text='; '.join(parts) or 'no rows')


# --- Running ---------------------------------------------------------------------------------


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')


def probe_device(timeout: int = 120) -> dict:
  """{'kind', 'platform', 'jax'} of JAX's first device, asked in a process of its own (this one
  keeps no GPU client while the stages run)."""
  code = (
    'import json, jax; d = jax.devices()[0]; print(json.dumps(dict(kind=d.device_kind, '
    'platform=d.platform, jax=jax.__version__)))'
  )
  done = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, timeout=timeout, cwd=REPO
  )
  lines = done.stdout.strip().splitlines()
  if done.returncode or not lines:
    raise RuntimeError(f'Asking JAX for its device failed: {done.stderr.strip()[-2000:]}')
  return json.loads(lines[-1])


def _last_line(path: pathlib.Path) -> str:
  try:
    lines = [line for line in path.read_text(errors='replace').splitlines() if line.strip()]
  except OSError:
    return ''
  return lines[-1][-160:] if lines else ''


def run_stage(
  stage: Stage,
  log: pathlib.Path,
  timeout: float,
  *,
  cache_dir: str = '/tmp/gpu_quarter_hour_work/jax_cache',
  say=print_flush,
  every: float = 30,
):
  """Runs `stage` as a process group with its output in `log`, killed at `timeout` seconds:
  (status, seconds). JAX's compilation cache in `cache_dir` unless the environment names one.
  Progress: a line every `every` seconds with the log's last line."""
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')  # JAX and torch share the GPU
  # One compilation cache for the stages: the lookup stage grows the target grown_xxl grew, and
  # the two paper_scale stages compile the same target programs.
  env.setdefault('JAX_COMPILATION_CACHE_DIR', str(cache_dir))
  start = time.monotonic()
  with open(log, 'w') as f:
    f.write(f'$ {stage.command()}\n')
    f.flush()
    proc = subprocess.Popen(
      stage.argv, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env, start_new_session=True
    )
    while True:
      left = timeout - (time.monotonic() - start)
      try:
        rc = proc.wait(timeout=max(0.1, min(every, left)))
        break
      except subprocess.TimeoutExpired:
        if time.monotonic() - start >= timeout:
          _kill(proc)
          return f'timed out at {timeout:.0f} s', time.monotonic() - start
        say(f'  {stage.name}: {time.monotonic() - start:.0f} s: {_last_line(log)}')
  seconds = time.monotonic() - start
  return ('ok' if rc == 0 else f'failed (exit {rc})'), seconds


def _kill(proc: subprocess.Popen) -> None:
  """Ends the stage's process group (it and what it started): TERM, then KILL after 10 s."""
  for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(timeout=wait)
      return
    except subprocess.TimeoutExpired:
      continue


def run(
  stages: list[Stage],
  settings: Settings,
  out: str,
  *,
  deadline: float,
  device: dict,
  say=print_flush,
  clock=time.monotonic,
) -> list[dict]:
  """Runs the stages in turn until `deadline` seconds from now, writing the table after each:
  a stage starts only with at least half its budget left, under min(budget, time left)."""
  os.makedirs(out, exist_ok=True)
  start = clock()
  results = []
  for i, stage in enumerate(stages):
    elapsed = clock() - start
    left = deadline - elapsed
    record = dict(
      stage=stage.name, what=stage.spec.what, budget_s=stage.budget_s, command=stage.command(),
      argv=list(stage.argv), device=device.get('kind'), jax=device.get('jax'), date=_now(),
      seconds=None, figures={'text': ''},
    )  # fmt: skip
    prefix = f'[{elapsed:4.0f} s] {i + 1}/{len(stages)} {stage.name}'
    if stage.skip:
      record['status'] = f'skipped: {stage.skip}'
    elif left < stage.budget_s / 2:
      record['status'] = f'skipped: {left:.0f} s left before the {deadline:.0f} s deadline'
    else:
      say(f'{prefix}: started (budget {stage.budget_s} s, {left:.0f} s left): {stage.command()}')
      log = pathlib.Path(out) / f'{stage.name}.log'
      cache = os.path.join(settings.workdir, 'jax_cache')
      record['status'], record['seconds'] = run_stage(
        stage, log, min(stage.budget_s, left), cache_dir=cache, say=say
      )
      record['log'] = str(log)
      try:
        record['figures'] = stage.spec.figures(log.read_text(errors='replace'), settings)
      except Exception as e:  # noqa: BLE001 (a table cell, not a crash)
        record['figures'] = {'text': f'figures unread ({type(e).__name__}: {e}); see the log'}
    results.append(record)
    took = f' in {record["seconds"]:.0f} s' if record['seconds'] is not None else ''
    figures = record['figures'].get('text')
    say(f'{prefix}: {record["status"]}{took}' + (f' -- {figures}' if figures else ''))
    write_table(results, out)
  return results


def _cell(text) -> str:
  return str('-' if text is None or text == '' else text).replace('|', '\\|').replace('\n', ' ')


def markdown(results: list[dict]) -> str:
  """The one table: per stage its figures, status, seconds (budget), device, jax, date, command."""
  head = ('stage', 'figures', 'status', 's (budget)', 'device', 'jax', 'date', 'command')
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for r in results:
    seconds = f'{r["seconds"]:.0f}' if r.get('seconds') is not None else '-'
    cells = (
      r['stage'], r['figures'].get('text'), r['status'], f'{seconds} ({r["budget_s"]})',
      r['device'], r['jax'], r['date'], f'`{r["command"]}`',
    )  # fmt: skip
    lines.append('| ' + ' | '.join(_cell(c) for c in cells) + ' |')
  return '\n'.join(lines) + '\n'


def write_table(results: list[dict], out: str) -> tuple[pathlib.Path, pathlib.Path]:
  """<out>/gpu_quarter_hour.md and .json."""
  md, js = (pathlib.Path(out) / f'{TABLE}.{ext}' for ext in ('md', 'json'))
  kinds = sorted({str(r['device']) for r in results})
  title = f'# GPU quarter-hour: {", ".join(kinds)}, jax {results[0]["jax"]}\n\n' if results else ''
  md.write_text(title + markdown(results))
  js.write_text(json.dumps(results, indent=1) + '\n')
  return md, js


# --- The dry run: the plan, compiled for an H100 without one ---------------------------------


def print_plan(stages: list[Stage], deadline: float, say=print_flush) -> None:
  budgets = sum(s.budget_s for s in stages if not s.skip)
  say(f'plan: {len(stages)} stages on one GPU, deadline {deadline:.0f} s (budgets {budgets} s):')
  for stage in stages:
    say(f'  {stage.name} ({stage.spec.what})')
    if stage.skip:
      say(f'    skipped: {stage.skip}')
    else:
      say(f'    budget {stage.budget_s} s: {stage.command()}')
    if stage.spec.not_compiled:
      say(f'    not compiled without the device: {stage.spec.not_compiled}')


def _sampling():
  from specdec_jax.sampling import SamplingConfig

  return SamplingConfig(temperature=0.0)


def _abstract(s: Settings, name: str, mesh, target=None):
  """An abstract model of the shape `name` (or paper_scale's one-layer / block shapes over
  `target`'s config: `synthetic.drafter_config`), bfloat16, replicated on `mesh`."""
  from benchmarks import synthetic

  if target is None:
    config = synthetic.shape(name, s.dtype)
  else:
    config = dataclasses.replace(synthetic.drafter_config(name, target), dtype=s.dtype)
  return synthetic.abstract_model(config, mesh, param_dtype=s.dtype)


def _ids(s: Settings, mesh):
  from benchmarks import synthetic

  return synthetic.abstract_batch(mesh, 1, s.source_length)


def _generate_program(s: Settings, mesh) -> dict:
  """`generate` of the target: its loop runs the step that step_11b times against the bound."""
  import jax

  from specdec_jax import decode

  target, ids = _abstract(s, s.target, mesh), _ids(s, mesh)
  with jax.set_mesh(mesh):
    low = decode.lower_generate(
      target, ids, ids, sampling=_sampling(), max_new_tokens=s.max_new_tokens
    )
  return {f'generate ({s.target})': low}


def _speculative_programs(s: Settings, mesh, drafter: str, *, gamma: int, tree=None) -> dict:
  import jax

  from specdec_jax import decode

  target, ids = _abstract(s, s.target, mesh), _ids(s, mesh)
  own_encoder = drafter in _t5_shapes()
  model = _abstract(s, drafter, mesh, None if own_encoder else target.config)
  with jax.set_mesh(mesh):
    low = decode.lower_speculative(
      target, model, ids, ids, gamma=gamma, sampling=_sampling(),
      max_new_tokens=s.max_new_tokens, tree=tree,
    )  # fmt: skip
  what = f'tree of {tree.num_nodes}' if tree else f'gamma {gamma}'
  return {f'speculative ({s.target}, {drafter}, {what})': low}


def _lookup_programs(s: Settings, mesh) -> dict:
  """The source-lookup drafter's loop at --gamma over the target (it calls no model: one pass an
  iteration)."""
  import jax

  from specdec_jax import decode, draft_lookup

  target, ids = _abstract(s, s.target, mesh), _ids(s, mesh)
  with jax.set_mesh(mesh):
    low = decode.lower_speculative(
      target, draft_lookup.source_lookup(target), ids, ids, gamma=s.gamma, sampling=_sampling(),
      max_new_tokens=s.max_new_tokens,
    )  # fmt: skip
  return {f'speculative ({s.target}, source lookup, gamma {s.gamma})': low}


def _t5_shapes():
  from specdec_jax.models import t5

  return t5.CONFIGS


def _block_programs(s: Settings, mesh) -> dict:
  """The block drafter's loop at --block_gamma and its best-first tree loop of --tree_nodes."""
  from specdec_jax import decode

  out = _speculative_programs(s, mesh, s.block_drafter, gamma=s.block_gamma)
  depth = min(s.tree_nodes - 1, s.block_gamma)
  tree = decode.TreeSpec(s.tree_nodes)
  out.update(_speculative_programs(s, mesh, s.block_drafter, gamma=depth, tree=tree))
  return out


def _grown_programs(s: Settings, mesh) -> dict:
  """The grown target's build (`t5_growth.lower_grow`, as `pretrained.grow_pair` runs it) and
  the loops of the distilled drafter over it: a chain at --gamma and its top-2 token tree."""
  import jax

  from benchmarks import synthetic
  from specdec_jax import decode, pretrained, step_models
  from specdec_jax.measure import job_config
  from specdec_jax.models import t5_growth

  pair = pretrained.load(s.pair)  # on the host: its shapes
  grown = t5_growth.grown_config(pair.target.config, s.grow_to)
  whole = lambda x: jax.ShapeDtypeStruct(
    x.shape, x.dtype, sharding=jax.NamedSharding(mesh, jax.P())
  )
  small = pair.target.replace(params=jax.tree.map(whole, pair.target.params))
  build, target = t5_growth.lower_grow(small, grown, mesh=mesh, param_dtype=s.dtype)
  config = pair.drafters['distilled'].config
  widths = {k: grown.d_model for k in ('encoder_dim', 'feature_dim') if getattr(config, k)}
  drafter = synthetic.abstract_model(
    dataclasses.replace(config, **widths), mesh, param_dtype=s.dtype
  )
  depth, tree = job_config.tree_spec(step_models.as_step_model(drafter)[0], s.main_tree_nodes)
  ids = _ids(s, mesh)
  options = dict(sampling=_sampling(), max_new_tokens=s.max_new_tokens)
  with jax.set_mesh(mesh):
    chain = decode.lower_speculative(target, drafter, ids, ids, gamma=s.gamma, **options)
    topk = decode.lower_speculative(target, drafter, ids, ids, gamma=depth, tree=tree, **options)
  return {
    f'build ({s.pair} grown to {s.grow_to})': build,
    f'speculative (grown, distilled, gamma {s.gamma})': chain,
    f'speculative (grown, distilled, tree of {tree.num_nodes})': topk,
  }


def compile_stages(stages: list[Stage], settings: Settings, machine: str, say=print_flush) -> int:
  """Compiles each planned stage's programs for `machine`'s compile-only device (this process's
  JAX must hold its compiler): a line per program with its memory; returns the failures."""
  import jax

  from benchmarks import machines

  mesh = machines.compile_only_mesh(machine, 1, 1)
  hbm = machines.get(machine).chip.hbm_bytes
  device = mesh.devices.flat[0]
  say(f'compiling for {machine} ({device.device_kind}, compile-only), jax {jax.__version__}:')
  failures = 0
  for stage in stages:
    if stage.skip or stage.spec.programs is None:
      why = stage.skip or stage.spec.not_compiled or 'no program of its own'
      say(f'  {stage.name}: not compiled: {why}')
      continue
    try:
      start = time.monotonic()
      lowered = stage.spec.programs(settings, mesh)
      for name, low in lowered.items():
        t0 = time.monotonic()
        m = low.compile().memory_analysis()
        args, outs, temps = m.argument_size_in_bytes, m.output_size_in_bytes, m.temp_size_in_bytes
        total = args + outs + temps - m.alias_size_in_bytes  # a donated input is its output
        fits = 'fits' if total <= hbm else 'does NOT fit'
        say(
          f'  {stage.name}: {name}: compiled in {time.monotonic() - t0:.1f} s; arguments '
          f'{args / 2**30:.2f} GiB, outputs {outs / 2**30:.2f}, temporaries '
          f'{temps / 2**30:.2f}: {total / 2**30:.2f} GiB {fits} {hbm / 2**30:.0f} GiB'
        )
      say(f'  {stage.name}: {len(lowered)} programs in {time.monotonic() - start:.1f} s')
    except Exception as e:  # noqa: BLE001 (one stage's failure is a line of the plan)
      failures += 1
      first = (str(e).strip().splitlines() or [''])[0][:300]
      say(f'  {stage.name}: compile FAILED: {type(e).__name__}: {first}')
  return failures


def cuda_plugin_path(gpu_site: str) -> str | None:
  """'' where this Python already has the CUDA plugin, `gpu_site` where it holds it, else None."""
  for plugin in ('jax_plugins.xla_cuda13', 'jax_plugins.xla_cuda12'):
    try:
      if importlib.util.find_spec(plugin):
        return ''
    except ModuleNotFoundError:  # no jax_plugins package at all
      break
  site = pathlib.Path(gpu_site)
  if any((site / 'jax_plugins').glob('xla_cuda*')):
    return str(site)
  return None


def dry_run(argv: list[str], gpu_site: str, machine: str, say=print_flush) -> int:
  """The compile half of --dry_run in a fresh process whose JAX holds the CUDA plugin (a backend
  chooses its plugins when it starts) and runs on the CPU alone: its exit status."""
  from benchmarks import machines

  path = cuda_plugin_path(gpu_site)
  if path is None:
    say(f'not compiled for {machine}: its compiler is not in this Python: '
        f'{machines.install_line(machine)} (or --gpu_site=DIR).')  # fmt: skip
    return 0
  env = dict(os.environ, JAX_PLATFORMS='cpu', JAX_SKIP_CUDA_CONSTRAINTS_CHECK='1')
  env['PYTHONPATH'] = os.pathsep.join(filter(None, [str(REPO), path, env.get('PYTHONPATH')]))
  # Its lines as they come (an 11B program takes a minute or more to compile here); its stderr
  # (the compilers' warnings) only where it fails.
  done = subprocess.run(
    [sys.executable, '-m', 'scripts.gpu_quarter_hour', *argv, '--compile_only'],
    cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
  )  # fmt: skip
  if done.returncode:
    say(done.stderr[-3000:], end='')
  return done.returncode


# --- main --------------------------------------------------------------------------------------


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  settings = settings_from_flags()
  if _BUNDLE.value:
    pairs = [settings.pair, *_WITH_PAIRS.value]
    try:
      manifest = gpu_bundle.make_bundle(_BUNDLE.value, pairs=pairs, wheels_from=_WHEELS_FROM.value)
    except ValueError as e:
      raise app.UsageError(str(e)) from e
    mib = gpu_bundle.MIB
    parts = ', '.join(f'{k} {v / mib:.1f}' for k, v in manifest['sizes'].items())
    print(
      f'{_BUNDLE.value}: {manifest["bytes"] / mib:.1f} MiB of {gpu_bundle.BUNDLE_LIMIT / mib:.0f} '
      f'(MiB: {parts}); on the GPU: bash {_BUNDLE.value}/run.sh'
    )
    return
  try:
    budgets = parse_budgets(_BUDGETS.value)
    stages = plan(settings, _STAGES.value, budgets, check=not _COMPILE_ONLY.value)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  if _COMPILE_ONLY.value:
    sys.exit(1 if compile_stages(stages, settings, _COMPILE_FOR.value) else 0)
  if _DRY_RUN.value:
    print_plan(stages, _DEADLINE.value)
    sys.exit(dry_run(sys.argv[1:], _GPU_SITE.value, _COMPILE_FOR.value))  # --compile_only wins
  start = time.monotonic()
  device = probe_device()
  print(f'device: {device["kind"]} ({device["platform"]}), jax {device["jax"]}', flush=True)
  if device['platform'] != 'gpu' and not _ALLOW_CPU.value:
    raise app.UsageError(f'JAX sees no GPU ({device["kind"]}): --allow_cpu to run anyway.')
  deadline = _DEADLINE.value - (time.monotonic() - start)
  results = run(stages, settings, _OUT.value, deadline=deadline, device=device, say=print_flush)
  md, js = write_table(results, _OUT.value)
  print(f'\n{md.read_text()}\n{md}, {js}', flush=True)


if __name__ == '__main__':
  import benchmarks

  app.run(main, flags_parser=benchmarks.flags_parser(FLAGS))
