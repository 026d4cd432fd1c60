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
  # Its header says its own rows, not the main job's it borrows the sentences from.
  (header,) = [line for line in printed if 'test sentences of' in line]
  assert 'block drafters (4,), proposals' in header and 'passes over' not in header


def test_the_prediction_takes_each_pair_s_own_costs():
  # Two pair directories of one task (two variants of a drafter, as the model card's width
  # ablation ran them): each row's speedup is priced by its own pair's cost row.
  acceptance = [
    dict(pair=p, task='EnDe', drafter='block', temp=0.0, proposal='argmax', gamma=4,
         tokens_per_call=2.0)
    for p in ('a/pair', 'b/pair')
  ]  # fmt: skip
  costs = [
    dict(pair='a/pair', task='EnDe', drafter='block', gamma=4, c=0.0, c_fixed=0.5, pass_cost=1.0),
    dict(pair='b/pair', task='EnDe', drafter='block', gamma=4, c=0.0, c_fixed=1.0, pass_cost=1.0),
  ]
  lines = block_drafting.predicted(acceptance, costs)
  assert [line.split(' = ')[-1] for line in lines] == ['1.33x', '1.00x']
