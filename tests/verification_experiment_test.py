"""experiments/verification.py: the runlocal variant end to end on the shipped pair, the exact
accepted-length CCDF of Sun et al.'s toy model against known values, the rational oracle and
Monte Carlo with the jitted verifiers, and the config."""

import csv
import dataclasses
import json
import math
import pathlib
import subprocess
import sys
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments import verification, verification_report, verification_toy
from experiments.configs import verification as verification_config
from specdec_jax import verifiers, verify
from specdec_jax.measure import translation
from specdec_jax.sampling import SamplingConfig
from tests import helpers
from tests import verify_oracle as oracle

_ROOT = pathlib.Path(__file__).resolve().parents[1]

_TOY = (verification_toy.SUN_TOY_TARGET, verification_toy.SUN_TOY_DRAFTER)


def _exact_ccdf(gamma, method, target=_TOY[0], drafter=_TOY[1]):
  dist = verification_toy.toy_accepted_distribution(target, drafter, gamma, method)
  return verification_toy.ccdf_of_distribution(dist)


def _csv(path):
  with open(path) as f:
    reader = csv.DictReader(f)
    return reader.fieldnames, list(reader)


def _not_strict(constant: str):
  raise ValueError(f'{constant} in a results file: strict JSON writes null.')


def test_not_strict_catches_what_json_loads_lets_through():
  # Negative control for the check below: Python reads NaN by default.
  assert math.isnan(json.loads('[NaN]')[0])
  with pytest.raises(ValueError, match='NaN in a results file'):
    json.loads('[NaN]', parse_constant=_not_strict)


@pytest.mark.slow  # ~35 CPU-s
@helpers.needs_pair('ende')
def test_runlocal_end_to_end(tmp_path):
  config = verification_config.get_config('runlocal')
  lines = []
  paths = verification.run(config, str(tmp_path), progress=False, echo=lines.append)

  for name in ('improvement.png', 'ccdf.png'):
    assert (tmp_path / name).read_bytes()[:8] == b'\x89PNG\r\n\x1a\n', name
  assert not (tmp_path / 'batch.png').exists()  # one batch size
  assert '| drafter | B | temp | gamma |' in (tmp_path / 'table.md').read_text()
  for name, columns in verification.TABLES.items():
    header, rows = _csv(tmp_path / f'{name}.csv')
    assert tuple(header) == tuple(c.name for c in columns)
    # Strict JSON: json.loads takes NaN and Infinity unless told not to.
    strict = json.loads((tmp_path / f'{name}.json').read_text(), parse_constant=_not_strict)
    assert len(strict) == len(rows) > 0, name
    assert paths[f'{name}.csv'] == str(tmp_path / f'{name}.csv')

  runs = json.loads((tmp_path / 'runs.json').read_text())
  # Every run holds what the summary is made of, as written (not the column list against itself).
  header, _ = _csv(tmp_path / 'runs.csv')
  assert {'block_efficiency', 'speedup', 'tokens_per_s', 'seed'} <= set(header)
  assert all(r['seed'] in config.seeds and r['tokens'] > 0 for r in runs)
  seeds, gamma = config.seeds, config.gammas[0]
  assert len(runs) == len(seeds) * (1 + len(config.verifiers))  # autoregressive + each verifier
  for r in runs:
    assert r['seconds'] > 0 and r['tokens_per_s'] > 0 and r['speedup'] > 0
    if r['method'] == 'autoregressive':
      assert r['block_efficiency'] == 1.0 and r['speedup'] == 1.0 and r['alpha'] is None
    else:
      assert 1.0 <= r['block_efficiency'] <= gamma + 1 and 0 <= r['alpha'] <= 1

  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert [(r['method'], r['num_seeds']) for r in summary] == [
    ('autoregressive', 2),
    ('token', 2),
    ('block', 2),
  ]
  token, block = summary[1], summary[2]
  assert token['block_efficiency_gain_pct'] is None
  be = {m: [r['block_efficiency'] for r in runs if r['method'] == m] for m in ('token', 'block')}
  assert block['block_efficiency_mean'] == pytest.approx(np.mean(be['block']))
  assert block['block_efficiency_std'] == pytest.approx(np.std(be['block'], ddof=1))
  assert block['block_efficiency_gain_pct'] == pytest.approx(
    100 * (np.mean(be['block']) / np.mean(be['token']) - 1)
  )
  assert block['speedup_gain_pct'] is not None and block['speedup_gain_pct_std'] is not None

  ccdf = json.loads((tmp_path / 'ccdf.json').read_text())
  curves = {}
  for r in ccdf:
    curves.setdefault((r['model'], r['method'], r['gamma']), []).append(r)
  toy = {k: v for k, v in curves.items() if k[0] == 'toy'}
  real = {k: v for k, v in curves.items() if k[0] != 'toy'}
  assert len(toy) == len(config.toy_gammas) * 2 and len(real) == 2
  for (model, method, g), rows in curves.items():
    values = [r['p_at_least_k'] for r in rows]
    assert [r['k'] for r in rows] == list(range(g + 1)) and values[0] == 1.0
    assert all(a >= b for a, b in zip(values, values[1:]))  # a CCDF never increases
    assert rows[0]['mean_accepted'] == pytest.approx(sum(values[1:]))
  assert [r['exact'] for r in toy['toy', 'block', 2]] == ['1', '2/3', '5/9']
  assert all(r['estimate'] == 'trace' and r['samples'] > 0 for v in real.values() for r in v)

  # One line per finished row or curve, printed as it came.
  assert sum(line.startswith('run ') for line in lines) == len(runs)
  assert sum(line.startswith('ccdf ') for line in lines) == len(curves)


