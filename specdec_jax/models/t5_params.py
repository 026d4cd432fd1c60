"""T5 params: `init_params` (the layout T5X names, with its initialisers) and `param_count`.
Re-exported by `models.t5`."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from specdec_jax.models.t5_config import T5Config

Params = Any  # nested dicts of arrays, the layout `init_params` builds


def param_count(params: Params) -> int:
  """Number of parameters in a params pytree (of arrays or shape structs)."""
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


def init_params(rng: jax.Array, config: T5Config) -> Params:
  """Random float32 params with T5X's initialisers.

  Embedding ~ N(0, 1); kernels truncated-normal with variance 1 / fan_in, the query kernels with
  1 / (D * H) (the attention's 1/sqrt(H) folded in); relative-position tables uniform with
  variance 1 / fan_avg; norm scales 1. Logits of a random model are then O(1).
  """
  d, f, nh = config.d_model, config.d_ff, config.num_heads * config.d_kv
  d_enc = config.encoder_dim or d
  init = jax.nn.initializers
  kernel = init.variance_scaling(1.0, 'fan_in', 'truncated_normal')
  query = init.variance_scaling(1.0 / config.d_kv, 'fan_in', 'truncated_normal')
  relpos = init.variance_scaling(1.0, 'fan_avg', 'uniform')
  scale = init.ones

  def attention(kv_dim=d):
    return {
      'query': {'kernel': ((d, nh), query)},
      'key': {'kernel': ((kv_dim, nh), kernel)},
      'value': {'kernel': ((kv_dim, nh), kernel)},
      'out': {'kernel': ((nh, d), kernel)},
    }

  def mlp():
    names = ('wi_0', 'wi_1') if config.feed_forward == 'gated-gelu' else ('wi',)
    return {
      **{name: {'kernel': ((d, f), kernel)} for name in names},
      'wo': {'kernel': ((f, d), kernel)},
    }

  def norm():
    return {'scale': ((d,), scale)}

  relpos_bias = {
    'rel_embedding': ((config.num_heads, config.relative_attention_num_buckets), relpos)
  }
  encoder = {'relpos_bias': relpos_bias, 'encoder_norm': norm()}
  for i in range(config.num_encoder_layers):
    encoder[f'layers_{i}'] = {
      'pre_attention_layer_norm': norm(),
      'attention': attention(),
      'pre_mlp_layer_norm': norm(),
      'mlp': mlp(),
    }
  decoder = {'relpos_bias': relpos_bias, 'decoder_norm': norm()}
  for i in range(config.num_decoder_layers):
    decoder[f'layers_{i}'] = {
      'pre_self_attention_layer_norm': norm(),
      'self_attention': attention(),
      'pre_cross_attention_layer_norm': norm(),
      'encoder_decoder_attention': attention(d_enc),
      'pre_mlp_layer_norm': norm(),
      'mlp': mlp(),
    }
  if not config.tie_word_embeddings:
    decoder['logits_dense'] = {'kernel': ((d, config.vocab_size), kernel)}
  if config.feature_dim:
    decoder['feature_in'] = {'kernel': ((config.feature_dim, d), kernel)}
    if not config.block_size:  # a block drafter predicts no states
      decoder['feature_out'] = {'kernel': ((d, config.feature_dim), kernel)}
  if config.block_size:
    decoder['block_queries'] = {'embedding': ((config.block_size - 1, d), init.normal(1.0))}
  specs = {
    'token_embedder': {'embedding': ((config.vocab_size, d), init.normal(1.0))},
    'encoder': encoder,
    'decoder': decoder,
  }
  if config.num_encoder_layers == 0:
    del specs['encoder']

  is_spec = lambda x: isinstance(x, tuple) and len(x) == 2 and callable(x[1])
  leaves, treedef = jax.tree.flatten(specs, is_leaf=is_spec)
  keys = jax.random.split(rng, len(leaves))
  return treedef.unflatten(
    [initializer(key, shape, jnp.float32) for key, (shape, initializer) in zip(keys, leaves)]
  )
