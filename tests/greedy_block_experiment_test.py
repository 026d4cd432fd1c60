"""experiments/greedy_block.py (the check of Sun et al.'s Appendix C statement): its config and checks, the table's layout,
the runlocal variant end to end on the shipped 48M pair (slow); and the verification experiment's
toy part for greedy block verification (its first iteration's law from the kernel)."""

import json

import numpy as np
import pytest

from experiments import greedy_block, verification, verification_toy
from experiments.configs import greedy_block as greedy_block_config
from experiments.configs import verification as verification_config
from tests import helpers


def test_config_and_checks():
  config = greedy_block_config.get_config()
  assert config.tasks == ('ende', 'debsumm') and config.gammas == (4, 6, 8)
  assert config.verifiers == ('token', 'block', 'greedy_block') and config.temperature == 1.0
  ende = greedy_block.task_config(config, 'ende')
  assert (ende.pretrained, ende.task, ende.max_new_tokens) == ('ende48m', 'EnDe', 64)
  assert ende.drafters == ('distilled',) and ende.verifiers == config.verifiers
  assert ende.block_drafters == ()  # the main job adds its block rows; greedy block refuses them
  debsumm = greedy_block.task_config(config, 'debsumm')
  assert (debsumm.pretrained, debsumm.max_source_length) == ('debsumm48m', 256)
  with pytest.raises(ValueError, match="Unknown task 'cnndm'"):
    greedy_block.prepare(greedy_block_config.get_config('tasks=cnndm'))
  with pytest.raises(ValueError, match='first_samples must be an int >= 1'):
    greedy_block.prepare(greedy_block_config.get_config('first_samples=0'))
  runlocal = greedy_block_config.get_config('runlocal')
  assert runlocal.tasks == ('ende',) and runlocal.num_examples == 3


def test_table4_layout():
  rows = [
    dict(task='EnDe', gamma=8, method=m, first_block_efficiency=f, first_block_efficiency_se=0.01,
         block_efficiency=b, speedup=s)
    for m, f, b, s in (('token', 2.0, 1.9, 1.1), ('block', 2.2, 2.1, 1.2), ('greedy_block', 2.4, 2.0, 1.15))
  ]  # fmt: skip
  table = greedy_block.format_table4(rows, ('token', 'block', 'greedy_block'))
  assert table.splitlines()[2] == (
    '| EnDe | 8 | 2.000 +- 0.010 / 2.200 +- 0.010 / 2.400 +- 0.010 | 1.900 / 2.100 / 2.000 | '
    '1.10 / 1.20 / 1.15 |'
  )


def test_paired_differences():
  """Per-seed differences of the last verifier against each other, their spread, and the count of
  seeds where it is below 0; a seed missing a verifier is left out of every difference."""
  values = {('token', 0): 1.8, ('block', 0): 2.0, ('greedy_block', 0): 1.9,
            ('token', 1): 1.7, ('block', 1): 1.9, ('greedy_block', 1): 2.0,
            ('token', 2): 1.6, ('block', 2): 2.1}  # fmt: skip
  rows = [
    dict(task='EnDe', gamma=8, method=m, seed=s, block_efficiency=v) for (m, s), v in values.items()
  ]
  verifiers = ('token', 'block', 'greedy_block')
  (r,) = greedy_block.paired_differences(rows, verifiers)
  assert r['seeds'] == 2
  assert r['block'] == pytest.approx((1.95, np.std([2.0, 1.9], ddof=1)))
  mean, sd, below, per_seed = r['greedy_block - block']
  assert per_seed == pytest.approx([-0.1, 0.1]) and below == 1
  assert (mean, sd) == pytest.approx((0.0, np.std([-0.1, 0.1], ddof=1)))
  assert r['greedy_block - token'][2] == 0
  table = greedy_block.format_paired([r], verifiers)
  assert table.splitlines()[2] == (
    '| EnDe | 8 | 2 | 1.750 +- 0.071 / 1.950 +- 0.071 / 1.950 +- 0.071 | '
    '+0.200 +- 0.141 [< 0 at 0 of 2] (+0.100, +0.300) | '
    '+0.000 +- 0.141 [< 0 at 1 of 2] (-0.100, +0.100) |'
  )


def test_verification_toy_part_has_greedy_block():
  """The toy's first iteration from the kernel's law: E[tau] 12/9 at gamma 2 (block 11/9)."""
  dist = verification_toy.toy_greedy_block_distribution(
    verification_toy.SUN_TOY_TARGET, verification_toy.SUN_TOY_DRAFTER, 2
  )
  np.testing.assert_allclose(dist, [1 / 3, 0, 2 / 3], atol=1e-6)
  config = verification_config.get_config('greedy,parts=toy,toy_gammas=2')
  verification.check(config)
  curves = [rows for _, rows in verification_toy.toy_rows(config)]
  means = {rows[0]['method']: rows[0]['mean_accepted'] for rows in curves}
  assert means == pytest.approx({'token': 10 / 9, 'block': 11 / 9, 'greedy_block': 12 / 9})
  assert curves[-1][0]['estimate'] == 'kernel_law'


@pytest.mark.slow  # ~2-3 min: 8 programs to compile
@helpers.needs_pair('ende48m')
def test_runlocal_end_to_end(tmp_path):
  lines = []
  paths = greedy_block.run(
    greedy_block_config.get_config('runlocal'), str(tmp_path), echo=lines.append
  )
  rows = json.loads((tmp_path / 'results.json').read_text())
  assert [r['method'] for r in rows] == ['token', 'block', 'greedy_block']
  for r in rows:
    assert 1 <= r['first_block_efficiency'] <= 5 and 1 <= r['block_efficiency'] <= 5
    assert r['first_samples'] == 12 and r['sentences'] == 3 and r['speedup'] > 0
  assert (tmp_path / 'table.md').read_text().startswith('| task | gamma | first iteration')
  paired = json.loads((tmp_path / 'paired.json').read_text())
  assert [(r['seed'], r['method']) for r in paired] == [
    (s, m) for s in (0, 1) for m in ('token', 'block', 'greedy_block')
  ]
  assert all(1 <= r['block_efficiency'] <= 5 and r['sentences'] == 3 for r in paired)
  assert '[< 0 at' in (tmp_path / 'paired.md').read_text()
  assert set(paths) == {'csv', 'json', 'table.md', 'paired.csv', 'paired.json', 'paired.md'}
