"""experiments/token_trees.py end to end on `:runlocal` (8 sentences of ende48m, budget 9, T=0):
its rows and pass costs, files and printed tables through the experiment skeleton."""

import csv

import pytest

from experiments import token_trees
from experiments.configs import token_trees as config_lib
from tests import helpers


@pytest.mark.slow  # decodes 8 sentences with each method, then times passes of 4 nodes
@helpers.needs_pair('ende48m')
def test_runlocal_writes_and_prints_its_rows(tmp_path):
  config = config_lib.get_config('runlocal')
  printed = []
  paths = token_trees.run(config, str(tmp_path), echo=printed.append)
  with open(paths['csv']) as f:
    rows = list(csv.DictReader(f))
  assert rows and {r['budget'] for r in rows} == {'9'}
  assert all(1 <= float(r['tokens_per_call']) <= int(r['gamma']) + 1 for r in rows)
  with open(paths['passes_csv']) as f:
    (passes,) = list(csv.DictReader(f))
  assert passes['nodes'] == '4' and float(passes['chain']) > 0 and float(passes['tree']) > 0
  assert sum(line.split()[:1] == ['EnDe'] for line in printed) == len(rows) + 1
  # Its header says its own rows, not the main job's it borrows the sentences from.
  (header,) = [line for line in printed if 'test sentences of' in line]
  assert 'budgets (9,) at temperatures (0.0,)' in header and 'passes over' not in header


def test_rows_of_a_drafter_the_pair_lacks_are_skipped():
  # A pair with only a block drafter (a distillation's pair/) runs its block rows; one without a
  # block drafter runs the distilled drafter's.
  config = config_lib.get_config()
  block = type('Drafter', (), {'steps': type('Steps', (), {'block_size': 8})()})()
  only_block = [r[0] for r in token_trees.planned(config, {'block': block}, 17, 1.0)]
  only_distilled = [r[0] for r in token_trees.planned(config, {'distilled': None}, 17, 1.0)]
  assert only_block == ['block chain', 'block tree', 'block sampled']
  assert only_distilled == ['distilled chain', 'distilled 4 paths', 'distilled topk']
  config.methods = ('block tree',)
  assert [r[0] for r in token_trees.planned(config, {'block': block}, 17, 0.0)] == ['block tree']
  config.block_drafter = 'wide'  # another block drafter of the pair runs the block rows
  rows = token_trees.planned(config, {'block': None, 'wide': block}, 17, 0.0)
  assert [(r[0], r[1]) for r in rows] == [('block tree', 'wide')]
