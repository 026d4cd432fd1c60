"""An EAGLE-style drafter's input adapter (`T5Config.feature_dim`): each input's vector is its
token's embedding plus a projection of the target's state at the position before it (Li et al.
2024). The decoder stack itself knows no role (`t5_layers.decoder`)."""

import jax

from specdec_jax.models.t5_config import T5Config
from specdec_jax.models.t5_layers import dense
from specdec_jax.models.t5_params import Params


def feature_inputs(
  params: Params, x: jax.Array, features: jax.Array, config: T5Config
) -> jax.Array:
  """x [B, T, D] (the tokens' embeddings) + `decoder/feature_in`(features [B, T, feature_dim])."""
  return x + dense(features, params['decoder']['feature_in'], config)
