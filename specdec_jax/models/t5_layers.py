"""T5's layers, the pure functions `models.t5`'s encode / decode / forward are made of: the
relative-position bias, dense and RMS-norm, attention, the MLP, embedding and output logits, the
cross-attention keys and values, and the decoder stack (`decoder`: every decoder pass, cached or
teacher-forced, a chain, a block drafter's slots or a token tree, runs it).

Params are the nested dicts `t5_params.init_params` builds; see `models.t5` for the numerics and
the axis legend (B batch, T query length, S key length, N heads, H head dim, D model dim).
"""

import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax import sharding
from specdec_jax.models import t5_relpos
from specdec_jax.models.t5_config import T5Config
from specdec_jax.models.t5_dropout import Dropout, dropper
from specdec_jax.models.t5_layout import Layout
from specdec_jax.models.t5_params import Params

# Masked attention logits. Finite, so a row with every key masked (an all-padding source) gives a
# uniform softmax rather than NaN; scores are float32 whatever the model dtype.
MASKED = -1e30


# ---------------------------------------------------------------------------------------------
# Relative position bias (the buckets: `t5_relpos`).


def relpos_bias(
  rel_embedding: jax.Array,
  q_pos: jax.Array,
  k_pos: jax.Array,
  *,
  bidirectional: bool,
  config: T5Config,
) -> jax.Array:
  """f32[B|1, N, T, S] bias from the table rel_embedding [N, buckets], q_pos [B|1, T], k_pos
  [S] or [B|1, S]."""
  buckets = t5_relpos.relative_position_bucket(
    k_pos[..., None, :] - q_pos[..., None],
    bidirectional=bidirectional,
    num_buckets=config.relative_attention_num_buckets,
    max_distance=config.relative_attention_max_distance,
  )
  return jnp.moveaxis(rel_embedding.astype(jnp.float32)[:, buckets], 0, 1)


# ---------------------------------------------------------------------------------------------
# Layers.


def dense(x: jax.Array, p: Params, config: T5Config) -> jax.Array:
  """x [..., I] @ p['kernel'] [I, O] -> [..., O] in the model dtype; a fused layout's stacked
  kernel [I, K, O] (models/t5_fused.py) gives [..., K, O] from the one dot."""
  dtype = jnp.dtype(config.dtype)
  kernel = p['kernel'].astype(dtype)
  spec = '...i,io->...o' if kernel.ndim == 2 else '...i,iko->...ko'
  return jnp.einsum(spec, x.astype(dtype), kernel)


def rms_norm(x: jax.Array, p: Params, config: T5Config) -> jax.Array:
  """T5 layer norm of x [..., D]: no mean subtraction, no bias; float32 inside."""
  x32 = x.astype(jnp.float32)
  variance = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(variance + config.layer_norm_epsilon)
  return (y * p['scale'].astype(jnp.float32)).astype(x.dtype)


