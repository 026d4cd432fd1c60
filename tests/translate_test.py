"""The main job's runlocal variant end to end on the shipped pair, and its config and failures."""

import json
import math
import pathlib
import types
from unittest import mock

import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import debsumm, ende
from specdec_jax import analysis, decode, decode_stats
from specdec_jax.measure import evaluation, job_config, results_io, tables, timing, translation
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig
from tests import helpers

# The tests read the pairs the main job loads: each loads once a worker (tests/conftest.py).
pytestmark = pytest.mark.usefixtures('pairs_loaded_once')

_SHIPPED = helpers.shipped('ende')


def _fake_step_costs(target, drafter, *, gamma, **kw):
  """`timing.step_costs` without its timed loops (~10 CPU-s per drafter): a pass cost that
  depends on the drafter, so that pooling them (the median over drafters) shows."""
  pass_cost = 1.0 + gamma / 10 + (0.5 if isinstance(drafter, t5.T5Model) else 0.0)
  return dict(c=0.05, c_fixed=0.02, c_alone=0.04, pass_cost=pass_cost)


def _spy_decodings(monkeypatch) -> list:
  """(temperature, {method: Run}) of every `translation.translate_in_turn` call, as it is made."""
  decoded, real = [], translation.translate_in_turn

  def spy(*args, **kwargs):
    decoded.append((kwargs['sampling'].temperature, runs := real(*args, **kwargs)))
    return runs

  monkeypatch.setattr(translation, 'translate_in_turn', spy)
  return decoded


def _assert_greedy_outputs_identical(decoded, num_sources: int) -> None:
  """Lossless at temperature 0: every speculative method emitted the baseline's token ids, row for
  row (and the ids are real outputs, not empty rows)."""
  greedy = [runs for temperature, runs in decoded if temperature == 0]
  assert greedy
  for runs in greedy:
    want = runs['autoregressive'].outputs
    assert len(want) == num_sources and all(len(ids) > 1 for ids in want)
    for method, run in runs.items():
      assert len(run.outputs) == num_sources, method
      for got, expected in zip(run.outputs, want):
        np.testing.assert_array_equal(got, expected, err_msg=method)


