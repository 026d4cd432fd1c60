"""Tests for specdec_jax.training.trainer, specdec_jax.data.batching and the train configs.

The end-to-end test runs the `runlocal` target config on a synthetic fixture corpus and a tiny
tokenizer written to tmp, then reruns it to check that training resumes from the checkpoint.
"""

import dataclasses
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from experiments.configs import train_drafter, train_target
from specdec_jax import checkpoints
from specdec_jax.data import batching, pairs, tokenizer
from specdec_jax.models import t5
from specdec_jax.training import trainer
from tests import helpers


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  """data_dir with train.tsv, valid.tsv and spm_ende_8k.model (a tiny vocabulary)."""
  data_dir = tmp_path_factory.mktemp('ende')
  train, valid = helpers.fixture_pairs(200, seed=0), helpers.fixture_pairs(16, seed=1)
  pairs.write_tsv(train, data_dir / 'train.tsv')
  pairs.write_tsv(valid, data_dir / 'valid.tsv')
  tok = tokenizer.train_tokenizer([s for p in train for s in p], vocab_size=320)
  tok.save(data_dir / 'spm_ende_8k.model')
  return data_dir, tok


def _smoke_config(data_dir, vocab_size, **overrides):
  config = train_target.get_config('runlocal')
  config.data_dir = str(data_dir)
  config.model.vocab_size = vocab_size
  config.update(overrides)
  return config


