"""scripts/gpu_quarter_hour.py: its plan (every stage's command and budget, the lookup stage
skipped until it exists), the figures it reads from each stage's output, the run (a process per
stage, killed at its budget, skipped past the deadline, one table), `--dry_run`, and the bundle a
GPU run carries (<= 64 MiB). The dry run's compile for an H100 is the slow test at the end (it
needs the CUDA plugin: skipped without it)."""

import dataclasses
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks import paper_scale
from scripts import gpu_bundle
from scripts import gpu_quarter_hour as gqh
from specdec_jax.measure import tables
from tests import helpers

NOT_YET = 'not available yet: no lookup here'


@pytest.fixture
def parsed():
  """The script's flags parsed from `argv` (reset after)."""

  def parse(*argv):
    gqh.FLAGS.unparse_flags()
    gqh.FLAGS(['gpu_quarter_hour', *argv])

  yield parse
  gqh.FLAGS.unparse_flags()


@pytest.fixture
def no_lookup(monkeypatch):
  monkeypatch.setattr(gqh, 'lookup_status', lambda s=None: NOT_YET)


def test_the_plan_gives_every_stage_its_command_and_budget_and_skips_the_lookup_until_it_exists(
  no_lookup, monkeypatch
):
  stages = gqh.plan(gqh.Settings(python='python'))
  assert [s.name for s in stages] == [
    'step_11b',
    'hf_peer_11b',
    'grown_xxl',
    'block_tree',
    'lookup',
  ]
  commands = {s.name: s.command() for s in stages}
  assert commands['step_11b'].startswith('python -m benchmarks.paper_scale --target=t5-11b ')
  assert '--drafters=t5-small,one-layer --gammas=5 --loop_gamma=0' in commands['step_11b']
  assert commands['hf_peer_11b'].startswith(
    'python -m benchmarks.hf_peer --random_weights --target=t5-11b --drafters=t5-small '
    '--dtype=bfloat16'
  )
  assert commands['grown_xxl'] == (
    'python -m experiments.translate --config=experiments/configs/ende.py:xxl,pretrained=ende,'
    'grow_to=t5_1_1-xxl,num_examples=8,gammas=5,temperatures=0,1,drafters=distilled,tree_nodes=5 '
    '--workdir=/tmp/gpu_quarter_hour_work/grown_xxl'
  )
  assert '--drafters=block --gammas=4,8' in commands['block_tree']
  assert '--tree_nodes=16' in commands['block_tree']
  skipped = {s.name: s.skip for s in stages if s.skip}
  assert skipped == {'lookup': NOT_YET}
  # Within the device tool's 10-minute command: the stages' budgets and the deadline.
  assert sum(s.budget_s for s in stages) <= gqh.FLAGS['deadline'].default <= 600
  # The main job's items parse as the config says (a tuple field takes the values after it).
  from experiments.configs import ende

  config = ende.get_config(stages[2].argv[3].split(':', 1)[1])
  assert (config.grow_to, config.temperatures, config.drafters) == (
    't5_1_1-xxl',
    (0.0, 1.0),
    ('distilled',),
  )
  assert (config.tree_nodes, config.num_examples, config.param_dtype) == ((5,), 8, 'bfloat16')

  chosen = gqh.plan(gqh.Settings(), ['grown_xxl'], {'grown_xxl': 200})
  assert [(s.name, s.budget_s) for s in chosen] == [('grown_xxl', 200)]
  with pytest.raises(ValueError, match="Unknown stage 'fast'"):
    gqh.plan(gqh.Settings(), ['fast'])
  assert gqh.parse_budgets(['step_11b=90']) == {'step_11b': 90}
  with pytest.raises(ValueError, match='name=seconds'):
    gqh.parse_budgets(['step_11b'])
  # Once the lookup drafter is registered, its stage runs the main job's lookup rows.
  monkeypatch.setattr(gqh, 'lookup_status', lambda s=None: None)
  (lookup,) = gqh.plan(gqh.Settings(python='python'), ['lookup'])
  assert not lookup.skip and gqh.LOOKUP_ITEMS in lookup.command()


