"""Teacher-forced training of T5 translation models (target and drafter) on sentence pairs.

Library half of `scripts/train.py`: the train state, the label-smoothed cross-entropy, the step,
evaluation (valid loss and greedy BLEU via `decode.generate`), and `train_and_evaluate`, which
runs them in `loop.run` (checkpoints, resume, metrics, exports). Configs live in
`experiments/configs/train_*.py`; nothing here reads flags.

On a ('data', 'model') mesh (`config.mesh`, as the main job's; one device by default), as T5X's
partitioned trainer does: the state lives where `state_shardings` puts it (the params by the
rules of `sharding` or replicated, per `config.model_sharding`; each optimizer moment as its
param; scalars replicated), each step is one jit with explicit in and out shardings
(`compile_step`: XLA reduces the gradients over 'data'), and each process builds only its own
rows of every batch (`sharding.global_batch`). The order of batches is a function of the step
alone, so any mesh, process count or resume sees the same batches and, up to float summation
order, the same losses.

Axes: B batch, S source length, T target length, V vocab.
"""

import dataclasses
import functools
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import sacrebleu
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from specdec_jax import checkpoints, decode, sampling, sharding
from specdec_jax.data import batching, pairs
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.models import t5, t5_growth
from specdec_jax.training import loop


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
  # Params held where they start: '/'-joined path prefixes, e.g. 'token_embedder' (a drafter
  # sharing the target's embeddings and output layer, `t5_growth.drafter_from_target`).
  frozen: tuple[str, ...] = ()

  def __post_init__(self):
    if self.lr_decay not in ('cosine', 'rsqrt', 'constant'):
      raise ValueError(f"lr_decay must be 'cosine', 'rsqrt' or 'constant', got {self.lr_decay!r}")

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict) -> 'OptimizerConfig':
    """The fields of this class read from a training config."""
    fields = {f.name: config[f.name] for f in dataclasses.fields(cls)}
    return cls(**dict(fields, frozen=tuple(fields['frozen'])))


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


def frozen_mask(params, frozen: tuple[str, ...]):
  """True at each leaf of `params` whose '/'-joined path starts with one of `frozen`.

  Raises:
    ValueError: a prefix that names no param (a typo would silently train everything).
  """
  flat, treedef = jax.tree_util.tree_flatten_with_path(params)
  paths = ['/'.join(str(getattr(k, 'key', k)) for k in path) for path, _ in flat]
  under = lambda path, prefix: path == prefix or path.startswith(prefix + '/')
  for prefix in frozen:
    if not any(under(path, prefix) for path in paths):
      raise ValueError(f'frozen: {prefix!r} names no param (they are {sorted(paths)}).')
  return jax.tree.unflatten(treedef, [any(under(path, f) for f in frozen) for path in paths])


def make_optimizer(config: OptimizerConfig) -> optax.GradientTransformation:
  """AdamW (decoupled weight decay, none on norm scales) after global-norm gradient clipping, on
  every param but the `frozen` ones, whose updates are zero (they stay exactly as they started,
  and their gradients count in no norm)."""
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)
  adamw = optax.chain(
    optax.clip_by_global_norm(config.grad_clip_norm),
    optax.adamw(
      learning_rate_schedule(config),
      b1=config.adam_b1,
      b2=config.adam_b2,
      weight_decay=config.weight_decay,
      mask=decay_mask,
    ),
  )
  if not config.frozen:
    return adamw
  labels = lambda params: jax.tree.map(
    lambda f: 'frozen' if f else 'trained', frozen_mask(params, config.frozen)
  )
  return optax.multi_transform({'trained': adamw, 'frozen': optax.set_to_zero()}, labels)


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


# `train_step` on one device (the loop compiles it on its mesh: `compile_step`).
jit_train_step = jax.jit(
  train_step,
  static_argnames=('model_config', 'optimizer_config', 'label_smoothing', 'dropout_rate'),
  donate_argnames=('state',),
)
_loss_terms_jit = jax.jit(_loss_terms, static_argnames=('model_config', 'label_smoothing'))


def init_state(
  rng: jax.Array, model_config: t5.T5Config, optimizer_config: OptimizerConfig, params=None
) -> TrainState:
  """Step 0: `params` (random ones, `t5.init_params`, if None) and a fresh optimizer state."""
  if params is None:
    params = t5.init_params(rng, model_config)
  opt_state = make_optimizer(optimizer_config).init(params)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)


def state_shardings(state, mesh: Mesh, how: str = 'auto') -> TrainState:
  """Where each array of a train state (or of its `jax.eval_shape`) lives on `mesh`: the params
  sharded by `sharding.DEFAULT_RULES` ('model'), whole on every device ('replicated') or by their
  count ('auto', `sharding.rules_for`); each optimizer moment as its param; scalars replicated."""
  rules = sharding.rules_for(how, t5.param_count(state.params))
  return sharding.tree_shardings(state, mesh, rules)


