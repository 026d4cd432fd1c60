r"""Block drafting measured (experiments/block_drafting.py): tokens per call, acceptance by
position, and the draft's cost per iteration against an autoregressive drafter's.

  python -m experiments.block_drafting --config=experiments/configs/block_drafting.py
  python -m experiments.block_drafting --config=experiments/configs/block_drafting.py:runlocal
  python -m experiments.block_drafting --config=experiments/configs/block_drafting.py:pairs=debsumm48m

Items apply in the order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.num_examples, c.batch_size = 8, 8
  c.block_gammas, c.gammas = (4,), (3,)
  c.timing_rounds = 0
  c.workdir = '/tmp/specdec_block_drafting_runlocal'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pairs = ('ende48m',)  # pair directories of pretrained/ (or paths), one task each
  c.drafters = ('block', 'distilled')  # the block drafter beside the autoregressive one
  c.temperatures = (0.0, 1.0)
  c.proposals = ('argmax', 'sample')  # a block drafter's, at temperature > 0
  c.gammas = (3, 5)  # an autoregressive drafter's
  c.block_gammas = (4, 6, 8)  # a block drafter's
  c.num_examples = 100
  c.batch_size = 16  # acceptance runs only: nothing is timed there
  # Lengths are the main job's for the pair (configs/ende.py, or debsumm.py for a debsumm pair).
  c.timing_rounds = 1  # 0: no cost rows
  c.timing_repeats = 15
  c.workdir = '/tmp/specdec_block_drafting'
  return common.parse(arg, c, {'runlocal': _runlocal})
