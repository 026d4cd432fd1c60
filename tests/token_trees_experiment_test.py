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