@helpers.needs_pair('ende')
@pytest.mark.parametrize(
  'items, costs',
  [
    # Default: two drafters (a T5 and an n-gram, so the pass cost is pooled over two), greedy,
    # each with a chain and a top-2 token tree of 5 nodes, the model costs faked (timing_test
    # and distill_test time them). Temperature 1 and the bigram are decoded by the timed-in-turn
    # test below.
    ('runlocal,num_examples=3,drafters=distilled,trigram,temperatures=0,tree_nodes=5', 'fake'),
    pytest.param('runlocal,num_examples=3', 'measured', marks=pytest.mark.slow),  # the whole job
  ],
)
def test_runlocal_end_to_end(tmp_path, monkeypatch, items, costs):
  config = ende.get_config(items)
  if costs == 'fake':
    monkeypatch.setattr(timing, 'step_costs', _fake_step_costs)
  plan = evaluation.prepare(config)
  decoded = _spy_decodings(monkeypatch)
  writer = results_io.ResultsWriter(str(tmp_path))
  for row in evaluation.rows(plan, progress=False):
    assert isinstance(row, evaluation.Row)
    writer.add(row)
    # Each finished row is on disk at once, as strict JSON (null for missing values).
    on_disk = json.loads(pathlib.Path(writer.paths['json']).read_text())
    assert on_disk[-1]['method'] == row.method
  rows = writer.rows
  methods = {(r['drafter'], r['method'], r['temp']) for r in rows}
  want = [('-', 'autoregressive')] + [(d, v) for d in config.drafters for v in config.verifiers]
  want += [(d, 'tree') for d in config.drafters if config.tree_nodes]
  assert methods == {(d, m, t) for d, m in want for t in config.temperatures}
  assert len(rows) == plan.num_methods
  for row in rows:
    assert row['seconds'] > 0 and row['tokens_per_s'] > 0
    if row['method'] == 'tree':  # a top-2 tree of 5 nodes: depth 2, at most 3 tokens a call
      assert (row['tree_nodes'], row['gamma']) == (5, 2) and row['alpha'] is None
      assert 1 <= row['block_efficiency'] <= 3
    elif row['method'] != 'autoregressive':
      assert 0 <= row['alpha'] <= 1 and 1 <= row['block_efficiency'] <= config.gammas[0] + 1
      assert row['tree_nodes'] is None
    else:
      assert row['alpha'] is None
  # Greedy speculative decoding is lossless: the same tokens as greedy autoregressive, row for
  # row, in every (drafter, gamma) group; so the same BLEU in every temperature-0 row.
  _assert_greedy_outputs_identical(decoded, config.num_examples)
  assert len({r['bleu'] for r in rows if r['temp'] == 0.0}) == 1
  spec = [r for r in rows if r['method'] != 'autoregressive']
  # The pass cost is the target's, pooled over the drafters: one value per gamma (per tree size).
  assert len({r['pass_cost'] for r in spec}) == len(config.gammas) + len(config.tree_nodes)
  if costs == 'fake':  # gamma 4: the median of the T5's 1.9 and the n-gram's 1.4 (unpooled: each)
    chains = [r['pass_cost'] for r in spec if r['method'] != 'tree']
    assert chains == pytest.approx([1.65] * len(chains))
    # The trees' (depth 2): 1.2 + 0.5 for the T5, pooled with the n-gram's 1.2
    trees = [r['pass_cost'] for r in spec if r['method'] == 'tree']
    assert trees == pytest.approx([1.45] * len(trees))
  for r in spec:  # fitted over 3 sentences (None where their iteration counts coincide)
    if r['iteration_cost'] is not None:
      assert r['predicted_loop'] == pytest.approx(r['block_efficiency'] / r['iteration_cost'])
  # The printed table: a header and a line per row, each cell under its column.
  lines = tables.format_table(rows, evaluation.TABLE).splitlines()
  assert len(lines) == 1 + len(rows)
  speedup = [c.name for c in evaluation.TABLE].index('speedup')
  assert [line.split()[speedup] for line in lines] == ['speedup'] + [
    f'{r["speedup"]:.2f}x' for r in rows
  ]
  assert 'NaN' not in pathlib.Path(writer.paths['json']).read_text()
  results_io.plot_speedup(rows, str(tmp_path / 'speedup.png'))
  assert (tmp_path / 'speedup.png').stat().st_size > 0


@helpers.needs_pair('ende')
@pytest.mark.parametrize(
  'item, column, value',
  [
    pytest.param('draft_stop=0.3', 'draft_stop', 0.3, marks=pytest.mark.slow),  # ~35 CPU-s
    pytest.param('num_drafts=2', 'num_drafts', 2, marks=pytest.mark.slow),  # ~60 CPU-s
  ],
)
def test_multidraft_and_draft_stop_rows(item, column, value):
  """Rows say their K / draft stop, and predict from their measured block efficiency over the
  iteration's cost (no closed form in alpha); K's costs are measured at 2 rows per row."""
  items = 'runlocal,num_examples=1,max_new_tokens=16,drafters=trigram,temperatures=1'
  rows = list(
    evaluation.rows(
      evaluation.prepare(ende.get_config(f'{items},verifiers=block,{item}')), progress=False
    )
  )
  assert [getattr(r, column) for r in rows] == [None, value]
  r = rows[1]
  cost = r.gamma * r.c + r.c_fixed + r.pass_cost
  assert r.predicted_speedup == pytest.approx(r.block_efficiency / cost)


@pytest.mark.slow  # ~25 CPU-s
@helpers.needs_pair('debsumm48m')
def test_debsumm_runlocal_gives_its_rows(monkeypatch):
  config = debsumm.get_config('runlocal,num_examples=2,temperatures=0')
  plan = evaluation.prepare(config)
  assert plan.truncated <= 1  # the 2nd test source is longer than 256 tokens: cut, not refused
  decoded = _spy_decodings(monkeypatch)
  rows = list(evaluation.rows(plan, progress=False))
  assert len(rows) == plan.num_methods and {r.task for r in rows} == {'DebSumm'}
  _assert_greedy_outputs_identical(decoded, config.num_examples)