def test_translate_trace_gives_the_accepted_lengths_the_stats_count(ende_pair):
  pair = ende_pair
  sources = [s for s, _ in pair.test_pairs()[:3]]
  run = translation.translate(
    pair.target, pair.drafters['bigram'], pair.tokenizer, sources, method='block', gamma=3,
    sampling=SamplingConfig(temperature=1.0), batch_size=2, max_source_length=64,
    max_new_tokens=24, seed=3, trace=True,
  )  # fmt: skip
  taus = run.accepted_lengths
  # One tau per live iteration (the stats count target calls of rows still emitting only).
  assert taus.size == int(run.stats.target_calls)
  assert taus.sum() == int(run.stats.accepted)
  np.testing.assert_array_equal(
    [(taus > i).sum() for i in range(3)], np.asarray(run.stats.accepted_per_position)
  )
  ccdf = verification_toy.ccdf_of_lengths(taus, 3)
  np.testing.assert_allclose(ccdf[1:], np.asarray(run.stats.accepted_per_position) / taus.size)
  with pytest.raises(ValueError, match='speculative method'):
    translation.translate(
      pair.target, None, pair.tokenizer, sources, method='autoregressive', gamma=1,
      sampling=SamplingConfig(), batch_size=1, max_source_length=64, max_new_tokens=8, trace=True,
    )  # fmt: skip


def test_toy_known_values():
  """Sun et al. §3 (and docs/method.md §9, computed by hand): gamma 2, E[tau] 10/9 vs 11/9."""
  assert _exact_ccdf(2, 'token') == [1, Fraction(2, 3), Fraction(4, 9)]
  assert _exact_ccdf(2, 'block') == [1, Fraction(2, 3), Fraction(5, 9)]
  assert sum(_exact_ccdf(2, 'token')[1:]) == Fraction(10, 9)
  assert sum(_exact_ccdf(2, 'block')[1:]) == Fraction(11, 9)
  # With one draft, block verification is token verification.
  assert _exact_ccdf(1, 'token') == _exact_ccdf(1, 'block') == [1, Fraction(2, 3)]
  # Token verification on context-free models: P(tau >= k) = (sum_x min(p, q))^k.
  assert _exact_ccdf(5, 'token') == [Fraction(2, 3) ** k for k in range(6)]


