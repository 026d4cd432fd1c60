"""experiments/block_drafting.py end to end on `:runlocal` (8 sentences of ende48m): its rows,
files and printed tables through the experiment skeleton."""

import csv

import pytest

from experiments import block_drafting
from experiments.configs import block_drafting as config_lib
from tests import helpers


@pytest.mark.slow  # decodes 8 sentences with each drafter, temperature and proposal
@helpers.needs_pair('ende48m')
def test_runlocal_writes_and_prints_its_rows(tmp_path):
  config = config_lib.get_config('runlocal')
  printed = []
  paths = block_drafting.run(config, str(tmp_path), echo=printed.append)
  with open(paths['csv']) as f:
    rows = list(csv.DictReader(f))
  assert {r['drafter'] for r in rows} == {'block', 'distilled'}
  for r in rows:
    accepted = [float(x) for x in r['accepted'].split()]
    assert len(accepted) == int(r['gamma']) and accepted == sorted(accepted, reverse=True)
    # (each position's count printed to 2 decimals)
    assert float(r['tokens_per_call']) == pytest.approx(
      1 + sum(accepted), abs=0.005 * len(accepted)
    )
  assert not any('draft/iter' in line for line in printed)  # timing_rounds 0: no cost rows
  assert any(line.split()[:1] == ['task'] and 'tok/call' in line for line in printed)
  assert sum(line.split()[:1] == ['EnDe'] for line in printed) == len(rows)
