"""benchmarks/paper_scale.py: a CPU smoke run at tiny shapes, its four tables parsed and checked
against each other, against the bytes a decoder call reads and against the formula; the drafter
shapes, the constant weights and the chip table."""

import contextlib
import dataclasses
import io
import math

import jax
import numpy as np
import pytest
from absl import flags
from absl.testing import flagsaver

from benchmarks import memory_model, paper_scale, synthetic
from specdec_jax import analysis, decode
from specdec_jax.models import t5

# The shipped 13.5M EN->DE target's shape with 2 layers a side: each call takes long enough
# (~0.5 ms here) that its in-loop time stands clear of a loaded CPU's noise; the drafter is one
# decoder layer of T5-small's width (the default `one-layer`), in the target's vocabulary.
_TARGET, _DRAFTER = 'smoke-target', 'one-layer'
_SMOKE = dataclasses.replace(
  t5.CONFIGS['t5_1_1-small'],
  vocab_size=8000,
  d_model=256,
  d_ff=1024,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=2,
)
_GAMMA, _MAX_NEW, _SOURCE, _BANDWIDTH = 3, 32, 8, 100.0  # GB/s


@pytest.fixture(scope='module')
def printed() -> str:
  out = io.StringIO()
  with (
    pytest.MonkeyPatch.context() as patch,
    flagsaver.flagsaver(),
    contextlib.redirect_stdout(out),
  ):
    patch.setitem(t5.CONFIGS, _TARGET, _SMOKE)
    flags.FLAGS(['paper_scale', '--noeigen_dots'])  # this worker's XLA flags stay as they are
    paper_scale.FLAGS.unparse_flags()
    paper_scale.FLAGS(
      [
        'paper_scale',
        f'--target={_TARGET}',
        f'--drafters={_DRAFTER}',
        '--dtype=float32',
        f'--gammas={_GAMMA}',
        f'--loop_gamma={_GAMMA}',
        f'--max_new_tokens={_MAX_NEW}',
        f'--source_length={_SOURCE}',
        f'--hbm_bandwidth={_BANDWIDTH:g}',
        '--rounds=1',
        '--repeats=3',
        '--timer_repeats=2',  # the tables' consistency is checked here, not the timers' noise
        '--tree_nodes=4',
        '--tree_depth=3',
      ]
    )
    paper_scale.main(['paper_scale'])
  return out.getvalue()


def _table(text: str, number: int, columns) -> list[dict]:
  """The rows of table `number` as {column name: float or str}; every numeric cell finite."""
  lines = text.splitlines()
  start = next(i for i, line in enumerate(lines) if line.startswith(f'{number}. '))
  header, rows = lines[start + 1], []
  assert header.split() == ' '.join(c.title for c in columns).split()
  for line in lines[start + 2 :]:
    if not line.strip():
      break
    cells = line.split()
    assert len(cells) == len(columns), line
    rows.append({c.name: _value(cell, c) for cell, c in zip(cells, columns)})
  return rows


def _value(cell: str, column):
  if not column.fmt:
    return cell
  assert cell != '-', f'{column.name} is missing'
  value = float(cell.removesuffix(column.suffix))
  assert math.isfinite(value), (column.name, cell)
  return value


def _read_bytes(config: t5.T5Config, *, positions: int, cache_len: int) -> int:
  """What a float32 decoder call reads, by `memory_model.call_cost`'s rule: every decoder param
  but the cross-attention key / value kernels, the embedding rows gathered (v1.1: untied), both
  caches whole."""
  params = jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))
  weights = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(params['decoder']):
    names = [str(getattr(k, 'key', k)) for k in path]
    if not ('encoder_decoder_attention' in names and names[-2] in ('key', 'value')):
      weights += int(np.prod(leaf.shape))
  assert not config.tie_word_embeddings
  rows = positions * config.d_model
  kv = config.num_heads * config.d_kv * config.num_decoder_layers
  caches = 2 * kv * (cache_len + _SOURCE)
  return 4 * (weights + rows + caches)


