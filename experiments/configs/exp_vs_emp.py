r"""Expected vs empirical speedup (Leviathan et al. Table 4, §3.5), experiments/exp_vs_emp.py.

  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py           # ~15 min
  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py:runlocal  # ~1 min
  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py:gammas=2,4,8
  python -m experiments.exp_vs_emp --config=experiments/configs/exp_vs_emp.py:ende48m   # ~35 min

Every (drafter, gamma, temperature) point of the main job's measurement (specdec_jax.measure.evaluation:
batch 1, compilation excluded, c and the (gamma+1)-pass cost timed in the loop), token
verification. The fields are the main job's (experiments/configs/ende.py). Items apply in the
order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.drafters, c.gammas, c.temperatures = ('bigram', 'distilled'), (1, 3), (0.0,)
  c.num_examples, c.max_new_tokens = 4, 32
  c.workdir = '/tmp/specdec_exp_vs_emp_runlocal'
  c.timing_rounds = 1


def _ende48m(c):
  # The main job's 48M pair and its drafters (it ships no small T5); 100 sentences, as the main job.
  c.pretrained, c.drafters, c.num_examples = 'ende48m', ('distilled', 'trigram', 'bigram'), 100
  c.workdir = '/tmp/specdec_exp_vs_emp_ende48m'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pretrained = 'ende'  # a pair under pretrained/, or a directory laid out the same way
  c.task = 'EnDe'  # the rows' task name, as in the paper's tables
  c.drafters = ('distilled', 'small-t5', 'bigram')
  c.gammas = (1, 2, 3, 4, 5, 6, 7)
  c.temperatures = (0.0, 1.0)
  c.verifiers = ('token',)  # the paper's analysis is for token verification
  c.num_examples = 200  # ~3.4K target tokens per point
  c.batch_size = 1  # as the paper: speedups are per sequence
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.seed = 0
  # Target step, pass and drafter costs (c, pass cost) are measured this many times; the median.
  c.timing_rounds = 3
  c.workdir = '/tmp/specdec_exp_vs_emp'
  return common.parse(arg, c, {'runlocal': _runlocal, 'ende48m': _ende48m})
