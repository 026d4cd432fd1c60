"""T5 v1.0 and v1.1 encoder-decoders with multi-token, per-row incremental decoding.

Pure functions on a params pytree named as T5X names it (`init_params` builds it; `checkpoints`
maps HF and T5X checkpoints onto it). The numerics are those of T5X and of
HF's `T5ForConditionalGeneration`: pre-norm residual blocks with RMS layer norm (no mean, no bias,
computed in float32); no run-time 1/sqrt(H) attention scaling (it lives in the query kernel); one
relative-position bias table per stack, shared by its layers, bidirectional in the encoder and
causal in the decoder; no position bias in encoder-decoder attention. v1.0 has a ReLU MLP and ties
the output layer to the embedding (logits = (x * D**-0.5) @ embedding.T); v1.1 has a gated-GELU
MLP (tanh-approximate GELU) and an untied `decoder/logits_dense`.

  encoded = encode(params, input_ids, input_mask, config=config)
  cache = init_cache(params, encoded, input_mask, config=config, max_decode_len=64)
  logits, cache = decode(params, tokens, cache, config=config)  # tokens [B, T], any T >= 1
  cache = cache.replace(end_index=...)                           # rewind rows after a rejection

`decode` writes tokens[b, t] at position end_index[b] + t of row b, so rows of one batch can be at
different lengths, and one call can score the gamma + 1 positions of a speculative iteration.
`forward` is the teacher-forced pass (training, and the reference in tests); it runs the same layer
code (`t5_layers`) with the chunk attending only to itself.

Axis legend: B batch, T query length (decoder positions in a call), S key length (S_enc encoder
positions, S_max decoder cache slots), V vocab, N heads, H head dim (d_kv), D model dim, F d_ff,
L layers.
"""

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax import sharding
from specdec_jax.models import t5_block, t5_eagle, t5_layers, t5_layout, t5_tree
from specdec_jax.models.t5_config import CONFIGS, T5Config  # noqa: F401 (part of this API)
from specdec_jax.models.t5_dropout import Dropout, dropper
from specdec_jax.models.t5_layout import Layout
from specdec_jax.models.t5_params import Params, init_params, param_count  # noqa: F401 (API)


@flax.struct.dataclass
class T5Model:
  """A config and its params. A pytree whose leaves are the params (the config is static).

  `rules` are the logical-axis rules its activations are constrained by on a mesh
  (`sharding.constrain`): the default ones for a model sharded over 'model', `sharding.
  REPLICATED_RULES` for one whose params are whole on every device (a replicated drafter, whose
  program then has no collective). Off a mesh they change nothing.
  """

  config: T5Config = flax.struct.field(pytree_node=False)
  params: Params
  rules: sharding.Rules = flax.struct.field(pytree_node=False, default=sharding.DEFAULT_RULES)

  @property
  def has_encoder(self) -> bool:
    return self.config.num_encoder_layers > 0

  @property
  def steps(self) -> 'T5Steps':
    """This model as a step model for the decode loops (see `step_models.StepModel`)."""
    return T5Steps(self.config, self.rules)