def _cache_len(gamma):
  return decode.buffer_length(_MAX_NEW, gamma)


def test_header_names_the_device_and_the_bandwidth(printed):
  first = printed.splitlines()[0]
  assert first.startswith(f'device: cpu (HBM {_BANDWIDTH:g} GB/s (--hbm_bandwidth)), jax ')
  assert f'target {_TARGET}' in first and 'float32, constant weights' in first
  assert 'timer repeats 2;' in first  # --timer_repeats, said beside the rounds
  assert first.endswith('draft scan looped (--unroll_draft)')


class _Stop(Exception):
  pass


def test_unroll_draft_reaches_the_timers_and_the_loop(monkeypatch):
  # Each timer and loop records what it was asked and stops the run: only the plumbing of the
  # flag is checked here (tests/decode_unroll_test.py checks what unrolling does).
  asked = {}

  def spy(name, result=None):
    def record(*args, **kwargs):
      asked[name] = kwargs.get('unroll_draft')
      if result is None:
        raise _Stop
      return result

    return record

  monkeypatch.setitem(t5.CONFIGS, _TARGET, _SMOKE)
  monkeypatch.setattr(paper_scale.timing, 'step_costs', spy('step_costs'))
  monkeypatch.setattr(paper_scale.timing, 'step_seconds', spy('step_seconds', 1.0))
  monkeypatch.setattr(paper_scale.timing, 'iteration_seconds', spy('iteration_seconds', 1.0))
  monkeypatch.setattr(paper_scale.decode, 'speculative_generate', spy('speculative_generate'))
  out = io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out):
    flags.FLAGS(['paper_scale', '--noeigen_dots'])
    paper_scale.FLAGS.unparse_flags()
    argv = [f'--target={_TARGET}', f'--drafters={_DRAFTER}', '--dtype=float32', '--unroll_draft']
    paper_scale.FLAGS(['paper_scale', *argv, f'--source_length={_SOURCE}'])
    with pytest.raises(_Stop):
      paper_scale.main(['paper_scale'])
    target = synthetic.model(_SMOKE, dtype='float32', weights='constant')
    run = paper_scale.settings_from_flags()  # what main passes its helpers: no flag read later
    assert run.unroll_draft and run.source_length == _SOURCE
    with pytest.raises(_Stop):
      paper_scale.loop_seconds(target, target, run, gamma=_GAMMA, max_new_tokens=4)
    monkeypatch.setattr(paper_scale, 'loop_seconds', lambda *args, **kwargs: (1.0, 1.0))
    paper_scale._loop_rows(target, {'drafter': target}, _GAMMA, run)
  assert out.getvalue().splitlines()[0].endswith('draft scan unrolled (--unroll_draft)')
  unrolled = dict(step_costs=True, speculative_generate=True, iteration_seconds=True)
  assert asked == dict(unrolled, step_seconds=None)  # the autoregressive step drafts nothing


def test_target_calls_against_the_bytes_they_read(printed):
  rows = _table(printed, 1, paper_scale.TARGET_COLUMNS)
  assert [r['call'] for r in rows] == ['step', f'pass-{_GAMMA + 1}']
  assert [r['positions'] for r in rows] == [1, _GAMMA + 1]
  config = _SMOKE
  for row, cache_len in zip(rows, (_cache_len(0), _cache_len(_GAMMA))):
    nbytes = _read_bytes(config, positions=row['positions'], cache_len=cache_len)
    assert row['mbytes'] == pytest.approx(nbytes / 1e6, abs=0.051)
    assert row['bound'] == pytest.approx(nbytes / (_BANDWIDTH * 1e9) * 1e3, rel=1e-3)
    assert row['ms'] > 0  # the percentage of the bound: `test_tables_print_the_measured_costs`
  assert rows[1]['pass_cost'] > 0


