r"""The main job: EN->DE on the shipped 48M pair (pretrained/ende48m), Table 2 of Leviathan et al.

  python -m experiments.translate --config=experiments/configs/ende.py          # the default
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal # 8 sentences, 13.5M
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=ende  # 13.5M
  python -m experiments.translate --config=experiments/configs/ende.py:full     # 500 sentences
  python -m experiments.translate --config=experiments/configs/ende.py:gammas=3,5,7,batch_size=8
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=/my/pair_dir
  python -m experiments.translate --config=experiments/configs/ende.py:paper   # T5-11B, v4-8
  python -m experiments.translate --config=experiments/configs/ende.py:large   # grown, CPU
  python -m experiments.translate --config=experiments/configs/ende.py:xxl     # grown, 1 GPU / v4-8
  python -m experiments.translate --config=experiments/configs/ende.py:grow_to=t5_1_1-xl
  python -m experiments.translate --config=experiments/configs/ende.py:tree_nodes=5,9  # + trees

Every method at batch 1 as in the paper: autoregressive, and the distilled, trigram and bigram
drafters with token and block verification at gammas 3 and 5 (the block drafter, where the pair
ships one, at gammas 4 and 8: one call drafts them all), temperatures 0 and 1, on the first 40
test sentences. Each (drafter, gamma, temperature) decodes every sentence autoregressively,
then with token, then with block verification, each call timed (`translation.translate_in_turn`):
one autoregressive baseline serves both verifiers. Items apply in the order written
(experiments/configs/common.py).

Cost: 2 temperatures x 8 (drafter, gamma) x (1 baseline + 2 verifiers) = 48 passes of 40
sentences (1,920 sentence decodings), and one round of cost timing per (drafter, gamma). How long
it took, on which machine, and what it measured: docs/results.md section 1 (and the README's
table).

Statistical cost (40 sentences, not 100 or 500): every mean over the sentences (alpha, block
efficiency, the speedup as a ratio of summed seconds) has a standard error sqrt(100/40) = 1.6x
that of 100 sentences, and BLEU (a corpus score; at temperature 1 one sample per sentence) moves
more between runs. c and the pass cost come from one timing round, not the median of 3 (the pass
cost is still a median, over the 3 drafters' rounds). Sharing the baseline costs no precision:
each speedup is still timed against an autoregressive decoding of the same batch a moment before
it, and token vs block (a ratio of their own seconds) no longer carries two baselines' noise.
`:full` (500 sentences, gammas 3, 5, 7, 3 timing rounds) has sqrt(500/40) = 3.5x smaller errors
than the default.
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.pretrained = 'ende'  # the 13.5M pair: a smoke test of the same job, 3-4x faster
  c.num_examples, c.gammas, c.max_new_tokens = 8, (4,), 32
  c.workdir = '/tmp/specdec_ende_runlocal'
  c.timing_rounds = 1


def full(c):
  """500 test sentences, gamma 3, 5 and 7 (the `:full` variant; `debsumm.py` uses it too)."""
  c.num_examples, c.gammas, c.timing_rounds = 500, (3, 5, 7), 3


def _paper(c):
  """Leviathan et al.'s EnDe rows: the public T5 (v1.0) 11B target with T5-small drafting, both
  T5X checkpoints read from gs:// slice by slice, on a v4-8 (4 chips: the target split over
  'model', the drafter replicated), bfloat16 params, batch 1. Both were trained on a task mixture
  that includes WMT EN->DE with this prefix (the paper fine-tuned its T5-XXL on EnDe alone).
  Stage the vocabulary and a WMT test set on every host first:

    gcloud storage cp gs://t5-data/vocabs/cc_all.32000/sentencepiece.model /tmp/t5/spm.model
    sacrebleu -t wmt14 -l en-de --echo src ref | tr -s ' ' | \
        awk -F'\t' 'NF == 2' > /tmp/t5/wmt14_ende.tsv   # source<TAB>reference

  then, on a v4-8 (scripts/launch_tpu.py starts it detached on every host of a slice):

    python -m experiments.translate --config=experiments/configs/ende.py:paper
  """
  t5x = 'gs://t5-data/pretrained_models/t5x'
  c.target = f'{t5x}/t5_11B/checkpoint_1000000'
  c.drafter = f'{t5x}/t5_small/checkpoint_1000000'
  c.tokenizer = '/tmp/t5/spm.model'
  c.test_file = '/tmp/t5/wmt14_ende.tsv'
  c.source_prefix = 'translate English to German: '
  c.task = 'EnDe'
  c.mesh, c.drafter_sharding, c.param_dtype = '1x4', 'replicated', 'bfloat16'
  c.max_source_length, c.max_new_tokens = 128, 128
  c.gammas = (3, 5, 7)
  c.num_examples, c.timing_rounds = 100, 3  # an accelerator is not the 2-core budget
  c.workdir = '/tmp/specdec_paper'


def grown_large(c):
  """The target grown to t5_1_1-large shapes (733M params with the pair's 8,000-piece vocabulary;
  `pretrained.grow_pair`), computing what the shipped target computes: the same table at a
  780M-class target's cost, shrunk to what a shared 2-core CPU decodes in under 30 minutes (12
  sentences, the distilled and bigram drafters at gamma 3 and the block drafter at gamma 8, the
  costs' fastest of 3 runs, not 15). Its rows: docs/results.md section 12."""
  c.grow_to = 't5_1_1-large'
  c.num_examples, c.drafters, c.gammas, c.timing_repeats = 12, ('distilled', 'bigram'), (3,), 3
  c.block_gammas = (8,)
  c.workdir = f'/tmp/specdec_{c.task.lower()}_large'


