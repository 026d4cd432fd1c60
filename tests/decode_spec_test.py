"""Tests of `decode.LoopSpec` and the jitted loops it drives: the greedy fast path against the
general path, one program per spec, and the spec's validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, verify
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing
from tests import fakes
from tests.helpers import GREEDY, ONE_HOT, ragged_source

# ---------------------------------------------------------------------------------------------
# The greedy fast path (argmax ids, no probability vectors) against the general path.


def _both_paths(target, drafter, ids, mask, *, gamma, verifier, max_new_tokens):
  """(fast, general) outputs of the jitted loop: at temperature 0, and by the general path on the
  same one-hot vectors (`ONE_HOT`); drafter None: autoregressive."""
  ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
  spec = lambda fast: decode.LoopSpec(
    sampling=GREEDY if fast else ONE_HOT,
    max_new_tokens=max_new_tokens,
    gamma=gamma,
    verifier=verifier,
  )
  if drafter is None:
    run = lambda fast: decode.autoregressive_loop(
      target.steps, target.params, ids, mask, jax.random.key(0), spec=spec(fast)
    )
  else:
    run = lambda fast: decode.speculative_loop(
      target.steps,
      target.params,
      drafter.steps,
      drafter.params,
      ids,
      mask,
      jax.random.key(0),
      spec=spec(fast),
    )
  return run(True), run(False)


def _assert_same_output(fast, general):
  np.testing.assert_array_equal(fast.tokens, general.tokens)
  np.testing.assert_array_equal(fast.lengths, general.lengths)
  for name in ('target_calls', 'accepted', 'accepted_per_position', 'beta_count'):
    np.testing.assert_array_equal(getattr(fast.stats, name), getattr(general.stats, name))
  np.testing.assert_allclose(fast.stats.beta_sum, general.stats.beta_sum)


def _noisy_copy(model, seed, noise):
  """A drafter that agrees with `model`'s argmax often, not always."""
  table = model.params['table']
  table = table + noise * jax.random.normal(jax.random.key(seed), table.shape)
  return fakes.MarkovModel(model.steps, {'table': table})


@pytest.mark.parametrize('verifier', ['token', 'block'])
@pytest.mark.parametrize('gamma', [1, 4])
def test_greedy_fast_path_matches_general_path_markov(verifier, gamma):
  target = fakes.random_markov(seed=11, vocab_size=16, positions=40, eos_id=1)
  drafter = _noisy_copy(target, seed=12, noise=1.0)
  ids, mask = jnp.zeros((64, 1), jnp.int32), jnp.ones((64, 1), jnp.int32)
  fast, general = _both_paths(
    target, drafter, ids, mask, gamma=gamma, verifier=verifier, max_new_tokens=30
  )
  assert 0 < int(fast.stats.accepted.sum()) < int(fast.stats.drafted.sum())
  _assert_same_output(fast, general)
  _assert_same_output(
    *_both_paths(target, None, ids, mask, gamma=0, verifier='token', max_new_tokens=30)
  )


_GREEDY_VERIFY = verify.greedy_verify


def _off_by_one_greedy_verify(draft_tokens, target_ids):
  """Plausible bug: the corrected token read one position too far."""
  tau, _ = _GREEDY_VERIFY(draft_tokens, target_ids)
  gamma = draft_tokens.shape[1]
  y = jnp.take_along_axis(target_ids, jnp.minimum(tau + 1, gamma)[:, None], axis=1)[:, 0]
  return tau, y


def test_negative_control_greedy_fast_path_off_by_one_differs(monkeypatch):
  target = fakes.random_markov(seed=11, vocab_size=16, positions=40, eos_id=1)
  drafter = _noisy_copy(target, seed=12, noise=1.0)
  ids, mask = jnp.zeros((64, 1), jnp.int32), jnp.ones((64, 1), jnp.int32)
  monkeypatch.setattr(verify, 'greedy_verify', _off_by_one_greedy_verify)
  jax.clear_caches()
  fast, general = _both_paths(
    target, drafter, ids, mask, gamma=3, verifier='token', max_new_tokens=30
  )
  monkeypatch.undo()
  jax.clear_caches()
  assert (np.asarray(fast.tokens) != np.asarray(general.tokens)).any()


