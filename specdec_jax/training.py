"""Teacher-forced training of T5 translation models (target and drafter) on sentence pairs.

Library half of `scripts/train.py`: the train state, the label-smoothed cross-entropy, the jitted
step, evaluation (valid loss and greedy BLEU via `decode.generate`), and `train_and_evaluate`,
which runs them in `train_loop.run` (checkpoints, resume, metrics, exports). Configs live in
`experiments/configs/train_*.py`; nothing here reads flags.

Axes: B batch, S source length, T target length, V vocab.
"""

import dataclasses
import math
import os
import shutil
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import sacrebleu

from specdec_jax import checkpoints, decode, sampling, train_loop
from specdec_jax.data import batching, pairs
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5, t5_growth


@flax.struct.dataclass
class TrainState:
  """step int32[], params (T5X-named pytree, float32), opt_state (optax)."""

  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW and learning-rate schedule settings; hashable, so a static jit argument."""

  learning_rate: float = 1e-3
  warmup_steps: int = 1000
  num_train_steps: int = 20_000
  lr_decay: str = 'cosine'  # 'cosine' | 'rsqrt' | 'constant'
  end_lr_fraction: float = 0.1
  adam_b1: float = 0.9
  adam_b2: float = 0.98
  weight_decay: float = 0.01
  grad_clip_norm: float = 1.0

  def __post_init__(self):
    if self.lr_decay not in ('cosine', 'rsqrt', 'constant'):
      raise ValueError(f"lr_decay must be 'cosine', 'rsqrt' or 'constant', got {self.lr_decay!r}")

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'OptimizerConfig':
    """The fields of this class read from a training config."""
    return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls)})


def learning_rate_schedule(config: OptimizerConfig) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then 'cosine' decay to `end_lr_fraction` of it over the
  remaining steps, 'rsqrt' (T5's 1/sqrt(step) after warmup) or 'constant'."""
  peak, warmup, total = config.learning_rate, max(config.warmup_steps, 1), config.num_train_steps
  warm = optax.linear_schedule(0.0, peak, warmup)
  if config.lr_decay == 'cosine':
    decay = optax.cosine_decay_schedule(peak, max(total - warmup, 1), alpha=config.end_lr_fraction)
  elif config.lr_decay == 'rsqrt':
    decay = lambda step: peak * jnp.sqrt(warmup / jnp.maximum(step + warmup, warmup))
  else:
    decay = optax.constant_schedule(peak)
  return optax.join_schedules([warm, decay], [warmup])


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW (decoupled weight decay, none on norm scales) after global-norm gradient clipping."""
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)
  return optax.chain(
    optax.clip_by_global_norm(config.grad_clip_norm),
    optax.adamw(
      learning_rate_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      weight_decay=config.weight_decay,
      mask=decay_mask,
    ),
  )


def cross_entropy(
  logits: jax.Array, targets: jax.Array, mask: jax.Array, *, label_smoothing: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Summed token losses.

  Args:
    logits: f32[B, T, V].
    targets: int32[B, T] gold ids.
    mask: bool[B, T] tokens that count.
    label_smoothing: mass spread uniformly over the vocabulary.

  Returns:
    (smoothed loss sum, negative log-likelihood sum, number of tokens), float32 scalars.
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32))
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  smooth = -jnp.mean(log_probs, axis=-1)
  loss = (1.0 - label_smoothing) * nll + label_smoothing * smooth
  weights = mask.astype(jnp.float32)
  return jnp.sum(loss * weights), jnp.sum(nll * weights), jnp.sum(weights)


def _loss_terms(
  params, batch, *, model_config: t5.T5Config, label_smoothing: float, dropout: t5.Dropout = None
):
  decoder_inputs = t5.shift_right(batch['targets'], model_config.decoder_start_token_id)
  logits = t5.forward(
    params,
    batch['inputs'],
    batch['input_mask'],
    decoder_inputs,
    config=model_config,
    dropout=dropout,
  )
  return cross_entropy(
    logits, batch['targets'], batch['target_mask'], label_smoothing=label_smoothing
  )


def train_step(
  state: TrainState,
  batch: dict[str, jax.Array],
  *,
  model_config: t5.T5Config,
  optimizer_config: OptimizerConfig,
  label_smoothing: float,
  dropout_rate: float = 0.0,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One AdamW step on the mean token loss of a batch (fields of `batching.batch_arrays`).

  With `dropout_rate` > 0 the model runs with T5's residual dropout (`t5.forward`), its mask
  drawn from a key folded with the step number (a resumed run draws the same masks).

  Returns:
    The new state and float32 scalars `loss` (smoothed, per token), `nll` (per token), `tokens`
    (real target tokens), `grad_norm`.
  """

  dropout = (jax.random.fold_in(jax.random.key(0), state.step), dropout_rate)

  def loss_fn(params):
    loss_sum, nll_sum, tokens = _loss_terms(
      params, batch, model_config=model_config, label_smoothing=label_smoothing, dropout=dropout
    )
    denominator = jnp.maximum(tokens, 1.0)
    return loss_sum / denominator, (nll_sum / denominator, tokens)

  (loss, (nll, tokens)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
  optimizer = make_optimizer(optimizer_config)
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {'loss': loss, 'nll': nll, 'tokens': tokens, 'grad_norm': optax.global_norm(grads)}
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


_train_step_jit = jax.jit(
  train_step,
  static_argnames=('model_config', 'optimizer_config', 'label_smoothing', 'dropout_rate'),
  donate_argnames=('state',),
)
_loss_terms_jit = jax.jit(_loss_terms, static_argnames=('model_config', 'label_smoothing'))


def init_state(
  rng: jax.Array, model_config: t5.T5Config, optimizer_config: OptimizerConfig
) -> TrainState:
  """Step 0: random params (`t5.init_params`) and a fresh optimizer state."""
  params = t5.init_params(rng, model_config)
  opt_state = make_optimizer(optimizer_config).init(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


init_state_jit = jax.jit(init_state, static_argnames=('model_config', 'optimizer_config'))


def evaluate_loss(params, batches, *, model_config: t5.T5Config) -> float:
  """Mean per-token negative log-likelihood over `batching.eval_batches` output."""
  nll_sum = tokens = 0.0
  for batch in batches:
    _, nll, n = _loss_terms_jit(params, batch, model_config=model_config, label_smoothing=0.0)
    nll_sum, tokens = nll_sum + float(nll), tokens + float(n)
  return nll_sum / max(tokens, 1.0)


def evaluate_bleu(
  model: t5.T5Model,
  data: batching.EncodedPairs,
  references: list[str],
  tokenizer: tokenizer_lib.Tokenizer,
  *,
  batch_size: int,
  max_new_tokens: int,
) -> tuple[float, list[str]]:
  """Greedy-decodes the sources of `data`; returns (corpus BLEU vs `references`, hypotheses)."""
  hypotheses = []
  greedy = sampling.SamplingConfig(temperature=0.0)
  for batch in batching.eval_batches(data, batch_size):
    out = decode.generate(
      model,
      batch['inputs'],
      batch['input_mask'],
      sampling=greedy,
      max_new_tokens=max_new_tokens,
      rng=jax.random.key(0),
    )
    tokens = np.asarray(out.tokens)
    hypotheses.extend(tokenizer.decode(row) for row in tokens)
  hypotheses = hypotheses[: len(references)]
  return sacrebleu.corpus_bleu(hypotheses, [references]).score, hypotheses


def model_config_from(config: ml_collections.ConfigDict) -> t5.T5Config:
  return t5.T5Config(**config.model.to_dict())


def _paths(config: ml_collections.ConfigDict) -> dict[str, str]:
  data_dir = config.data_dir
  return {
    'train': config.train_file or os.path.join(data_dir, 'train.tsv'),
    'valid': config.valid_file or os.path.join(data_dir, 'valid.tsv'),
    'tokenizer': config.tokenizer or os.path.join(data_dir, 'spm_ende_8k.model'),
  }


def export(model: t5.T5Model, path: str, tokenizer_path: str) -> None:
  """checkpoints.save into a fresh `path` (replacing an older export) plus the tokenizer as
  `spm.model`."""
  tmp = path + '.tmp'
  shutil.rmtree(tmp, ignore_errors=True)
  checkpoints.save(model, tmp)
  shutil.copy(tokenizer_path, os.path.join(tmp, 'spm.model'))
  shutil.rmtree(path, ignore_errors=True)
  os.rename(tmp, path)


def exporter(model_config: t5.T5Config, tokenizer_path: str) -> train_loop.ExportFn:
  """The `train_loop.ExportFn` of T5 params of `model_config`: `export` with the tokenizer."""
  return lambda params, path: export(
    t5.T5Model(config=model_config, params=params), path, tokenizer_path
  )


def _initial_params(init_from: str, model_config: t5.T5Config, seed: int):
  """The params of the `checkpoints.save` directory `init_from`: as they are if its config is
  `model_config`, else grown to it by `t5_growth.grow` (same function, larger shape)."""
  init = checkpoints.restore(init_from)
  if init.config == model_config:
    return init.params
  print(f'growing {init_from} ({t5.param_count(init.params):,} params) to the model shape')
  return t5_growth.grow(init, model_config, jax.random.key(seed + 1)).params


def _data(config: ml_collections.ConfigDict, tok: tokenizer_lib.Tokenizer) -> dict:
  """The training batches, the valid batches for the loss and the valid pairs for BLEU."""
  paths = _paths(config)
  lengths = dict(
    max_source_length=config.max_source_length, max_target_length=config.max_target_length
  )
  train_data, dropped = batching.encode_pairs(pairs.load_pairs(paths['train']), tok, **lengths)
  valid_pairs = pairs.load_pairs(paths['valid'])[: config.num_eval_pairs]
  valid_data, valid_dropped = batching.encode_pairs(valid_pairs, tok, **lengths)
  bleu_pairs = [
    p
    for p in valid_pairs
    if len(tok.encode(p[0])) <= config.max_source_length
    and len(tok.encode(p[1])) <= config.max_target_length
  ][: config.num_bleu_pairs]
  bleu_data, _ = batching.encode_pairs(bleu_pairs, tok, **lengths)
  batches = batching.BucketedBatches(
    train_data, batch_size=config.batch_size, buckets=config.length_buckets, seed=config.seed
  )
  print(
    f'train: {len(train_data)} pairs ({dropped} too long), {batches.num_batches_per_epoch} '
    f'batches/epoch; valid: {len(valid_data)} pairs for loss ({valid_dropped} too long), '
    f'{len(bleu_pairs)} for BLEU',
    flush=True,
  )
  return {
    'train': batches,
    'valid': batching.eval_batches(valid_data, config.eval_batch_size),
    'bleu': (bleu_data, bleu_pairs),
  }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config.model` on the pairs, resuming from `workdir/checkpoints` if present.

  Writes (`train_loop.run`) `workdir/metrics.jsonl` (train and eval records), orbax checkpoints
  of the full train state every `checkpoint_every` steps, `workdir/best/` (lowest valid loss so
  far) and, at the end, `workdir/final/`: both `checkpoints.save` directories with the tokenizer
  as `spm.model`.

  Returns:
    The last evaluation's record.
  """
  paths = _paths(config)
  tok = tokenizer_lib.Tokenizer.load(paths['tokenizer'])
  model_config = model_config_from(config)
  if tok.vocab_size != model_config.vocab_size:
    raise ValueError(
      f'tokenizer has {tok.vocab_size} pieces, model vocab_size is {model_config.vocab_size}'
    )
  data = _data(config, tok)
  optimizer_config = OptimizerConfig.from_config(config)
  state = init_state_jit(jax.random.key(config.seed), model_config, optimizer_config)
  if config.init_from:
    state = state.replace(params=_initial_params(config.init_from, model_config, config.seed))
    state = state.replace(opt_state=make_optimizer(optimizer_config).init(state.params))
  print(f'model: {t5.param_count(state.params):,} params, {model_config}', flush=True)

  def train_step(state, step):
    batch = data['train'].batch(step)
    state, metrics = _train_step_jit(
      state,
      batch,
      model_config=model_config,
      optimizer_config=optimizer_config,
      label_smoothing=config.label_smoothing,
      dropout_rate=config.dropout_rate,
    )
    del metrics['tokens']  # counted below, source and target
    counts = {
      'examples': batch['inputs'].shape[0],
      'tokens': float(batch['input_mask'].sum() + batch['target_mask'].sum()),
      'padded_tokens': batch['inputs'].size + batch['targets'].size,
    }
    return state, metrics, counts

  def evaluate(params):
    valid_nll = evaluate_loss(params, data['valid'], model_config=model_config)
    bleu_data, bleu_pairs = data['bleu']
    bleu, hyps = evaluate_bleu(
      t5.T5Model(config=model_config, params=params),
      bleu_data,
      [p[1] for p in bleu_pairs],
      tok,
      batch_size=config.eval_batch_size,
      max_new_tokens=config.max_target_length,
    )
    print(f'  e.g. {bleu_pairs[0][0]!r} -> {hyps[0]!r}', flush=True)
    return {'valid_nll': valid_nll, 'valid_ppl': math.exp(min(valid_nll, 50)), 'valid_bleu': bleu}

  schedule = learning_rate_schedule(optimizer_config)
  return train_loop.run(
    state,
    train_step,
    evaluate,
    cadence=train_loop.Cadence.from_config(config),
    workdir=workdir,
    export=exporter(model_config, paths['tokenizer']),
    best=train_loop.Best('valid_nll'),
    log_extra=lambda step: {'learning_rate': float(schedule(step - 1))},
  )