def test_methods_timed_in_turn_decode_as_alone_and_share_one_baseline(monkeypatch, ende_pair):
  pair = ende_pair
  sources = [s for s, _ in pair.test_pairs()[:3]]
  kw = dict(
    gamma=3, sampling=SamplingConfig(temperature=1.0), batch_size=2, max_source_length=64,
    max_new_tokens=16, seed=1,
  )  # fmt: skip
  args = (pair.target, pair.drafters['bigram'], pair.tokenizer, sources)
  alone = translation.translate(*args, method='token', **kw)
  # Every timed call is `timing.timed`'s, which raises if XLA compiles during it: after the
  # warm-up, none of the 2 batches x 3 methods compiles anything.
  guarded, real_timed = [], timing.timed
  monkeypatch.setattr(
    timing, 'timed', lambda fn, what: guarded.append(what) or real_timed(fn, what)
  )
  runs = translation.translate_in_turn(*args, methods=('autoregressive', 'token', 'block'), **kw)
  monkeypatch.setattr(timing, 'timed', real_timed)
  assert guarded == [f'{m} on batch {i}' for i in (0, 1) for m in runs]
  assert list(runs) == ['autoregressive', 'token', 'block']
  assert runs['token'].hypotheses == alone.hypotheses and runs['token'].tokens == alone.tokens
  # Per batch (2 batches): each method's seconds and loop iterations.
  for run in runs.values():
    assert run.batch_seconds.shape == run.batch_iterations.shape == (2,)
    assert np.all(run.batch_seconds > 0) and np.all(run.batch_iterations >= 1)
  assert runs['token'].batch_iterations.sum() >= runs['token'].stats.target_calls / 2  # 2 rows
  for methods, match in [
    (('token', 'token'), 'methods must be distinct'),
    ((), 'methods must be distinct'),
    (('autoregressive', 'nope'), "Unknown verifier 'nope'"),
  ]:
    with pytest.raises(ValueError, match=match):
      translation.translate_in_turn(*args, methods=methods, **kw)
  with pytest.raises(ValueError, match=r"needs gamma for the verifiers among \('token',\)"):
    translation.translate_in_turn(*args, methods=('token',), **dict(kw, gamma=None))
  # Both verifiers' speedups are over the one baseline timed in turn with them, which is also
  # the temperature's autoregressive row. (The shapes above: the compiled programs are reused.)
  config = ende.get_config(
    'runlocal,num_examples=2,drafters=bigram,temperatures=1,gammas=3,batch_size=2,'
    'max_source_length=64,max_new_tokens=16'
  )
  monkeypatch.setattr(timing, 'step_costs', _fake_step_costs)
  decoded = _spy_decodings(monkeypatch)
  auto, token, block = evaluation.rows(evaluation.prepare(config), progress=False)
  ((_, runs),) = decoded  # one (drafter, gamma, temperature)
  assert (auto.method, token.method, block.method) == ('autoregressive', 'token', 'block')
  assert auto.seconds == runs['autoregressive'].seconds
  assert token.speedup == runs['autoregressive'].seconds / runs['token'].seconds
  assert block.speedup == runs['autoregressive'].seconds / runs['block'].seconds


def test_cost_phase_shows_its_own_progress_before_the_decode_bar(monkeypatch, capsys):
  # The newcomer's first run sat at 0% for minutes while the costs were measured, and the decode
  # bar's first estimate counted them: the phase has its own bar (what, k of n), and the decode
  # bar is made after it (its clock starts at the first decoded sentence).
  config = ende.get_config(
    'runlocal,num_examples=2,drafters=bigram,temperatures=0,gammas=2,3,batch_size=2,'
    'max_source_length=64,max_new_tokens=8'
  )
  made = []
  real_costs = evaluation.model_costs

  def spy_costs(plan, **kw):
    made.append('costs')
    return real_costs(plan, **kw)

  monkeypatch.setattr(timing, 'step_costs', _fake_step_costs)
  monkeypatch.setattr(evaluation, 'model_costs', spy_costs)
  monkeypatch.setattr(translation, 'translate_in_turn', lambda **kw: made.append('decode') or {})
  with pytest.raises(KeyError):  # the spy decodes nothing: the first row cannot be made
    list(evaluation.rows(evaluation.prepare(config), progress=True))
  assert made == ['costs', 'decode']
  err = capsys.readouterr().err
  assert 'model costs (c, c_fixed, pass cost' in err and '2/2' in err
  assert 'bigram, gamma 3' in err
  assert err.index('model costs') < err.index('sentence')