@pytest.mark.parametrize('verifier', ['token', 'block'])
def test_greedy_fast_path_matches_general_path_t5(verifier, tiny_pair):
  target, drafter = tiny_pair
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  fast, general = _both_paths(
    target, drafter, ids, mask, gamma=3, verifier=verifier, max_new_tokens=16
  )
  _assert_same_output(fast, general)


# ---------------------------------------------------------------------------------------------
# One program per spec.


def test_greedy_token_and_block_share_one_program():
  """At temperature 0 both verifiers keep the same tokens, so the spec names one program;
  sampling, they are two."""
  target = fakes.random_markov(seed=41, vocab_size=6, positions=12)
  drafter = fakes.random_markov(seed=42, vocab_size=6, positions=12)
  ids, mask = ragged_source(vocab=6)
  for sampling, programs in [(GREEDY, 1), (sampling_lib.SamplingConfig(temperature=1.0), 2)]:
    kw = dict(sampling=sampling, max_new_tokens=7, rng=jax.random.key(0))
    decode.speculative_generate(target, drafter, ids, mask, gamma=2, verifier='token', **kw)
    with timing.compiles() as compiled:
      decode.speculative_generate(target, drafter, ids, mask, gamma=2, verifier='block', **kw)
    loops = [name for name in compiled if 'speculative_loop' in name]
    assert len(loops) == programs - 1, (sampling, compiled)


def test_loop_spec_normalizes_only_the_greedy_fast_path():
  spec = lambda **kw: decode.LoopSpec(max_new_tokens=4, gamma=2, verifier='block', **kw)
  token = decode.LoopSpec(sampling=GREEDY, max_new_tokens=4, gamma=2, verifier='token')
  assert spec(sampling=GREEDY) == token and hash(spec(sampling=GREEDY)) == hash(token)
  # The general path on greedy's one-hot vectors runs the named verifier; so does sampling.
  assert spec(sampling=ONE_HOT).verifier == 'block'
  assert spec(sampling=sampling_lib.SamplingConfig(temperature=1.0)).verifier == 'block'
  assert decode.LoopSpec(sampling=GREEDY, max_new_tokens=4).buffer_length == 4 + 0 + 2


@pytest.mark.parametrize(
  'kw, error, match',
  [
    (dict(verifier='nope'), ValueError, 'Unknown verifier'),
    (dict(gamma=-1), ValueError, 'gamma must be >= 0'),
    (dict(gamma=2.0), TypeError, 'gamma must be an int'),
    (dict(max_new_tokens=0), ValueError, 'max_new_tokens must be >= 1'),
    (dict(sampling=None), TypeError, 'sampling must be a sampling.SamplingConfig'),
  ],
)
def test_loop_spec_refuses_bad_fields(kw, error, match):
  with pytest.raises(error, match=match):
    decode.LoopSpec(**{'sampling': GREEDY, 'max_new_tokens': 4, 'gamma': 2, **kw})


def test_loops_refuse_a_spec_of_the_other_kind():
  model, ids = fakes.random_markov(seed=1), jnp.zeros((1, 1), jnp.int32)
  args = (ids, ids + 1, jax.random.key(0))
  autoregressive = decode.LoopSpec(sampling=GREEDY, max_new_tokens=2)
  with pytest.raises(ValueError, match=r'spec.gamma >= 1, got 0'):
    decode.speculative_loop(
      model.steps, model.params, model.steps, model.params, *args, spec=autoregressive
    )
  with pytest.raises(ValueError, match='spec.gamma must be 0, got 2'):
    decode.autoregressive_loop(
      model.steps,
      model.params,
      *args,
      spec=decode.LoopSpec(sampling=GREEDY, max_new_tokens=2, gamma=2),
    )
