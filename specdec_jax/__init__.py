"""specdec_jax: lossless speculative decoding of T5 encoder-decoder pairs in JAX.

The modules, by folder (this is the one list; docs/method.md has the formulas they implement,
docs/architecture.md why the folders are these). The engine is the top level: a reader of the
method needs only it and `models`.

engine (specdec_jax/)
  sampling           `SamplingConfig` and the logits -> probabilities transform; `sample`.
  verify             token and block verification of one draft (pure kernels).
  verify_greedy      greedy block verification (one draft, levels carried between iterations).
  verify_multipath   verification of K drafted paths (multi-path block, recursive rejection).
  trees              token trees of N static slots: the representation, ancestor mask, builders.
  verify_tree        lossless verification of a token tree (greedy, sample along, recursive rej.).
  verifiers          the registry of named verifiers: kernels, carried state, constraints.
  analysis           the formulas of Leviathan et al. (2023), section 3, as vectorized numpy.
  cache              the decoder KV cache with a write position per row (`end_index`).
  step_models        the `StepModel` protocol the loops are written against; `Capabilities`.
  decode             the API: `generate`, `speculative_generate` and their lowerings.
  decode_loop        the loops: ONE while-loop body for chains, K paths and trees; `LoopState`.
  loop_spec          `LoopSpec`, `TreeSpec`: what a loop is asked to do, checked once; its buffer.
  draft              what the steps hand each other: `DraftView`, `Draft` (data), `Outcome`.
  drafting           the drafting registry: token, block call, the tree builders, source lookup.
  draft_lookup       source-lookup drafting: the latest source matches of the emitted suffix.
  scoring            each draft shape's target pass and commit (chain, K paths, tree).
  rules              the verification rules by (rule, shape); greedy decoding is entries.
  decode_steps       the chain steps: drafter calls, target pass, chain verification, emit.
  decode_stats       `DecodeOutput`, `DecodeStats`, `SpeculativeTrace`, `to_host`.
  validation         checks at the decode loops' boundary; `NonFiniteError`.
  drafters           n-gram drafters (`NGramDrafter`).
  pretrained         the shipped pairs (`load`), and a pair from checkpoints.
  sharding           logical-axis rules onto a ('data', 'model') mesh; multi-host helpers.

models/
  t5                 T5 v1.0 / v1.1 with multi-token, per-row incremental decoding; `T5Steps`.
  t5_layers          T5's layers (attention, MLP, norms, relative bias) and its decoder stack,
                     which takes embedded inputs and a `Layout` and knows no role.
  t5_layout          `Layout`: where a decoder pass's inputs sit and what they see (chain, packed).
  t5_eagle           an EAGLE-style drafter's input adapter (the target's states projected in).
  t5_fused           the fused decoder layout (q/k/v and gated-MLP kernels stacked), both ways.
  t5_config          `T5Config` and `CONFIGS` (public T5, T5 v1.1, FLAN-T5 and test shapes).
  t5_params          `init_params` (T5X's names and initialisers) and `param_count`.
  t5_relpos          T5's relative-position buckets.
  t5_dropout         T5's residual dropout, for training only.
  t5_growth          growing a trained T5 into a larger one computing the same function.
  t5_tree            one decoder pass over a token tree (positions, mask); keeping its path.
  t5_block           a block drafter's layouts: its drafting call's slots and mask, its training row.

checkpoints/
  (package)          orbax save / restore, and every format's loader in one place.
  hf                 Hugging Face T5 checkpoints (safetensors read slice by slice), both ways.
  t5x                T5X checkpoints (msgpack, tensorstore/zarr, OCDBT; local or gs://).
  common             what the formats share: lazy arrays, renaming, checks, sharded placement.

training/
  trainer            teacher-forced training of targets and drafters.
  loop               the one training loop (checkpoints, resume, metrics, exports).
  distill            distillation of a drafter from its target (DistillSpec).
  distill_data       the target's outputs and states the distillation trains on.
  distill_loss       the distillation losses and step (student against the teacher).

measure/
  evaluation         the main job's rows: speculative vs autoregressive decoding, timed.
  job_config         a main-job config checked, its trees read, its pair loaded (layout).
  translation        a test set decoded by each method in turn, timed: a `Run` per method.
  timing             model calls timed as a decode loop sees them; compiling while timed fails.
  timed_loops        the jitted programs those timers time: model calls in a loop, as the loop's.
  profiling          an iteration's time by component, from XLA:CPU's per-op trace.
  xla_cpu            XLA:CPU's kernels for few-row dots (the main job's `prefer_eigen_dots`).
  tables             plain-text tables from a column spec.
  results_io         each experiment's table as CSV / strict JSON, row by row; speedup.png.
  traces             a speculative run drawn iteration by iteration (Leviathan et al.'s Figure 1).

data/                the EN->DE and debsumm corpora, pair files, tokenizer, batching.
"""
