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
  assert set(paths) == {'csv', 'json', 'table.md'}