def heads(
  p: Params, x: jax.Array, config: T5Config, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> jax.Array:
  """Query, key or value projection: x [B, T, D] -> [B, T, N, H]."""
  y = dense(x, p, config)
  y = y.reshape(*y.shape[:-1], config.num_heads, config.d_kv)
  return sharding.constrain(y, ('batch', 'length', 'heads', 'kv'), rules)


def self_qkv(
  p: Params, x: jax.Array, config: T5Config, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """A decoder self-attention's queries, keys and values, each [B, T, N, H]: one dot on the
  fused layout's kernel [D, 3, N H] where the params hold one (models/t5_fused.py), else three."""
  if 'qkv' not in p:
    return tuple(heads(p[name], x, config, rules) for name in ('query', 'key', 'value'))
  y = dense(x, p['qkv'], config).reshape(*x.shape[:-1], 3, config.num_heads, config.d_kv)
  axes = ('batch', 'length', 'heads', 'kv')
  return tuple(sharding.constrain(y[..., i, :, :], axes, rules) for i in range(3))


def attention(
  p: Params,
  q: jax.Array,
  k: jax.Array,
  v: jax.Array,
  bias: jax.Array | None,
  mask: jax.Array,
  config: T5Config,
) -> jax.Array:
  """Multi-head attention and output projection.

  Args:
    p: the attention's params (its 'out' kernel is used here).
    q: [B, T, N, H] queries.
    k: [B, S, N, H] keys.
    v: [B, S, N, H] values.
    bias: f32[B|1, N, T, S] relative-position bias, or None.
    mask: bool[B|1, 1, T|1, S] True where a query may attend to a key.
    config: model config.

  Returns:
    [B, T, D] in the model dtype.
  """
  scores = jnp.einsum('btnh,bsnh->bnts', q, k, preferred_element_type=jnp.float32)
  if bias is not None:
    scores = scores + bias
  weights = jax.nn.softmax(jnp.where(mask, scores, MASKED), axis=-1).astype(v.dtype)
  out = jnp.einsum('bnts,bsnh->btnh', weights, v)
  return dense(out.reshape(*out.shape[:2], -1), p['out'], config)


def mlp(
  p: Params, x: jax.Array, config: T5Config, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> jax.Array:
  """x [B, T, D] -> [B, T, D]: ReLU (v1.0) or gated tanh-GELU (v1.1)."""
  if 'wi_fused' in p:  # gated, wi_0 and wi_1 stacked [D, 2, F] (models/t5_fused.py)
    y = dense(x, p['wi_fused'], config)
    h = jax.nn.gelu(y[..., 0, :], approximate=True) * y[..., 1, :]
  elif config.feed_forward == 'gated-gelu':
    h = jax.nn.gelu(dense(x, p['wi_0'], config), approximate=True) * dense(x, p['wi_1'], config)
  else:
    h = jax.nn.relu(dense(x, p['wi'], config))
  h = sharding.constrain(h, ('batch', 'length', 'mlp'), rules)
  return dense(h, p['wo'], config)


def embed(
  params: Params,
  tokens: jax.Array,
  config: T5Config,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> jax.Array:
  """tokens int32[B, T] -> [B, T, D] in the model dtype (an id >= V embeds as NaN)."""
  x = jnp.take(params['token_embedder']['embedding'], tokens, axis=0).astype(config.dtype)
  return sharding.constrain(x, ('batch', 'length', 'embed'), rules)


def logits(
  params: Params, y: jax.Array, config: T5Config, rules: sharding.Rules = sharding.DEFAULT_RULES
) -> jax.Array:
  """Output layer: normed decoder states y [B, T, D] -> f32[B, T, V]."""
  dtype = jnp.dtype(config.dtype)
  if config.tie_word_embeddings:
    # Mesh TF rescales before the tied output layer (HF: `scale_decoder_outputs`).
    embedding = params['token_embedder']['embedding'].astype(dtype)
    tied = lambda y, kernel: jnp.einsum(
      'btd,dv->btv', y, kernel, preferred_element_type=jnp.float32
    )
    # XLA:CPU runs the embedding read transposed ([V, D] contracted on D) many times slower than
    # the same dot on a [D, V] kernel from two rows on (docs/performance.md, "Few-row dots"): on a
    # CPU the kernel is a transposed copy that XLA cannot fold back into the dot (the decode
    # loops hoist it, the embedding being loop-invariant); elsewhere the layout is free.
    out = jax.lax.platform_dependent(
      y * config.d_model**-0.5,
      embedding,
      cpu=lambda y, e: tied(y, jax.lax.optimization_barrier(e.T)),
      default=lambda y, e: tied(y, e.T),
    )
  else:
    kernel = params['decoder']['logits_dense']['kernel'].astype(dtype)
    out = jnp.einsum('btd,dv->btv', y, kernel, preferred_element_type=jnp.float32)
  return sharding.constrain(out, ('batch', 'length', 'vocab'), rules)


def cross_kv(
  params: Params,
  encoded: jax.Array,
  config: T5Config,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> tuple[jax.Array, jax.Array]:
  """Encoder-decoder attention keys and values of every decoder layer: 2 x [L, B, S_enc, N, H]."""
  layers = [
    params['decoder'][f'layers_{i}']['encoder_decoder_attention']
    for i in range(config.num_decoder_layers)
  ]
  k = jnp.stack([heads(a['key'], encoded, config, rules) for a in layers])
  v = jnp.stack([heads(a['value'], encoded, config, rules) for a in layers])
  return k, v


def decoder(
  params: Params,
  x: jax.Array,
  cross_k: jax.Array,
  cross_v: jax.Array,
  encoder_mask: jax.Array,
  *,
  layout: Layout,
  config: T5Config,
  self_cache: tuple[jax.Array, jax.Array, jax.Array] | None = None,
  dropout: Dropout = None,
  taps: tuple[int, ...] | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
):
  """The decoder stack on T embedded inputs, up to its final norm (`logits` is the output layer).

  It knows no role: the callers build its inputs (`embed`; an EAGLE-style drafter's features,
  `t5_eagle.feature_inputs`; a block drafter's query slots, `t5_block.slot_inputs`) and their
  `t5_layout.Layout` (a chain, a block call's slots, a token tree, a packed training row).

  Args:
    params: model params.
    x: [B, T, D] the inputs' vectors.
    cross_k: [L, B, S_enc, N, H] encoder-decoder attention keys.
    cross_v: [L, B, S_enc, N, H] encoder-decoder attention values.
    encoder_mask: bool[B, S_enc] real encoder positions.
    layout: the inputs' positions, the keys' positions and the mask (`t5_layout`).
    config: model config.
    self_cache: None without a cache (the inputs attend only to each other, keys at
      `layout.k_pos` = the inputs' positions), or (self_k, self_v, end_index): [L, B, S_max, N, H]
      twice and int32[B]; the inputs' keys/values are written at slots end_index[b] + t, and they
      attend to the cache.
    dropout: (key, rate) for training (see `t5.forward`), or None.
    taps: decoder layers whose outputs to return as well (`T5Config.feature_layers`), or None.

  Returns:
    the normed final states [B, T, D], and the updated (self_k, self_v) (None without a cache);
    with `taps`, a third item [B, T, len(taps) x D]: the residual stream after each tapped layer,
    normed by the final norm, concatenated in the order given (the last layer's is the final
    states).
  """
  if taps is not None and not all(0 <= i < config.num_decoder_layers for i in taps):
    raise ValueError(
      f'Decoder layers {tuple(taps)} asked for, but this T5 has {config.num_decoder_layers} '
      f'(0..{config.num_decoder_layers - 1}).'
    )
  dec = params['decoder']
  q_pos, k_pos, attend = layout.q_pos, layout.k_pos, layout.mask
  if self_cache is not None:
    self_k, self_v, end_index = self_cache
  bias = relpos_bias(
    dec['relpos_bias']['rel_embedding'], q_pos, k_pos, bidirectional=False, config=config
  )
  # Causal within the chunk; also hides stale cache slots (>= end_index + T) left by rejections.
  self_mask = (k_pos[..., None, :] <= q_pos[..., None] if attend is None else attend)[:, None]
  cross_mask = encoder_mask[:, None, None, :]

  drop = dropper(dropout, stream=1)
  x = drop(x, 0)
  tapped = {}
  for i in range(config.num_decoder_layers):
    layer = dec[f'layers_{i}']
    h = rms_norm(x, layer['pre_self_attention_layer_norm'], config)
    a = layer['self_attention']
    q, k, v = self_qkv(a, h, config, rules)
    if self_cache is not None:
      self_k = cache_lib.write(self_k, k, end_index, layer=i)
      self_v = cache_lib.write(self_v, v, end_index, layer=i)
      k, v = self_k[i], self_v[i]
    x = x + drop(attention(a, q, k, v, bias, self_mask, config), 3 * i + 1)
    h = rms_norm(x, layer['pre_cross_attention_layer_norm'], config)
    a = layer['encoder_decoder_attention']
    q = heads(a['query'], h, config, rules)
    x = x + drop(attention(a, q, cross_k[i], cross_v[i], None, cross_mask, config), 3 * i + 2)
    y = mlp(layer['mlp'], rms_norm(x, layer['pre_mlp_layer_norm'], config), config, rules)
    x = x + drop(y, 3 * i + 3)
    x = sharding.constrain(x, ('batch', 'length', 'embed'), rules)
    if taps is not None and i in taps:
      tapped[i] = rms_norm(x, dec['decoder_norm'], config)
  states = drop(rms_norm(x, dec['decoder_norm'], config), 3 * config.num_decoder_layers + 1)
  kv = None if self_cache is None else (self_k, self_v)
  if taps is None:
    return states, kv
  return states, kv, jnp.concatenate([tapped[i] for i in taps], axis=-1)
