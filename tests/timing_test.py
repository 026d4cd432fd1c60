"""Timing loops: one compiled program per model shape, whatever the loop lengths."""

import dataclasses
import re

import jax
import jax.numpy as jnp

from specdec_jax import step_models, timing
from specdec_jax.models import t5


def _tiny(name: str) -> t5.T5Model:
  config = t5.CONFIGS[name]
  return t5.T5Model(config=config, params=t5.init_params(jax.random.key(0), config))


def test_step_and_iteration_timers_compile_once_per_shape():
  target, drafter = _tiny('tiny-v1.1'), _tiny('tiny-v1.0')
  kw = dict(batch_size=1, source_length=8, cache_len=32, repeats=1)
  steps_before = timing._repeated_steps._cache_size()
  iterations_before = timing._repeated_iterations._cache_size()
  for calls in [(2, 6), (3, 9)]:
    assert timing.step_seconds(target, calls=calls, **kw) >= 0
    assert timing.iteration_seconds(target, drafter, gamma=2, calls=calls, **kw) >= 0
  # Two loop lengths per call and two calls: still one program each.
  assert timing._repeated_steps._cache_size() == steps_before + 1
  assert timing._repeated_iterations._cache_size() == iterations_before + 1


def _computes_two_position_logits(compiled_text: str, vocab: int) -> bool:
  """Whether a compiled program produces a [2, vocab]-shaped result: the logits of a drafter call
  fed two positions (batch 1), i.e. that call's output layer was not dropped."""
  return re.search(rf'= f32\[(1,)?2,{vocab}\]', compiled_text) is not None


def test_iteration_timer_keeps_every_drafter_output_layer():
  # The timing loop discarded the first drafter call's logits once; XLA then dropped that call's
  # output layer and in-loop c read 2-4x low. Each draft is now the argmax of its call's logits.
  vocab = 1000  # a size no other axis has
  target_config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], vocab_size=vocab)
  drafter_config = dataclasses.replace(
    target_config, d_model=8, d_kv=4, num_heads=2, d_ff=16, num_encoder_layers=0,
    num_decoder_layers=1, encoder_dim=target_config.d_model,
  )  # fmt: skip
  target, drafter = (
    t5.T5Model(config, t5.init_params(jax.random.key(seed), config))
    for seed, config in enumerate((target_config, drafter_config))
  )
  args = [*step_models.as_step_model(target), *step_models.as_step_model(drafter)]
  args += [*step_models.encoder_of(drafter, target), jnp.full((1, 8), 3, jnp.int32)]
  text = (
    timing._repeated_iterations.lower(*args, gamma=3, cache_len=16, calls=jnp.int32(2))
    .compile()
    .as_text()
  )
  assert _computes_two_position_logits(text, vocab)
  # Negative control: a program that discards a two-position call's logits has no such result.
  steps, params = step_models.as_step_model(drafter)
  encoded = target.steps.encode(target.params, jnp.full((1, 8), 3, jnp.int32), jnp.ones((1, 8)))

  @jax.jit
  def discarding(params, encoded):
    cache = steps.init_cache(params, encoded, jnp.ones((1, 8), jnp.int32), 16)
    _, cache = steps.step(params, jnp.full((1, 2), 3, jnp.int32), cache)
    return steps.step(params, jnp.full((1, 1), 3, jnp.int32), cache)[0]

  control = discarding.lower(params, encoded).compile().as_text()
  assert not _computes_two_position_logits(control, vocab)


def test_timers_run_a_drafter_that_reads_the_target_states():
  """An EAGLE-style drafter is timed as the loop runs it (`decode.draft` with the last pass's
  states; its bare step reads zero states), and such a drafter cannot be timed by `step` alone."""
  target = _tiny('tiny-v1.1')
  config = dataclasses.replace(
    t5.CONFIGS['tiny-v1.0'], num_encoder_layers=0, encoder_dim=32, feature_dim=32,
    num_decoder_layers=1,
  )  # fmt: skip
  drafter = t5.T5Model(config, t5.init_params(jax.random.key(1), config))
  kw = dict(batch_size=1, source_length=8, cache_len=32, repeats=1, calls=(1, 3))
  assert timing.step_seconds(drafter, target=target, **kw) >= 0
  assert timing.iteration_seconds(target, drafter, gamma=3, **kw) >= 0
  costs = timing.step_costs(target, drafter, batch_size=1, source_length=8, gamma=2, rounds=1)
  assert costs['c'] >= 0 and costs['pass_cost'] > 0
