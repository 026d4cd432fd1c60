"""benchmarks/synthetic.py: the benchmarks' T5 models of public shapes, constant or random, in
their dtype, and their shapes by name."""

import jax
import numpy as np
import pytest

from benchmarks import synthetic
from specdec_jax import decode
from specdec_jax.models import t5
from specdec_jax.sampling import SamplingConfig


def test_constant_weights():
  model = synthetic.model(t5.CONFIGS['tiny-v1.0'], dtype='bfloat16', weights='constant')
  assert model.config.dtype == 'bfloat16'
  for leaf in jax.tree.leaves(model.params):
    assert leaf.dtype == np.dtype('bfloat16')
    want = leaf.shape[0] ** -0.5 if leaf.ndim > 1 else 1.0
    np.testing.assert_allclose(np.asarray(leaf, np.float32), want, rtol=1e-2)


def test_random_weights_are_drawn_in_their_dtype_at_their_scale():
  model = synthetic.model(t5.CONFIGS['tiny-v1.1'], dtype='bfloat16', seed=0)
  assert model.config.dtype == 'bfloat16'
  assert all(leaf.dtype == np.dtype('bfloat16') for leaf in jax.tree.leaves(model.params))
  kernel = np.asarray(model.params['decoder']['layers_0']['mlp']['wo']['kernel'], np.float32)
  rows = kernel.shape[0]
  assert np.isfinite(kernel).all() and kernel.std() == pytest.approx(rows**-0.5, rel=0.15)
  norm = np.asarray(model.params['decoder']['decoder_norm']['scale'], np.float32)
  np.testing.assert_array_equal(norm, 1.0)
  other = synthetic.model(t5.CONFIGS['tiny-v1.1'], dtype='bfloat16', seed=1)
  assert not np.array_equal(
    np.asarray(other.params['decoder']['layers_0']['mlp']['wo']['kernel'], np.float32), kernel
  )


@pytest.mark.parametrize('name', ['tiny-v1.0', 'tiny-v1.1'])  # tied and untied output layers
def test_random_models_never_stop(name):
  model = synthetic.model(t5.CONFIGS[name], dtype='float32', seed=1)
  ids = jax.numpy.asarray(np.random.default_rng(0).integers(2, 128, (4, 6)), jax.numpy.int32)
  out = decode.generate(
    model,
    ids,
    jax.numpy.ones_like(ids),
    sampling=SamplingConfig(temperature=0.0),
    max_new_tokens=12,
    rng=jax.random.key(0),
  )
  np.testing.assert_array_equal(out.lengths, 12)


def test_shapes_by_name():
  assert synthetic.shape('t5-11b') is t5.CONFIGS['t5-11b']
  in_bf16 = synthetic.shape('t5-11b', dtype='bfloat16')
  assert in_bf16.dtype == 'bfloat16' and t5.CONFIGS['t5-11b'].dtype == 'float32'
  assert in_bf16.d_model == t5.CONFIGS['t5-11b'].d_model
  with pytest.raises(ValueError, match="Unknown T5 shape 't5-huge'; one of: t5-small"):
    synthetic.shape('t5-huge')
  with pytest.raises(ValueError, match='weights must be one of'):
    synthetic.model(t5.CONFIGS['tiny-v1.0'], dtype='float32', weights='zeros')
