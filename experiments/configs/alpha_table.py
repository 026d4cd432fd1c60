r"""Table 3 of Leviathan et al.: alpha by drafter and sampling setting (experiments/alpha_table.py).

  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py           # ~8 min
  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py:runlocal  # < 1 min
  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py:samplings=t0,t0.5
  python -m experiments.alpha_table --config=experiments/configs/alpha_table.py:debsumm  # ~15 min

Alpha is `DecodeStats.alpha` of a speculative run (token verification, one gamma): the mean of
beta = sum_x min(p, q) over the positions the run verified. Nothing is timed, so the sentences are
decoded in batches. A sampling setting is a label `t<temperature>[-k<top_k>][-p<top_p>]`:
`t0` greedy, `t1` standard sampling, `t1-k5` temperature 1 and top-k 5, `t0.7-p0.9` nucleus.
Each pair of `pairs` (a directory of pretrained/, or a path) is one task; a drafter a pair does
not ship is skipped for that pair. Items apply in the order written (experiments/configs/common.py).
"""

import ml_collections

from experiments.configs import common, debsumm


def _runlocal(c):
  c.drafters = ('unigram', 'bigram', 'distilled')
  c.samplings = ('t0', 't1')
  c.num_examples, c.batch_size, c.max_new_tokens = 8, 8, 32
  c.workdir = '/tmp/specdec_alpha_table_runlocal'


def _debsumm(c):
  # The second task (pretrained/debsumm48m, the paper's CNNDM): its long sources and short outputs.
  c.pairs, c.drafters = ('debsumm48m',), ('unigram', 'bigram', 'trigram', 'distilled')
  main = debsumm.get_config()  # the lengths of its Table-2 rows
  c.max_source_length, c.max_new_tokens = main.max_source_length, main.max_new_tokens
  c.workdir = '/tmp/specdec_alpha_table_debsumm'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pairs = ('ende',)  # one task per pair
  c.drafters = ('unigram', 'bigram', 'trigram', 'small-t5', 'distilled')
  # The paper's two settings (argmax, standard sampling), then sharper distributions.
  c.samplings = ('t0', 't1', 't1-k20', 't1-k5')
  c.gamma = 4  # drafts per iteration of the measuring run (alpha hardly depends on it)
  c.verifier = 'token'
  c.num_examples = 500  # every shipped test pair: ~8K target tokens (the paper: 10K)
  c.batch_size = 16  # nothing is timed: batches only make it faster
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.seed = 0
  c.workdir = '/tmp/specdec_alpha_table'
  return common.parse(arg, c, {'runlocal': _runlocal, 'debsumm': _debsumm})