@helpers.needs_pair('ende')
def test_the_lookup_stage_runs_the_lookup_rows_alone_and_its_loop_compiles():
  # Its config items, on the 13.5M pair ungrown: the source-lookup drafter's rows and no other
  # drafter's; its program (the lookup loop over a tiny target) lowers and compiles here.
  import jax
  import numpy as np

  from experiments.configs import ende
  from specdec_jax.measure import evaluation

  assert gqh.lookup_status() is None  # the lookup drafter is registered
  plan = evaluation.prepare(ende.get_config(f'runlocal,{gqh.LOOKUP_ITEMS}'))
  assert plan.groups == [('lookup', 4)] and list(plan.drafters) == ['lookup']
  with pytest.raises(ValueError, match='No drafter to run: config.drafters is empty'):
    evaluation.prepare(ende.get_config('runlocal,drafters='))
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ('data', 'model'))
  settings = gqh.Settings(target='tiny-v1.0', max_new_tokens=8, source_length=16)
  (spec,) = [stage for stage in gqh.STAGES if stage.name == 'lookup']
  ((name, low),) = spec.programs(settings, mesh).items()
  assert 'source lookup' in name and low.compile().memory_analysis() is not None


def test_the_lookup_stage_is_not_available_while_its_module_does_not_import(monkeypatch):
  monkeypatch.setattr(gqh, 'LOOKUP_MODULE', 'specdec_jax.no_such_drafter')
  why = gqh.lookup_status()
  assert why.startswith('not available yet: specdec_jax.no_such_drafter') and 'import' in why


def test_dry_run_prints_the_plan_and_says_so_when_it_cannot_compile(parsed, no_lookup, capsys):
  parsed('--dry_run', '--gpu_site=/nonexistent')
  with pytest.MonkeyPatch.context() as m:
    m.setattr(gqh, 'cuda_plugin_path', lambda site: None)
    m.setattr(sys, 'argv', ['gpu_quarter_hour', '--dry_run'])
    with pytest.raises(SystemExit) as exit_:
      gqh.main(['gpu_quarter_hour'])
  assert exit_.value.code == 0
  out = capsys.readouterr().out
  assert 'plan: 5 stages on one GPU, deadline 570 s' in out
  assert out.count('    budget ') == 4 and f'skipped: {NOT_YET}' in out
  assert "not compiled without the device: transformers' rows" in out
  assert 'not compiled for h100: its compiler is not in this Python: pip install' in out


def _paper_scale_text(rows1, rows2, rows4, gammas, rows5=()) -> str:
  speedup = (
    paper_scale.SPEEDUP_COLUMNS[:4]
    + tuple(tables.Column(f'gamma_{g}', f'gamma {g}', '.2f', 7, suffix='x') for g in gammas)
    + paper_scale.SPEEDUP_COLUMNS[4:]
  )
  parts = [
    'device: NVIDIA H100 80GB HBM3 (HBM 3350 GB/s (H100 SXM)), jax 0.11.2; target t5-11b',
    '',
    '1. target calls (ms; HBM bound: bytes read / bandwidth)',
    tables.format_table(rows1, paper_scale.TARGET_COLUMNS),
    '',
    '2. drafters (ms; c in target steps)',
    tables.format_table(rows2, paper_scale.DRAFTER_COLUMNS),
    '',
    '4. speedup by the formula (measured c, pass cost); paper: pass cost 1, best gamma 1..64',
    tables.format_table(rows4, speedup),
  ]
  if rows5:
    parts += [
      '',
      '5. token trees of depth 8: a pass',
      tables.format_table(rows5, paper_scale.TREE_COLUMNS),
    ]
  return '\n'.join(parts) + '\n'


def _drafter(name, gamma, c, c_fixed):
  return dict(drafter=name, params=60.5, gamma=gamma, step=0.33, c_alone=0.068, c=c,
              c_fixed=c_fixed, c_bound=0.0068, iteration=6.5)  # fmt: skip


def _speedup(name, alpha_of, temp, gammas, best_gamma, best):
  row = dict(drafter=name, alpha_of=alpha_of, temp=temp, alpha=0.75, best_gamma=best_gamma,
             best=best, paper_gamma=6, paper=2.5)  # fmt: skip
  return dict(row, **{f'gamma_{g}': best for g in gammas})


