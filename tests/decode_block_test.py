"""Block drafting (a drafter proposing all gamma drafts in one call, `decode_steps.draft_block`)
through the jitted loop: lossless over whole sequences (chi-square of the first tokens over 100k
rows against the target's exact law) for each verifier and each proposal, negative controls that
must fail the same test, greedy output equal to the target's, one program per shape, and the
errors a user meets first."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import checkpoints, decode, decode_steps, sharding
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timed_loops, timing
from specdec_jax.models import t5
from tests import fakes, helpers
from tests.chisquare import SIGNIFICANCE
from tests.fakes import BLOCK, SEQUENCE_LENGTH, SEQUENCE_ROWS, STATE_TARGET, sequence_pvalue
from tests.helpers import GREEDY, ragged_source, tiny_block_t5

SAMPLING = sampling_lib.SamplingConfig(temperature=1.0)


def _samples(verifier='token', *, proposal, sampling=SAMPLING, gamma=2, seed=3, **kw):
  ids = jnp.zeros((SEQUENCE_ROWS, 1), jnp.int32)
  out = decode.speculative_generate(
    STATE_TARGET, BLOCK, ids, jnp.ones_like(ids), gamma=gamma, verifier=verifier,
    sampling=sampling, max_new_tokens=SEQUENCE_LENGTH, rng=jax.random.key(seed),
    proposal=proposal, **kw,
  )  # fmt: skip
  return np.asarray(out.tokens), out.stats


@pytest.mark.parametrize(
  'verifier, proposal, sampling, num_drafts',
  [
    ('token', 'sample', SAMPLING, 1),
    ('block', 'argmax', sampling_lib.SamplingConfig(temperature=0.7, top_k=3), 1),
    ('block', 'sample', SAMPLING, 2),
    pytest.param('block', 'sample', SAMPLING, 1, marks=pytest.mark.slow),
    pytest.param('token', 'argmax', SAMPLING, 1, marks=pytest.mark.slow),
    pytest.param('token', 'sample', SAMPLING, 2, marks=pytest.mark.slow),
    pytest.param('token', 'sample', sampling_lib.SamplingConfig(1.3, top_p=0.8), 1, marks=pytest.mark.slow),
  ],
  ids=str,
)  # fmt: skip
def test_block_drafting_is_lossless(verifier, proposal, sampling, num_drafts):
  tokens, stats = _samples(verifier, proposal=proposal, sampling=sampling, num_drafts=num_drafts)
  assert sequence_pvalue(tokens, sampling) > SIGNIFICANCE
  summed = jax.tree.map(np.asarray, stats.summed())
  assert 0 < summed.accepted < summed.drafted  # drafts were kept and rejected: a real test


@pytest.mark.slow
def test_block_drafting_is_lossless_with_draft_stop():
  tokens, stats = _samples('token', proposal='sample', draft_stop=0.3, gamma=3)
  assert sequence_pvalue(tokens) > SIGNIFICANCE
  summed = jax.tree.map(np.asarray, stats.summed())
  assert summed.drafted < 3 * summed.target_calls  # some iterations stopped early


def _q_of_the_next_position(*args, **kwargs):
  """Bug: draft i verified against q_{i+1} (the last against itself)."""
  drafts, q, cache, lengths = _DRAFT_BLOCK(*args, **kwargs)
  if q is not None:
    q = jnp.concatenate([q[:, 1:], q[:, -1:]], axis=1)
  return drafts, q, cache, lengths


def _drafted_jointly(*args, **kwargs):
  """Bug: draft 2 copies draft 1 half the time (drawn jointly), verified as if drawn from q_2."""
  drafts, q, cache, lengths = _DRAFT_BLOCK(*args, **kwargs)
  coin = jax.random.bernoulli(jax.random.key(7), 0.5, drafts[:, :1].shape)
  copied = jnp.where(coin, drafts[:, :1], drafts[:, 1:2])
  return drafts.at[:, 1:2].set(copied), q, cache, lengths


_DRAFT_BLOCK = decode_steps.draft_block


@pytest.mark.parametrize(
  'bug', [_q_of_the_next_position, _drafted_jointly], ids=lambda f: f.__name__
)
def test_negative_controls_fail(monkeypatch, bug):
  monkeypatch.setattr(decode_steps, 'draft_block', bug)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _samples('token', proposal='sample')
  monkeypatch.undo()
  jax.clear_caches()
  assert sequence_pvalue(tokens) < SIGNIFICANCE


# ---------------------------------------------------------------------------------------------
# Greedy: the target's greedy output, token for token.


def test_greedy_equals_generate_markov():
  target = fakes.with_states(fakes.random_markov(seed=10))  # a long greedy output
  drafter = fakes.random_block_drafter(seed=6)
  ids, mask = ragged_source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert int(np.sum(out.stats.accepted)) > 0


# (max_new_tokens 1 at gamma 4: a block call is 2 gamma wide, wider than the loop's buffer of
# M + gamma + 2 slots; the drafter's cache has gamma - 1 more, `Drafting.extra_slots`.)
@pytest.mark.parametrize(
  'verifier, gamma, num_drafts, max_new_tokens, block_attention',
  [
    ('token', 4, 1, 16, 'causal'),
    ('block', 2, 2, 16, 'causal'),
    ('token', 4, 1, 1, 'causal'),
    ('token', 3, 1, 16, 'bidirectional'),
  ],
)
def test_greedy_equals_generate_t5(
  verifier, gamma, num_drafts, max_new_tokens, block_attention, tiny_pair
):
  target, _ = tiny_pair
  drafter = tiny_block_t5(target, block_attention=block_attention)
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=max_new_tokens, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  out = decode.speculative_generate(
    target, drafter, ids, mask, gamma=gamma, verifier=verifier, num_drafts=num_drafts, **kw
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_a_drafter_reading_several_target_layers(tiny_pair):
  """`T5Config.feature_layers`: the loop feeds the drafter the tapped layers' states (tapping
  the last layer is reading the final states: the same run, token for token; tapping layer 0
  instead changes the drafts, so the run), the loop's iteration as `timing.step_costs` times it
  feeds them too, and a layer the target lacks is one clear error."""
  target, _ = tiny_pair  # 3 decoder layers of width 32
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  base = tiny_block_t5(target)
  reads = lambda layers: t5.T5Model(
    dataclasses.replace(base.config, feature_layers=layers), base.params
  )
  kw = dict(gamma=3, sampling=SAMPLING, max_new_tokens=12, rng=jax.random.key(4))
  run = lambda drafter: decode.speculative_generate(target, drafter, ids, mask, **kw).tokens
  np.testing.assert_array_equal(run(reads((2,))), run(base))
  assert not np.array_equal(run(reads((0,))), run(base))
  two = tiny_block_t5(target, feature_dim=64, feature_layers=(0, 2))
  iterations = timed_loops.iteration_loop(
    (target.steps, target.params), (two.steps, two.params), batch_size=1, source_length=5,
    gamma=4, cache_len=32,
  )  # fmt: skip
  assert iterations(2).shape == (1, 5, target.config.vocab_size)
  far = tiny_block_t5(target, feature_dim=64, feature_layers=(0, 3))
  with pytest.raises(ValueError, match=r'decoder layers \(0, 3\) .* the target has 3'):
    decode.speculative_generate(
      target, far, ids, mask, gamma=2, sampling=GREEDY, max_new_tokens=4, rng=None
    )


@pytest.mark.slow  # ~8 CPU-s: generate and the loop compiled for two tapped layers
def test_a_drafter_reading_two_target_layers_is_greedy_exact(tiny_pair):
  target, _ = tiny_pair
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  two = tiny_block_t5(target, feature_dim=64, feature_layers=(0, 2))
  greedy = dict(sampling=GREEDY, max_new_tokens=16, rng=None)
  ref = decode.generate(target, ids, mask, **greedy)
  out = decode.speculative_generate(target, two, ids, mask, gamma=4, **greedy)
  np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_one_program_per_shape(tiny_pair):
  target, _ = tiny_pair
  drafter = tiny_block_t5(target)
  kw = dict(gamma=3, sampling=SAMPLING, max_new_tokens=8)
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  decode.speculative_generate(target, drafter, ids, mask, rng=jax.random.key(0), **kw)
  with timing.compiles() as compiled:
    for seed in (1, 2):
      other = tiny_block_t5(target, seed=seed + 10)  # other weights, same shapes
      decode.speculative_generate(target, other, ids, mask, rng=jax.random.key(seed), **kw)
  assert compiled == []


# ---------------------------------------------------------------------------------------------
# The model: one block call computes what the teacher-forced training pass computes.


@pytest.mark.parametrize('block_attention', ['causal', 'bidirectional'])
def test_step_block_equals_the_training_pass(block_attention, tiny_pair):
  target, _ = tiny_pair
  drafter = tiny_block_t5(target, block_attention=block_attention)
  cfg, params = drafter.config, drafter.params
  b, s, t, d = 2, 5, 9, target.config.d_model
  encoded = jax.random.normal(jax.random.key(1), (b, s, d))
  mask = jnp.ones((b, s), bool)
  tokens = jax.random.randint(jax.random.key(2), (b, t), 2, cfg.vocab_size)
  features = jax.random.normal(jax.random.key(3), (b, t, d))
  anchors = jnp.array([[0, 3, 5], [2, 4, 8]])
  states = t5.block_states(params, encoded, mask, tokens, features, anchors, config=cfg)
  flat = t5.output_logits(params, states.reshape(b, -1, cfg.d_model), config=cfg)
  trained = flat.reshape(b, 3, cfg.block_size, -1)
  steps = drafter.steps
  step_block = jax.jit(steps.step_block, static_argnums=4)  # one program for every anchor
  for row in range(b):
    for k, a in enumerate(np.asarray(anchors[row]).tolist()):
      cache = steps.init_cache(params, encoded[row : row + 1], mask[row : row + 1], 32)
      unread = lambda x: jnp.where(
        (jnp.arange(t + 2) <= a).reshape((1, -1) + (1,) * (x.ndim - 2)),
        jnp.pad(x[row : row + 1], [(0, 0), (0, 2)] + [(0, 0)] * (x.ndim - 2)),
        0,
      )
      # Positions 0..a with the pending token a kept, the inputs after it unread (zeros).
      logits, cache = step_block(
        params, unread(tokens), unread(features), cache, cfg.block_size, jnp.array([a + 1])
      )
      np.testing.assert_allclose(logits[0], trained[row, k], atol=2e-5)
      assert int(cache.end_index[0]) == a + 1
  # Negative controls: the slots of another anchor's block are not this one's, and the other
  # attention's slots are not these (the anchor's own output, causal in both, is).
  assert not np.allclose(trained[0, 1, 1:], trained[0, 2, 1:], atol=1e-3)
  other = 'causal' if block_attention == 'bidirectional' else 'bidirectional'
  other_cfg = dataclasses.replace(cfg, block_attention=other)
  other_states = t5.block_states(params, encoded, mask, tokens, features, anchors, config=other_cfg)
  np.testing.assert_allclose(other_states[:, :, 0], states[:, :, 0], atol=1e-5)
  assert not np.allclose(other_states[:, :, 1:-1], states[:, :, 1:-1], atol=1e-3)


def test_saves_restores_and_has_logical_axes(tiny_pair, tmp_path):
  """A block drafter round-trips through `checkpoints.save` / `restore` (its config and its query
  slots, T5X-style names), and every param has logical axes: the slots replicated under the
  default ('model') rules as under the replicated ones."""
  target, _ = tiny_pair
  drafter = tiny_block_t5(target)
  assert drafter.params['decoder']['block_queries']['embedding'].shape == (3, 16)
  assert 'feature_out' not in drafter.params['decoder']  # it predicts no states
  checkpoints.save(drafter, tmp_path / 'block')
  restored = checkpoints.restore(tmp_path / 'block')
  assert restored.config == drafter.config and restored.config.block_size == 4
  for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(drafter.params)):
    np.testing.assert_array_equal(a, b)
  axes = sharding.param_logical_axes(drafter.params)
  assert tuple(axes['decoder']['block_queries']['embedding']) == ('length', 'embed')
  for rules in (sharding.DEFAULT_RULES, sharding.REPLICATED_RULES):
    assert dict(rules)['length'] is None and dict(rules)['embed'] is None


# ---------------------------------------------------------------------------------------------
# Errors before any work.


def test_errors(tiny_pair):
  target, _ = tiny_pair
  drafter = tiny_block_t5(target)
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=4, rng=None)
  with pytest.raises(ValueError, match=r'gamma=5 exceeds .* block_size=4'):
    decode.speculative_generate(target, drafter, ids, mask, gamma=5, **kw)
  with pytest.raises(ValueError, match='is a block drafter .* cannot be the target'):
    decode.generate(drafter, ids, mask, **kw)
  with pytest.raises(ValueError, match='is a block drafter .* cannot be the target'):
    decode.speculative_generate(drafter, drafter, ids, mask, gamma=2, **kw)
  other_width = helpers.tiny_t5(drafter.config, feature_dim=8)
  with pytest.raises(ValueError, match='feature_dim=8.*width 32'):
    decode.speculative_generate(target, other_width, ids, mask, gamma=2, **kw)
  other_vocab = helpers.tiny_t5(dataclasses.replace(drafter.config, vocab_size=64))
  with pytest.raises(ValueError, match='vocabularies differ'):
    decode.speculative_generate(target, other_vocab, ids, mask, gamma=2, **kw)
  with pytest.raises(ValueError, match='greedy_block.*a block drafter'):
    decode.speculative_generate(
      target, drafter, ids, mask, gamma=2, verifier='greedy_block',
      sampling=SAMPLING, max_new_tokens=4, rng=jax.random.key(0),
    )  # fmt: skip
  with pytest.raises(ValueError, match='block_size needs feature_dim'):
    dataclasses.replace(drafter.config, feature_dim=None)