def test_loop_costs_fit_fixed_and_per_iteration_seconds():
  iterations = [12, 30, 7, 19]
  seconds = [0.015 + 0.004 * n for n in iterations]
  fixed, per_iteration = translation.loop_costs(seconds, iterations)
  assert fixed == pytest.approx(0.015) and per_iteration == pytest.approx(0.004)
  # Calls of one length cannot separate the two: NaN, never a number.
  assert all(math.isnan(x) for x in translation.loop_costs([0.1, 0.2], [5, 5]))
  assert all(math.isnan(x) for x in translation.loop_costs([0.1], [5]))


def _run(fixed, per_iteration, iterations, stats):
  """A Run whose batch seconds are exactly fixed + per_iteration * iterations."""
  iterations = np.asarray(iterations)
  return translation.Run(['x'] * len(iterations), 60, stats, fixed + per_iteration * iterations,
                        iterations)  # fmt: skip


def test_speculative_row_predicts_whole_calls_with_each_methods_fixed_seconds():
  plan = types.SimpleNamespace(task='t', config=ml_collections.ConfigDict(), bleu=lambda h: 0.0)
  zeros = decode_stats.DecodeStats.zeros(1, 3).summed()
  stats = zeros.replace(target_calls=20, accepted=40, drafted=60, beta_sum=40.0, beta_count=50)
  baseline = _run(0.02, 0.010, [10, 20, 30], zeros)
  cost = dict(c=0.1, c_fixed=0.2, c_alone=0.05, pass_cost=1.5)
  row = evaluation.speculative_row(
    plan, 'd', 'token', 3, 0.0, _run(0.03, 0.018, [4, 7, 9], stats), baseline, cost
  )
  assert row.alpha == pytest.approx(0.8) and row.block_efficiency == pytest.approx(3.0)
  assert row.iteration_cost == pytest.approx(1.8)
  # E[tokens] 2.952 over 3 x 0.1 + 0.2 + 1.5 target steps (1.476x; 1.64x without c_fixed).
  predicted = analysis.walltime_improvement_measured(0.8, 3, 0.1, 1.5, 0.2)
  assert row.predicted_speedup == pytest.approx(2.952 / 2.0)
  assert row.predicted_speedup == pytest.approx(predicted)
  # The baseline's loop is its 0.66 s less 3 x 0.02 fixed; the speculative call adds 3 x 0.03.
  assert row.predicted_call == pytest.approx(0.66 / (0.09 + 0.6 / predicted))
  # Without fixed seconds the call prediction is the loop's; a fit that cannot be made: None.
  row = evaluation.speculative_row(
    plan, 'd', 'token', 3, 0.0, _run(0.0, 0.018, [4, 7, 9], stats),
    _run(0.0, 0.010, [10, 20, 30], zeros), cost,
  )  # fmt: skip
  assert row.predicted_call == pytest.approx(predicted)
  row = evaluation.speculative_row(
    plan, 'd', 'token', 3, 0.0, _run(0.03, 0.018, [5, 5, 5], stats), baseline, cost
  )
  assert row.predicted_call is None and row.iteration_cost is None


def test_config_items_apply_in_order_and_lists_hold_any_number():
  config = ende.get_config('runlocal,gammas=3,5,batch_size=8')
  assert config.gammas == (3, 5) and config.batch_size == 8 and config.num_examples == 8
  assert ende.get_config('num_examples=150,runlocal').num_examples == 8  # runlocal came later
  assert ende.get_config('runlocal,num_examples=150').num_examples == 150
  assert ende.get_config('temperatures=0,1e-3,0.5').temperatures == (0.0, 0.001, 0.5)
  assert ende.get_config('tree_nodes=5,9').tree_nodes == (5, 9)  # an empty default's numbers
  assert ende.get_config('drafters=,lookup=true').drafters == ()  # `key=` alone: empty
  with pytest.raises(ValueError, match='Unknown config item'):
    ende.get_config('gama=3')
  with pytest.raises(ValueError, match="Bad value for config field 'batch_size'"):
    ende.get_config('batch_size=two')


