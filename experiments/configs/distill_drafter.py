r"""Distil a drafter from the shipped target (DistillSpec-style; `specdec_jax.training.distill`).

  python -m scripts.distill --config=experiments/configs/distill_drafter.py --workdir=workdir/distill
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:independent \
      --workdir=workdir/distill_independent            # a small T5 with its own encoder
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:runlocal \
      --workdir=/tmp/distill_smoke                     # a few steps on a handful of sources
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:grown \
      --workdir=workdir/distill_grown                  # for the 48M target of pretrained/ende48m
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:deeper \
      --workdir=workdir/distill_deeper                 # its drafter, 2 layers deep
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:eagle \
      --workdir=workdir/distill_eagle                  # its drafter reading the target's states
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:debsumm48m \
      --workdir=workdir/distill_debsumm48m             # for pretrained/debsumm48m's (issue 27)
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:block \
      --workdir=workdir/block_ende48m                  # its block drafter (issue 45)
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:block_wide \
      --workdir=workdir/block_wide                     # the same at the target's width (EAGLE)
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:block_wide_longer \
      --workdir=workdir/block_wide_longer              # ... trained longer on 20,000 sources
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:block_wide_taps \
      --workdir=workdir/block_wide_taps                # ... reading 3 of the target's layers
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:block_debsumm48m \
      --workdir=workdir/block_debsumm48m               # pretrained/debsumm48m's block drafter
  python -m scripts.distill --config=experiments/configs/distill_drafter.py:paper \
      --workdir=/mnt/shared/distill_t5_11b             # T5 11B's, on a v4-32 (see _paper)
  # your own pair: --config.teacher=/path/to/t5 (ours, HF or T5X) --config.tokenizer=spm.model
  #                --config.train_file=sources.tsv --config.valid_file=valid.tsv

Default drafter: one gated-GELU decoder layer (d_model 128) over the *target's* encoder output
(`num_encoder_layers=0`; `encoder_dim=0` takes the target's d_model, so any target works),
trained on the target's greedy and sampled outputs for the first `num_train_sources` training
sources with forward KL. Rerunning the same command resumes. The exported drafter
(<workdir>/best) plugs into `speculative_generate` as it is; the loops give it the target's
encoder output.
"""

import pathlib

import ml_collections

from experiments.configs import common, ende, train_common
from specdec_jax.models import t5

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _independent(c):
  c.student.update(d_model=96, d_kv=24, d_ff=256, num_encoder_layers=2, encoder_dim=None)


def _grown(c):
  # The 48M target of pretrained/ende48m (the shipped target grown, train_target.py:grown), its
  # drafter started from pretrained/ende's distilled one (t5_growth.follow_grown_encoder).
  c.teacher = str(_ROOT / 'pretrained' / 'ende48m' / 'target')
  c.init_from = str(_ROOT / 'pretrained' / 'ende' / 'distilled')
  c.learning_rate, c.warmup_steps, c.num_train_steps, c.eval_every = 5e-4, 100, 1000, 250
  # Greedy outputs only: the 48M target samples 20k outputs in ~25 min on 2 cores, a T1 set as many.
  c.data_temperatures = (0.0,)


def _deeper(c):
  # pretrained/ende48m's distilled drafter grown to 2 decoder layers (the new one starts as the
  # identity, t5_growth.grow) and distilled on greedy and sampled outputs. Measured and not
  # shipped: pretrained/ende48m/MODEL_CARD.md, "A deeper drafter".
  _grown(c)
  c.init_from = str(_ROOT / 'pretrained' / 'ende48m' / 'distilled')
  c.student.num_decoder_layers = 2
  c.num_train_steps = 1500
  c.data_temperatures = (0.0, 1.0)  # greedy and sampled outputs: both alphas count


def _eagle(c):
  # pretrained/ende48m's distilled drafter made EAGLE-style (Li et al. 2024): it also reads the
  # target's final decoder state at the previous position (feature_dim; t5_growth.
  # add_feature_input starts it computing what it computed) and learns to predict that state to
  # feed itself while drafting. Measured and not shipped: pretrained/ende48m/MODEL_CARD.md.
  _deeper(c)
  c.student.num_decoder_layers = 1
  c.student.feature_dim = 0  # 0: the target's d_model
  c.learning_rate, c.num_train_steps, c.eval_every = 5e-4, 2000, 1000
  c.on_policy_every = 0  # it cannot draft without the target


