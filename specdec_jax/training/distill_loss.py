"""The distillation loss and step (`distill`): divergences between the target's next-token
distributions p and the drafter's q, the student's teacher-forced passes (one, or several for an
EAGLE-style student), one AdamW step, and the teacher-forced metrics of a drafter.

The target is frozen: its outputs are computed without gradient, from its cached states when the
batch carries them (`distill_data.TeacherStates.fields`), else by running it.

Axis legend: B batch, S source length, T target length, V vocab, D model dim.
"""

import functools

import jax
import jax.numpy as jnp
import optax

from specdec_jax import sharding
from specdec_jax.models import t5
from specdec_jax.training import trainer

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
  teacher_states, teacher_logits, encoded = _teacher_outputs(
    teacher, batch, student_config.feature_layers
  )
  ((student_logits, _),) = _student_passes(
    student_config, student_params, batch, teacher_states, encoded, passes=1, rng=None
  )
  return teacher_logits, student_logits


def _teacher_outputs(teacher: t5.T5Model, batch, layers=None):
  """The target on the batch's decoder sequences, without gradient: (the states a student reads
  [B, T, F]: the final decoder states, or with `layers` (`T5Config.feature_layers`) those layers'
  states; logits f32[B, T, V]; its encoder output or None when cached without it)."""
  cfg = teacher.config
  if 'teacher_states' in batch:
    states, encoded = batch['teacher_states'], batch.get('encoded')
    features = batch['teacher_features'] if layers is not None else states
  else:
    encoded = t5.encode(teacher.params, batch['inputs'], batch['input_mask'], config=cfg)
    decoder_in = t5.shift_right(batch['targets'], cfg.decoder_start_token_id)
    out = t5.decoder_states(
      teacher.params, encoded, batch['input_mask'], decoder_in, config=cfg, state_layers=layers
    )
    states, features = out if layers is not None else (out, out)
  logits = t5.output_logits(teacher.params, states, config=cfg)
  return jax.tree.map(jax.lax.stop_gradient, (features, logits, encoded))


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


def block_anchors(rng, target_mask: jax.Array, num_anchors: int) -> jax.Array:
  """int32[B, A] random block starts (pending-token positions), uniform over each row's
  positions 0..length-1, drawn with replacement."""
  lengths = jnp.maximum(target_mask.sum(axis=1), 1)
  u = jax.random.uniform(rng, (target_mask.shape[0], num_anchors))
  return jnp.minimum((u * lengths[:, None]).astype(jnp.int32), lengths[:, None] - 1)


def block_terms(
  student_config, params, batch, teacher_states, teacher_logits, encoded, anchors
) -> tuple[dict, jax.Array]:
  """A block drafter's per-position divergences from the target on the batch's sequences.

  From each anchor a (a pending token's position), the block's G outputs propose the tokens after
  positions a .. a + G - 1 (`t5.block_states`); position j's law is compared with the target's at
  a + j, its own next-token law on the true prefix, which is what verification compares draft j
  with whenever drafts 1..j - 1 were accepted (at temperature 0: equal to the target's tokens).

  Returns:
    (`token_divergences` f32[B, A, G], valid bool[B, A, G]: a + j inside the sequence).
  """
  cfg = student_config
  decoder_in = t5.shift_right(batch['targets'], cfg.decoder_start_token_id)
  features = t5.shift_states(jnp.asarray(teacher_states, jnp.float32))
  states = t5.block_states(
    params, encoded, batch['input_mask'], decoder_in, features, anchors, config=cfg
  )
  b, a, g, d = states.shape
  logits = t5.output_logits(params, states.reshape(b, a * g, d), config=cfg)
  index = anchors[:, :, None] + jnp.arange(g)  # [B, A, G] the target position each one predicts
  t = teacher_logits.shape[1]
  rows = jnp.clip(index, max=t - 1).reshape(b, a * g)
  teacher = jnp.take_along_axis(teacher_logits, rows[..., None], axis=1)
  valid = (index < t) & jnp.take_along_axis(batch['target_mask'], rows, axis=1).reshape(b, a, g)
  terms = token_divergences(teacher, logits)
  return {k: v.reshape(b, a, g) for k, v in terms.items()}, valid


def _block_loss(student_config, params, batch, teacher, rng, *, num_anchors, decay, divergence):
  """(loss, metrics) of a block drafter: the position-weighted mean divergence over random
  block starts (weight decay**j at block position j, as a draft there counts only if the
  earlier ones were kept), and per-position greedy agreement 'agree_<j>'."""
  teacher_states, teacher_logits, encoded = teacher
  anchors = block_anchors(rng, batch['target_mask'], num_anchors)
  terms, valid = block_terms(
    student_config, params, batch, teacher_states, teacher_logits, encoded, anchors
  )
  g = valid.shape[-1]
  weights = valid * (decay ** jnp.arange(g, dtype=jnp.float32))
  loss = jnp.sum(terms[divergence] * weights) / jnp.maximum(jnp.sum(weights), 1.0)
  metrics = _masked_means(terms, valid)
  counts = jnp.maximum(valid.sum(axis=(0, 1)), 1)
  agree = jnp.sum(terms['agree'] * valid, axis=(0, 1)) / counts
  metrics.update({f'agree_{j + 1}': agree[j] for j in range(g)})
  return loss, metrics


