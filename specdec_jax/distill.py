"""Distilling a drafter from its target (DistillSpec, Zhou et al. 2024), the drafter's training mode.

A drafter is only as good as its acceptance rate alpha = E[1 - TV(p, q)] against *the target*, so
it is trained to match the target's token distributions, not the references:
- data (`distill_data`): the target's own outputs on training sources (greedy and/or sampled,
  generated once and cached in the workdir in resumable shards), with the target's states on them
  computed once (`cache_teacher`), and optionally on-policy sequences drafted by the student
  itself during training and scored by the live target (`on_policy_every`);
- loss: a token-level divergence between the target's distribution p and the student's q at every
  position of those sequences: forward KL, reverse KL, or total variation (alpha = 1 - TVD);
- metric: alpha against the target, measured the way the decode loop measures it (speculative
  decoding of held-out sources at temperature 0 and 1), plus the teacher-forced TVD.

The student is a small `T5Model` with its own encoder, or a decoder over the target's encoder
(`num_encoder_layers=0, encoder_dim=<target d_model>`): it trains on the target's encoder output,
and the decode loops then encode each source once for both models.

Axis legend: B batch, S source length, T target length, V vocab.
"""

import dataclasses
import functools
import os

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from specdec_jax import checkpoints, decode, train_loop, training
from specdec_jax import sampling as sampling_lib
from specdec_jax.data import batching
from specdec_jax.data import pairs as pairs_lib
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.distill_data import TeacherStates, generate_outputs
from specdec_jax.models import t5, t5_growth

DIVERGENCES = ('fkl', 'rkl', 'tvd')


def token_divergences(teacher_logits: jax.Array, student_logits: jax.Array) -> dict:
  """Per-position divergences between the target's p and the drafter's q (temperature 1).

  Args:
    teacher_logits: f32[..., V].
    student_logits: f32[..., V].

  Returns:
    f32[...] arrays: 'fkl' KL(p || q), 'rkl' KL(q || p), 'tvd' TV(p, q) = 1 - beta,
    'agree' 1.0 where the argmaxes agree (the greedy acceptance).
  """
  log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32))
  log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32))
  p, q = jnp.exp(log_p), jnp.exp(log_q)
  return {
    'fkl': jnp.sum(p * (log_p - log_q), axis=-1),
    'rkl': jnp.sum(q * (log_q - log_p), axis=-1),
    'tvd': 0.5 * jnp.sum(jnp.abs(p - q), axis=-1),
    'agree': (jnp.argmax(teacher_logits, -1) == jnp.argmax(student_logits, -1)).astype(jnp.float32),
  }


def _logits(teacher: t5.T5Model, student_config: t5.T5Config, student_params, batch):
  """(teacher logits, student logits) f32[B, T, V] on the batch's decoder sequences; an
  EAGLE-style student reads the target's true states (its first pass, `_student_passes`).

  With the target's states cached in the batch (`TeacherStates.fields`: 'teacher_states' and, for
  a student over the target's encoder, 'encoded'), only the target's output layer runs.
  """
  teacher_states, teacher_logits, encoded = _teacher_outputs(teacher, batch)
  ((student_logits, _),) = _student_passes(
    student_config, student_params, batch, teacher_states, encoded, passes=1, rng=None
  )
  return teacher_logits, student_logits


def _teacher_outputs(teacher: t5.T5Model, batch):
  """The target on the batch's decoder sequences, without gradient: (final decoder states
  [B, T, D], logits f32[B, T, V], its encoder output or None when cached without it)."""
  cfg = teacher.config
  if 'teacher_states' in batch:
    states, encoded = batch['teacher_states'], batch.get('encoded')
  else:
    encoded = t5.encode(teacher.params, batch['inputs'], batch['input_mask'], config=cfg)
    decoder_in = t5.shift_right(batch['targets'], cfg.decoder_start_token_id)
    states = t5.decoder_states(teacher.params, encoded, batch['input_mask'], decoder_in, config=cfg)
  logits = t5.output_logits(teacher.params, states, config=cfg)
  return jax.tree.map(jax.lax.stop_gradient, (states, logits, encoded))