def abstract_state(
  model_config: t5.T5Config, optimizer_config: OptimizerConfig, mesh: Mesh, how: str = 'auto'
) -> tuple[TrainState, TrainState]:
  """(the step-0 state as `jax.ShapeDtypeStruct`s carrying their shardings, those shardings):
  where `create_state` puts every array, with nothing allocated (e.g. to compile for a mesh)."""
  init = functools.partial(init_state, model_config=model_config, optimizer_config=optimizer_config)
  shapes = jax.eval_shape(init, jax.random.key(0))
  shardings = state_shardings(shapes, mesh, how)
  structs = jax.tree.map(
    lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), shapes, shardings
  )
  return structs, shardings


def create_state(
  rng: jax.Array,
  model_config: t5.T5Config,
  optimizer_config: OptimizerConfig,
  mesh: Mesh,
  how: str = 'auto',
  params=None,
) -> tuple[TrainState, TrainState]:
  """(step-0 state, its shardings): built in place on `mesh` (`state_shardings`), each device
  computing only its shards of the random params and optimizer state. `params` (host arrays, the
  same on every process) start it instead of random ones.
  """
  init = functools.partial(init_state, model_config=model_config, optimizer_config=optimizer_config)
  _, shardings = abstract_state(model_config, optimizer_config, mesh, how)
  if params is not None:
    params = jax.device_put(params, shardings.params)
  state = jax.jit(init, out_shardings=shardings)(rng, params=params)
  return state, shardings


def compile_step(step, mesh: Mesh, shardings: TrainState, *extra_shardings):
  """`step(state, batch, *extra) -> (state, metrics)` as one jit on `mesh` with explicit
  shardings: the state stays where `shardings` put it (and is donated), the batch arrives split
  over 'data' (each leaf's first axis), `extra` (e.g. a frozen teacher) as `extra_shardings`
  say, and the metrics come back replicated. XLA adds the collectives, e.g. the gradients'
  reduction over 'data'. Call (or lower) it under `jax.set_mesh(mesh)`, which turns on the
  models' activation constraints."""
  rows = sharding.batch_sharding(mesh, 1)  # a prefix: axis 0 of every leaf, whatever its rank
  return jax.jit(
    step,
    in_shardings=(shardings, rows, *extra_shardings),
    out_shardings=(shardings, NamedSharding(mesh, P())),
    donate_argnums=0,
  )


def global_batch(make_rows: Callable[[np.ndarray], dict], index: np.ndarray, mesh: Mesh) -> dict:
  """The training batch of the pairs `index`, split over `mesh`'s 'data' axis: each process calls
  `make_rows` on its own share of `index` only (`sharding.global_batch`)."""
  return sharding.global_batch(
    lambda rows: make_rows(index[rows.start : rows.stop]), len(index), mesh
  )