def test_drafter_costs(printed):
  (row,) = _table(printed, 2, paper_scale.DRAFTER_COLUMNS)
  assert row['drafter'] == _DRAFTER and row['gamma'] == _GAMMA
  drafter = synthetic.drafter_config(_DRAFTER, _SMOKE)
  assert row['params'] == pytest.approx(
    t5.param_count(jax.eval_shape(lambda k: t5.init_params(k, drafter), jax.random.key(0))) / 1e6,
    abs=0.051,
  )
  # c and c_fixed as printed: `test_tables_print_the_measured_costs`; the speedup test checks
  # the formula reads both.
  assert row['step'] > 0 and row['iteration'] > 0 and row['c_alone'] > 0
  target_bytes = _read_bytes(_SMOKE, positions=1, cache_len=_cache_len(0))
  # The drafter reads its own one layer and caches (its cross cache over the target's encoder).
  drafter_bytes = memory_model.call_bytes(
    drafter, batch=1, positions=1, cache_len=_cache_len(_GAMMA), source_length=_SOURCE
  )
  assert drafter_bytes > 0
  assert row['c_bound'] == pytest.approx(drafter_bytes / target_bytes, rel=1e-3)


def test_loops_against_their_model_calls(printed):
  rows = _table(printed, 3, paper_scale.LOOP_COLUMNS)
  assert [r['loop'] for r in rows] == ['autoregressive', _DRAFTER]
  autoregressive, speculative = rows
  assert autoregressive['tokens'] == 1.0
  # Constant weights: every argmax is token 0, so the drafts are the target's, all accepted.
  assert speculative['tokens'] == pytest.approx((_GAMMA + 1), abs=0.01)
  for row in rows:
    assert row['iteration'] > 0 and row['model_calls'] > 0
    share = 100 * (1 - row['model_calls'] / row['iteration'])
    assert row['loop_share'] == pytest.approx(share, abs=0.6 + abs(share) * 1e-3)


def test_speedups_are_the_formula_at_the_printed_costs(printed):
  pass_cost = _table(printed, 1, paper_scale.TARGET_COLUMNS)[1]['pass_cost']
  drafter = _table(printed, 2, paper_scale.DRAFTER_COLUMNS)[0]
  c, c_fixed = drafter['c'], drafter['c_fixed']
  gamma_column = paper_scale.tables.Column(f'gamma_{_GAMMA}', f'gamma {_GAMMA}', '.2f', suffix='x')
  columns = paper_scale.SPEEDUP_COLUMNS
  rows = _table(printed, 4, columns[:4] + (gamma_column,) + columns[4:])
  assert [(r['alpha_of'], r['temp'], r['alpha']) for r in rows] == _ALPHA_ROWS
  for row in rows:
    alpha = row['alpha']
    formula = analysis.walltime_improvement_measured(alpha, _GAMMA, c, pass_cost, c_fixed)
    assert row[f'gamma_{_GAMMA}'] == pytest.approx(formula, rel=0.02, abs=0.011)
    assert row['best_gamma'] == _GAMMA and row['best'] == row[f'gamma_{_GAMMA}']
    # The paper's pick: the best of gamma 1..64 at pass cost 1.
    best = max(analysis.walltime_improvement(alpha, g, c) for g in range(1, 65))
    assert row['paper'] == pytest.approx(best, rel=0.02, abs=0.011)
    assert 1 <= row['paper_gamma'] <= 64


# Table 4's alphas: the paper's (Leviathan et al., Table 3) and our drafters' (docs/results.md
# section 3), by temperature.
_ALPHA_ROWS = [
  ('paper-T5-small-(EnDe)', 0, 0.75),
  ('paper-T5-small-(EnDe)', 1, 0.62),
  ('ours-debsumm-distilled', 0, 0.66),
  ('ours-debsumm-distilled', 1, 0.54),
  ('ours-ende48m-distilled', 0, 0.49),
  ('ours-ende48m-distilled', 1, 0.48),
]