def _student_passes(student_config, params, batch, teacher_states, encoded, *, passes, rng):
  """[(logits f32[B, T, V], predicted target states or None)] of `passes` teacher-forced passes.

  An ordinary student makes one pass. An EAGLE-style student (`feature_dim`) reads at each
  position the target's state at the position before; while drafting it reads its own prediction
  of that state instead at every position after the first draft. So its first pass reads the
  target's true states, and each further pass reads, at a random half of the positions (a fair
  coin each), the previous pass's predictions (EAGLE-3's training-time test, in its cheap form):
  the loss then covers drafting from its own predicted states.
  """
  cfg = student_config
  decoder_in = t5.shift_right(batch['targets'], cfg.decoder_start_token_id)
  mask = batch['input_mask']

  def run(features):
    if cfg.num_encoder_layers == 0:  # reads the target's encoder
      states = t5.decoder_states(params, encoded, mask, decoder_in, config=cfg, features=features)
    else:
      own = t5.encode(params, batch['inputs'], mask, config=cfg)
      states = t5.decoder_states(params, own, mask, decoder_in, config=cfg, features=features)
    logits = t5.output_logits(params, states, config=cfg)
    predicted = None if features is None else t5.predicted_features(params, states, config=cfg)
    return logits, predicted

  if cfg.feature_dim is None:
    return [run(None)]
  true = t5.shift_states(jnp.asarray(teacher_states, jnp.float32))
  results = [run(true)]
  for i in range(1, passes):
    own = t5.shift_states(jax.lax.stop_gradient(results[-1][1]))
    coin = jax.random.bernoulli(jax.random.fold_in(rng, i), 0.5, true.shape[:2] + (1,))
    results.append(run(jnp.where(coin, own, true)))
  return results


def feature_error(predicted: jax.Array, states: jax.Array) -> jax.Array:
  """f32[B, T]: squared error of predicted target states relative to their squared norm."""
  states = jnp.asarray(states, jnp.float32)
  return jnp.sum(jnp.square(predicted - states), -1) / (jnp.sum(jnp.square(states), -1) + 1e-6)


def _masked_means(terms: dict, mask: jax.Array) -> dict:
  weights = mask.astype(jnp.float32)
  tokens = jnp.maximum(weights.sum(), 1.0)
  return {k: jnp.sum(v * weights) / tokens for k, v in terms.items()}


@functools.partial(
  jax.jit,
  static_argnames=(
    'student_config',
    'optimizer_config',
    'divergence',
    'feature_passes',
    'feature_weight',
  ),
  donate_argnames=('state',),
)
def distill_step(
  state: training.TrainState,
  batch,
  teacher: t5.T5Model,
  *,
  student_config: t5.T5Config,
  optimizer_config: training.OptimizerConfig,
  divergence: str,
  feature_passes: int = 2,
  feature_weight: float = 0.5,
):
  """One AdamW step on the mean token `divergence` between target and drafter.

  An EAGLE-style student (`feature_dim`) makes `feature_passes` passes (`_student_passes`); its
  loss is the divergence averaged over them plus `feature_weight` times the mean `feature_error`
  of its predicted target states.

  Returns:
    The new state and float32 scalars: the mean of each of `token_divergences` (the first pass),
    'grad_norm'; for an EAGLE-style student also 'feature_error' and, of its last pass, the
    divergences suffixed '_own' (drafting partly from its own predicted states).
  """

  def loss_fn(params):
    teacher_states, teacher_logits, encoded = _teacher_outputs(teacher, batch)
    rng = jax.random.fold_in(jax.random.key(0), state.step)
    passes = _student_passes(
      student_config,
      params,
      batch,
      teacher_states,
      encoded,
      passes=feature_passes,
      rng=rng,
    )
    mask = batch['target_mask']
    per_pass = [_masked_means(token_divergences(teacher_logits, q), mask) for q, _ in passes]
    means = dict(per_pass[0])
    loss = sum(m[divergence] for m in per_pass) / len(per_pass)
    if student_config.feature_dim is not None:
      errors = [
        _masked_means({'e': feature_error(f, teacher_states)}, mask)['e'] for _, f in passes
      ]
      means['feature_error'] = sum(errors) / len(errors)
      loss = loss + feature_weight * means['feature_error']
      means.update({f'{k}_own': v for k, v in per_pass[-1].items()})
    return loss, means

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  updates, opt_state = training.make_optimizer(optimizer_config).update(
    grads, state.opt_state, state.params
  )
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, grad_norm=optax.global_norm(grads))
  return training.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


@functools.partial(jax.jit, static_argnames=('student_config',))
def _eval_terms(student_params, batch, teacher, *, student_config):
  teacher_logits, student_logits = _logits(teacher, student_config, student_params, batch)
  terms = token_divergences(teacher_logits, student_logits)
  weights = batch['target_mask'].astype(jnp.float32)
  return {k: jnp.sum(v * weights) for k, v in terms.items()}, weights.sum()