def evaluate_loss(params, batches, *, model_config: t5.T5Config, mesh: Mesh | None = None) -> float:
  """Mean per-token negative log-likelihood over `batching.eval_batches` output (each batch split
  over `mesh`'s 'data' axis when given)."""
  nll_sum = tokens = 0.0
  for batch in batches:
    if mesh is not None:
      batch = sharding.from_host(batch, mesh)
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
  mesh: Mesh | None = None,
) -> tuple[float, list[str]]:
  """Greedy-decodes the sources of `data` (each batch split over `mesh`'s 'data' axis when
  given); returns (corpus BLEU vs `references`, hypotheses)."""
  hypotheses = []
  greedy = sampling.SamplingConfig(temperature=0.0)
  for batch in batching.eval_batches(data, batch_size):
    inputs = batch['inputs'], batch['input_mask']
    if mesh is not None:
      inputs = sharding.from_host(inputs, mesh)
    out = decode.generate(
      model, *inputs, sampling=greedy, max_new_tokens=max_new_tokens, rng=jax.random.key(0)
    )
    hypotheses.extend(tokenizer.decode(row) for row in decode.to_host(out.tokens))
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
  `spm.model`. With several processes every one calls it (each saves its shards); process 0
  moves the files."""
  tmp = path + '.tmp'
  if sharding.is_main_process():
    shutil.rmtree(tmp, ignore_errors=True)
  sharding.barrier(f'export {tmp}: cleared')
  checkpoints.save(model, tmp)
  if sharding.is_main_process():
    shutil.copy(tokenizer_path, os.path.join(tmp, 'spm.model'))
    shutil.rmtree(path, ignore_errors=True)
    os.rename(tmp, path)
  sharding.barrier(f'export {path}: renamed')


def exporter(model_config: t5.T5Config, tokenizer_path: str) -> loop.ExportFn:
  """The `loop.ExportFn` of T5 params of `model_config`: `export` with the tokenizer."""
  return lambda params, path: export(
    t5.T5Model(config=model_config, params=params), path, tokenizer_path
  )


def _initial_params(init_from: str, model_config: t5.T5Config, seed: int):
  """The params (host arrays) of the `checkpoints.save` directory `init_from`: as they are if its
  config is `model_config`, else grown to it by `t5_growth.grow` (same function, larger shape)."""
  init = checkpoints.restore(init_from)
  if init.config != model_config:
    loop.say(f'growing {init_from} ({t5.param_count(init.params):,} params) to the model shape')
    init = t5_growth.grow(init, model_config, jax.random.key(seed + 1))
  return jax.device_get(init.params)


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
  loop.say(
    f'train: {len(train_data)} pairs ({dropped} too long), {batches.num_batches_per_epoch} '
    f'batches/epoch; valid: {len(valid_data)} pairs for loss ({valid_dropped} too long), '
    f'{len(bleu_pairs)} for BLEU'
  )
  return {
    'train': batches,
    'valid': batching.eval_batches(valid_data, config.eval_batch_size),
    'bleu': (bleu_data, bleu_pairs),
  }


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains `config.model` on the pairs, resuming from `workdir/checkpoints` if present.

  Writes (`loop.run`) `workdir/metrics.jsonl` (train and eval records), orbax checkpoints
  of the full train state every `checkpoint_every` steps, `workdir/best/` (lowest valid loss so
  far) and, at the end, `workdir/final/`: both `checkpoints.save` directories with the tokenizer
  as `spm.model`. On a mesh of several processes every process runs this (module docstring);
  the workdir must be one directory they all see.

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
  mesh = sharding.mesh_from_spec(config.mesh, config.batch_size)
  sharding.check_batch(config.eval_batch_size, mesh)
  sharding.check_placement(config.model_sharding, 'config.model_sharding')
  data = _data(config, tok)
  optimizer_config = OptimizerConfig.from_config(config)
  state, step_fn = _state_and_step(config, model_config, optimizer_config, mesh)
  schedule = learning_rate_schedule(optimizer_config)
  with jax.set_mesh(mesh):
    return loop.run(
      state,
      _batch_step(step_fn, data['train'], mesh),
      _evaluator(config, model_config, data, tok, mesh),
      cadence=loop.Cadence.from_config(config),
      workdir=workdir,
      export=exporter(model_config, paths['tokenizer']),
      best=loop.Best('valid_nll'),
      log_extra=lambda step: {'learning_rate': float(schedule(step - 1))},
    )


def _state_and_step(config, model_config: t5.T5Config, optimizer_config, mesh):
  """The initial train state on `mesh` (from `config.init_from` if set) and the compiled step."""
  init_params = None
  if config.init_from:
    init_params = _initial_params(config.init_from, model_config, config.seed)
  state, shardings = create_state(
    jax.random.key(config.seed),
    model_config,
    optimizer_config,
    mesh,
    config.model_sharding,
    init_params,
  )
  loop.say(
    f'model: {t5.param_count(state.params):,} params, {model_config}; mesh {dict(mesh.shape)}'
  )
  step_fn = compile_step(
    functools.partial(
      train_step,
      model_config=model_config,
      optimizer_config=optimizer_config,
      label_smoothing=config.label_smoothing,
      dropout_rate=config.dropout_rate,
    ),
    mesh,
    shardings,
  )
  return state, step_fn


def _batch_step(step_fn, train, mesh):
  """`loop.run`'s step: the global batch of a step (each process builds its rows), one
  compiled step, and the counts of what it read (on the host: no sync)."""
  pairs = train.data

  def step(state, step):
    index, source_length, target_length = train.batch_index(step)
    batch = global_batch(
      lambda rows: batching.batch_arrays(pairs, rows, source_length, target_length), index, mesh
    )
    state, metrics = step_fn(state, batch)
    del metrics['tokens']  # counted below (on the host: no sync), source and target
    counts = {
      'examples': len(index),
      'tokens': float(pairs.input_lengths[index].sum() + pairs.target_lengths[index].sum()),
      'padded_tokens': len(index) * (source_length + target_length),
    }
    return state, metrics, counts

  return step


def _evaluator(config, model_config: t5.T5Config, data, tok, mesh):
  """`loop.run`'s evaluation: validation loss and perplexity, and BLEU of greedy outputs."""

  def evaluate(params):
    valid_nll = evaluate_loss(params, data['valid'], model_config=model_config, mesh=mesh)
    bleu_data, bleu_pairs = data['bleu']
    bleu, hyps = evaluate_bleu(
      t5.T5Model(config=model_config, params=params),
      bleu_data,
      [p[1] for p in bleu_pairs],
      tok,
      batch_size=config.eval_batch_size,
      max_new_tokens=config.max_target_length,
      mesh=mesh,
    )
    loop.say(f'  e.g. {bleu_pairs[0][0]!r} -> {hyps[0]!r}')
    return {'valid_nll': valid_nll, 'valid_ppl': math.exp(min(valid_nll, 50)), 'valid_bleu': bleu}

  return evaluate