def grown_xxl(c):
  """The target grown to t5_1_1-xxl shapes (11B params; the paper's target's cost) in bfloat16
  params on the accelerator (one GPU, or a v4-8 as 1x4 with the drafters replicated), the default
  table (40 sentences, every drafter, gammas 3 and 5). Its build never holds the 11B params on the
  host (`t5_growth.grow_placed`); its memory per v4 device: tests/tpu_paper_test.py."""
  c.grow_to, c.param_dtype, c.drafter_sharding = 't5_1_1-xxl', 'bfloat16', 'replicated'
  c.workdir = f'/tmp/specdec_{c.task.lower()}_xxl'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pretrained = 'ende48m'  # a pair under pretrained/, or a directory laid out the same way
  c.task = 'EnDe'  # the rows' task name, as in the paper's tables
  # Names of the pair's drafters (specdec_jax.pretrained), or ('all',). The unigram and the
  # small T5 (dominated by the distilled drafter) are in the alpha table (experiments/alpha_table.py).
  c.drafters = ('distilled', 'trigram', 'bigram')
  # Block drafters (one call drafts gamma tokens), added to the rows where the pair ships them:
  # pretrained/ende48m and debsumm48m do, the 13.5M pair does not.
  c.block_drafters = ('block',)
  c.workdir = '/tmp/specdec_ende'
  c.num_examples = 40  # :full for 500; the docstring gives the statistical cost
  c.batch_size = 1
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.temperatures = (0.0, 1.0)
  c.gammas = (3, 5)
  # A block drafter's gammas (one call drafts them all, so they may be larger; <= its block_size).
  c.block_gammas = (4, 8)
  c.verifiers = ('token', 'block')
  # Token-tree rows (none by default): node budgets N, each drafter's tree of N nodes scored in
  # one target pass (a block drafter's best-first tree from its one call, depth min(N - 1,
  # block_size); an autoregressive drafter's top-2 tree, N odd, depth (N - 1) / 2), token-tree
  # verification (docs/method.md section 13), timed in turn with its own autoregressive baseline.
  c.tree_nodes = ()
  # The source-lookup drafter's chain rows (`draft_lookup.source_lookup`: the latest match of the
  # last 3..1 emitted tokens in the row's own source, a one-hot law, no model; c = 0), at
  # config.gammas with each verifier but greedy_block. Its trees and the hybrid tree:
  # `python -m benchmarks.lookup_loop`.
  c.lookup = False
  # How drafts are proposed at temperature > 0 (speculative_generate's proposal): 'sample' (each
  # draft drawn from the drafter's law) or 'argmax' (its most likely token, q one-hot).
  c.proposal = 'sample'
  # K draft paths per iteration (speculative_generate's num_drafts): K > 1 verifies K independent
  # paths with verify_multipath (block: greedy multi-path block verification; token: recursive
  # rejection) and runs each row as K rows of both models.
  c.num_drafts = 1
  # Adaptive draft length (speculative_generate's draft_stop): stop drafting after the first draft
  # the drafter gives less than this probability (its own softmax); None: always gamma drafts.
  c.draft_stop = None
  c.seed = 0
  # Where it runs: a 'DATAxMODEL' device mesh ('auto': one device on CPU, 1xN over every device of
  # an accelerator); drafters 'replicated' on every device, sharded by the 'model' rules, or 'auto'
  # (replicated under 1B params). A multi-host slice runs the same command on every host.
  c.mesh = 'auto'
  c.drafter_sharding = 'auto'
  # Every T5's decoder q/k/v kernels and gated-MLP wi_0/wi_1 kernels fused into one dot each
  # (`t5.fuse_projections`; one device only): the same tokens, and on XLA:CPU a one-row step
  # ~14% faster while a multi-row pass is not, so the speedups fall (docs/performance.md, "Fused
  # decoder projections"). Off: the T5X layout, as every result in docs/results.md ran.
  c.fused_projections = False
  # A pair given by checkpoints instead of `pretrained` (T5X, HF or our own directories; gs://
  # URLs for T5X): all four are needed together; the drafter's rows are named 'drafter'.
  c.target = ''
  c.drafter = ''
  c.tokenizer = ''  # SentencePiece model
  c.test_file = ''  # (source, reference) pairs: TSV, or JSONL with source/target keys
  c.source_prefix = ''  # e.g. 'translate English to German: ' for the public T5 checkpoints
  c.param_dtype = ''  # params on the device: '' as the loader gives them, or e.g. 'bfloat16'
  # A T5 shape of t5.CONFIGS (e.g. 't5_1_1-xxl'): the pair's target grown to it, built on the
  # devices in param_dtype, computing what the shipped target computes (`pretrained.grow_pair`);
  # its drafters follow it. '' decodes with the shipped target.
  c.grow_to = ''
  # Target step, pass and drafter costs (c, pass cost) are measured this many times; the median.
  # 1 by default (the cost of the default run, see above); :full measures 3.
  c.timing_rounds = 1
  c.timing_repeats = 15  # timed runs of each cost loop per round; the fastest counts
  variants = {'runlocal': _runlocal, 'full': full, 'paper': _paper}
  return common.parse(arg, c, {**variants, 'large': grown_large, 'xxl': grown_xxl})