def teacher_forced_metrics(teacher, student_config, student_params, batches) -> dict:
  """Mean token divergences over `batching.eval_batches` of (source, target output) pairs."""
  sums, tokens = {}, 0.0
  for batch in batches:
    terms, n = _eval_terms(student_params, batch, teacher, student_config=student_config)
    for k, v in terms.items():
      sums[k] = sums.get(k, 0.0) + float(v)
    tokens += float(n)
  return {k: v / max(tokens, 1.0) for k, v in sums.items()}


def measured_alpha(
  teacher,
  student,
  data: batching.EncodedPairs,
  *,
  temperature: float,
  gamma: int,
  batch_size: int,
  max_new_tokens: int,
  seed: int = 0,
) -> float:
  """alpha of `student` against `teacher` measured by speculative decoding of `data`'s sources
  (pooled `DecodeStats.alpha`), as the main job reports it."""
  stats = []
  sampling = sampling_lib.SamplingConfig(temperature=temperature)
  for i, batch in enumerate(batching.eval_batches(data, batch_size)):
    real = batch['input_mask'].any(axis=1)  # eval_batches pads the last batch with empty rows
    out = decode.speculative_generate(
      teacher,
      student,
      batch['inputs'],
      batch['input_mask'].astype(np.int32),
      gamma=gamma,
      sampling=sampling,
      max_new_tokens=max_new_tokens,
      rng=jax.random.key(seed + i),
    )
    stats.append(jax.tree.map(lambda x: np.asarray(x)[real], out.stats))
  pooled = jax.tree.map(lambda *x: np.concatenate(x), *stats).summed()
  return float(pooled.alpha)


def load_model(path: str) -> t5.T5Model:
  """Any T5 checkpoint we read: ours (`checkpoints.save`), an HF directory, or a T5X checkpoint."""
  if os.path.isdir(os.path.join(path, 'params')):
    return checkpoints.restore(path)
  if os.path.exists(os.path.join(path, 'config.json')):
    return checkpoints.load_hf_t5(path)
  return checkpoints.load_t5x(path)


def initial_student(init_from: str, student_config: t5.T5Config, rng: jax.Array) -> t5.Params:
  """The params of the drafter saved at `init_from` (`checkpoints.save`), of the student's
  config, or grown into it so that it starts computing what the saved one computed:
  - a drafter of a smaller target, made to read the encoder of the target `t5_growth.grow` made
    from it (`t5_growth.follow_grown_encoder`), when the encoder_dim differs;
  - deeper, more heads or a wider d_ff (`t5_growth.grow`: the new layers start as the identity);
  - an ordinary drafter made EAGLE-style (`t5_growth.add_feature_input`), as it was.

  Raises:
    ValueError: any other difference, naming both configs and what cannot be grown.
  """
  init = checkpoints.restore(init_from)
  follow_key, grow_key, feature_key = jax.random.split(rng, 3)
  if student_config.feature_dim is not None and init.config.feature_dim is None:
    init = t5_growth.add_feature_input(init, student_config.feature_dim, feature_key)
    print(f'{init_from}: made EAGLE-style (feature input starts at zero)')
  if init.config.encoder_dim and init.config.encoder_dim != student_config.encoder_dim:
    try:
      init = t5_growth.follow_grown_encoder(init, student_config.encoder_dim, follow_key)
    except ValueError as e:
      raise ValueError(f"init_from {init_from} cannot read the student's encoder: {e}") from e
    print(f'{init_from}: made to read the grown encoder (encoder_dim {student_config.encoder_dim})')
  if init.config != student_config:
    try:
      init = t5_growth.grow(init, student_config, grow_key)
    except ValueError as e:
      raise ValueError(
        f'init_from {init_from} has config {init.config}, the student {student_config}: {e}'
      ) from e
    print(f'{init_from}: grown into the student (t5_growth.grow)')
  return init.params


def student_config_for(config: ml_collections.ConfigDict, teacher: t5.T5Model) -> t5.T5Config:
  """`config.student` completed from the target (vocabulary, and `encoder_dim` / `feature_dim`
  given as 0: the target's d_model); raises if the student cannot work with this target."""
  student = dict(config.student.to_dict(), vocab_size=teacher.config.vocab_size)
  if student['num_encoder_layers'] == 0 and not student.get('encoder_dim'):
    student['encoder_dim'] = teacher.config.d_model  # 0: whatever the target's d_model is
  if student.get('feature_dim') == 0:
    student['feature_dim'] = teacher.config.d_model  # 0: an EAGLE-style drafter of this target
  student_config = t5.T5Config(**student)
  if student_config.feature_dim is not None:
    if student_config.feature_dim != teacher.config.d_model:
      raise ValueError(
        f"An EAGLE-style drafter reads the target's states: feature_dim must be the target's "
        f'd_model ({teacher.config.d_model}), got {student_config.feature_dim}.'
      )
    if config.on_policy_every:
      raise ValueError(
        'on_policy_every needs a drafter that can draft alone; an EAGLE-style one (feature_dim) '
        "reads the target's states while drafting."
      )
  if (
    student_config.num_encoder_layers == 0 and student_config.encoder_dim != teacher.config.d_model
  ):
    raise ValueError(
      f"A drafter over the target's encoder needs encoder_dim = the target's "
      f'd_model ({teacher.config.d_model}), got {student_config.encoder_dim}.'
    )
  return student_config


