r"""The check of Sun et al.'s Appendix C statement (not a reproduction of its Table 4, which could
not be retrieved): token, block and greedy block verification on both shipped 48M pairs
(experiments/greedy_block.py).

  python -m experiments.greedy_block --config=experiments/configs/greedy_block.py
  python -m experiments.greedy_block --config=experiments/configs/greedy_block.py:runlocal
  python -m experiments.greedy_block --config=experiments/configs/greedy_block.py:tasks=ende,gammas=8

Tasks are main-job configs (experiments/configs/ende.py: EnDe on pretrained/ende48m, 64 source
and 64 new tokens; debsumm.py: DebSumm on pretrained/debsumm48m, 256 / 40), each with its pair's
`distilled` drafter at temperature 1, gammas 4 / 6 / 8 (the paper's Appendix C is read to be at gamma 8),
batch 1 as the main job times it, on the first 40 test sources of each pair; the first iteration
from 16 samples per source (640 rows); then whole sequences again, untimed, at seeds 0, 1, 2
(`paired_seeds`, one batch of 40), the verifiers of a seed sharing its keys, for the paired
differences over seeds (`:paired` runs that section alone). How long it took, on which machine: docs/results.md
section 8. Items apply in the order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.tasks, c.gammas, c.num_examples, c.first_samples = ('ende',), (4,), 3, 4
  c.paired_seeds, c.paired_batch_size = (0, 1), 3
  c.workdir = '/tmp/specdec_greedy_block_runlocal'


def _paired(c):
  c.timed = False  # the paired seeds' section alone


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.tasks = ('ende', 'debsumm')  # main-job configs (experiments/configs/<task>.py)
  c.drafter = 'distilled'
  c.verifiers = ('token', 'block', 'greedy_block')  # names of specdec_jax.verifiers.REGISTRY
  c.gammas = (4, 6, 8)
  c.temperature = 1.0
  c.num_examples = 40  # test sources per task (timed, whole sequences)
  c.batch_size = 1  # the main job's: each sentence timed alone
  c.first_samples = 16  # untimed first-iteration rows per source
  c.first_batch_size = 64
  c.seed = 0
  c.timed = True  # the timed whole sequences and the first iteration (`:paired`: off)
  c.paired_seeds = (0, 1, 2)  # untimed whole sequences, once per seed, verifiers sharing keys
  c.paired_batch_size = 40
  c.workdir = '/tmp/specdec_greedy_block'
  return common.parse(arg, c, {'runlocal': _runlocal, 'paired': _paired})