def test_the_figures_of_the_paper_scale_stages_are_read_from_their_tables():
  bound = dict(pass_cost=1.0, mbytes=11545.0, bound=3.446)
  rows1 = [
    dict(call='step', positions=1, ms=4.887, of_bound=71, **bound),
    dict(call='pass-6', positions=6, ms=4.981, of_bound=69, **dict(bound, pass_cost=1.02)),
  ]
  rows2 = [_drafter('t5-small', 5, 0.0645, 0.0), _drafter('one-layer', 5, 0.014, 0.0)]
  rows4 = [
    _speedup('t5-small', 'paper-T5-small-(EnDe)', 0, [5], 5, 2.45),
    _speedup('t5-small', 'paper-T5-small-(EnDe)', 1, [5], 5, 1.85),
    _speedup('one-layer', 'paper-T5-small-(EnDe)', 0, [5], 5, 3.02),
    _speedup('one-layer', 'ours-debsumm-distilled', 0, [5], 5, 2.48),
  ]
  step = gqh.step_figures(_paper_scale_text(rows1, rows2, rows4, [5]), gqh.Settings())
  assert (step['step_ms'], step['bound_ms'], step['of_bound'], step['pass_cost']) == (
    4.887,
    3.446,
    '71%',
    1.02,
  )
  assert step['c'] == {'t5-small': 0.0645, 'one-layer': 0.014}
  assert step['formula_paper_alpha']['one-layer'] == dict(gamma=5, speedup=3.02)
  assert step['text'] == (
    't5-11b step 4.887 ms, 71% of its HBM bound (3.446 ms); 6-position pass 1.02 steps; '
    "c: t5-small 0.0645, one-layer 0.0140; formula at the paper's alpha 0.75: t5-small 2.45x, "
    'one-layer 3.02x'
  )

  rows2 = [_drafter('block', 4, 0.0, 0.21), _drafter('block', 8, 0.0, 0.23)]
  rows4 = [_speedup('block', 'paper-T5-small-(EnDe)', 0, [4, 8], 8, 3.1)]
  rows5 = [dict(nodes=16, chain=1.02, tree=1.05, ratio=1.03)]
  block = gqh.block_figures(_paper_scale_text(rows1, rows2, rows4, [4, 8], rows5), gqh.Settings())
  assert block['call_steps'] == {4: 0.21, 8: 0.23} and block['tree'] == {
    16: dict(chain=1.02, tree=1.05)
  }
  assert block['text'] == (
    'block call 0.210 steps at gamma 4; block call 0.230 steps at gamma 8; formula at the '
    "paper's alpha 0.75: 3.10x (gamma 8); tree pass of 16 nodes 1.050 steps (chain 1.020)"
  )
  assert gqh.step_figures('Traceback ...', gqh.Settings())['text'] == 'no step row in the output'


def test_the_figures_of_hf_peer_and_the_main_job(tmp_path):
  from benchmarks import hf_peer

  results = [
    hf_peer.Result('ours', 'autoregressive', '-', [[1] * 64] * 4, 1.28),
    hf_peer.Result('ours', 'speculative', 't5-small', [[1] * 64] * 4, 0.64),
    hf_peer.Result('transformers', 'greedy', '-', [[1] * 64] * 4, 6.4),
    hf_peer.Result('transformers', 'assisted', 't5-small', note='failed: TypeError: nope'),
  ]
  text = 'random t5-11b: 4 sentences\n' + tables.format_table(
    hf_peer.summary_rows(results), hf_peer.COLUMNS
  )
  figures = gqh.hf_peer_figures(text)
  assert figures['methods']['ours speculative t5-small'] == dict(
    ms_per_token=2.5, vs_hf_greedy=10.0, identical='4/4'
  )
  assert figures['text'] == (
    'ours autoregressive 5.000 ms/token (5.00x HF greedy); ours speculative t5-small 2.500 '
    'ms/token (10.00x HF greedy); transformers greedy 25.000 ms/token; transformers assisted '
    't5-small: failed: TypeError: nope'
  )

  row = dict(task='EnDe', drafter='-', method='autoregressive', temp=0.0, gamma=0, alpha=None,
             block_efficiency=1.0, speedup=1.0, tokens_per_s=200.0, tree_nodes=None)  # fmt: skip
  rows = [
    row,
    dict(row, drafter='distilled', method='token', gamma=5, alpha=0.71, block_efficiency=3.1,
         speedup=2.05),
    dict(row, drafter='distilled', method='tree', gamma=2, tree_nodes=5, block_efficiency=2.4,
         speedup=1.8),
    dict(row, temp=1.0, tokens_per_s=190.0),
  ]  # fmt: skip
  (tmp_path / 'results.json').write_text(json.dumps(rows))
  figures = gqh.main_job_figures(str(tmp_path))
  assert figures['text'] == (
    'T=0: AR 200.0 tok/s, distilled token g5 2.05x (3.10 tok/call, alpha 0.71), distilled tree '
    'N5 1.80x (2.40 tok/call); T=1: AR 190.0 tok/s'
  )
  assert gqh.main_job_figures(str(tmp_path / 'none'))['text'].startswith('no rows')