def _data(config, teacher, tok, student_config, workdir: str) -> dict:
  """The target's outputs on the training and valid sources (generated once into `workdir`),
  the training batches and, with `cache_teacher`, the target's states on them."""
  lengths = dict(
    max_source_length=config.max_source_length, max_target_length=config.max_target_length
  )
  train_pairs = pairs_lib.load_pairs(config.train_file)[: config.num_train_sources or None]
  valid_pairs = pairs_lib.load_pairs(config.valid_file)[: config.num_valid_sources]
  train_src, _ = batching.encode_pairs(train_pairs, tok, **lengths)
  valid_src, _ = batching.encode_pairs(valid_pairs, tok, **lengths)
  os.makedirs(workdir, exist_ok=True)
  gen = dict(
    batch_size=config.generate_batch_size,
    max_new_tokens=config.max_target_length,
    seed=config.seed,
    progress=config.progress,
  )
  parts = [
    generate_outputs(
      teacher, train_src, temperature=t, shard_dir=os.path.join(workdir, f'data_t{t:g}'), **gen
    )
    for t in config.data_temperatures
  ]
  train = batching.EncodedPairs(
    *(
      np.concatenate([getattr(p, f) for p in parts])
      for f in ('inputs', 'targets', 'input_lengths', 'target_lengths')
    )
  )
  valid = generate_outputs(
    teacher, valid_src, temperature=0.0, shard_dir=os.path.join(workdir, 'valid_t0'), **gen
  )
  batches = batching.BucketedBatches(
    train, batch_size=config.batch_size, buckets=config.length_buckets, seed=config.seed
  )
  cached = None
  if config.cache_teacher:
    cached = TeacherStates.compute(
      teacher,
      train,
      with_encoder=student_config.num_encoder_layers == 0,
      batch_size=config.generate_batch_size,
      buckets=sorted(config.length_buckets),
      shard_dir=os.path.join(workdir, 'teacher_states'),
      progress=config.progress,
    )
  print(
    f'distillation data: {len(train)} target outputs on {len(train_src)} sources '
    f'(temperatures {tuple(config.data_temperatures)}), {batches.num_batches_per_epoch} '
    f'batches/epoch; valid {len(valid)}',
    flush=True,
  )
  return {'train': train, 'batches': batches, 'cached': cached, 'valid': valid}