def _block(c):
  # A block drafter for pretrained/ende48m's target (issue 45): its distilled drafter made to read
  # the target's states and to fill block_size - 1 query slots (t5_growth.add_feature_input,
  # add_block_queries), grown to 2 decoder layers, distilled on the target's greedy outputs (its
  # default proposal at T > 0 is each position's argmax, which greedy data teaches). The shipped
  # one is this run's step-300 export (pretrained/ende48m/MODEL_CARD.md: the session's CPU time
  # ended the schedule there).
  _deeper(c)
  c.student.feature_dim = 0  # 0: the target's d_model
  c.student.block_size = 8
  c.num_train_sources, c.num_valid_sources = 6_000, 128
  c.data_temperatures = (0.0,)
  c.eval_gamma = 8
  c.learning_rate, c.num_train_steps, c.eval_every = 1e-3, 600, 300
  c.checkpoint_every = 100
  c.on_policy_every = 0  # it cannot draft without the target


def _block_wide(c):
  # `block` at the target's width, built as EAGLE builds its drafter (t5_growth.
  # drafter_from_target): the target's embeddings, first decoder layer, final norm and output
  # layer, the state input at zero, 7 query slots; the embeddings and output layer frozen (the
  # target's own). The width ablation of issue 45 (pretrained/ende48m/MODEL_CARD.md).
  _block(c)
  c.init_from = ''
  c.init_from_target_layers = (0,)
  c.frozen = ('token_embedder', 'decoder/logits_dense')
  c.student.update(d_model=512, d_kv=64, num_heads=8, d_ff=1024, num_decoder_layers=1)
  c.student.tie_word_embeddings = False


def _block_wide_longer(c):
  # `block_wide` continued: the 20,000-source run's export (`:block_wide,num_train_sources=20000,
  # num_train_steps=300` in workdir/block_wide20k) trained 600 more steps on the same data under a
  # fresh warmup and cosine schedule. Link that run's data_t0, valid_t0 and teacher_states into the
  # new workdir to reuse its target outputs and states (their shards are checked by fingerprint).
  _block_wide(c)
  c.init_from_target_layers = ()
  c.init_from = 'workdir/block_wide20k/best'
  c.num_train_sources, c.num_train_steps, c.eval_every = 20_000, 600, 200


def _block_wide_taps(c):
  # `block_wide` reading three of the target's decoder layers (1, 4 and the last, 7) instead of
  # its final states alone, as DFlash's drafter reads several (shared/research/block_drafting.md,
  # section 5): the ablation of issue 45 at block_wide20k's budget (20,000 sources, 300 steps).
  # Link block_wide20k's data_t0 and valid_t0 into the workdir to reuse its target outputs; the
  # target's states are computed anew (they now hold three layers). Measured: level with
  # block_wide20k on the valid set, behind it on the test set (pretrained/ende48m/MODEL_CARD.md).
  _block_wide(c)
  c.student.feature_layers = (1, 4, 7)
  c.num_train_sources, c.num_train_steps, c.eval_every = 20_000, 300, 150


def _debsumm48m(c):
  # The 48M debsumm target (pretrained/debsumm48m: pretrained/ende48m's target fine-tuned on Debian
  # description -> synopsis, train_summ_target.py:from_ende48m, same shapes and tokenizer), its
  # drafter started from pretrained/ende48m's distilled one (it reads an encoder of that shape).
  # Sources of up to 256 tokens, summaries of 40 (the main job's, debsumm.py). The shipped
  # drafter started instead from the 13.5M debsumm pair's distilled one made to read the 48M
  # encoder (t5_growth.follow_grown_encoder); that pair left the repo for the size budget
  # (`git checkout abc7b7d -- pretrained/debsumm` restores it), and was run with
  # `:debsumm48m,num_train_sources=4000,num_train_steps=800,eval_every=400`
  # (pretrained/debsumm48m/MODEL_CARD.md).
  c.teacher = str(_ROOT / 'pretrained' / 'debsumm48m' / 'target')
  c.init_from = str(_ROOT / 'pretrained' / 'ende48m' / 'distilled')
  c.train_file = str(_ROOT / 'data' / 'debsumm' / 'train.tsv')
  c.valid_file = str(_ROOT / 'data' / 'debsumm' / 'valid.tsv')
  c.max_source_length, c.max_target_length = 256, 40
  c.length_buckets = (48, 64, 96, 128, 160, 192, 256)
  c.learning_rate, c.warmup_steps, c.num_train_steps, c.eval_every = 5e-4, 100, 1000, 250
  # Its outputs on 6,000 sources per temperature: ~5 min each on 2 cores (long sources).
  c.num_train_sources = 6_000