@dataclasses.dataclass(frozen=True)
class T5Steps:
  """A T5 model's static half as a step model (see `step_models.StepModel`); hashable."""

  config: T5Config
  rules: sharding.Rules = sharding.DEFAULT_RULES  # its activations' (`T5Model.rules`)
  # The decoder layers `step_states` returns (`tap_states`); None: the final states.
  state_layers: tuple[int, ...] | None = None

  vocab_size = property(lambda self: self.config.vocab_size)
  start_id = property(lambda self: self.config.decoder_start_token_id)
  eos_id = property(lambda self: self.config.eos_token_id)
  max_source_length = property(lambda self: self.config.max_source_length)
  max_target_length = property(lambda self: self.config.max_target_length)
  # No encoder of its own: the decode loops hand it the target's `encode` output.
  shares_target_encoder = property(lambda self: self.config.num_encoder_layers == 0)
  # An EAGLE-style drafter: reads the target's final decoder states (`step_features`).
  reads_target_states = property(lambda self: self.config.feature_dim is not None)
  feature_dim = property(lambda self: self.config.feature_dim)
  # The target's decoder layers such a drafter reads (None: the final states; `tap_states`).
  feature_layers = property(lambda self: self.config.feature_layers)
  # Width of `step_states`' states.
  state_dim = property(lambda self: self.config.d_model * len(self.state_layers or (None,)))
  # A block drafter: the most drafts one `step_block` call proposes (None: token by token).
  block_size = property(lambda self: self.config.block_size)
  # Width of the encoder output its cross-attention reads (a drafter over the target's encoder:
  # the target's d_model), and of what its own `encode` returns (`step_models.check_encoder_reader`).
  encoder_dim = property(lambda self: self.config.encoder_dim or self.config.d_model)
  encoded_dim = property(lambda self: self.config.d_model)

  def encode(self, params, input_ids, input_mask):
    return encode(params, input_ids, input_mask, config=self.config, rules=self.rules)

  def init_cache(self, params, encoded, input_mask, max_decode_len: int):
    return init_cache(
      params, encoded, input_mask, config=self.config, max_decode_len=max_decode_len,
      rules=self.rules,
    )  # fmt: skip

  def step(self, params, tokens, cache):
    if self.block_size is not None:
      raise ValueError(
        'This T5 is a block drafter (block_size is set): it drafts only inside '
        'speculative_generate (step_block); it cannot decode alone or be a target.'
      )
    if self.reads_target_states:
      raise ValueError(
        "This T5 reads the target's decoder states (feature_dim is set): it drafts only inside "
        'speculative_generate, which feeds them (step_features).'
      )
    return decode(params, tokens, cache, config=self.config, rules=self.rules)

  def step_at(self, params, tokens, features, cache, logits_at):
    """`step` (`step_features` with `features`) scoring only tokens[b, logits_at[b]] of each row:
    logits (and predicted features) [B, 1, ...]; the cache advances by T (`decode`'s `logits_at`;
    None: every position)."""
    if features is None:
      logits, cache = decode(
        params, tokens, cache, config=self.config, logits_at=logits_at, rules=self.rules
      )
      return logits, None, cache
    logits, states, cache = decode(
      params, tokens, cache, config=self.config, features=features, return_states=True,
      logits_at=logits_at, rules=self.rules,
    )  # fmt: skip
    return logits, predicted_features(params, states, config=self.config), cache

  def step_block(self, params, tokens, features, cache, gamma: int, num_kept):
    """A block drafter's call: the logits of gamma drafts after the pending token, in one pass.

    Args:
      tokens: int32[B, T] decoder inputs from the cache's end_index: each row's first
        num_kept[b] are kept positions (the last, tokens[b, num_kept[b] - 1], the pending token);
        the rest are unread.
      features: f32[B, T, feature_dim], the target's state at the position before each token.
      cache: the drafter's cache, holding the positions before tokens[:, 0].
      gamma: G <= block_size drafts.
      num_kept: int32[B] in 1..T.

    Returns:
      (logits f32[B, G, V]: draft 1 from the pending token's output, draft i + 1 from query slot
      i, which sits at the position after slot i - 1; the cache caught up on the kept positions,
      end_index advanced by num_kept). The pass is T + G - 1 wide: the slots of a row follow its
      kept tokens and overwrite its unread ones, then lie past end_index, stale.
    """
    if not 1 <= gamma <= self.block_size:
      raise ValueError(f"gamma={gamma} drafts exceed this drafter's block_size={self.block_size}.")
    width = tokens.shape[1] + gamma - 1
    pad = lambda x: jnp.pad(x, [(0, 0), (0, gamma - 1)] + [(0, 0)] * (x.ndim - 2))
    start = cache.end_index
    slots, logits_at, layout = t5_block.step_layout(
      num_kept, start, width, gamma, cache.max_decode_len, self.config.block_attention
    )
    logits, cache = decode(
      params, pad(tokens), cache, config=self.config, features=pad(features), slots=slots,
      logits_at=logits_at, layout=layout, rules=self.rules,
    )  # fmt: skip
    return logits, cache.replace(end_index=start + num_kept)

  def step_tree(self, params, tree, cache, max_depth: int, return_states: bool = False):
    """One pass over a token tree (`trees.Tree` of N slots) written at slots end_index + u:
    (logits f32[B, N, V] at every node, [states [B, N, D] with `return_states`,] the cache with
    the nodes written and end_index unchanged: `keep_path` keeps the accepted ones). Positions
    and mask: `t5_tree.layout`."""
    if self.block_size is not None or self.reads_target_states:
      raise ValueError(
        'step_tree is a target pass: this T5 is a drafter (block_size or feature_dim).'
      )
    layout = t5_tree.layout(tree, cache.end_index, cache.max_decode_len, max_depth)
    *out, new_cache = decode(
      params, tree.tokens, cache, config=self.config, return_states=return_states,
      state_layers=self.state_layers, layout=layout, rules=self.rules,
    )  # fmt: skip
    return (*out, new_cache.replace(end_index=cache.end_index))

  def keep_path(self, cache, path, num_accepted):
    """After `step_tree`: the accepted path's keys and values moved after the root
    (`t5_tree.keep_path`); end_index + 1 + num_accepted."""
    return t5_tree.keep_path(cache, path, num_accepted)

  def step_states(self, params, tokens, cache):
    """`step` that also returns the normed final decoder states [B, T, D] (what an EAGLE-style
    drafter of this target reads), or those of `state_layers`, [B, T, state_dim]."""
    return decode(
      params, tokens, cache, config=self.config, return_states=True,
      state_layers=self.state_layers, rules=self.rules,
    )  # fmt: skip

  def tap_states(self, layers: tuple[int, ...]) -> 'T5Steps':
    """This target with `step_states` (and `step_tree`'s states) giving the outputs of decoder
    `layers`, normed and concatenated (what a drafter with `T5Config.feature_layers` reads)."""
    n = self.config.num_decoder_layers
    if not all(0 <= i < n for i in layers):
      raise ValueError(
        f"The drafter reads the target's decoder layers {tuple(layers)} (feature_layers), but "
        f'the target has {n} (0..{n - 1}): it was trained for another target.'
      )
    return dataclasses.replace(self, state_layers=tuple(layers))

  def step_features(self, params, tokens, features, cache):
    """An EAGLE-style drafter's step: features [B, T, feature_dim] hold the target's state at the
    position before each token -> (logits, the predicted target state at each position, cache)."""
    return self.step_at(params, tokens, features, cache, None)