def distill_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Distils `config.student` from `config.teacher`, resuming from `workdir` if it holds a run.

  Writes `workdir/data_t<temperature>/` (the target's outputs) and, by `train_loop.run`,
  `workdir/metrics.jsonl` (one record per log or eval step, never repeated after a resume),
  orbax checkpoints of the train state, `workdir/best/` (highest validation alpha so far, mean
  over `eval_temperatures`) and `workdir/final/`, both `checkpoints.save` directories.

  Returns:
    The last evaluation's record.
  """
  teacher = load_model(config.teacher)
  teacher = jax.device_put(teacher, jax.devices()[0])
  tok = tokenizer_lib.Tokenizer.load(config.tokenizer)
  if tok.vocab_size > teacher.config.vocab_size:
    raise ValueError(
      f'Tokenizer has {tok.vocab_size} pieces, the target {teacher.config.vocab_size}.'
    )
  student_config = student_config_for(config, teacher)
  data = _data(config, teacher, tok, student_config, workdir)
  optimizer_config = training.OptimizerConfig.from_config(config)
  state = training.init_state_jit(jax.random.key(config.seed), student_config, optimizer_config)
  if config.init_from:
    params = initial_student(config.init_from, student_config, jax.random.key(config.seed + 1))
    state = state.replace(
      params=params, opt_state=training.make_optimizer(optimizer_config).init(params)
    )
  print(f'student: {t5.param_count(state.params):,} params, {student_config}', flush=True)
  on_policy = sampling_lib.SamplingConfig(temperature=1.0)

  def train_step(state, step):
    index, source_length, target_length = data['batches'].batch_index(step)
    batch = batching.batch_arrays(data['train'], index, source_length, target_length)
    if config.on_policy_every and step % config.on_policy_every == 0:
      batch = _on_policy_batch(  # the student's own sequences: the target scores them live
        teacher, student_config, state.params, batch, on_policy, config.max_target_length, step
      )
    elif data['cached'] is not None:
      batch.update(data['cached'].fields(index, source_length, target_length))
    state, metrics = distill_step(
      state,
      batch,
      teacher,
      student_config=student_config,
      optimizer_config=optimizer_config,
      divergence=config.divergence,
      feature_passes=config.get('feature_passes', 2),
      feature_weight=config.get('feature_weight', 0.5),
    )
    return state, metrics, {'examples': len(index)}

  def evaluate(params):
    return validation_metrics(teacher, student_config, params, data['valid'], config)

  return train_loop.run(
    state,
    train_step,
    evaluate,
    cadence=train_loop.Cadence.from_config(config),
    workdir=workdir,
    export=training.exporter(student_config, config.tokenizer),
    best=train_loop.Best('valid_alpha', higher_is_better=True),
    evaluate_at_start=bool(config.init_from),  # where the started-from drafter stands
    progress='distillation steps' if config.progress else '',
  )


def validation_metrics(
  teacher, student_config, params, valid: batching.EncodedPairs, config
) -> dict:
  """The drafter's teacher-forced divergences on the target's valid outputs ('valid_<name>'),
  its alpha measured by speculative decoding at each of `config.eval_temperatures`
  ('valid_alpha_t<temperature>') and their mean ('valid_alpha')."""
  record = {
    f'valid_{k}': v
    for k, v in teacher_forced_metrics(
      teacher, student_config, params, batching.eval_batches(valid, config.eval_batch_size)
    ).items()
  }
  student = t5.T5Model(config=student_config, params=params)
  alphas = [
    measured_alpha(
      teacher,
      student,
      valid,
      temperature=t,
      gamma=config.eval_gamma,
      batch_size=config.eval_batch_size,
      max_new_tokens=config.max_target_length,
    )
    for t in config.eval_temperatures
  ]
  for t, a in zip(config.eval_temperatures, alphas):
    record[f'valid_alpha_t{t:g}'] = a
  record['valid_alpha'] = float(np.mean(alphas))
  return record


def _on_policy_batch(
  teacher, student_config, student_params, batch, sampling, max_new_tokens, step
):
  """The batch with its target sequences replaced by the student's own samples (DistillSpec's
  on-policy data); the loss then scores them with the target."""
  student = t5.T5Model(config=student_config, params=student_params)
  if student_config.num_encoder_layers == 0:  # a decoder over the target's encoder drafts alone
    student = _WithEncoder(teacher, student)
  length = batch['targets'].shape[1]
  out = decode.generate(
    student,
    batch['inputs'],
    batch['input_mask'].astype(np.int32),
    sampling=sampling,
    max_new_tokens=min(length, max_new_tokens),
    rng=jax.random.key(step),
  )
  tokens = np.zeros_like(batch['targets'])
  tokens[:, : out.tokens.shape[1]] = np.asarray(out.tokens)
  mask = np.arange(length) < np.asarray(out.lengths)[:, None]
  return dict(batch, targets=tokens, target_mask=mask)


@flax.struct.dataclass
class _WithEncoder:
  """A decoder over the target's encoder as a stand-alone step model (for sampling from it)."""

  teacher: t5.T5Model
  student: t5.T5Model

  @property
  def steps(self):
    return _WithEncoderSteps(self.teacher.config, self.student.config)

  @property
  def params(self):
    return {'teacher': self.teacher.params, 'student': self.student.params}


@dataclasses.dataclass(frozen=True)
class _WithEncoderSteps:
  teacher_config: t5.T5Config
  student_config: t5.T5Config

  vocab_size = property(lambda self: self.student_config.vocab_size)
  start_id = property(lambda self: self.student_config.decoder_start_token_id)
  eos_id = property(lambda self: self.student_config.eos_token_id)

  def encode(self, params, input_ids, input_mask):
    return t5.encode(params['teacher'], input_ids, input_mask, config=self.teacher_config)

  def init_cache(self, params, encoded, input_mask, max_decode_len):
    return t5.init_cache(
      params['student'],
      encoded,
      input_mask,
      config=self.student_config,
      max_decode_len=max_decode_len,
    )

  def step(self, params, tokens, cache):
    return t5.decode(params['student'], tokens, cache, config=self.student_config)
