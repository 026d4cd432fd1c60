r"""The main job: EN->DE on the shipped 48M pair (pretrained/ende48m), Table 2 of Leviathan et al.

  python -m experiments.translate --config=experiments/configs/ende.py          # the headline rows
  python -m experiments.translate --config=experiments/configs/ende.py:all_drafters  # every drafter
  python -m experiments.translate --config=experiments/configs/ende.py:full     # 500 sentences
  python -m experiments.translate --config=experiments/configs/ende.py:runlocal # 8 sentences, 13.5M
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=ende  # 13.5M
  python -m experiments.translate --config=experiments/configs/ende.py:gammas=3,5,7,batch_size=8
  python -m experiments.translate --config=experiments/configs/ende.py:pretrained=/my/pair_dir
  python -m experiments.translate --config=experiments/configs/ende.py:paper   # T5-11B, v4-8
  python -m experiments.translate --config=experiments/configs/ende.py:large   # grown, CPU
  python -m experiments.translate --config=experiments/configs/ende.py:xxl     # grown, 1 GPU / v4-8
  python -m experiments.translate --config=experiments/configs/ende.py:grow_to=t5_1_1-xl
  python -m experiments.translate --config=experiments/configs/ende.py:tree_nodes=5,9  # + trees

The default is the headline rows, at batch 1 as in the paper, temperatures 0 and 1, on the first
40 test sentences: autoregressive; the best drafter, `distilled` at gamma 3, with token and with
block verification; and the block drafter's best tree, its best-first token tree of 5 nodes
(depth 4: one drafter call and one 5-position target pass an iteration), where the pair ships a
block drafter (`config.trees`; pretrained/ende48m and debsumm48m do, the 13.5M pair does not).
Both chosen from measured rows (docs/results.md sections 1 and 10, 2 CPU cores): the distilled
drafter at gamma 3 is the best T=1 row, the best at both temperatures with the decoder
projections fused, and within the run's noise of the greedy best (the trigram at gamma 3); the
block drafter's 5-node tree is its best row (a 9-node tree's pass costs 1.7-1.8 target steps on
that CPU). Each chain and each tree, at each temperature, decodes every sentence
autoregressively, then with each of its methods, each call timed
(`translation.translate_in_turn`): one autoregressive baseline serves both verifiers.

Everything else: `:all_drafters` adds the trigram and bigram drafters, gamma 5, and the block
drafter's chains at gammas 4 and 8 (the 34 rows the default ran before the headline cut, and the
tree), `:full` is that on 500 sentences with gammas 3, 5 and 7, and the other tables are the
experiments' mains (the README's "More"). Items apply in the order written
(experiments/configs/common.py).

Cost: 2 temperatures x (3 passes for the chain: its baseline and 2 verifiers; 2 for the tree: its
baseline and the tree) = 10 passes of 40 sentences (400 sentence decodings), and one round of
cost timing for each of the 2 groups the rows use (the distilled drafter at gamma 3, the block
drafter's 5-node tree): `evaluation.model_costs` times the plan's groups and nothing else. How
long it took, on which machine: docs/results.md section 1 (and the README's table).

Statistical cost (40 sentences, not 100 or 500): every mean over the sentences (alpha, block
efficiency, the speedup as a ratio of summed seconds) has a standard error sqrt(100/40) = 1.6x
that of 100 sentences, and BLEU (a corpus score; at temperature 1 one sample per sentence) moves
more between runs. c and the pass cost come from one timing round of 15 timed runs of each cost
loop, the fastest counting (`config.timing_repeats`: at 7, c spread 4.5x as much over trials,
benchmarks/cost_repeats.py), not the median of 3 rounds; each pass cost is its one drafter's
measurement (`:all_drafters` pools a gamma's over its drafters). Sharing the baseline costs no
precision: each speedup is still timed against an autoregressive decoding of the same batch a
moment before it, and token vs block (a ratio of their own seconds) carries no second baseline's
noise. `:full` (500 sentences, gammas 3, 5, 7, 3 timing rounds) has sqrt(500/40) = 3.5x smaller
errors than the default.
"""

import ml_collections

from experiments.configs import common


def _runlocal(c):
  c.pretrained = 'ende'  # the 13.5M pair: a smoke test of the same job, 3-4x faster
  c.num_examples, c.gammas, c.max_new_tokens = 8, (4,), 32
  c.workdir = '/tmp/specdec_ende_runlocal'
  c.timing_rounds = 1