def test_token_tree_passes_against_chain_passes(printed):
  """Table 5: a tree pass and a chain pass of N positions in target steps, and their ratio."""
  rows = _table(printed, 5, paper_scale.TREE_COLUMNS)
  assert [r['nodes'] for r in rows] == ['4']
  for r in rows:
    assert r['chain'] > 0 and r['tree'] > 0
    assert r['ratio'] == pytest.approx(r['tree'] / r['chain'], rel=0.01, abs=0.002)


def test_the_papers_best_gamma_stops_at_a_block_drafters_block_size():
  """At c = 0 the formula's best gamma runs far (52-64: every draft is worth its alpha^gamma); a
  block drafter proposes at most block_size drafts a call, so its best gamma stops there."""
  target = synthetic.shape('tiny-v1.1')
  found = {n: synthetic.abstract_model(synthetic.drafter_config(n, target)) for n in
           ('one-layer:tiny-v1.1', 'block:tiny-v1.1')}  # fmt: skip
  costs = {(n, 4): dict(c=0.0, c_fixed=0.01) for n in found}
  rows = paper_scale._speedup_rows(costs, {4: 1.0}, found, [4])
  for r in rows:
    block = r['drafter'].startswith('block')
    assert (r['paper_gamma'] <= synthetic.BLOCK_SIZE) == block, r
    assert r['paper'] == pytest.approx(
      analysis.walltime_improvement(r['alpha'], r['paper_gamma'], 0)
    )
  assert {r['paper_gamma'] for r in rows if r['drafter'].startswith('block')} == {
    synthetic.BLOCK_SIZE
  }