@pytest.mark.parametrize(
  'item, match',
  [
    ('num_examples=0', 'num_examples must be an int >= 1'),
    ('batch_size=0', 'batch_size must be an int >= 1'),
    ('gammas=0', 'gammas must hold ints >= 1'),
    ('num_drafts=0', 'num_drafts must be an int >= 1'),
    ('draft_stop=1.5', r'draft_stop must be a number in \(0, 1\)'),
    ('num_drafts=2,draft_stop=0.3', 'draft_stop needs num_drafts=1'),
    ('verifiers=token,nope', "Unknown verifier 'nope'"),
    ('drafter_sharding=nope', 'drafter_sharding must be'),
    ('tokenizer=/x.model', 'config.tokenizer needs config.target'),
    ('target=/x', r'also set config.drafter, config.tokenizer, config.test_file'),
    ('mesh=3x1', 'mesh'),
    ('verifiers=token,token', 'verifiers must be distinct'),
    ('temperatures=-1', 'temperature must be >= 0'),
    ('num_examples=100000', 'has only'),
    ('tree_nodes=1', 'tree_nodes must hold ints >= 2'),
    ('tree_nodes=6', r"Drafter 'distilled': .*top-2 tree has 1 \+ 2 \* depth nodes"),
    ('tree_nodes=5,proposal=argmax', "tree= does not support proposal='argmax'"),
    ('tree_nodes=5,num_drafts=2', 'needs num_drafts=1'),
    ('trees=block', "config.trees holds 'DRAFTER:N' entries"),
    ('trees=block:1', "config.trees holds 'DRAFTER:N' entries"),
  ],
)
@helpers.needs_pair('ende')
def test_bad_settings_fail_before_decoding(item, match):
  with pytest.raises(ValueError, match=match):
    evaluation.prepare(ende.get_config(item))


@helpers.needs_pair('ende48m')
def test_the_default_runs_the_headline_rows_and_times_only_their_groups(monkeypatch):
  # The README's first command: the best drafter (distilled, gamma 3) with each verifier and the
  # block drafter's 5-node tree alone (no chain rows of its own), at T = 0 and 1; the cost phase
  # times those 2 groups and nothing else, at the repeats benchmarks/cost_repeats.py asked for.
  config = ende.get_config()
  assert (config.temperatures, config.num_examples) == ((0.0, 1.0), 40)
  assert (config.timing_rounds, config.timing_repeats) == (1, 15)
  plan = evaluation.prepare(config)
  assert plan.groups == [('distilled', 3)] and plan.tree_only == ('block',)
  assert [(n, g, t.num_nodes) for n, g, t in plan.tree_groups] == [('block', 4, 5)]
  assert (plan.num_methods, plan.num_passes) == (8, 10)
  timed = []

  def fake(target, drafter, *, gamma, tree_nodes=None, repeats, **kw):
    timed.append((gamma, tree_nodes, repeats))
    return _fake_step_costs(target, drafter, gamma=gamma)

  monkeypatch.setattr(timing, 'step_costs', fake)
  assert sorted(evaluation.model_costs(plan), key=len) == [('distilled', 3), ('block', 4, 5)]
  assert timed == [(3, None, 15), (4, 5, 15)]
  # Everything else: :all_drafters (the 34 rows the default ran before, and the tree), :full.
  every = evaluation.prepare(ende.get_config('all_drafters'))
  assert set(every.chain_drafters) == {'distilled', 'trigram', 'bigram', 'block'}
  assert len(every.groups) == 8 and len(every.tree_groups) == 1 and every.num_methods == 36
  full = ende.get_config('full')
  assert (full.num_examples, full.gammas, full.timing_rounds) == (500, (3, 5, 7), 3)
  assert full.drafters == ('distilled', 'trigram', 'bigram') and full.block_drafters == ('block',)
  # Named trees of a drafter the pair does not ship are skipped, as block drafters are.
  assert job_config.named_trees(config) == [('block', 5)]
  assert job_config.tree_rows(config, ['distilled'], {'distilled': None}) == []