def all_drafters(c):
  """Every drafter the main job runs, beside the headline rows: the distilled, trigram and bigram
  drafters at gammas 3 and 5 and the block drafter's chains at gammas 4 and 8, each with token and
  block verification, and the block drafter's 5-node tree (the `:all_drafters` variant; `:full`
  and `debsumm.py` use it too). 34 rows of 48 passes and 8 cost groups before the tree's."""
  c.drafters, c.block_drafters = ('distilled', 'trigram', 'bigram'), ('block',)
  c.gammas, c.block_gammas = (3, 5), (4, 8)


def full(c):
  """`all_drafters` on 500 test sentences, gamma 3, 5 and 7, 3 timing rounds (the `:full`
  variant; `debsumm.py` uses it too)."""
  all_drafters(c)
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
  costs' fastest of 3 runs, not 15; no tree). Its rows: docs/results.md section 12."""
  c.grow_to = 't5_1_1-large'
  c.num_examples, c.drafters, c.gammas, c.timing_repeats = 12, ('distilled', 'bigram'), (3,), 3
  c.block_drafters, c.block_gammas, c.trees = ('block',), (8,), ()
  c.workdir = f'/tmp/specdec_{c.task.lower()}_large'


def grown_xxl(c):
  """The target grown to t5_1_1-xxl shapes (11B params; the paper's target's cost) in bfloat16
  params on the accelerator (one GPU, or a v4-8 as 1x4 with the drafters replicated), the default
  rows (40 sentences; `xxl,all_drafters`: every drafter at gammas 3 and 5). Its build never holds
  the 11B params on the host (`t5_growth.grow_placed`); its memory per v4 device:
  tests/tpu_paper_test.py."""
  c.grow_to, c.param_dtype, c.drafter_sharding = 't5_1_1-xxl', 'bfloat16', 'replicated'
  c.workdir = f'/tmp/specdec_{c.task.lower()}_xxl'


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pretrained = 'ende48m'  # a pair under pretrained/, or a directory laid out the same way
  c.task = 'EnDe'  # the rows' task name, as in the paper's tables
  # Names of the pair's drafters (specdec_jax.pretrained), or ('all',): their chain rows. The
  # default is the best one; :all_drafters adds the trigram and bigram. The unigram and the small
  # T5 (dominated by the distilled drafter) are in the alpha table (experiments/alpha_table.py).
  c.drafters = ('distilled',)
  # Block drafters (one call drafts gamma tokens) whose chains join the rows where the pair ships
  # them (pretrained/ende48m and debsumm48m do, the 13.5M pair does not); :all_drafters: 'block'.
  c.block_drafters = ()
  c.workdir = '/tmp/specdec_ende'
  c.num_examples = 40  # :full for 500; the docstring gives the statistical cost
  c.batch_size = 1
  c.max_source_length = 64
  c.max_new_tokens = 64
  c.temperatures = (0.0, 1.0)
  c.gammas = (3,)  # :all_drafters 3 and 5
  # A block drafter's gammas (one call drafts them all, so they may be larger; <= its block_size).
  c.block_gammas = (4, 8)
  c.verifiers = ('token', 'block')
  # Token-tree rows (none by default): node budgets N, each drafter's tree of N nodes scored in
  # one target pass (a block drafter's best-first tree from its one call, depth min(N - 1,
  # block_size); an autoregressive drafter's top-2 tree, N odd, depth (N - 1) / 2), token-tree
  # verification (docs/method.md section 13), timed in turn with its own autoregressive baseline.
  c.tree_nodes = ()
  # Named token trees, 'DRAFTER:N': that drafter's tree of N nodes alone (no chain rows of its own
  # unless it is in drafters or block_drafters), where the pair ships it (`job_config.named_trees`).
  # The default: the block drafter's best row, its 5-node best-first tree (depth 4).
  c.trees = ('block:5',)
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
  # The decoder layout every T5 decodes in (the same function): 'fused' (each layer's q/k/v
  # kernels and gated-MLP wi_0/wi_1 stacked into one dot each, models/t5_fused.py), 't5x', or
  # 'auto': the one with the faster autoregressive step where measured, fused but on one TPU chip
  # (`job_config.decoder_layout`; docs/performance.md, "Fused decoder projections").
  c.decoder_layout = 'auto'
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
  variants = {'runlocal': _runlocal, 'all_drafters': all_drafters, 'full': full, 'paper': _paper}
  return common.parse(arg, c, {**variants, 'large': grown_large, 'xxl': grown_xxl})