def test_tables_print_the_measured_costs(monkeypatch):
  # Every timer faked with known, distinct values (two drafters whose target costs differ, so the
  # pooling shows; a negative c_fixed, as an unrolled draft can measure): each printed cell is
  # checked against them and the bytes a call reads, not against other printed cells.
  fake = {
    'one-layer': dict(target_step=2e-3, target_pass=3e-3, pass_cost=1.4, drafter_step=1e-4,
                      c_alone=0.05, c=0.06, c_fixed=-0.02, iteration=4e-3),
    'one-layer:tiny-v1.0': dict(target_step=4e-3, target_pass=5e-3, pass_cost=1.6,
                                drafter_step=2e-4, c_alone=0.01, c=0.02, c_fixed=0.03,
                                iteration=6e-3),
  }  # fmt: skip
  drafters = list(fake)
  asked = {}

  def step_costs(target, drafter, **kw):
    name = drafters[len(asked)]
    asked[name] = kw['gamma']
    return fake[name]

  loops = iter([(8e-3, 1.0), (9e-3, 3.5), (10e-3, 3.0)])  # autoregressive, then each drafter
  monkeypatch.setitem(t5.CONFIGS, _TARGET, _SMOKE)
  monkeypatch.setattr(paper_scale.timing, 'step_costs', step_costs)
  monkeypatch.setattr(paper_scale.timing, 'step_seconds', lambda *a, **k: 6e-3)
  monkeypatch.setattr(paper_scale.timing, 'iteration_seconds', lambda *a, **k: 7.2e-3)
  monkeypatch.setattr(paper_scale, 'loop_seconds', lambda *a, **k: next(loops))
  out = io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out):
    flags.FLAGS(['paper_scale', '--noeigen_dots'])
    paper_scale.FLAGS.unparse_flags()
    paper_scale.FLAGS(
      ['paper_scale', f'--target={_TARGET}', f'--drafters={",".join(drafters)}', '--gammas=2',
       '--loop_gamma=2', f'--max_new_tokens={_MAX_NEW}', f'--source_length={_SOURCE}',
       '--dtype=float32', f'--hbm_bandwidth={_BANDWIDTH:g}']
    )  # fmt: skip
    paper_scale.main(['paper_scale'])
  printed = out.getvalue()
  assert asked == {name: 2 for name in drafters}
  step, pass_ = _table(printed, 1, paper_scale.TARGET_COLUMNS)
  for row, ms, cache_len in ((step, 3.0, _cache_len(0)), (pass_, 4.0, _cache_len(2))):
    assert row['ms'] == pytest.approx(ms)  # the median over the two drafters' measurements
    bound = _read_bytes(_SMOKE, positions=row['positions'], cache_len=cache_len) / 1e8  # ms
    assert row['of_bound'] == pytest.approx(100 * bound / ms, abs=0.51)
  assert (step['pass_cost'], pass_['pass_cost']) == (1.0, 1.5)
  rows = _table(printed, 2, paper_scale.DRAFTER_COLUMNS)
  for row, name in zip(rows, drafters):
    want = fake[name]
    assert (row['drafter'], row['gamma'], row['c'], row['c_fixed']) == (
      name, 2, want['c'], want['c_fixed'],
    )  # fmt: skip
    assert (row['c_alone'], row['step'], row['iteration']) == pytest.approx(
      (want['c_alone'], want['drafter_step'] * 1e3, want['iteration'] * 1e3)
    )
  rows = _table(printed, 3, paper_scale.LOOP_COLUMNS)
  assert [(r['loop'], r['iteration'], r['model_calls'], r['tokens']) for r in rows] == [
    ('autoregressive', 8.0, 6.0, 1.0), ('one-layer', 9.0, 7.2, 3.5),
    ('one-layer:tiny-v1.0', 10.0, 7.2, 3.0),
  ]  # fmt: skip
  assert [r['loop_share'] for r in rows] == [25, 20, 28]
  gamma_column = paper_scale.tables.Column('gamma_2', 'gamma 2', '.2f', suffix='x')
  columns = paper_scale.SPEEDUP_COLUMNS
  rows = _table(printed, 4, columns[:4] + (gamma_column,) + columns[4:])
  assert [(r['drafter'], r['alpha_of'], r['temp'], r['alpha']) for r in rows] == [
    (name, *alpha) for name in drafters for alpha in _ALPHA_ROWS
  ]
  # E[tokens] at gamma 2 over 2 c + c_fixed + the pooled pass cost 1.5, by hand at alpha 0.75:
  # 2.3125 / (0.12 - 0.02 + 1.5) = 1.445 and 2.3125 / (0.04 + 0.03 + 1.5) = 1.473.
  assert rows[0]['gamma_2'] == 1.45 and rows[len(_ALPHA_ROWS)]['gamma_2'] == 1.47


def test_drafter_shapes():
  target = t5.CONFIGS['t5-11b']
  one_layer = synthetic.drafter_config('one-layer', target)
  small = t5.CONFIGS['t5-small']
  assert (one_layer.num_encoder_layers, one_layer.num_decoder_layers) == (0, 1)
  assert one_layer.encoder_dim == target.d_model and one_layer.vocab_size == target.vocab_size
  assert (one_layer.d_model, one_layer.d_ff, one_layer.num_heads) == (
    small.d_model,
    small.d_ff,
    small.num_heads,
  )
  assert synthetic.drafter_config('t5-small', target) == small
  assert synthetic.drafter_config('one-layer:tiny-v1.0', target).d_model == 32
  with pytest.raises(ValueError, match='share the target vocabulary'):
    synthetic.drafter_config('tiny-v1.0', target)
  with pytest.raises(ValueError, match="Unknown T5 shape 't5-huge'"):
    synthetic.drafter_config('t5-huge', target)


