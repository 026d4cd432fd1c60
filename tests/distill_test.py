"""Distillation (specdec_jax.training.distill): the divergences, and the runlocal run end to end."""

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import distill_drafter
from specdec_jax import checkpoints, decode, pretrained
from specdec_jax.data import batching
from specdec_jax.models import t5
from specdec_jax.training import distill, distill_data, distill_loss, trainer
from tests import helpers

_SHIPPED = (pretrained.ROOT / 'ende' / 'target').exists()


def test_token_divergences_match_numpy():
  rng = np.random.default_rng(0)
  a, b = rng.normal(size=(3, 7)), rng.normal(size=(3, 7))
  got = distill_loss.token_divergences(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))
  p = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
  q = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
  np.testing.assert_allclose(got['fkl'], (p * np.log(p / q)).sum(-1), rtol=1e-4)
  np.testing.assert_allclose(got['rkl'], (q * np.log(q / p)).sum(-1), rtol=1e-4)
  np.testing.assert_allclose(got['tvd'], 1 - np.minimum(p, q).sum(-1), rtol=1e-4)  # alpha = 1-TV
  np.testing.assert_array_equal(got['agree'], (a.argmax(-1) == b.argmax(-1)).astype(np.float32))
  same = distill_loss.token_divergences(jnp.asarray(a), jnp.asarray(a))
  np.testing.assert_allclose(same['tvd'], 0.0, atol=1e-6)


def _assert_greedy_parity(pair, drafter, sources):
  """The drafter plugs into the loop with the pair's target; greedy output is the target's."""
  ids, mask = pair.tokenizer.encode_batch(sources, 32, truncate=True)
  kw = dict(
    sampling=distill.sampling_lib.SamplingConfig(temperature=0.0),
    max_new_tokens=16,
    rng=jax.random.key(0),
  )
  ref = decode.generate(pair.target, ids, mask, **kw)
  out = decode.speculative_generate(pair.target, drafter, ids, mask, gamma=3, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)


@pytest.mark.skipif(not _SHIPPED, reason='pretrained/ende not shipped in this checkout')
@pytest.mark.parametrize(
  'variant',
  [
    pytest.param('runlocal', marks=pytest.mark.slow),  # ~70 CPU-s
    pytest.param('runlocal,independent', marks=pytest.mark.slow),
  ],
)
def test_runlocal_distillation_end_to_end_and_resume(tmp_path, variant):
  sources = tmp_path / 'sources.tsv'
  test = pretrained.load('ende').test_pairs()
  sources.write_text(''.join(f'{s}\t{t}\n' for s, t in test[:80]))
  config = distill_drafter.get_config(f'{variant},train_file={sources},valid_file={sources}')
  workdir = tmp_path / 'run'
  record = distill.distill_and_evaluate(config, str(workdir))
  assert 0 <= record['valid_alpha_t0'] <= 1 and 0 <= record['valid_alpha_t1'] <= 1
  drafter = checkpoints.restore(workdir / 'final')
  assert drafter.steps.shares_target_encoder == ('independent' not in variant)
  # The distilled drafter plugs into the loop; greedy output is still the target's.
  pair = pretrained.load('ende')
  _assert_greedy_parity(pair, drafter, [source for source, _ in test[:3]])
  # Killed after the checkpoint at step 2 (of 4): rerunning resumes there, writes each record
  # once and ends where the uninterrupted run ended (same batches, same on-policy samples).
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  shutil.rmtree(workdir / 'checkpoints' / '4')
  distill.distill_and_evaluate(config, str(workdir))
  again = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [(r['kind'], r['step']) for r in again] == [(r['kind'], r['step']) for r in records]
  assert again[-1]['valid_alpha'] == pytest.approx(records[-1]['valid_alpha'], abs=1e-6)
  resumed = checkpoints.restore(workdir / 'final')
  for a, b in zip(jax.tree.leaves(drafter.params), jax.tree.leaves(resumed.params)):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  # Started from that drafter, a run first evaluates it (step 0): the same alpha as at its end.
  config.init_from = str(workdir / 'final')
  distill.distill_and_evaluate(config, str(tmp_path / 'again'))
  lines = (tmp_path / 'again' / 'metrics.jsonl').read_text().splitlines()
  start = next(r for r in map(json.loads, lines) if r['kind'] == 'eval')
  assert start['step'] == 0 and start['valid_alpha'] == records[-1]['valid_alpha']


