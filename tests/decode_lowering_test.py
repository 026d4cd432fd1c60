"""Tests of `decode.lower_speculative` / `lower_generate`: abstract inputs lower the real program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from tests import fakes, helpers

TARGET = fakes.random_markov(seed=1, vocab_size=8, positions=16)
DRAFTER = fakes.random_markov(seed=2, vocab_size=8, positions=16)


def _abstract(model):
  """The model with every param replaced by its `jax.ShapeDtypeStruct`."""
  return fakes.MarkovModel(model.steps, jax.eval_shape(lambda: model.params))


def _source():
  mask = np.array([[1, 1, 1], [1, 1, 0]], np.int32)
  return jnp.asarray(np.array([[3, 4, 5], [6, 7, 0]], np.int32)), jnp.asarray(mask)


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_abstract_lowering_is_the_program_a_call_runs(temperature):
  ids, mask = _source()
  kw = dict(sampling=sampling_lib.SamplingConfig(temperature=temperature), max_new_tokens=9)
  abstract_ids = jax.ShapeDtypeStruct(ids.shape, ids.dtype)
  abstract_mask = jax.ShapeDtypeStruct(mask.shape, jnp.bool_)  # cast to int32 as a call does
  lowered = decode.lower_speculative(
    _abstract(TARGET), _abstract(DRAFTER), abstract_ids, abstract_mask, gamma=3, **kw
  )
  concrete = decode.lower_speculative(TARGET, DRAFTER, ids, mask, gamma=3, **kw)
  assert lowered.as_text() == concrete.as_text()
  # The compiled program, run on real values, gives what speculative_generate gives.
  rng = jax.random.key(4)
  got = lowered.compile()(TARGET.params, DRAFTER.params, ids, mask, rng)
  want = decode.speculative_generate(TARGET, DRAFTER, ids, mask, gamma=3, rng=rng, **kw)
  np.testing.assert_array_equal(got.tokens, want.tokens)
  np.testing.assert_array_equal(got.stats.accepted, want.stats.accepted)

  lowered = decode.lower_generate(_abstract(TARGET), abstract_ids, abstract_mask, **kw)
  assert lowered.as_text() == decode.lower_generate(TARGET, ids, mask, **kw).as_text()
  compiled = lowered.compile()
  assert compiled.memory_analysis().argument_size_in_bytes >= TARGET.params['table'].nbytes
  got = compiled(TARGET.params, ids, mask, rng)
  want = decode.generate(TARGET, ids, mask, rng=rng, **kw)
  np.testing.assert_array_equal(got.tokens, want.tokens)


def test_lowering_a_different_gamma_gives_a_different_program():
  """Negative control for the text comparison above: it can see a change of program."""
  ids, mask = _source()
  kw = dict(sampling=sampling_lib.SamplingConfig(temperature=1.0), max_new_tokens=9)
  two = decode.lower_speculative(TARGET, DRAFTER, ids, mask, gamma=2, **kw)
  three = decode.lower_speculative(TARGET, DRAFTER, ids, mask, gamma=3, **kw)
  assert two.as_text() != three.as_text()


def test_abstract_inputs_are_still_validated():
  kw = dict(gamma=2, sampling=sampling_lib.SamplingConfig(temperature=0.0), max_new_tokens=4)
  floats = jax.ShapeDtypeStruct((2, 3), jnp.float32)
  ints = jax.ShapeDtypeStruct((2, 3), jnp.int32)
  with pytest.raises(TypeError, match='integer token ids'):
    decode.lower_speculative(TARGET, DRAFTER, floats, ints, **kw)
  with pytest.raises(ValueError, match=r'\[batch, length\]'):
    decode.lower_speculative(TARGET, DRAFTER, ints, jax.ShapeDtypeStruct((2, 4), jnp.int32), **kw)
  with pytest.raises(TypeError, match='input_mask must be bool or 0/1'):
    decode.lower_generate(TARGET, ints, floats, sampling=kw['sampling'], max_new_tokens=4)
  with pytest.raises(ValueError, match='vocabularies differ'):
    decode.lower_speculative(TARGET, fakes.random_markov(0, vocab_size=5), ints, ints, **kw)
  with pytest.raises(ValueError, match='gamma must be >= 1'):
    decode.lower_speculative(TARGET, DRAFTER, ints, ints, **dict(kw, gamma=0))


# An 11B-style plan in miniature: a tiny T5 pair's params and batch given only as sharded
# `ShapeDtypeStruct`s on a (data=2, model=4) mesh of 8 CPU devices; the program compiles and its
# per-device arguments are exactly the shards its shardings give (plus the PRNG key).
_SHARDED_SCRIPT = """
import dataclasses, math
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from specdec_jax import decode, sharding
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig

assert jax.device_count() == 8, jax.devices()
mesh = sharding.make_mesh(data=2, model=4)

def abstract(name):
  # One layer a side: the sharding of every kind of parameter, at half the compile time.
  config = dataclasses.replace(t5.CONFIGS[name], num_encoder_layers=1, num_decoder_layers=1)
  shapes = jax.eval_shape(lambda: t5.init_params(jax.random.key(0), config))
  shardings = sharding.param_shardings(shapes, mesh)
  return t5.T5Model(config=config, params=jax.tree.map(
      lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings))

target, drafter = abstract('tiny-v1.1'), abstract('tiny-v1.0')
ids = jax.ShapeDtypeStruct((4, 9), jnp.int32, sharding=NamedSharding(mesh, P('data', None)))
with jax.set_mesh(mesh):
  compiled = decode.lower_speculative(target, drafter, ids, ids, gamma=3,
                                      sampling=SamplingConfig(temperature=1.0),
                                      max_new_tokens=12).compile()
sharded = compiled.memory_analysis().argument_size_in_bytes
# Per device: each argument's shard (the model-split params a quarter, the batch a half, the
# params too small to split whole), and the PRNG key's 2 uint32 words.
args = jax.tree.leaves((target, drafter, ids, ids))
per_device = sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in args)
key_bytes = jax.random.key_data(jax.random.key(0)).nbytes
replicated = sum(x.size * x.dtype.itemsize for x in args)  # what one unsharded device holds
assert per_device < replicated / 3, (per_device, replicated)  # the expectation itself shards
assert sharded == per_device + key_bytes, (sharded, per_device, key_bytes)
assert compiled.cost_analysis()['flops'] > 0
print('LOWER_SHARDED_OK', sharded, per_device, replicated)
"""


def test_sharded_abstract_lowering_compiles_on_8_devices():
  helpers.run_on_cpu_devices(_SHARDED_SCRIPT, 'LOWER_SHARDED_OK')