def feature_error(predicted: jax.Array, states: jax.Array) -> jax.Array:
  """f32[B, T]: squared error of predicted target states relative to their squared norm."""
  states = jnp.asarray(states, jnp.float32)
  return jnp.sum(jnp.square(predicted - states), -1) / (jnp.sum(jnp.square(states), -1) + 1e-6)


def _masked_means(terms: dict, mask: jax.Array) -> dict:
  weights = mask.astype(jnp.float32)
  tokens = jnp.maximum(weights.sum(), 1.0)
  return {k: jnp.sum(v * weights) / tokens for k, v in terms.items()}


def distill_step(
  state: trainer.TrainState,
  batch,
  teacher: t5.T5Model,
  *,
  student_config: t5.T5Config,
  optimizer_config: trainer.OptimizerConfig,
  divergence: str,
  feature_passes: int = 2,
  feature_weight: float = 0.5,
  block_anchors_per_row: int = 16,
  block_decay: float = 0.8,
):
  """One AdamW step on the mean token `divergence` between target and drafter (not jitted: the
  loop compiles it on its mesh, `trainer.compile_step`; `jit_distill_step` on one device).

    A block drafter (`block_size`) is trained on `block_anchors_per_row` random block starts per
    sequence, all in one masked pass, each block position j weighted `block_decay**j`
    (`_block_loss`; docs/training.md, "Block drafters").

    An EAGLE-style student (`feature_dim`) makes `feature_passes` passes (`_student_passes`); its
    loss is the divergence averaged over them plus `feature_weight` times the mean `feature_error`
    of its predicted target states.

    Returns:
      The new state and float32 scalars: the mean of each of `token_divergences` (the first pass),
      'grad_norm'; for an EAGLE-style student also 'feature_error' and, of its last pass, the
      divergences suffixed '_own' (drafting partly from its own predicted states).
  """

  def loss_fn(params):
    teacher_states, teacher_logits, encoded = _teacher_outputs(
      teacher, batch, student_config.feature_layers
    )
    rng = jax.random.fold_in(jax.random.key(0), state.step)
    if student_config.block_size is not None:
      return _block_loss(
        student_config,
        params,
        batch,
        (teacher_states, teacher_logits, encoded),
        rng,
        num_anchors=block_anchors_per_row,
        decay=block_decay,
        divergence=divergence,
      )
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
  updates, opt_state = trainer.make_optimizer(optimizer_config).update(
    grads, state.opt_state, state.params
  )
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, grad_norm=optax.global_norm(grads))
  return trainer.TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


jit_distill_step = jax.jit(
  distill_step,
  static_argnames=(
    'student_config',
    'optimizer_config',
    'divergence',
    'feature_passes',
    'feature_weight',
    'block_anchors_per_row',
    'block_decay',
  ),
  donate_argnames=('state',),
)


@functools.partial(jax.jit, static_argnames=('student_config',))
def _eval_terms(student_params, batch, teacher, *, student_config):
  if student_config.block_size is not None:  # every position a block start
    teacher_states, teacher_logits, encoded = _teacher_outputs(
      teacher, batch, student_config.feature_layers
    )
    t = batch['targets'].shape[1]
    anchors = jnp.broadcast_to(jnp.arange(t), batch['targets'].shape)
    terms, valid = block_terms(
      student_config, student_params, batch, teacher_states, teacher_logits, encoded, anchors
    )
    weights = valid.astype(jnp.float32)
    return {k: jnp.sum(v * weights) for k, v in terms.items()}, weights.sum()
  teacher_logits, student_logits = _logits(teacher, student_config, student_params, batch)
  terms = token_divergences(teacher_logits, student_logits)
  weights = batch['target_mask'].astype(jnp.float32)
  return {k: jnp.sum(v * weights) for k, v in terms.items()}, weights.sum()


def teacher_forced_metrics(teacher, student_config, student_params, batches, mesh=None) -> dict:
  """Mean token divergences over `batching.eval_batches` of (source, target output) pairs (each
  batch split over `mesh`'s 'data' axis when given)."""
  sums, tokens = {}, 0.0
  for batch in batches:
    if mesh is not None:
      batch = sharding.from_host(batch, mesh)
    terms, n = _eval_terms(student_params, batch, teacher, student_config=student_config)
    for k, v in terms.items():
      sums[k] = sums.get(k, 0.0) + float(v)
    tokens += float(n)
  return {k: v / max(tokens, 1.0) for k, v in sums.items()}
