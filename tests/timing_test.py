"""Timing loops: one compiled program per model shape, whatever the loop lengths."""

import jax

from specdec_jax import timing
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