@pytest.mark.parametrize('gamma', [2, 3])
@pytest.mark.parametrize('method', ['token', 'block'])
def test_toy_matches_the_rational_oracle(gamma, method):
  """Against tests/verify_oracle.py (written independently, over emitted sequences), on the
  paper's toy and on a three-token context-free pair."""
  pairs = [_TOY, ((Fraction(1, 2), Fraction(1, 3), Fraction(1, 6)), (Fraction(1, 6), 0, Fraction(5, 6)))]  # fmt: skip
  for target, drafter in pairs:
    vocab = len(target)
    emitted = oracle.iteration_distribution(
      oracle.context_free_model(target, vocab, gamma),
      oracle.context_free_model(drafter, vocab, gamma),
      gamma,
      method,
    )
    expected = [Fraction(0)] * (gamma + 1)
    for seq, prob in emitted.items():
      expected[len(seq) - 1] += prob
    assert verification_toy.toy_accepted_distribution(target, drafter, gamma, method) == expected


@pytest.mark.parametrize('gamma', [2, 4, 6])
def test_toy_ccdf_matches_monte_carlo_of_the_jitted_verifiers(gamma):
  """200k iterations of verify.token_verify / block_verify on drafts sampled here (numpy): every
  P(tau >= k) within 5 binomial standard errors (+1e-6 for float32) of the exact value."""
  samples = 200_000
  rng = np.random.default_rng(gamma)
  q = np.array([2 / 3, 1 / 3], np.float32)
  p = np.array([1 / 3, 2 / 3], np.float32)
  drafts = (rng.random((samples, gamma)) >= q[0]).astype(np.int32)  # token 0 (A) w.p. 2/3
  for i, method in enumerate(('token', 'block')):
    tau = verify.VERIFIERS[method](
      jax.random.key(100 + i),
      jnp.asarray(drafts),
      jnp.broadcast_to(q, (samples, gamma, 2)),
      jnp.broadcast_to(p, (samples, gamma + 1, 2)),
    ).num_accepted
    observed = verification_toy.ccdf_of_lengths(np.asarray(tau), gamma)
    exact = np.array([float(x) for x in _exact_ccdf(gamma, method)])
    tolerance = 5 * np.sqrt(exact * (1 - exact) / samples) + 1e-6
    assert np.all(np.abs(observed - exact) <= tolerance), (method, observed, exact)


def test_block_accepts_more_than_token_on_the_toy():
  for gamma in range(1, 9):
    token, block = _exact_ccdf(gamma, 'token'), _exact_ccdf(gamma, 'block')
    assert sum(block) >= sum(token) and (gamma == 1 or sum(block) > sum(token))
    # On this toy model block verification's CCDF is at least token's at every k.
    assert all(b >= t for b, t in zip(block, token)), gamma


def test_toy_part_estimates_other_verifiers_by_monte_carlo(monkeypatch):
  """A verifier without an exact formula (as a new one registered would be) gets a
  Monte Carlo CCDF from its jitted kernel; a copy of token_verify must match token's exact one."""
  copy = dataclasses.replace(verifiers.get('token'), name='token_copy')
  monkeypatch.setitem(verifiers.REGISTRY, 'token_copy', copy)
  config = verification_config.get_config(
    'parts=toy,verifiers=token,token_copy,toy_gammas=3,toy_samples=50000'
  )
  verification.check(config)
  (_, exact), (_, estimated) = list(verification_toy.toy_rows(config))
  assert [r['estimate'] for r in exact + estimated] == ['exact'] * 4 + ['monte_carlo'] * 4
  np.testing.assert_allclose(
    [r['p_at_least_k'] for r in estimated], [r['p_at_least_k'] for r in exact], atol=0.01
  )