# ---------------------------------------------------------------------------------------------
# Public functions.


def encode(
  params: Params,
  input_ids: jax.Array,
  input_mask: jax.Array,
  *,
  config: T5Config,
  dropout: Dropout = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> jax.Array:
  """Runs the encoder.

  Args:
    params: model params.
    input_ids: int32[B, S] source tokens.
    input_mask: bool or int[B, S], nonzero at real (non-padding) tokens.
    config: model config.
    dropout: (key, rate) for training (see `forward`), or None.
    rules: the logical-axis rules of its activations on a mesh (`T5Model.rules`).

  Returns:
    [B, S, D] encoder output in the model dtype (float32 by default). Rows at padding positions
    are computed but meaningless; the decoder masks them.
  """
  if input_ids.ndim != 2 or input_mask.shape != input_ids.shape:
    raise ValueError(
      f'encode needs input_ids and input_mask of one shape [B, S], got '
      f'{input_ids.shape} and {input_mask.shape}.'
    )
  if config.num_encoder_layers == 0:
    raise ValueError(
      'This T5 has no encoder (num_encoder_layers=0): it decodes over another '
      "model's `encode` output (use `decode_forward` / the target's encoder)."
    )
  enc = params['encoder']
  positions = jnp.arange(input_ids.shape[1])
  bias = t5_layers.relpos_bias(
    enc['relpos_bias']['rel_embedding'],
    positions[None],
    positions,
    bidirectional=True,
    config=config,
  )
  mask = input_mask.astype(bool)[:, None, None, :]
  drop = dropper(dropout, stream=0)
  x = drop(t5_layers.embed(params, input_ids, config, rules), 0)
  for i in range(config.num_encoder_layers):
    layer = enc[f'layers_{i}']
    h = t5_layers.rms_norm(x, layer['pre_attention_layer_norm'], config)
    a = layer['attention']
    q, k, v = (t5_layers.heads(a[name], h, config, rules) for name in ('query', 'key', 'value'))
    x = x + drop(t5_layers.attention(a, q, k, v, bias, mask, config), 2 * i + 1)
    mlp = t5_layers.mlp(
      layer['mlp'], t5_layers.rms_norm(x, layer['pre_mlp_layer_norm'], config), config, rules
    )
    x = x + drop(mlp, 2 * i + 2)
    x = sharding.constrain(x, ('batch', 'length', 'embed'), rules)
  return drop(t5_layers.rms_norm(x, enc['encoder_norm'], config), 2 * config.num_encoder_layers + 1)


def init_cache(
  params: Params,
  encoded: jax.Array,
  input_mask: jax.Array,
  *,
  config: T5Config,
  max_decode_len: int,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> cache_lib.DecoderCache:
  """An empty decoder cache, with the encoder-decoder keys/values of all layers computed.

  Args:
    params: model params.
    encoded: [B, S_enc, D] `encode` output.
    input_mask: bool or int[B, S_enc], nonzero at real source tokens.
    config: model config.
    max_decode_len: S_max, decoder slots per row. `decode` calls must keep end_index + T <= S_max
      (positions past it are not stored); a speculative loop needs about max_target_length +
      gamma + 1.
    rules: the logical-axis rules of the cache and activations on a mesh (`T5Model.rules`).

  Returns:
    A `DecoderCache` in the model dtype with zero self-attention slots and end_index 0.
  """
  if max_decode_len < 1:
    raise ValueError(f'max_decode_len must be >= 1, got {max_decode_len}.')
  if encoded.shape[:2] != input_mask.shape:
    raise ValueError(f'encoded {encoded.shape} does not match input_mask {input_mask.shape}.')
  batch = encoded.shape[0]
  cross_k, cross_v = t5_layers.cross_kv(params, encoded, config, rules)
  shape = (config.num_decoder_layers, batch, max_decode_len, config.num_heads, config.d_kv)
  kv_axes = ('layers', 'batch', 'length', 'heads', 'kv')
  zeros = lambda: sharding.constrain(jnp.zeros(shape, config.dtype), kv_axes, rules)
  return cache_lib.DecoderCache(
    self_k=zeros(),
    self_v=zeros(),
    cross_k=sharding.constrain(cross_k, kv_axes, rules),
    cross_v=sharding.constrain(cross_v, kv_axes, rules),
    encoder_mask=input_mask.astype(bool),
    end_index=jnp.zeros((batch,), jnp.int32),
  )


def inputs(
  params: Params,
  tokens: jax.Array,
  *,
  config: T5Config,
  features: jax.Array | None = None,
  slots: jax.Array | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
) -> jax.Array:
  """The decoder stack's inputs [B, T, D] for this T5's role, composed by its config: the tokens'
  embeddings; plus the projected features of an EAGLE-style drafter (`config.feature_dim`:
  `t5_eagle.feature_inputs`); a block drafter's query slots in place of both where slots > 0
  (`config.block_size`: `t5_block.slot_inputs`).

  Args:
    tokens: int32[B, T].
    features: [B, T, feature_dim], exactly when `config.feature_dim` is set: the target's state
      at the position before each token (zeros before position 0).
    slots: int32[B, T], exactly when `config.block_size` is set: 0 where the input is the token,
      i >= 1 where it is query slot i.
  """
  if (features is None) != (config.feature_dim is None):
    raise ValueError(
      f'features must be given exactly when config.feature_dim is set: feature_dim '
      f'{config.feature_dim}, features {None if features is None else features.shape}.'
    )
  if (slots is None) != (config.block_size is None):
    raise ValueError(
      f'slots must be given exactly when config.block_size is set: block_size '
      f'{config.block_size}, slots {None if slots is None else slots.shape}.'
    )
  x = t5_layers.embed(params, tokens, config, rules)
  if features is not None:
    x = t5_eagle.feature_inputs(params, x, features, config)
  if slots is not None:
    x = t5_block.slot_inputs(params, x, slots)
  return x


def decode(
  params: Params,
  tokens: jax.Array,
  cache: cache_lib.DecoderCache,
  *,
  config: T5Config,
  features: jax.Array | None = None,
  return_states: bool = False,
  logits_at: jax.Array | None = None,
  slots: jax.Array | None = None,
  layout: Layout | None = None,
  state_layers: tuple[int, ...] | None = None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
):
  """Scores T new decoder positions per row and appends them to the cache.

  tokens[b, t] is decoder position end_index[b] + t (the decoder input is
  [decoder_start_token_id, y_1, y_2, ...]); it attends to the cached positions below it and to
  the chunk causally. Slots at or past end_index[b] + T are masked, so rewinding a row is just
  `cache.replace(end_index=...)`.

  Args:
    params: model params.
    tokens: int32[B, T] decoder inputs, any T >= 1 with end_index + T <= S_max.
    cache: `DecoderCache` from `init_cache` or an earlier `decode`.
    config: model config.
    features: [B, T, feature_dim], for (only) a model with `config.feature_dim`: the target's
      state at the position before each token.
    return_states: also return the normed final decoder states [B, T, D], or with
      `state_layers` those layers' (`t5_layers.decoder`'s taps) [B, T, len(state_layers) x D].
    logits_at: int32[B], or None: the logits (and states) of one position per row only,
      tokens[b, logits_at[b]], shaped [B, 1, ...]: the output layer then runs on one row (the
      decode loop's first drafter call feeds two positions and reads one).
      int32[B, R]: R positions per row, [B, R, ...] (a block drafter's call).
    slots: int32[B, T], for (only) a block drafter: which inputs are query slots (`inputs`).
    layout: the `t5_layout.Layout` of inputs that are not a causal chain (a block call's,
      `t5_block.step_layout`; a token tree's, `t5_tree.layout`); None: the chain at end_index.
    rules: the logical-axis rules of its activations on a mesh (`T5Model.rules`).

  Returns:
    (logits f32[B, T, V] predicting position end_index[b] + t + 1, cache with end_index += T);
    (logits, states, cache) with `return_states`.
  """
  if tokens.ndim != 2 or tokens.shape[0] != cache.end_index.shape[0]:
    raise ValueError(f'decode needs tokens [B={cache.end_index.shape[0]}, T], got {tokens.shape}.')
  if tokens.shape[1] > cache.max_decode_len:
    raise ValueError(
      f'decode got T={tokens.shape[1]} tokens for a cache of {cache.max_decode_len} slots.'
    )
  if layout is None:
    layout = t5_layout.chain(cache.end_index, tokens.shape[1], cache.max_decode_len)
  states, (self_k, self_v), *tapped = t5_layers.decoder(
    params,
    inputs(params, tokens, config=config, features=features, slots=slots, rules=rules),
    cache.cross_k,
    cache.cross_v,
    cache.encoder_mask,
    layout=layout,
    config=config,
    self_cache=(cache.self_k, cache.self_v, cache.end_index),
    taps=state_layers if return_states else None,
    rules=rules,
  )
  cache = cache.replace(self_k=self_k, self_v=self_v, end_index=cache.end_index + tokens.shape[1])
  pick = lambda x: x
  if logits_at is not None:
    rows = logits_at[:, None] if logits_at.ndim == 1 else logits_at
    pick = lambda x: jnp.take_along_axis(x, rows[..., None], axis=1)
  states = pick(states)
  logits = t5_layers.logits(params, states, config, rules)
  if not return_states:
    return logits, cache
  return logits, pick(tapped[0]) if tapped else states, cache


def forward(
  params: Params,
  input_ids: jax.Array,
  input_mask: jax.Array,
  decoder_input_ids: jax.Array,
  *,
  config: T5Config,
  dropout: Dropout = None,
) -> jax.Array:
  """Teacher-forced logits of the whole decoder sequence.

  Args:
    params: model params.
    input_ids: int32[B, S] source tokens.
    input_mask: bool or int[B, S], nonzero at real source tokens.
    decoder_input_ids: int32[B, T] decoder inputs, e.g. `shift_right(targets, start_id)`.
    config: model config.
    dropout: None (inference), or (key, rate) in training: T5's residual dropout, on the
      embeddings, every sublayer's output before it is added to the residual stream, and both
      stacks' final normed output.

  Returns:
    f32[B, T, V] logits; position t predicts decoder position t + 1 (causal, no cache).
  """
  encoded = encode(params, input_ids, input_mask, config=config, dropout=dropout)
  return decode_forward(
    params, encoded, input_mask, decoder_input_ids, config=config, dropout=dropout
  )


def decode_forward(
  params: Params,
  encoded: jax.Array,
  input_mask: jax.Array,
  decoder_input_ids: jax.Array,
  *,
  config: T5Config,
  dropout: Dropout = None,
) -> jax.Array:
  """Teacher-forced decoder logits over an encoder output (this model's, or another's: a
  drafter over its target's encoder); `forward` is `encode` then this.

  Args:
    params: model params.
    encoded: [B, S, encoder_dim or D] an `encode` output.
    input_mask: bool or int[B, S], nonzero at real source tokens.
    decoder_input_ids: int32[B, T] decoder inputs.
    config: model config.
    dropout: as `forward`'s.

  Returns:
    f32[B, T, V] logits, as `forward`.
  """
  states = decoder_states(
    params, encoded, input_mask, decoder_input_ids, config=config, dropout=dropout
  )
  return output_logits(params, states, config=config)


def decoder_states(
  params: Params,
  encoded: jax.Array,
  input_mask: jax.Array,
  decoder_input_ids: jax.Array,
  *,
  config: T5Config,
  features: jax.Array | None = None,
  dropout: Dropout = None,
  state_layers: tuple[int, ...] | None = None,
):
  """`decode_forward` up to the output layer: the normed final decoder states [B, T, D]; with
  `state_layers`, (those, the layers' states [B, T, len(state_layers) x D] as `T5Steps.tap_states`
  gives them).

  `output_logits(params, states, config=config)` turns them into `decode_forward`'s logits (a
  distillation caches a big target's states once and pays only its output layer per step).
  `features` [B, T, feature_dim]: for (only) an EAGLE-style model, the target's state at the
  position before each token (`shift_states` of the target's `decoder_states`). `dropout`: as
  `forward`'s.
  """
  cross_k, cross_v = t5_layers.cross_kv(params, encoded, config)
  states, _, *tapped = t5_layers.decoder(
    params,
    inputs(params, decoder_input_ids, config=config, features=features),
    cross_k,
    cross_v,
    input_mask.astype(bool),
    layout=t5_layout.teacher(decoder_input_ids.shape[1]),
    config=config,
    dropout=dropout,
    taps=state_layers,
  )
  return (states, *tapped) if tapped else states


def block_states(
  params: Params,
  encoded: jax.Array,
  input_mask: jax.Array,
  decoder_input_ids: jax.Array,
  features: jax.Array,
  anchors: jax.Array,
  *,
  config: T5Config,
  dropout: Dropout = None,
) -> jax.Array:
  """A block drafter's teacher-forced pass: every block it would propose from `anchors`, at once.

  One row packs the sequence's T inputs (causal, as `decoder_states`) and, for each anchor a (a
  pending token's position), the block_size - 1 query slots that would follow it, slot j at
  position a + j, attending to the inputs at positions <= a and to the anchor's slots as
  `config.block_attention` says (`t5_block.training_layout`; DFlash's training layout: all
  blocks in one masked pass). The block's G = block_size outputs,
  the anchor's own and its slots', propose the tokens after positions a .. a + G - 1, as
  `T5Steps.step_block` proposes them while decoding.

  Args:
    decoder_input_ids: int32[B, T]; features: [B, T, feature_dim] (`shift_states` of the
      target's states); anchors: int32[B, A] positions in 0..T-1.

  Returns:
    The normed final states [B, A, G, D] (`output_logits` turns them into logits).
  """
  batch, t = decoder_input_ids.shape
  a, g = anchors.shape[1], config.block_size
  slots, layout = t5_block.training_layout(anchors, t, g, config.block_attention)
  pad = lambda x: jnp.pad(x, [(0, 0), (0, a * (g - 1))] + [(0, 0)] * (x.ndim - 2))
  cross_k, cross_v = t5_layers.cross_kv(params, encoded, config)
  x = inputs(
    params, pad(decoder_input_ids), config=config, features=pad(jnp.asarray(features)),
    slots=slots,
  )  # fmt: skip
  states, _ = t5_layers.decoder(
    params, x, cross_k, cross_v, input_mask.astype(bool), layout=layout, config=config,
    dropout=dropout,
  )  # fmt: skip
  own = jnp.take_along_axis(states, anchors[..., None], axis=1)[:, :, None]  # [B, A, 1, D]
  rest = states[:, t:].reshape(batch, a, g - 1, -1)
  return jnp.concatenate([own, rest], axis=2)


def output_logits(params: Params, states: jax.Array, *, config: T5Config) -> jax.Array:
  """The output layer: `decoder_states` [B, T, D] -> f32[B, T, V] logits."""
  return t5_layers.logits(params, jnp.asarray(states, config.dtype), config)


def predicted_features(params: Params, states: jax.Array, *, config: T5Config) -> jax.Array:
  """An EAGLE-style model's prediction of the target's state at each position: its own normed
  states [B, T, D] -> [B, T, feature_dim]. While drafting, it is the next position's features."""
  return t5_layers.dense(states, params['decoder']['feature_out'], config).astype(jnp.float32)


def shift_states(states: jax.Array) -> jax.Array:
  """The features an EAGLE-style model reads at each decoder position: [B, T, F] -> the state at
  the position before (zeros at position 0), as `shift_right` does for tokens."""
  return jnp.pad(states, ((0, 0), (1, 0), (0, 0)))[:, :-1]


def shift_right(targets: jax.Array, decoder_start_token_id: int) -> jax.Array:
  """Decoder inputs for teacher forcing: int[B, T] -> [start, targets[:, :-1]]."""
  start = jnp.full_like(targets[:, :1], decoder_start_token_id)
  return jnp.concatenate([start, targets[:, :-1]], axis=1)