@pytest.mark.skipif(not _SHIPPED, reason='pretrained/ende not shipped in this checkout')
def test_pretrained_load():
  pair = pretrained.load('ende')
  assert 'bigram' in pair.drafters and pair.recommended in pair.drafters
  assert pair.drafter is pair.drafters[pair.recommended]
  assert pair.gamma(0.0) >= 1 and pair.gamma(1.0) >= 1
  assert len(pair.test_pairs()) >= 100
  assert pretrained.load(pair.directory).recommended == pair.recommended


def test_pretrained_load_unknown_pair(tmp_path):
  with pytest.raises(FileNotFoundError, match='No pretrained pair'):
    pretrained.load('no-such-pair')
  (tmp_path / 'pair.json').write_text(
    json.dumps(
      {'target': 'target', 'drafters': {'a': 'a.npz'}, 'recommended': 'b', 'gamma': {'0': 3}}
    )
  )
  with pytest.raises(ValueError, match="recommended drafter 'b' is not among"):
    pretrained.load(tmp_path)


def test_configs_share_one_parser():
  from experiments.configs import train_drafter, train_target

  c = train_target.get_config('runlocal,batch_size=4,model.d_model=48')
  assert c.batch_size == 4 and c.model.d_model == 48 and c.num_train_steps == 6
  assert train_drafter.get_config('runlocal').model.d_model == 16
  c = distill_drafter.get_config('independent,student.num_decoder_layers=2,divergence=tvd')
  assert c.student.num_encoder_layers == 2 and c.student.num_decoder_layers == 2
  assert c.divergence == 'tvd'
  # A field that is off by default (None) takes a number as a number, 'none' as None.
  c = distill_drafter.get_config('student.feature_dim=512,independent,student.encoder_dim=none')
  assert c.student.feature_dim == 512 and c.student.encoder_dim is None
  with pytest.raises(ValueError, match='Unknown config item'):
    train_target.get_config('runlokal')


@pytest.mark.slow  # ~26 CPU-s (17 s wall)
@pytest.mark.skipif(not _SHIPPED, reason='pretrained/ende not shipped in this checkout')
def test_step_costs_of_a_drafter_over_the_target_encoder():
  from specdec_jax.measure import timing
  from specdec_jax.models import t5

  pair = pretrained.load('ende')
  config = t5.T5Config(
    vocab_size=pair.target.config.vocab_size,
    d_model=16,
    d_kv=4,
    d_ff=32,
    num_heads=2,
    num_encoder_layers=0,
    num_decoder_layers=1,
    encoder_dim=pair.target.config.d_model,
  )
  drafter = helpers.tiny_t5(config, seed=0)
  # Timed through the target's encoder output (its own `encode` would raise). One round: each
  # value is that round's, so the ratios are exact functions of the seconds.
  costs = timing.step_costs(pair.target, drafter, batch_size=1, source_length=16, gamma=2, rounds=1)
  assert set(costs) == {
    'target_step', 'target_pass', 'drafter_step', 'iteration', 'c', 'c_fixed', 'c_alone',
    'pass_cost',
  }  # fmt: skip
  # Every loop ran and took time; the drafter's step alone is too cheap to time here (its slope
  # reads ~0: timing.step_costs), hence c from its calls in the loop.
  assert all(0 < costs[k] < 1 for k in ('target_step', 'target_pass', 'iteration')), costs
  assert costs['drafter_step'] >= 0
  assert costs['c_alone'] == costs['drafter_step'] / costs['target_step']  # a ratio of slopes
  # The 3-position pass costs more than a step and less than 3; measured from the long runs
  # (pass_cost) and from the slopes (target_pass / target_step) it is the same pass: the two agree
  # within a shared 2-core machine's noise (1.59 / 1.63 and 1.68 / 1.74 in two runs).
  assert 1 < costs['pass_cost'] < 3 and costs['target_pass'] > costs['target_step']
  assert costs['pass_cost'] == pytest.approx(costs['target_pass'] / costs['target_step'], rel=0.5)
  # The iteration holds the pass; a 16-wide one-layer drafter's call costs a fraction of a 13.5M
  # target's step (c ~0.01), its first call and weight reload under a step (c_fixed ~0.2).
  assert costs['iteration'] > costs['target_step']
  assert 0 <= costs['c'] < 0.5 and costs['c_alone'] < 0.5 and abs(costs['c_fixed']) < 1
  with pytest.raises(ValueError, match='pass target='):
    timing.step_seconds(drafter, batch_size=1, source_length=16)