def _block_debsumm48m(c):
  # The block drafter of pretrained/debsumm48m's target, from its distilled drafter, as `block`.
  _debsumm48m(c)
  c.init_from = str(_ROOT / 'pretrained' / 'debsumm48m' / 'distilled')
  c.data_temperatures = (0.0,)
  c.student.update(feature_dim=0, block_size=8, num_decoder_layers=2)
  c.num_train_sources, c.num_valid_sources = 3_000, 96
  c.eval_gamma = 8
  c.learning_rate, c.num_train_steps, c.eval_every = 1e-3, 600, 300
  c.checkpoint_every = 100
  c.on_policy_every = 0


def _paper(c):
  """A one-layer drafter over the encoder of the public T5 (v1.0) 11B, the target of
  `ende.py:paper` (its T5X checkpoint read from gs:// slice by slice, its vocabulary and WMT14
  test set), distilled on a v4-32: 16 chips on 4 hosts, mesh 4x4 (the teacher sharded over
  'model' = 4 chips, 4 data-parallel replicas), the student and its AdamW state replicated. Stage
  the vocabulary and the WMT sources on every host (the test set as ende.py:paper says):

    gcloud storage cp gs://t5-data/vocabs/cc_all.32000/sentencepiece.model /tmp/t5/spm.model
    sacrebleu -t wmt08,wmt09,wmt10,wmt11,wmt12,wmt13 -l en-de --echo src ref | tr -s ' ' | \
        awk -F'\t' 'NF == 2' > /tmp/t5/wmt_ende_train.tsv
    sacrebleu -t wmt15 -l en-de --echo src ref | tr -s ' ' | awk -F'\t' 'NF == 2' \
        > /tmp/t5/wmt15_ende.tsv

  (source_prefix, ende.py:paper's 'translate English to German: ', is prepended on reading)
  (newstest2008-2013, about 16,000 sources; any more WMT-style sources can go in the same file),
  then on every host (scripts/launch_tpu.py does it: README, "On a TPU slice"):

    python -m scripts.distill --config=experiments/configs/distill_drafter.py:paper \
        --workdir=/mnt/shared/distill_t5_11b

  The workdir must be one directory all 4 hosts see (the same mount on each). The drafter it
  writes (<workdir>/best) then drafts for the target in the main job:
  `experiments/configs/ende.py:paper,drafter=<workdir>/best`. Not run yet: the settings below
  are planned (docs/results/memory_plan.md, "Distillation"), not tuned.

  Memory per chip: the teacher's params held in bfloat16 (teacher_param_dtype; it computes in
  float32): 22 GB, 5.3 GiB per chip over model = 4; with the student's state and the step's
  activations 10.1 GiB of a v4 chip's 32 GiB at batch 128, source and target 128 (15.3 GiB with
  float32 params; docs/results/memory_plan.md, "Distillation": `python -m benchmarks.distill_plan
  --machines=v4-32:4x4 --batch=128 --source_length=128 --target_length=128`).

  cache_teacher=False. Cached, the teacher's states take 4 bytes x d_model 1024 x (source +
  target tokens) per pair: up to 1 MiB a pair at 128 + 128 tokens, up to 31 GiB for the 32,000
  pairs of 16,000 sources at 2 temperatures, held whole in every host's RAM and as much written
  to the shared workdir. Live, the teacher's forward costs 86 ms per step of batch 128 on the v4
  roofline (distill_model.forward_cost, 4x4, source and target 128): 4.3 minutes over 3,000
  steps, all the cache could save (less the pass that fills it), so the teacher runs in every
  step.
  """
  paper = ende.get_config('paper')
  staged = pathlib.Path(paper.tokenizer).parent  # where ende.py:paper stages its files
  c.teacher, c.tokenizer, c.test_file = paper.target, paper.tokenizer, paper.test_file
  c.teacher_param_dtype, c.source_prefix = paper.param_dtype, paper.source_prefix
  c.train_file = str(staged / 'wmt_ende_train.tsv')
  c.valid_file = str(staged / 'wmt15_ende.tsv')
  c.num_train_sources = 0  # all
  c.max_source_length, c.max_target_length = paper.max_source_length, paper.max_new_tokens
  c.length_buckets = (32, 64, 128)  # one compiled step each
  c.mesh, c.student_sharding, c.cache_teacher = '4x4', 'replicated', False
  c.batch_size = 128
  c.learning_rate, c.warmup_steps = 1e-3, 300  # a 1024-wide student: half the default rate
  teacher = t5.CONFIGS['t5-11b']  # the shapes of paper.target (checkpoints_t5x infers them)
  c.student.update(d_model=teacher.d_model, num_heads=16, d_kv=64, d_ff=4 * teacher.d_model)


