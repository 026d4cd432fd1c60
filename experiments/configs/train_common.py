"""Training settings shared by `train_target.py` and `train_drafter.py` (not a config itself).

Model shapes are set by the two configs; everything else (data, optimizer, schedule, evaluation,
checkpointing) is here, so the target and its drafter are trained the same way on the same data.
"""

import ml_collections


def base_config(placement: str = 'model_sharding') -> ml_collections.ConfigDict:
  """Data, optimizer and loop settings (`shrink` makes them a smoke test); `placement` names the
  field that places the trained model on the mesh ('student_sharding' in distillation)."""
  c = ml_collections.ConfigDict()
  c.data_dir = './data/ende'
  c.train_file = ''  # default <data_dir>/train.tsv; any load_pairs file (TSV / JSONL) works
  c.valid_file = ''  # default <data_dir>/valid.tsv
  c.tokenizer = ''  # default <data_dir>/spm_ende_8k.model
  c.seed = 0
  # A checkpoints.save directory to start from instead of random params: of the model's shape,
  # or a smaller T5 grown to it with the same function (specdec_jax.models.t5_growth).
  c.init_from = ''

  c.max_source_length = 64
  c.max_target_length = 64
  c.length_buckets = (16, 32, 64)  # one compiled train step per bucket
  c.batch_size = 128

  c.num_train_steps = 20_000  # ~41 epochs of the 62k train pairs
  c.learning_rate = 1e-3
  c.warmup_steps = 1_000
  c.lr_decay = 'cosine'  # 'cosine' | 'rsqrt' | 'constant'
  c.end_lr_fraction = 0.1
  c.adam_b1 = 0.9
  c.adam_b2 = 0.98
  c.weight_decay = 0.01
  c.grad_clip_norm = 1.0
  c.frozen = ()  # param path prefixes held where they start (trainer.OptimizerConfig.frozen)
  c.label_smoothing = 0.1
  c.dropout_rate = 0.0  # T5's residual dropout (t5.forward); T5 itself used 0.1

  # The device mesh: 'DATAxMODEL' (e.g. '4x4' on a v4-32) or 'auto' (1x1 on CPU, 1xN on an
  # accelerator), as the main job's; batch sizes must split over 'data'. Every process of a
  # multi-host slice runs the same command on a workdir they all see.
  c.mesh = 'auto'
  # Where the trained model's params and optimizer state live: 'replicated' on every device,
  # 'model' (sharded by specdec_jax.sharding.DEFAULT_RULES) or 'auto' (replicated under 1B params).
  c[placement] = 'auto'

  c.log_every = 100
  c.eval_every = 1_000
  c.checkpoint_every = 1_000
  c.keep_checkpoints = 3
  c.num_eval_pairs = 2_000  # valid pairs for the loss (the whole valid split)
  c.num_bleu_pairs = 512  # valid pairs decoded greedily for BLEU
  c.eval_batch_size = 128

  return c


def shrink(c: ml_collections.ConfigDict) -> None:
  """The `runlocal` settings: a few steps on tiny batches."""
  c.max_source_length = c.max_target_length = 32
  c.length_buckets = (16, 32)
  c.batch_size = 8
  c.num_train_steps = 6
  c.warmup_steps = 2
  c.log_every = 2
  c.eval_every = 3
  c.checkpoint_every = 3
  c.num_eval_pairs = 16
  c.num_bleu_pairs = 8
  c.eval_batch_size = 8