def test_config_variants_and_checks():
  default = verification_config.get_config()
  assert default.gammas == (4, 6, 8) and default.temperatures == (0.2, 0.6, 1.0)
  assert default.seeds == (0, 1, 2) and default.verifiers == ('token', 'block')
  assert default.drafters == ('distilled', 'small-t5') and default.batch_sizes == (1,)
  batch = verification_config.get_config('batch')
  assert batch.batch_sizes == (1, 8, 32) and batch.temperatures == (0.0, 1.0)
  assert batch.drafters == ('distilled',) and batch.parts == ('sweep',)
  assert verification_config.get_config('batch,runlocal').batch_sizes == (1, 2)
  assert verification_config.get_config('runlocal,num_examples=8').num_examples == 8
  verification.check(default)
  for item, match in [
    ('parts=toy,nope', 'config.parts'),
    ('verifiers=token,nope', 'Unknown verifier'),
    ('seeds=0,0', 'repeated'),
    ('batch_sizes=0', 'batch_sizes'),
    ('toy_gammas=13', 'toy_gammas'),
    ('num_drafts=0', 'num_drafts'),
    ('draft_stops=0.5,x', 'draft_stops must hold numbers'),
    ('draft_stops=1.5', r'draft_stop must be a number in \(0, 1\)'),
  ]:
    with pytest.raises(ValueError, match=match):
      verification.check(verification_config.get_config(item))


def test_multipath_variant_names_its_methods():
  """`:multipath` sweeps K paths and draft stops of both verifiers; each method name maps to
  speculative_generate's keywords."""
  config = verification_config.get_config('multipath')
  verification.check(config)
  methods = verification.sweep_methods(config)
  assert methods[:6] == ['token', 'token/K2', 'token/K4', 'token/stop0.3', 'token/stop0.5',
                         'token/stop0.7']  # fmt: skip
  assert len(methods) == 12 and config.pretrained == 'ende48m' and config.drafters == ('distilled',)
  assert verification.method_options('block/K4') == ('block', {'num_drafts': 4})
  assert verification.method_options('token/stop0.5') == ('token', {'draft_stop': 0.5})
  assert verification.method_options('block') == ('block', {})
  from_text = verification_config.get_config('draft_stops=0.25')  # text from the command line
  assert verification.sweep_methods(from_text) == ['token', 'token/stop0.25', 'block',
                                                   'block/stop0.25']  # fmt: skip


def test_command_line_main_runs_the_toy_part(tmp_path):
  """The absl main (`common.run_experiment`): --config with items and --workdir, end to end."""
  config = 'experiments/configs/verification.py:runlocal,parts=toy'
  command = [sys.executable, '-m', 'experiments.verification', f'--config={config}']
  done = subprocess.run(
    command + [f'--workdir={tmp_path}'], capture_output=True, text=True, cwd=_ROOT, timeout=300
  )
  assert done.returncode == 0, done.stderr
  assert 'E[tau] 1.1111 = 10/9' in done.stdout and (tmp_path / 'ccdf.csv').exists()
  stray = subprocess.run(command + ['extra'], capture_output=True, text=True, cwd=_ROOT)
  assert stray.returncode != 0 and 'Unexpected arguments' in stray.stderr


def test_batch_figure_and_tables_from_summary_rows(tmp_path):
  """plot_batch / format_tables on hand-made summary rows (the batch variant's shape)."""
  runs = [
    dict(drafter=d, method=m, temp=1.0, gamma=g, batch_size=b, seed=s, alpha=None,
         block_efficiency=be, tokens=10, seconds=1.0 / tps, tokens_per_s=tps, speedup=1.0)
    for d, m, g, be in [('-', 'autoregressive', 0, 1.0), ('distilled', 'token', 4, 1.8),
                        ('distilled', 'block', 4, 2.0)]
    for b in (1, 8) for s, tps in ((0, 100.0 * b), (1, 110.0 * b))
  ]  # fmt: skip
  summary = []
  for key in dict.fromkeys((r['drafter'], r['batch_size']) for r in runs):
    summary += verification.summarize([r for r in runs if (r['drafter'], r['batch_size']) == key])
  block = [r for r in summary if r['method'] == 'block']
  assert [r['block_efficiency_gain_pct'] for r in block] == pytest.approx([100 / 9] * 2)
  assert verification_report.plot_batch(summary, str(tmp_path / 'batch.png'))
  assert (tmp_path / 'batch.png').stat().st_size > 0
  table = verification_report.format_tables(summary)
  assert '+11.1' in table and table.count('\n') == 3  # header, rule, one line per batch size
  one_batch = [r for r in summary if r['batch_size'] == 1]
  assert not verification_report.plot_batch(one_batch, str(tmp_path / 'none.png'))
  assert not (tmp_path / 'none.png').exists()