def test_tree_rows_build_each_drafters_tree():
  # A block drafter's best-first tree on its one call (depth capped at its block_size); an
  # autoregressive drafter's top-2 tree, whose nodes are odd.
  block, autoregressive = types.SimpleNamespace(block_size=8), types.SimpleNamespace()
  assert job_config.tree_spec(block, 5) == (4, decode.TreeSpec(5))
  assert job_config.tree_spec(block, 17) == (8, decode.TreeSpec(17))
  tree = decode.TreeSpec(9, builder='topk', top_k=2)
  assert job_config.tree_spec(autoregressive, 9) == (4, tree)
  with pytest.raises(ValueError, match='an odd number; got 8'):
    job_config.tree_spec(autoregressive, 8)


def test_the_main_job_decodes_in_the_fused_layout_by_default():
  # By default the target and every T5 drafter decode in the fused decoder layout (n-gram
  # drafters unchanged), and the rows' header says so; decoder_layout=t5x: the T5X layout as
  # loaded; another layout is refused by name.
  items = 'runlocal,num_examples=1,drafters=distilled,bigram'
  plan = evaluation.prepare(ende.get_config(items))
  attention = lambda m: m.params['decoder']['layers_0']['self_attention']
  assert 'qkv' in attention(plan.pair.target) and 'query' not in attention(plan.pair.target)
  assert 'qkv' in attention(plan.drafters['distilled'])
  assert 'log_base' in plan.drafters['bigram'].params  # an n-gram drafter as loaded
  assert 'decoder projections fused' in plan.inputs_summary()
  plain = evaluation.prepare(ende.get_config(f'{items},decoder_layout=t5x'))
  assert 'query' in attention(plain.pair.target) and 'fused' not in plain.inputs_summary()
  with pytest.raises(ValueError, match="decoder_layout must be one of .* got 'flat'"):
    evaluation.prepare(ende.get_config(f'{items},decoder_layout=flat'))
  # 'auto' keeps the T5X layout on one TPU chip only (XLA:TPU's estimate of its step).
  config = ende.get_config(items)
  assert job_config.decoder_layout(config, None) == 'fused'  # this CPU
  with mock.patch.object(jax, 'default_backend', return_value='tpu'):
    assert job_config.decoder_layout(config, None) == 't5x'
    assert job_config.decoder_layout(config, types.SimpleNamespace(size=4)) == 'fused'


def test_missing_pair_and_drafter_fail_early(tmp_path):
  with pytest.raises(FileNotFoundError, match='No pretrained pair'):
    evaluation.prepare(ende.get_config(f'pretrained={tmp_path / "nope"}'))
  if _SHIPPED:
    with pytest.raises(ValueError, match=r"Drafter\(s\) \['nope'\] are not in"):
      evaluation.prepare(ende.get_config('drafters=nope'))


def test_unwritable_workdir_fails_before_decoding(tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with pytest.raises((ValueError, OSError)):
    results_io.ResultsWriter(str(blocker / 'sub'))


def test_results_writer_writes_strict_json(tmp_path):
  writer = results_io.ResultsWriter(str(tmp_path))
  writer.add(
    dict(
      task='EnDe',
      drafter='-',
      method='autoregressive',
      temp=0.0,
      gamma=0,
      alpha=math.nan,
      block_efficiency=1.0,
      c=None,
      pass_cost=None,
      speedup=1.0,
      predicted_speedup=None,
      bleu=1.0,
      seconds=1.0,
      tokens_per_s=2.0,
    )
  )
  assert json.loads((tmp_path / 'results.json').read_text())[0]['alpha'] is None
  assert (tmp_path / 'results.csv').read_text().count('\n') == 2


def test_bad_config_override_is_one_line():
  import subprocess
  import sys

  result = subprocess.run(
    [
      sys.executable,
      '-m',
      'experiments.translate',
      '--config=experiments/configs/ende.py',
      '--config.bogus=3',
    ],
    capture_output=True,
    text=True,
    cwd=pathlib.Path(__file__).resolve().parents[1],
    timeout=120,
  )
  assert result.returncode != 0
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) <= 2 and 'bogus' in lines[-1], result.stderr
