r"""Token trees measured (experiments/token_trees.py): tokens per target call of a tree, a chain
and K paths at equal node budgets, and a tree pass's cost against a chain pass's.

  python -m experiments.token_trees --config=experiments/configs/token_trees.py
  python -m experiments.token_trees --config=experiments/configs/token_trees.py:runlocal
  python -m experiments.token_trees --config=experiments/configs/token_trees.py:pairs=debsumm48m
  python -m experiments.token_trees --config=experiments/configs/token_trees.py:passes_only

Items apply in the order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.pairs = ('ende48m',)
  c.num_examples, c.batch_size = 8, 8
  c.budgets, c.temperatures = (9,), (0.0,)
  c.pass_nodes = (4,)
  c.repeats = 2
  c.workdir = '/tmp/specdec_token_trees_runlocal'


def _passes_only(c):
  c.temperatures = ()  # no acceptance rows: the pass costs alone


def _no_passes(c):
  c.pass_nodes = ()  # acceptance rows alone


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pairs = ('ende48m', 'debsumm48m')  # pair directories of pretrained/ (or paths)
  c.temperatures = (0.0, 1.0)
  c.budgets = (9, 17)  # positions one target pass scores
  c.methods = ('',)  # names of experiments/token_trees.py's rows to run ('': all)
  c.block_drafter = 'block'  # the pair's block drafter the block rows run ('wide' on ende48m)
  c.num_examples = 40
  c.batch_size = 8  # acceptance runs only: nothing is timed there
  c.pass_nodes = (4, 8, 16, 32, 64)  # tree pass costs at batch 1; () skips them
  c.repeats = 5
  c.workdir = '/tmp/specdec_token_trees'
  return common.parse(
    arg, c, {'runlocal': _runlocal, 'passes_only': _passes_only, 'no_passes': _no_passes}
  )
