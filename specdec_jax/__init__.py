"""specdec_jax: lossless speculative decoding of T5 encoder-decoder pairs in JAX.

Public modules (README.md has a table of them; docs/method.md the formulas they implement):

  sampling           `SamplingConfig` and the logits -> probabilities transform; `sample`.
  verify             token, block and greedy verification of one drafted block (pure kernels).
  verify_multipath   verification of K drafted paths (multi-path block, recursive rejection).
  analysis           the formulas of Leviathan et al. (2023), section 3, as vectorized numpy.
  models.t5          T5 v1.0 / v1.1 with multi-token, per-row incremental decoding; `T5Steps`.
  models.t5_config   `T5Config` and `CONFIGS` (public T5, T5 v1.1, FLAN-T5 and test shapes).
  models.t5_params   `init_params` (T5X's names and initialisers) and `param_count`.
  models.t5_relpos   T5's relative-position buckets.
  models.t5_dropout  T5's residual dropout, for training only.
  models.t5_growth   growing a trained T5 into a larger one computing the same function.
  cache              the decoder KV cache with a write position per row (`end_index`).
  step_models        the `StepModel` protocol the decode loops are written against.
  decode             `generate` and `speculative_generate`, each one jit.
  decode_steps       the steps of one iteration: draft, target pass, verify, emit.
  decode_stats       `DecodeOutput`, `DecodeStats`, `SpeculativeTrace`, `to_host`.
  validation         checks at the decode loops' boundary; `NonFiniteError`.
  drafters           n-gram drafters (`NGramDrafter`).
  pretrained         the shipped pairs (`load`), and a pair from checkpoints.
  checkpoints        orbax save / restore, and every format's loader in one place.
  checkpoints_hf     Hugging Face T5 checkpoints (safetensors read slice by slice), both ways.
  checkpoints_t5x    T5X checkpoints (msgpack, tensorstore/zarr, OCDBT; local or gs://).
  checkpoint_utils   what the formats share: lazy arrays, renaming, checks, sharded placement.
  sharding           logical-axis rules onto a ('data', 'model') mesh; multi-host helpers.
  training           teacher-forced training of targets and drafters.
  train_loop         the one training loop (checkpoints, resume, metrics, exports).
  distill            distillation of a drafter from its target (DistillSpec).
  distill_data       the target's outputs and states the distillation trains on.
  evaluation         the main job's rows: speculative vs autoregressive decoding, timed.
  tables             plain-text tables from a column spec.
  results_io         each experiment's table as CSV / strict JSON, row by row; speedup.png.
  timing             model calls timed as a decode loop sees them.
  profiling          an iteration's time by component, from XLA:CPU's per-op trace.
  xla_cpu            XLA:CPU's kernels for few-row dots (the main job's `prefer_eigen_dots`).
  traces             a speculative run drawn iteration by iteration (Leviathan et al.'s Figure 1).
  data               the EN->DE and debsumm corpora, pair files, tokenizer, batching.
"""