def _random_pairs(n, s_max, t_max, min_target=1, vocab=64):
  """n random (source, target) pairs of ids in 2..vocab-1, padded to s_max / t_max, of random
  lengths (targets at least min_target long)."""
  rng = np.random.default_rng(0)
  in_len, tgt_len = rng.integers(1, s_max + 1, n), rng.integers(min_target, t_max + 1, n)
  return batching.EncodedPairs(
    rng.integers(2, vocab, (n, s_max)) * (np.arange(s_max) < in_len[:, None]),
    rng.integers(2, vocab, (n, t_max)) * (np.arange(t_max) < tgt_len[:, None]),
    in_len,
    tgt_len,
  )


@pytest.mark.slow  # ~25 CPU-s each
@pytest.mark.parametrize('over_target_encoder', [True, False])
def test_cached_teacher_states_give_the_live_targets_step(tmp_path, over_target_encoder):
  """A step on the cached states equals a step that runs the whole target (same loss, metrics
  and update), for a student over the target's encoder and one with its own."""
  teacher_config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], vocab_size=64)
  teacher = helpers.tiny_t5(teacher_config, seed=1)
  student_config = dataclasses.replace(
    teacher_config,
    d_model=16,
    num_decoder_layers=1,
    **(dict(num_encoder_layers=0, encoder_dim=32) if over_target_encoder else {}),
  )
  data = _random_pairs(10, 12, 9)
  tgt_len = data.target_lengths
  kw = dict(with_encoder=over_target_encoder, batch_size=4, buckets=[8, 12], progress=False)
  cached = distill_data.TeacherStates.compute(teacher, data, shard_dir=str(tmp_path), **kw)
  again = distill_data.TeacherStates.compute(teacher, data, shard_dir=str(tmp_path), **kw)  # shards
  np.testing.assert_array_equal(again.decoder[3], cached.decoder[3])
  assert len(cached.decoder[3]) == tgt_len[3]
  other = helpers.tiny_t5(teacher_config, seed=2)
  with pytest.raises(ValueError, match='computed from other sources, another target'):
    distill_data.TeacherStates.compute(other, data, shard_dir=str(tmp_path), **kw)
  optimizer_config = trainer.OptimizerConfig(learning_rate=1e-2, warmup_steps=1)
  index = np.array([0, 3, 5, 9])
  live = batching.batch_arrays(data, index, 12, 9)
  fast = dict(live, **cached.fields(index, 12, 9))
  assert ('encoded' in fast) == over_target_encoder
  results = []
  for batch in (live, fast):
    state = trainer.init_state(jax.random.key(0), student_config, optimizer_config)
    results.append(
      distill_loss.jit_distill_step(
        state, batch, teacher, student_config=student_config,
        optimizer_config=optimizer_config, divergence='fkl',
      )
    )  # fmt: skip
  (s1, m1), (s2, m2) = results
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  # A wrong cache (another pair's states) changes the loss: the test can fail.
  wrong = dict(live, **cached.fields(index[::-1], 12, 9))
  state = trainer.init_state(jax.random.key(0), student_config, optimizer_config)
  _, m3 = distill_loss.jit_distill_step(
    state, wrong, teacher, student_config=student_config,
    optimizer_config=optimizer_config, divergence='fkl',
  )  # fmt: skip
  assert abs(float(m3['fkl']) - float(m1['fkl'])) > 1e-3