def test_compile_for_a_tpu_prints_the_compilers_tables(monkeypatch, tmp_path):
  # --compile_for: tables 1, 2 and 4 from XLA:TPU's estimated cycles (tiny shapes, one gamma).
  monkeypatch.setenv('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
  try:
    paper_scale.paper_scale_tpu.machines.compile_only_devices('tpu-v4')
  except RuntimeError as e:
    pytest.skip(f'--compile_for needs a TPU compiler (libtpu): {e}')
  tiny = dataclasses.replace(t5.CONFIGS['tiny-v1.0'], d_model=128, d_kv=32, d_ff=256)
  monkeypatch.setitem(t5.CONFIGS, 'tiny-target', tiny)
  drafter = 'one-layer:tiny-target'
  monkeypatch.setattr(paper_scale.paper_scale_tpu, 'PAPER_DRAFTER', drafter)
  out = io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out):
    flags.FLAGS(['paper_scale', '--noeigen_dots'])
    paper_scale.FLAGS.unparse_flags()
    drafters = f'{drafter},block:tiny-target'  # and a block drafter: one call an iteration
    argv = ['--compile_for=tpu-v4', '--target=tiny-target', f'--drafters={drafters}', '--gammas=3']
    argv += ['--tree_nodes=4', '--tree_depth=3']  # table 5: a tree pass beside a chain pass
    paper_scale.FLAGS(['paper_scale', *argv, '--source_length=8', '--max_new_tokens=8',
                       f'--compile_cache={tmp_path}'])  # fmt: skip
    paper_scale.main(['paper_scale'])
  printed = out.getvalue()
  assert 'compiled for: tpu-v4' in printed and 'estimates, not timings' in printed
  tpu = paper_scale.paper_scale_tpu
  step, pass_ = _table(printed, 1, tpu.TARGET_COLUMNS)
  assert (step['call'], step['pass_cost'], pass_['call']) == ('step', 1.0, 'pass-4')
  assert pass_['pass_cost'] == pytest.approx(pass_['mcycles'] / step['mcycles'], rel=0.01)
  for row in (step, pass_):
    assert row['of_bound'] == pytest.approx(100 * row['bound'] / row['mcycles'], rel=0.02, abs=0.6)
  row, block = _table(printed, 2, tpu.DRAFTER_COLUMNS)
  assert row['drafter'] == drafter and row['gamma'] == 3 and row['c'] > 0
  assert block['drafter'] == 'block:tiny-target' and block['c'] == 0
  assert block['c_fixed'] > 0 and block['c_alone'] > 0  # its call: 4 kept positions, 3 drafts
  gamma_column = paper_scale.tables.Column('gamma_3', 'gamma 3', '.2f', suffix='x')
  columns = tpu.SPEEDUP_COLUMNS[:3] + (gamma_column,) + tpu.SPEEDUP_COLUMNS[3:]
  # The block drafter's rows have no paper column: the formula at c 0 and its c_fixed.
  lines = printed.splitlines()
  table_4 = lines[next(i for i, line in enumerate(lines) if line.startswith('4. ')) :]
  block_rows = [line.split() for line in table_4 if line.startswith('block:')]
  assert [(cells[1], cells[2]) for cells in block_rows] == [('0', '0.75'), ('1', '0.62')]
  for cells in block_rows:
    formula = analysis.expected_tokens(float(cells[2]), 3) / (block['c_fixed'] + pass_['pass_cost'])
    assert float(cells[3].removesuffix('x')) == pytest.approx(formula, rel=0.02, abs=0.011)
  rows = _table('\n'.join(line for line in lines if not line.startswith('block:')), 4, columns)
  assert [(r['temp'], r['alpha']) for r in rows] == [(0, 0.75), (1, 0.62)]
  for r, (alpha, _, measured) in zip(rows, tpu.PAPER_TABLE_2.values()):
    formula = analysis.expected_tokens(alpha, 3) / (
      3 * row['c'] + row['c_fixed'] + pass_['pass_cost']
    )
    assert r['gamma_3'] == pytest.approx(formula, rel=0.02, abs=0.011)
    assert r['paper'] == measured  # beside it, no ratio: an estimate over a measurement
  (tree,) = _table(printed, 5, paper_scale.tree_pass_tpu.TABLE)
  assert tree['nodes'] == '4' and 0.5 < tree['ratio'] < 2
  assert 0 < tree['tree_copies'] <= tree['chain_copies']  # no layout copy the chain avoids
