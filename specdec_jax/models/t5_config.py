"""`T5Config` (the shape and numerics of a T5 v1.0 / v1.1 model, validated) and `CONFIGS`, the
published and test shapes by name. Re-exported by `models.t5`, where the model code lives."""

import dataclasses

_FEED_FORWARDS = ('relu', 'gated-gelu')
_DTYPES = ('float32', 'bfloat16')
_BLOCK_ATTENTIONS = ('causal', 'bidirectional')


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Shapes and numerics of a T5 model; hashable, so it is a static jit argument.

  v1.0: feed_forward='relu', tie_word_embeddings=True. v1.1: 'gated-gelu', False.
  `dtype` is the activation (and cache) dtype; params may be stored in float32 or in `dtype`.
  """

  vocab_size: int = 32128
  d_model: int = 512
  d_kv: int = 64
  d_ff: int = 2048
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  feed_forward: str = 'relu'
  tie_word_embeddings: bool = True
  layer_norm_epsilon: float = 1e-6
  dtype: str = 'float32'
  pad_token_id: int = 0
  eos_token_id: int = 1
  decoder_start_token_id: int = 0
  max_source_length: int = 512
  max_target_length: int = 512
  # Width of the encoder output the decoder's cross-attention reads (None: d_model). A decoder
  # without an encoder of its own (num_encoder_layers = 0) reads another model's encoder output:
  # a drafter over the target's encoder sets encoder_dim to the target's d_model.
  encoder_dim: int | None = None
  # Width of the *target's* final decoder states this decoder reads (an EAGLE-style drafter, Li et
  # al. 2024; None: an ordinary decoder). Position t's input adds a projection of the target's
  # state at position t - 1 to the token embedding, and the decoder predicts the target's state at
  # t, which stands in for it at position t + 1 while drafting (`t5.predicted_features`).
  feature_dim: int | None = None
  # Which of the target's decoder layers those states come from (DFlash's drafter reads
  # several): the residual stream after each listed layer, normed by the target's final norm,
  # concatenated in order, so feature_dim is len(feature_layers) x the target's d_model. None:
  # the final states only (the same as (last layer,)). The target's step model gives them
  # (`T5Steps.tap_states`).
  feature_layers: tuple[int, ...] | None = None
  # A block drafter (None: an ordinary decoder): the most drafts one call proposes. It reads the
  # target's states (feature_dim set) and, after the pending token, fills block_size - 1 query
  # slots, each a learned per-offset embedding (`decoder/block_queries`) that attends causally to
  # the past and to the slots before it: the pending token's output proposes draft 1, slot i
  # draft i + 1 (`t5.T5Steps.step_block`).
  block_size: int | None = None
  # How a block drafter's slots see each other: 'causal' (slot i the slots before it) or
  # 'bidirectional' (every slot of its block, DFlash's choice; the pending token stays causal, its
  # keys are cached). Chosen by ablation: pretrained/ende48m/MODEL_CARD.md, "block".
  block_attention: str = 'causal'

  def __post_init__(self):
    positive = (
      'vocab_size',
      'd_model',
      'd_kv',
      'd_ff',
      'num_heads',
      'num_decoder_layers',
      'max_source_length',
      'max_target_length',
    )
    for name in positive:
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f'T5Config.{name} must be a positive int, got {value!r}.')
    n = self.num_encoder_layers
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
      raise ValueError(f'T5Config.num_encoder_layers must be an int >= 0, got {n!r}.')
    for name in ('encoder_dim', 'feature_dim', 'block_size'):
      dim = getattr(self, name)
      if dim is not None and (not isinstance(dim, int) or isinstance(dim, bool) or dim < 1):
        raise ValueError(f'T5Config.{name} must be a positive int or None, got {dim!r}.')
    if self.feature_layers is not None:
      layers = tuple(self.feature_layers)  # a JSON list on restore
      object.__setattr__(self, 'feature_layers', layers)
      if (
        not layers
        or len(set(layers)) != len(layers)
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers)
      ):
        raise ValueError(
          f'T5Config.feature_layers must be distinct layer indices >= 0, or None; got {layers!r}.'
        )
      if self.feature_dim is None or self.feature_dim % len(layers):
        raise ValueError(
          f'T5Config.feature_layers {layers} needs feature_dim, a multiple of their number '
          f"(their count x the target's d_model); got feature_dim {self.feature_dim}."
        )
    if self.block_size is not None:
      if self.block_size < 2:
        raise ValueError(f'T5Config.block_size must be >= 2 or None, got {self.block_size}.')
      if self.feature_dim is None:
        raise ValueError(
          "T5Config.block_size needs feature_dim: a block drafter reads the target's states."
        )
    if self.block_attention not in _BLOCK_ATTENTIONS:
      raise ValueError(
        f'T5Config.block_attention must be one of {_BLOCK_ATTENTIONS}, got {self.block_attention!r}.'
      )
    if n == 0 and self.encoder_dim is None:
      raise ValueError(
        "T5Config with num_encoder_layers=0 reads another model's encoder "
        "output: set encoder_dim to that encoder's width (its d_model)."
      )
    for name in ('pad_token_id', 'eos_token_id', 'decoder_start_token_id'):
      value = getattr(self, name)
      if not isinstance(value, int) or not 0 <= value < self.vocab_size:
        raise ValueError(f'T5Config.{name} must be an id in [0, {self.vocab_size}), got {value!r}.')
    # The bidirectional bucket function needs num_buckets // 4 >= 1 exact buckets, and the
    # logarithmic part needs max_distance beyond the causal exact range (num_buckets // 2).
    if self.relative_attention_num_buckets < 4:
      raise ValueError(
        'T5Config.relative_attention_num_buckets must be >= 4, got '
        f'{self.relative_attention_num_buckets}.'
      )
    if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
      raise ValueError(
        'T5Config.relative_attention_max_distance must exceed '
        'relative_attention_num_buckets // 2, got '
        f'{self.relative_attention_max_distance}.'
      )
    if self.feed_forward not in _FEED_FORWARDS:
      raise ValueError(
        f'T5Config.feed_forward must be one of {_FEED_FORWARDS}, got {self.feed_forward!r}.'
      )
    if self.dtype not in _DTYPES:
      raise ValueError(f'T5Config.dtype must be one of {_DTYPES}, got {self.dtype!r}.')
    if not self.layer_norm_epsilon > 0:
      raise ValueError(f'T5Config.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon}.')


def _v1_0(**kwargs) -> T5Config:
  return T5Config(feed_forward='relu', tie_word_embeddings=True, **kwargs)


def _v1_1(**kwargs) -> T5Config:
  return T5Config(feed_forward='gated-gelu', tie_word_embeddings=False, **kwargs)


def _layers(n: int) -> dict[str, int]:
  return dict(num_encoder_layers=n, num_decoder_layers=n)


CONFIGS: dict[str, T5Config] = {
  # Published shapes (Raffel et al. 2020; T5 v1.1 release), vocab 32128.
  't5-small': _v1_0(d_model=512, d_kv=64, d_ff=2048, num_heads=8, **_layers(6)),
  't5-base': _v1_0(d_model=768, d_kv=64, d_ff=3072, num_heads=12, **_layers(12)),
  't5-large': _v1_0(d_model=1024, d_kv=64, d_ff=4096, num_heads=16, **_layers(24)),
  't5-3b': _v1_0(d_model=1024, d_kv=128, d_ff=16384, num_heads=32, **_layers(24)),
  't5-11b': _v1_0(d_model=1024, d_kv=128, d_ff=65536, num_heads=128, **_layers(24)),
  't5_1_1-small': _v1_1(d_model=512, d_kv=64, d_ff=1024, num_heads=6, **_layers(8)),
  't5_1_1-base': _v1_1(d_model=768, d_kv=64, d_ff=2048, num_heads=12, **_layers(12)),
  't5_1_1-large': _v1_1(d_model=1024, d_kv=64, d_ff=2816, num_heads=16, **_layers(24)),
  't5_1_1-xl': _v1_1(d_model=2048, d_kv=64, d_ff=5120, num_heads=32, **_layers(24)),
  't5_1_1-xxl': _v1_1(d_model=4096, d_kv=64, d_ff=10240, num_heads=64, **_layers(24)),
  # FLAN-T5 (Chung et al. 2022; HF google/flan-t5-*): T5 v1.1's architecture and sizes.
  'flan-t5-small': _v1_1(d_model=512, d_kv=64, d_ff=1024, num_heads=6, **_layers(8)),
  'flan-t5-base': _v1_1(d_model=768, d_kv=64, d_ff=2048, num_heads=12, **_layers(12)),
  'flan-t5-large': _v1_1(d_model=1024, d_kv=64, d_ff=2816, num_heads=16, **_layers(24)),
  'flan-t5-xl': _v1_1(d_model=2048, d_kv=64, d_ff=5120, num_heads=32, **_layers(24)),
  'flan-t5-xxl': _v1_1(d_model=4096, d_kv=64, d_ff=10240, num_heads=64, **_layers(24)),
  # Tiny test models. The v1.0/v1.1 pair shares a vocabulary (drafter and target); tiny-v1.1 has
  # unequal stack depths and few buckets, so short test sequences reach the logarithmic and
  # clipped buckets; tiny-t5x is the shape of T5X's test_t5_tiny checkpoint (N * H != D).
  'tiny-v1.0': _v1_0(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_heads=4, **_layers(2)),
  'tiny-v1.1': _v1_1(
    vocab_size=128,
    d_model=32,
    d_kv=8,
    d_ff=48,
    num_heads=4,
    num_encoder_layers=2,
    num_decoder_layers=3,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=12,
  ),
  'tiny-t5x': _v1_1(vocab_size=32128, d_model=8, d_kv=3, d_ff=16, num_heads=4, **_layers(2)),
}