def _fake(name, code, budget):
  spec = gqh.StageSpec(
    name,
    f'the fake {name}',
    budget,
    lambda s, code=code: [sys.executable, '-c', code],
    lambda out, s: {'text': out.strip().splitlines()[-1]},
  )
  return gqh.Stage(spec, tuple(spec.argv(None)), budget)


def test_run_gives_each_stage_its_process_and_budget_skips_past_the_deadline_and_writes_one_table(
  tmp_path,
):
  stages = [
    _fake('fine', "print('11B step 4.9 ms')", 30),
    _fake('fails', "print('half'); raise SystemExit(3)", 30),
    _fake('hangs', "import time; print('started', flush=True); time.sleep(60)", 2),
    _fake('late', "print('never')", 30),
    dataclasses.replace(_fake('absent', "print('never')", 30), skip='not available yet: x'),
  ]
  # The clock read at the start, then before each stage: 90 s used before the fourth, whose 10 s
  # left are under half its budget.
  ticks = iter([0, 0, 1, 2, 90, 95, 99])
  said = []
  results = gqh.run(
    stages, gqh.Settings(), str(tmp_path), deadline=100, device=dict(kind='Fake GPU', jax='0.0'),
    say=said.append, clock=lambda: next(ticks),
  )  # fmt: skip
  status = {r['stage']: r['status'] for r in results}
  assert status == {
    'fine': 'ok',
    'fails': 'failed (exit 3)',
    'hangs': 'timed out at 2 s',
    'late': 'skipped: 10 s left before the 100 s deadline',
    'absent': 'skipped: not available yet: x',
  }
  assert results[0]['figures']['text'] == '11B step 4.9 ms'
  assert (tmp_path / 'hangs.log').read_text().splitlines()[-1] == 'started'
  assert not (tmp_path / 'late.log').exists()
  table = (tmp_path / 'gpu_quarter_hour.md').read_text()
  assert table.startswith('# GPU quarter-hour: Fake GPU, jax 0.0\n')
  lines = [line for line in table.splitlines() if line.startswith('| ')]
  assert len(lines) == 6  # the header and a row per stage
  assert re.match(
    r'\| fine \| 11B step 4\.9 ms \| ok \| \d+ \(30\) \| Fake GPU \| 0\.0 \| ', lines[1]
  )
  assert lines[1].endswith(f'| `{stages[0].command()}` |')
  assert json.loads((tmp_path / 'gpu_quarter_hour.json').read_text())[3]['status'].startswith(
    'skipped'
  )
  assert any('fine: started (budget 30 s' in line for line in said)


def _fake_wheels(directory: pathlib.Path) -> str:
  directory.mkdir()
  for requirement in gpu_bundle.PINNED_WHEELS:
    name, _, version = requirement.partition('==')
    (directory / f'{name.replace("-", "_")}-{version}-py3-none-any.whl').write_bytes(b'0' * 1000)
  return str(directory)


@helpers.needs_pair('ende')
def test_the_bundle_holds_the_code_the_pair_and_the_wheels_within_64_mib(tmp_path):
  wheels = _fake_wheels(tmp_path / 'wheels')
  manifest = gpu_bundle.make_bundle(str(tmp_path / 'bundle'), pairs=['ende'], wheels_from=wheels)
  bundle = tmp_path / 'bundle'
  for path in (
    'specdec_jax/decode.py',
    'benchmarks/paper_scale.py',
    'experiments/translate.py',
    'scripts/gpu_quarter_hour.py',
    'pretrained/ende/pair.json',
    'run.sh',
    'BUNDLE.json',
  ):
    assert (bundle / path).is_file(), path  # fmt: skip
  assert not list(bundle.rglob('__pycache__')) and not (bundle / 'tests').exists()
  assert len(list((bundle / '.whl').glob('*.whl'))) == len(gpu_bundle.PINNED_WHEELS)
  assert manifest['pairs'] == ['ende'] and manifest['bytes'] <= gpu_bundle.BUNDLE_LIMIT
  assert manifest['bytes'] == sum(p.stat().st_size for p in bundle.rglob('*') if p.is_file())
  assert 'scripts.gpu_quarter_hour --out=' in (bundle / 'run.sh').read_text()
  # Again into the same folder: the earlier bundle is replaced; any other folder is refused.
  gpu_bundle.make_bundle(str(bundle), pairs=['ende'], wheels_from=wheels)
  (tmp_path / 'other').mkdir()
  (tmp_path / 'other' / 'notes.txt').write_text('mine')
  with pytest.raises(ValueError, match='not empty'):
    gpu_bundle.make_bundle(str(tmp_path / 'other'), pairs=['ende'], wheels_from=wheels)