def _runlocal(c):
  train_common.shrink(c)
  c.num_train_sources, c.num_valid_sources = 64, 16
  c.generate_batch_size = 16
  c.batch_size, c.num_train_steps, c.eval_every, c.checkpoint_every = 8, 4, 2, 2
  c.log_every, c.eval_batch_size, c.warmup_steps = 2, 8, 1
  c.on_policy_every = 2 if c.student.feature_dim is None else 0
  c.progress = False


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = train_common.base_config(placement='student_sharding')
  c.teacher = str(_ROOT / 'pretrained' / 'ende' / 'target')
  c.tokenizer = str(_ROOT / 'pretrained' / 'ende' / 'spm.model')
  c.train_file = str(_ROOT / 'data' / 'ende' / 'train.tsv')  # sources; references are unused
  c.valid_file = str(_ROOT / 'data' / 'ende' / 'valid.tsv')
  c.num_train_sources = 20_000  # 0: all
  c.num_valid_sources = 256
  # The dtype the target's params are held in on the devices ('bfloat16': half the memory; it
  # still computes in its config's dtype); '': the checkpoint's own.
  c.teacher_param_dtype = ''
  c.source_prefix = ''  # prepended to every source (T5's 'translate English to German: ')
  # The held-out pairs of the pair directory the run writes (<workdir>/pair/test.tsv, what the
  # main job decodes); '' copies valid_file.
  c.test_file = str(_ROOT / 'pretrained' / 'ende' / 'test.tsv')
  c.data_temperatures = (0.0, 1.0)  # one target output per source per temperature
  c.generate_batch_size = 64
  c.divergence = 'fkl'  # 'fkl' | 'rkl' | 'tvd' (specdec_jax.training.distill_loss.DIVERGENCES)
  c.on_policy_every = 0  # k > 0: every k-th batch is drafted by the student itself
  # An EAGLE-style student (student.feature_dim set): teacher-forced passes per step (the 2nd on
  # reads its own predicted states at a random half of the positions; distill_loss._student_passes)
  # and the weight of its state-prediction error in the loss.
  c.feature_passes = 2
  c.feature_weight = 0.5
  c.block_anchors = 16
  c.block_decay = 0.8
  # Run the target over the training pairs once (its encoder output and final decoder states,
  # kept in RAM: 4 bytes x d_model per token) so that each step pays only its output layer; the
  # loss is the same. False: the whole target runs in every step (no memory needed).
  c.cache_teacher = True
  # A checkpoints.save directory of the student's shape, or a drafter over the encoder of a
  # smaller target that this teacher was grown from (t5_growth): it starts where that one was.
  c.init_from = ''
  # Or (not both) a drafter at the target's width started from the target's own embeddings,
  # these decoder layers and its output layer (t5_growth.drafter_from_target).
  c.init_from_target_layers = ()
  c.eval_temperatures = (0.0, 1.0)
  c.eval_gamma = 4
  c.progress = True
  c.batch_size = 64
  c.num_train_steps = 3_000
  c.learning_rate = 2e-3
  c.warmup_steps = 200
  c.label_smoothing = 0.0  # unused: the loss is the divergence
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 250
  c.student = ml_collections.ConfigDict(
    dict(
      d_model=128,
      d_kv=32,
      num_heads=4,
      d_ff=512,
      num_encoder_layers=0,
      num_decoder_layers=1,
      encoder_dim=0,  # 0: the target's d_model (a decoder over the target's encoder)
      # None: an ordinary decoder; 0 (the target's d_model): EAGLE-style, it also reads the
      # target's final decoder states (T5Config.feature_dim).
      feature_dim=None,
      # None: it reads the target's final states; or a tuple of the target's decoder layers whose
      # states it reads, concatenated (DFlash's multi-layer features; T5Config.feature_layers).
      feature_layers=None,
      # None; or a block drafter (needs feature_dim): the most drafts one call proposes
      # (T5Config.block_size), trained on random block starts (block_anchors per sequence, block
      # position j weighted block_decay**j; docs/training.md, "Block drafters").
      block_size=None,
      # How its query slots see each other: 'causal' or 'bidirectional' (T5Config.block_attention).
      block_attention='causal',
      feed_forward='gated-gelu',
      tie_word_embeddings=True,
      max_source_length=512,
      max_target_length=512,
    )
  )
  return common.parse(
    arg,
    c,
    {
      'runlocal': _runlocal,
      'independent': _independent,
      'grown': _grown,
      'deeper': _deeper,
      'eagle': _eagle,
      'debsumm48m': _debsumm48m,
      'block': _block,
      'block_wide': _block_wide,
      'block_wide_longer': _block_wide_longer,
      'block_wide_taps': _block_wide_taps,
      'block_debsumm48m': _block_debsumm48m,
      'paper': _paper,
    },
  )
