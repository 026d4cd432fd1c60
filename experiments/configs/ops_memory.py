r"""Arithmetic operations and memory reads per emitted token (Leviathan et al. §3.4),
experiments/ops_memory.py.

  python -m experiments.ops_memory --config=experiments/configs/ops_memory.py           # ~5 min
  python -m experiments.ops_memory --config=experiments/configs/ops_memory.py:runlocal  # < 1 min
  python -m experiments.ops_memory --config=experiments/configs/ops_memory.py:gammas=1,2,4,8

Per-call costs come from XLA's cost analysis of the compiled model calls (batch 1, the decode
loops' cache lengths); call counts from real runs over the pair's test sentences, which are not
timed and so run in batches (counts are per row: a finished row's idle work is not counted).
Items apply in the order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.drafters, c.gammas, c.temperatures = ('bigram', 'distilled'), (3,), (0.0,)
  c.num_examples, c.batch_size, c.max_new_tokens = 8, 8, 32
  c.workdir = '/tmp/specdec_ops_memory_runlocal'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pretrained = 'ende'  # a pair under pretrained/, or a directory laid out the same way
  c.drafters = ('distilled', 'small-t5', 'bigram')
  c.gammas = (1, 3, 5, 7)
  c.temperatures = (0.0, 1.0)
  c.verifiers = ('token',)  # the paper's analysis is for token verification
  c.num_examples = 200
  c.batch_size = 16  # nothing is timed: batches only make it faster
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.seed = 0
  c.workdir = '/tmp/specdec_ops_memory'
  return common.parse(arg, c, {'runlocal': _runlocal})