def test_cached_layer_states_give_the_live_targets_step(tmp_path):
  """A block student reading two of the target's layers (`feature_layers`): its step on the
  cached states (the final ones for the target's logits, the tapped ones for it to read) equals
  the step that runs the whole target; the layers' states cached as another layer's change it."""
  teacher_config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], vocab_size=64)  # 3 layers
  teacher = helpers.tiny_t5(teacher_config, seed=1)
  student_config = dataclasses.replace(
    teacher_config, d_model=16, num_decoder_layers=1, num_encoder_layers=0, encoder_dim=32,
    feature_dim=64, feature_layers=(0, 2), block_size=3,
  )  # fmt: skip
  data = _random_pairs(6, 8, 9, min_target=2)
  tgt_len = data.target_lengths
  # One bucket: one teacher program a layer set (the test above has two).
  kw = dict(with_encoder=True, batch_size=4, buckets=[12], progress=False)
  cached = {
    layers: distill_data.TeacherStates.compute(
      teacher, data, shard_dir=str(tmp_path / str(layers)), feature_layers=layers, **kw
    )
    for layers in ((0, 2), (1, 2))
  }
  assert cached[(0, 2)].features[3].shape == (tgt_len[3], 64)
  optimizer_config = trainer.OptimizerConfig(learning_rate=1e-2, warmup_steps=1)
  index = np.array([0, 3, 5, 1])
  live = batching.batch_arrays(data, index, 8, 9)
  step = lambda batch: distill_loss.jit_distill_step(
    trainer.init_state(jax.random.key(0), student_config, optimizer_config), batch, teacher,
    student_config=student_config, optimizer_config=optimizer_config, divergence='fkl',
  )  # fmt: skip
  (s1, m1), (s2, m2) = step(live), step(dict(live, **cached[(0, 2)].fields(index, 8, 9)))
  for k in m1:
    np.testing.assert_allclose(m2[k], m1[k], rtol=1e-5, atol=1e-6, err_msg=k)
  for a, b in zip(jax.tree.leaves(s1.params), jax.tree.leaves(s2.params)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  _, m3 = step(dict(live, **cached[(1, 2)].fields(index, 8, 9)))  # layer 1's states, not 0's
  assert abs(float(m3['fkl']) - float(m1['fkl'])) > 1e-4


def test_initial_student_from_a_drafter_of_the_target_before_growth(tmp_path):
  config = dataclasses.replace(
    t5.CONFIGS['tiny-v1.1'], vocab_size=64, d_model=16, num_encoder_layers=0,
    num_decoder_layers=1, encoder_dim=32,
  )  # fmt: skip
  old = helpers.tiny_t5(config, seed=0)
  checkpoints.save(old, tmp_path / 'drafter')
  same = distill.initial_student(str(tmp_path / 'drafter'), config, jax.random.key(1))
  assert jax.tree.all(jax.tree.map(np.array_equal, same, old.params))
  # The target was grown to d_model 64: the cross-attention reads 64 dimensions, half each.
  grown = distill.initial_student(
    str(tmp_path / 'drafter'), dataclasses.replace(config, encoder_dim=64), jax.random.key(1)
  )
  key = grown['decoder']['layers_0']['encoder_decoder_attention']['key']['kernel']
  want = old.params['decoder']['layers_0']['encoder_decoder_attention']['key']['kernel']
  np.testing.assert_allclose(key[:32] + key[32:], want, rtol=1e-5, atol=1e-6)
  # And deeper at once: the old layer first, then a new one that starts as the identity.
  deeper = distill.initial_student(
    str(tmp_path / 'drafter'),
    dataclasses.replace(config, encoder_dim=64, num_decoder_layers=2),
    jax.random.key(1),
  )
  assert jax.tree.all(
    jax.tree.map(np.array_equal, deeper['decoder']['layers_0'], grown['decoder']['layers_0'])
  )
  assert not np.any(deeper['decoder']['layers_1']['mlp']['wo']['kernel'])
  with pytest.raises(
    ValueError, match='init_from .* has config .*d_model=16.*the student.*wider d_model'
  ):
    distill.initial_student(
      str(tmp_path / 'drafter'), dataclasses.replace(config, d_model=32), jax.random.key(1)
    )


def _tiny_teacher_and_sources(num: int, width: int, seed: int):
  """A random tiny T5 (vocabulary 64) and `num` random sources of 1..width tokens, padded."""
  config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], vocab_size=64)
  teacher = helpers.tiny_t5(config, seed=1)
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, width + 1, num)
  inputs = rng.integers(2, 64, (num, width)) * (np.arange(width) < lengths[:, None])
  targets = np.zeros((num, 4), np.int64)  # unused: generate_outputs reads the sources
  return teacher, batching.EncodedPairs(inputs, targets, lengths, np.ones(num, np.int64))