def test_runlocal_trains_resumes_and_exports(corpus, tmp_path):
  data_dir, tok = corpus
  config = _smoke_config(data_dir, tok.vocab_size)  # 6 steps, checkpoints at 3 and 6
  workdir = tmp_path / 'work'
  result = trainer.train_and_evaluate(config, str(workdir))
  assert result['step'] == 6 and np.isfinite(result['valid_nll'])
  uninterrupted = checkpoints.restore(workdir / 'final')
  assert uninterrupted.config == trainer.model_config_from(config)
  assert tokenizer.Tokenizer.load(workdir / 'final' / 'spm.model').vocab_size == tok.vocab_size
  checkpoints.restore(workdir / 'best')

  # Interrupted after the checkpoint at step 3: rerunning resumes there and ends where the
  # uninterrupted run ended (same batches, same updates).
  shutil.rmtree(workdir / 'checkpoints' / '6')
  assert trainer.train_and_evaluate(config, str(workdir))['step'] == 6
  resumed = checkpoints.restore(workdir / 'final')
  for a, b in zip(jax.tree.leaves(uninterrupted.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

  with open(workdir / 'metrics.jsonl') as f:
    records = [json.loads(line) for line in f]
  train = [r for r in records if r['kind'] == 'train']
  # The rerun started at step 3, not 0, and replaced the records written after that checkpoint.
  assert [r['step'] for r in train] == [2, 4, 6]
  keys = [(r['kind'], r['step']) for r in records]
  assert len(keys) == len(set(keys)), keys
  assert all(np.isfinite(r['loss']) and r['tokens_per_second'] > 0 for r in train)
  assert train[2]['nll'] < train[0]['nll']


@pytest.mark.parametrize('dropout_rate', [0.0, 0.1])
def test_train_step_fits_a_fixed_batch(corpus, dropout_rate):
  _, tok = corpus
  config = _smoke_config(
    'unused',
    tok.vocab_size,
    learning_rate=3e-3,
    warmup_steps=1,
    num_train_steps=1000,
    lr_decay='constant',
  )
  model_config = trainer.model_config_from(config)
  data, _ = batching.encode_pairs(
    helpers.fixture_pairs(8, seed=2), tok, max_source_length=32, max_target_length=32
  )
  batch = batching.batch_arrays(data, np.arange(8), 32, 32)
  optimizer_config = trainer.OptimizerConfig.from_config(config)
  state = trainer.init_state(jax.random.key(0), model_config, optimizer_config)
  step = functools.partial(
    trainer.jit_train_step,
    model_config=model_config,
    optimizer_config=optimizer_config,
    label_smoothing=0.0,
  )
  no_dropout_nll = float(step(jax.tree.map(jnp.copy, state), batch)[1]['nll'])  # state is donated
  losses = []
  for _ in range(40):
    state, metrics = step(state, batch, dropout_rate=dropout_rate)
    losses.append(float(metrics['nll']))
  assert int(state.step) == 40
  assert losses[-1] < 0.5 * losses[0], losses
  # The rate reaches the model: the first step's loss is the no-dropout loss only at rate 0.
  assert (losses[0] == pytest.approx(no_dropout_nll, rel=1e-5)) == (dropout_rate == 0.0)


@pytest.mark.parametrize('label_smoothing', [0.0, 0.1])
def test_cross_entropy_matches_numpy(label_smoothing):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  targets = rng.integers(0, 5, size=(2, 3))
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  loss, nll, tokens = trainer.cross_entropy(
    jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(mask), label_smoothing=label_smoothing
  )
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  gold = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
  want = (1 - label_smoothing) * gold - label_smoothing * log_probs.mean(-1)
  np.testing.assert_allclose(float(nll), gold[mask].sum(), rtol=1e-5)
  np.testing.assert_allclose(float(loss), want[mask].sum(), rtol=1e-5)
  assert float(tokens) == 3


def test_bucketed_batches_deterministic_fixed_shapes(corpus):
  _, tok = corpus
  unique = list(dict.fromkeys(helpers.fixture_pairs(120, seed=3)))[:100]
  data, dropped = batching.encode_pairs(unique, tok, max_source_length=32, max_target_length=32)
  assert dropped == 0
  a = batching.BucketedBatches(data, batch_size=8, buckets=(12, 16, 32), seed=5)
  b = batching.BucketedBatches(data, batch_size=8, buckets=(12, 16, 32), seed=5)
  seen = []
  for step in range(a.num_batches_per_epoch):
    batch = a.batch(step)
    assert batch['inputs'].shape[0] == 8 and batch['inputs'].shape[1] in (12, 16, 32)
    assert batch['inputs'].shape == batch['targets'].shape
    np.testing.assert_array_equal(batch['inputs'][~batch['input_mask']], 0)
    assert (batch['targets'][batch['target_mask']] != 0).all()
    seen.append(batch['inputs'])
  # Every pair at most once per epoch; a fresh instance (a resumed run) gives the same batch.
  rows = {tuple(r) for x in seen for r in x}
  assert len(rows) == sum(len(x) for x in seen)
  later = a.num_batches_per_epoch + 3
  for key, value in a.batch(later).items():
    np.testing.assert_array_equal(value, b.batch(later)[key])
  with pytest.raises(ValueError, match='largest bucket'):
    batching.BucketedBatches(data, batch_size=8, buckets=(4,), seed=0)


def test_eval_batches_pad_last_batch_with_weightless_rows(corpus):
  _, tok = corpus
  data, dropped = batching.encode_pairs(
    helpers.fixture_pairs(10, seed=4), tok, max_source_length=32, max_target_length=30
  )
  assert dropped == 0
  batches = batching.eval_batches(data, 4)
  assert len(batches) == 3 and batches[-1]['targets'].shape == (4, 30)
  assert batches[-1]['input_mask'][2:].sum() == 0 and batches[-1]['target_mask'][2:].sum() == 0
  assert sum(int(b['target_mask'].sum()) for b in batches) == int(data.target_lengths.sum())


def test_configs_param_ratio_and_runlocal():
  shapes = {}
  for name, module in (('target', train_target), ('drafter', train_drafter)):
    config = module.get_config()
    model_config = trainer.model_config_from(config)
    params = jax.eval_shape(lambda c=model_config: t5.init_params(jax.random.key(0), c))
    shapes[name] = (model_config, t5.param_count(params))
    assert model_config.vocab_size == 8000
    assert module.get_config('runlocal').num_train_steps < 10
  target, drafter = shapes['target'], shapes['drafter']
  assert target[0].feed_forward == 'gated-gelu' and not target[0].tie_word_embeddings
  assert 12e6 < target[1] < 15e6
  assert 10 <= target[1] / drafter[1] <= 30
  with pytest.raises(ValueError, match='Unknown config item'):
    train_target.get_config('runlokal')


@pytest.mark.parametrize('frozen', [('token_embedder', 'decoder/logits_dense'), ()])
def test_frozen_params_stay_where_they_start(frozen):
  # Weight decay and AdamW's moments move nothing frozen; everything else moves, as it would
  # whatever the frozen params' gradients (they count in no clipping norm). Negative control:
  # nothing frozen, the same params move, and the other gradients change the rest's updates.
  small = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], num_encoder_layers=1, num_decoder_layers=1)
  params = t5.init_params(jax.random.key(0), small)
  config = trainer.OptimizerConfig(learning_rate=1e-2, warmup_steps=1, frozen=frozen)
  optimizer = trainer.make_optimizer(config)
  is_frozen = trainer.frozen_mask(params, ('token_embedder', 'decoder/logits_dense'))

  @jax.jit
  def step(new, state, key, scale_of_frozen_grads):
    leaves, tree = jax.tree.flatten(new)
    keys = jax.random.split(key, len(leaves))
    grads = tree.unflatten([jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])
    grads = jax.tree.map(lambda g, f: g * scale_of_frozen_grads if f else g, grads, is_frozen)
    updates, state = optimizer.update(grads, state, new)
    return optax.apply_updates(new, updates), state

  def train(scale_of_frozen_grads):
    state, new = optimizer.init(params), params
    for i in range(3):
      new, state = step(new, state, jax.random.key(i), scale_of_frozen_grads)
    return new

  new = train(1.0)
  same = jax.tree.map(np.array_equal, params, new)
  assert same['token_embedder']['embedding'] == bool(frozen)
  assert same['decoder']['logits_dense']['kernel'] == bool(frozen)
  assert not any(jax.tree.leaves(same['decoder']['layers_0']))
  assert not any(jax.tree.leaves(same['encoder']))
  other = train(100.0)
  unchanged = jax.tree.map(np.array_equal, new['encoder'], other['encoder'])
  assert all(jax.tree.leaves(unchanged)) == bool(frozen)


