r"""The main job: EN->DE on the shipped 48M pair (pretrained/ende48m), Table 2 of Leviathan et al.

  python -m experiments.translate --config=experiments/configs/ende.py          # ~12 min, 2 cores
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal # ~1 min smoke
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=ende  # 13.5M
  python -m experiments.translate --config=experiments/configs/ende.py:full     # 500 sentences
  python -m experiments.translate --config=experiments/configs/ende.py:gammas=3,5,7,batch_size=8
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=/my/pair_dir

Every method at batch 1 as in the paper: autoregressive, and the distilled, trigram and bigram
drafters with token and block verification at temperature 0 and 1. Items apply in the order written
(experiments/configs/common.py). Numbers it gave on a 2-core CPU are in the README.
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.pretrained = 'ende'  # the 13.5M pair: a smoke test of the same job, 3-4x faster
  c.num_examples, c.gammas, c.max_new_tokens = 8, (4,), 32
  c.workdir = '/tmp/specdec_ende_runlocal'
  c.timing_rounds = 1


def _full(c):
  c.num_examples, c.gammas = 500, (3, 5, 7)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pretrained = 'ende48m'  # a pair under pretrained/, or a directory laid out the same way
  c.task = 'EnDe'  # the rows' task name, as in the paper's tables
  # Names of the pair's drafters (specdec_jax.pretrained), or ('all',). The unigram and the
  # small T5 (dominated by the distilled drafter) are in the alpha table (experiments/alpha_table.py).
  c.drafters = ('distilled', 'trigram', 'bigram')
  c.workdir = '/tmp/specdec_ende'
  c.num_examples = 100
  c.batch_size = 1
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.temperatures = (0.0, 1.0)
  c.gammas = (3, 5)
  c.verifiers = ('token', 'block')
  c.seed = 0
  # Where it runs: a 'DATAxMODEL' device mesh ('auto': one device on CPU, 1xN over every device of
  # an accelerator); drafters 'replicated' on every device, sharded by the 'model' rules, or 'auto'
  # (replicated under 1B params). A multi-host slice runs the same command on every host.
  c.mesh = 'auto'
  c.drafter_sharding = 'auto'
  # A pair given by checkpoints instead of `pretrained` (T5X, HF or our own directories; gs://
  # URLs for T5X): all four are needed together; the drafter's rows are named 'drafter'.
  c.target = ''
  c.drafter = ''
  c.tokenizer = ''  # SentencePiece model
  c.test_file = ''  # (source, reference) pairs: TSV, or JSONL with source/target keys
  c.source_prefix = ''  # e.g. 'translate English to German: ' for the public T5 checkpoints
  # Target step, pass and drafter costs (c, pass cost) are measured this many times; the median.
  c.timing_rounds = 3
  return common.parse(arg, c, {'runlocal': _runlocal, 'full': _full})
