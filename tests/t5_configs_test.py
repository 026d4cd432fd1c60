"""The published configs of `t5.CONFIGS` against the HF and T5X naming tables and known published
shapes (abstract params from `jax.eval_shape`: no weights, no allocation)."""

import math

import pytest

from specdec_jax import checkpoints
from specdec_jax.checkpoints import common as checkpoint_utils
from specdec_jax.checkpoints import t5x as checkpoints_t5x
from specdec_jax.models import t5

PUBLISHED = [
  *(f't5-{size}' for size in ('small', 'base', 'large', '3b', '11b')),
  *(f't5_1_1-{size}' for size in ('small', 'base', 'large', 'xl', 'xxl')),
  *(f'flan-t5-{size}' for size in ('small', 'base', 'large', 'xl', 'xxl')),
]


def _shapes(config: t5.T5Config) -> dict[str, tuple[int, ...]]:
  """Names and shapes of `t5.init_params(config)` via `jax.eval_shape` (cached per config)."""
  return checkpoint_utils.param_shapes(config)


def _hf_shapes(name: str) -> dict[str, tuple[int, ...]]:
  """The HF state-dict shapes of a config's params (HF stores kernels as [out, in])."""
  config = t5.CONFIGS[name]
  shapes = _shapes(config)
  return {
    theirs: shapes[ours][::-1] if transposed else shapes[ours]
    for ours, (theirs, transposed) in checkpoints.hf_names(config).items()
  }


@pytest.mark.parametrize('name', PUBLISHED)
def test_published_config_matches_the_naming_tables(name):
  config = t5.CONFIGS[name]
  shapes = _shapes(config)
  assert set(checkpoints.hf_names(config)) == set(shapes)
  assert set(checkpoints_t5x.t5x_names(config)) == set(shapes)
  # T5X checkpoints carry no config: the one inferred from these shapes is this one.
  assert checkpoints_t5x.infer_t5x_config(shapes) == config
  hf = _hf_shapes(name)
  assert hf['shared.weight'] == (32128, config.d_model)
  layers = config.num_encoder_layers
  assert f'encoder.block.{layers - 1}.layer.1.DenseReluDense.wo.weight' in hf
  assert f'encoder.block.{layers}.layer.0.SelfAttention.q.weight' not in hf
  # v1.0 ties the output layer to the embedding; v1.1 and FLAN-T5 have their own lm_head.
  assert ('lm_head.weight' in hf) == name.startswith(('t5_1_1', 'flan'))


# Shapes as published in the HF checkpoints (state dict names, [out, in]) and T5X's (ours).
KNOWN = {
  't5-small': {
    'shared.weight': (32128, 512),
    'encoder.block.5.layer.1.DenseReluDense.wi.weight': (2048, 512),
    'decoder.block.5.layer.1.EncDecAttention.k.weight': (512, 512),
    'encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight': (32, 8),
  },
  't5_1_1-xxl': {
    'shared.weight': (32128, 4096),
    'lm_head.weight': (32128, 4096),
    'encoder.block.23.layer.1.DenseReluDense.wi_0.weight': (10240, 4096),
    'decoder.block.23.layer.2.DenseReluDense.wo.weight': (4096, 10240),
    'decoder.block.0.layer.0.SelfAttention.q.weight': (4096, 4096),
    'decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight': (32, 64),
  },
  'flan-t5-xl': {
    'shared.weight': (32128, 2048),
    'lm_head.weight': (32128, 2048),
    'encoder.block.23.layer.1.DenseReluDense.wi_1.weight': (5120, 2048),
    'encoder.block.0.layer.0.SelfAttention.o.weight': (2048, 2048),
    'encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight': (32, 32),
  },
}
KNOWN_T5X = {
  't5_1_1-xxl': {
    'encoder/layers_0/mlp/wi_0/kernel': (4096, 10240),
    'decoder/logits_dense/kernel': (4096, 32128),
    'encoder/relpos_bias/rel_embedding': (64, 32),
  },
  't5-11b': {
    'encoder/layers_23/mlp/wi/kernel': (1024, 65536),
    'encoder/layers_0/attention/query/kernel': (1024, 16384),
  },
}
# Parameter counts that HF reports for the published checkpoints (`model.num_parameters()`,
# counting the tied embedding once).
KNOWN_COUNTS = {'t5-small': 60_506_624, 't5-base': 222_903_552}


@pytest.mark.parametrize('name', list(KNOWN))
def test_published_hf_shapes(name):
  hf = _hf_shapes(name)
  for theirs, shape in KNOWN[name].items():
    assert hf[theirs] == shape, theirs


@pytest.mark.parametrize('name', list(KNOWN_T5X))
def test_published_t5x_shapes(name):
  shapes = _shapes(t5.CONFIGS[name])
  for ours, shape in KNOWN_T5X[name].items():
    assert shapes[ours] == shape, ours


@pytest.mark.parametrize('name', list(KNOWN_COUNTS))
def test_published_parameter_counts(name):
  shapes = _shapes(t5.CONFIGS[name])
  assert sum(math.prod(s) for s in shapes.values()) == KNOWN_COUNTS[name]


def test_flan_t5_has_the_t5_1_1_architecture():
  for size in ('small', 'base', 'large', 'xl', 'xxl'):
    assert t5.CONFIGS[f'flan-t5-{size}'] == t5.CONFIGS[f't5_1_1-{size}']