def test_a_frozen_prefix_that_names_no_param_is_an_error():
  params = t5.init_params(jax.random.key(0), t5.CONFIGS['tiny-v1.1'])
  config = trainer.OptimizerConfig(frozen=('decoder/logit_dense',))
  with pytest.raises(ValueError, match="frozen: 'decoder/logit_dense' names no param"):
    trainer.make_optimizer(config).init(params)


@pytest.mark.parametrize('lr_decay', ['cosine', 'rsqrt', 'constant'])
def test_learning_rate_schedule_warmup_then_decay(lr_decay):
  config = trainer.OptimizerConfig.from_config(train_target.get_config())
  config = dataclasses.replace(config, lr_decay=lr_decay)
  schedule = trainer.learning_rate_schedule(config)
  peak, warmup = config.learning_rate, config.warmup_steps
  assert float(schedule(0)) == 0.0
  np.testing.assert_allclose(float(schedule(warmup // 2)), peak / 2, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(warmup)), peak, rtol=1e-6)
  end = {
    'cosine': peak * config.end_lr_fraction,
    'rsqrt': peak * (warmup / config.num_train_steps) ** 0.5,
    'constant': peak,
  }[lr_decay]
  np.testing.assert_allclose(float(schedule(config.num_train_steps)), end, rtol=1e-5)
  with pytest.raises(ValueError, match='lr_decay'):
    dataclasses.replace(config, lr_decay='linear')


@pytest.mark.slow  # ~30 CPU-s
def test_init_from_a_smaller_model_starts_at_its_loss(corpus, tmp_path):
  data_dir, tok = corpus
  config = _smoke_config(data_dir, tok.vocab_size, num_train_steps=0)
  small_config = dataclasses.replace(
    trainer.model_config_from(config), d_model=16, num_heads=2, d_ff=32
  )
  small = helpers.tiny_t5(small_config, seed=3)
  checkpoints.save(small, tmp_path / 'small')
  config.init_from = str(tmp_path / 'small')
  result = trainer.train_and_evaluate(config, str(tmp_path / 'work'))
  grown = checkpoints.restore(tmp_path / 'work' / 'final')
  assert grown.config == trainer.model_config_from(config) != small_config
  # Grown, not trained (0 steps): the valid loss is the small model's.
  valid, _ = batching.encode_pairs(
    pairs.load_pairs(data_dir / 'valid.tsv'), tok, max_source_length=32, max_target_length=32
  )
  want = trainer.evaluate_loss(
    small.params, batching.eval_batches(valid, config.eval_batch_size), model_config=small_config
  )
  np.testing.assert_allclose(result['valid_nll'], want, rtol=1e-4)