def test_target_outputs_are_reused_only_for_the_same_target_and_sources(tmp_path):
  teacher, data = _tiny_teacher_and_sources(6, 8, seed=0)
  kw = dict(temperature=1.0, batch_size=4, max_new_tokens=5, shard_dir=str(tmp_path))
  first = distill_data.generate_outputs(teacher, data, progress=False, **kw)
  again = distill_data.generate_outputs(teacher, data, progress=False, **kw)  # from the shards
  np.testing.assert_array_equal(again.targets, first.targets)
  other_sources = dataclasses.replace(data, inputs=np.roll(data.inputs, 1, axis=0))
  with pytest.raises(ValueError, match='computed from other sources'):
    distill_data.generate_outputs(teacher, other_sources, progress=False, **kw)
  with pytest.raises(ValueError, match='computed from other sources'):
    distill_data.generate_outputs(teacher, data, progress=False, **dict(kw, temperature=0.0))


def test_target_outputs_cut_to_each_batchs_longest_source_are_unchanged(tmp_path):
  """Greedy outputs decoded with each batch's columns cut to its longest source equal those
  decoded at the full width (the padding columns are masked out)."""
  teacher, data = _tiny_teacher_and_sources(12, 16, seed=1)
  kw = dict(temperature=0.0, batch_size=3, max_new_tokens=6, progress=False)
  cut = distill_data.generate_outputs(
    teacher, data, shard_dir=str(tmp_path / 'a'), width_step=4, **kw
  )
  full = distill_data.generate_outputs(
    teacher, data, shard_dir=str(tmp_path / 'b'), width_step=16, **kw
  )
  np.testing.assert_array_equal(cut.targets, full.targets)
  np.testing.assert_array_equal(cut.target_lengths, full.target_lengths)


@pytest.mark.slow
@pytest.mark.skipif(not _SHIPPED, reason='pretrained/ende not shipped in this checkout')
def test_runlocal_distillation_of_an_eagle_style_drafter(tmp_path):
  """student.feature_dim=0: a drafter reading the target's states trains (two passes, the state
  prediction loss) and plugs into the loop; greedy output is still the target's."""
  sources = tmp_path / 'sources.tsv'
  test = pretrained.load('ende').test_pairs()
  sources.write_text(''.join(f'{s}\t{t}\n' for s, t in test[:40]))
  config = distill_drafter.get_config(
    f'student.feature_dim=0,runlocal,train_file={sources},valid_file={sources}'
  )
  assert config.on_policy_every == 0  # it cannot draft alone
  distill.distill_and_evaluate(config, str(tmp_path / 'run'))
  records = (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()
  train = [r for r in map(json.loads, records) if r['kind'] == 'train']
  assert train and all(np.isfinite(r['feature_error']) and 'agree_own' in r for r in train)
  drafter = checkpoints.restore(tmp_path / 'run' / 'final')
  pair = pretrained.load('ende')
  assert drafter.config.feature_dim == pair.target.config.d_model
  _assert_greedy_parity(pair, drafter, [source for source, _ in test[:3]])
  config.on_policy_every = 2
  with pytest.raises(ValueError, match='on_policy_every needs a drafter that can draft alone'):
    distill.distill_and_evaluate(config, str(tmp_path / 'again'))


def test_a_config_field_added_at_its_default_keeps_the_fingerprint():
  """`model_digest` keys a config by its fields off their defaults: a field T5Config gains later
  (as block_attention did), left at its default, keeps every cached shard valid; a field set to
  another value, or another shape, changes it."""
  model = helpers.tiny_t5('tiny-v1.0', seed=0)

  @dataclasses.dataclass(frozen=True)
  class Later(t5.T5Config):
    a_later_field: int = 7

  later = t5.T5Model(config=Later(**dataclasses.asdict(model.config)), params=model.params)
  assert distill_data.model_digest(later) == distill_data.model_digest(model)
  moved = t5.T5Model(
    config=Later(**dataclasses.asdict(model.config), a_later_field=8), params=model.params
  )
  assert distill_data.model_digest(moved) != distill_data.model_digest(model)
  # Negative control: keyed by every field (as before), the added field changes it.
  every_field = lambda m: distill_data._digest(dataclasses.asdict(m.config))
  assert every_field(later) != every_field(model)
  wider = dataclasses.replace(model.config, d_ff=2 * model.config.d_ff)
  assert ('d_ff', wider.d_ff) in distill_data.config_key(wider)