def test_the_size_check_refuses_a_bundle_over_the_limit(tmp_path):
  sizes = {'pretrained/ende48m': 85_043_928, 'specdec_jax': 900_000}
  with pytest.raises(ValueError, match=r'82\.0 MiB, over the 64 MiB.*pretrained/ende48m 81\.1'):
    gpu_bundle.check_size(sizes)
  assert gpu_bundle.check_size({'a': gpu_bundle.BUNDLE_LIMIT}) == gpu_bundle.BUNDLE_LIMIT
  # Checked before anything is copied: nothing is written.
  with pytest.raises(ValueError, match='over the 1 MiB'):
    gpu_bundle.make_bundle(str(tmp_path / 'b'), pairs=['ende'], limit=gpu_bundle.MIB)
  assert not (tmp_path / 'b').exists()


@helpers.needs_pair('ende48m')
@helpers.needs_pair('debsumm48m')
def test_the_48m_pairs_do_not_fit_and_a_delta_brings_its_base():
  assert gpu_bundle.pairs_needed(gpu_bundle.REPO, ['debsumm48m']) == ['debsumm48m', 'ende48m']
  with pytest.raises(ValueError, match='over the 64 MiB'):
    gpu_bundle.check_size(
      gpu_bundle.part_sizes(gpu_bundle.bundle_parts(gpu_bundle.REPO, ['ende48m']))
    )


def test_the_pinned_wheels_are_setup_py_s_pins():
  setup = (gpu_bundle.REPO / 'setup.py').read_text()
  for requirement in gpu_bundle.PINNED_WHEELS:
    name = requirement.partition('==')[0]
    pinned = re.search(rf"'{re.escape(name)}==([^']+)'", setup)
    assert pinned is None or requirement == f'{name}=={pinned.group(1)}', requirement


_SITE = gqh.cuda_plugin_path(os.environ.get('SPECDEC_GPU_SITE', gqh.GPU_SITE))


@pytest.mark.slow  # 200-235 s (133 CPU-s) on 2 cores at load 8, 2026-11-29: 8 XLA:GPU programs
@pytest.mark.skipif(_SITE is None, reason='no CUDA plugin: ' + gqh.GPU_SITE)
@helpers.needs_pair('ende')
def test_dry_run_compiles_every_stage_s_programs_for_an_h100_without_one():
  """Tiny shapes (tiny-v1.0 for the 11B, the 13.5M pair grown to t5_1_1-small): each stage's
  programs compile for the compile-only H100; transformers' rows say why not."""
  argv = ['--dry_run', '--target=tiny-v1.0', '--drafter=tiny-v1.0',
          '--block_drafter=block:tiny-v1.0', '--grow_to=t5_1_1-small', '--max_new_tokens=8',
          '--source_length=16', '--tree_nodes=8', '--block_gamma=4', f'--gpu_site={_SITE or "-"}']  # fmt: skip
  done = subprocess.run(
    [sys.executable, '-m', 'scripts.gpu_quarter_hour', *argv], cwd=gpu_bundle.REPO, capture_output=True,
    text=True, timeout=900,
  )  # fmt: skip
  out = done.stdout
  assert done.returncode == 0, out + done.stderr[-3000:]
  assert 'compiling for h100 (NVIDIA H100 80GB HBM3, compile-only)' in out
  stages = (('step_11b', 1), ('hf_peer_11b', 1), ('grown_xxl', 3), ('block_tree', 2), ('lookup', 1))
  for stage, programs in stages:
    assert out.count(f'  {stage}: ') - 1 == programs, out  # its programs and its total line
    assert f'  {stage}: {programs} programs in ' in out
  assert 'FAILED' not in out and out.count(' GiB fits 80 GiB') == 8
