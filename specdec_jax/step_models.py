"""Step models: what the decode loops know about a model, and nothing more.

A step model is a hashable static half (`steps`, a jit static argument) plus a params pytree. The
loops in `decode.py` call only the methods below, so they never import a model: T5 provides its
adapter beside itself (`models.t5.T5Steps`, reached as `T5Model.steps`), n-gram drafters are step
models already (`drafters.NGramSteps`), and tests drive the loops with fake Markov chains.

Axis legend: B batch, S source length, T query length, V vocab.
"""

import dataclasses
import functools
from typing import Any, Protocol

import jax

# The id the loops write past each row's length in `DecodeOutput.tokens`: T5's pad, which
# `data.tokenizer` (PAD_ID) and the batching code use too.
PAD_ID = 0


class StepModel(Protocol):
  """The static half of a model as the decode loops see it.

  Every cache is a `flax.struct.dataclass` with an `end_index: int32[B]` field, the number of valid
  decoder positions per row. `step` writes T positions starting at `end_index` and advances it by T;
  the loops rewind a row with `cache.replace(end_index=...)`.

  Optional attributes, read once by `capabilities` (the loops and tools ask that):
    max_source_length / max_target_length: int limits checked before decoding (None: no limit).
    shares_target_encoder: True for a drafter whose `init_cache` takes the *target's* `encode`
      output (a small decoder over the target's encoder); the loop then encodes once.
    encoder_dim / encoded_dim: int widths of the encoder output a drafter over the target's
      encoder reads, and of what a target's `encode` returns (`check_encoder_reader`).
    reads_target_states: True for an EAGLE-style drafter (Li et al. 2024) that reads the target's
      final decoder states: it has `feature_dim` and
      `step_features(params, tokens, features f32[B, T, feature_dim], cache)
        -> (logits, predicted features f32[B, T, feature_dim], cache)`,
      where features[:, t] is the target's state at the position before tokens[:, t]. Its target
      then needs `state_dim` (= feature_dim) and
      `step_states(params, tokens, cache) -> (logits, states [B, T, state_dim], cache)`.
      A drafter with `feature_layers` (a tuple of the target's decoder layers) reads those
      layers' states, concatenated: its target then needs `tap_states(layers)`, the target whose
      `step_states` gives them (`state_source`).
    block_size: int, for a block drafter (it also reads the target's states): the most drafts
      one call of `step_block(params, tokens, features, cache, gamma, num_kept int32[B])
        -> (logits f32[B, gamma, V], cache)` proposes: the laws of the gamma positions after
      each row's pending token tokens[b, num_kept[b] - 1], conditioned on the kept prefix only,
      the cache caught up on the kept positions (end_index advanced by num_kept).
    step_at: `step_at(params, tokens, features, cache, logits_at int32[B])
        -> (logits [B, 1, V], predicted features [B, 1, F] or None, cache advanced by T)`: a
      drafter's call that reads only position logits_at[b] of each row (`step`, or
      `step_features` with `features`), for a drafter that can skip the rest (a T5's output layer
      then runs on one row). Without it the loop picks that position from `step`'s logits.
  """

  vocab_size: int
  start_id: int  # the decoder's first input token
  eos_id: int

  def encode(self, params, input_ids, input_mask) -> Any:
    """int32[B, S] source ids and mask -> whatever `init_cache` needs (e.g. f32[B, S, D])."""

  def init_cache(self, params, encoded, input_mask, max_decode_len: int) -> Any:
    """An empty cache of `max_decode_len` decoder slots per row, end_index 0."""

  def step(self, params, tokens, cache) -> tuple[Any, Any]:
    """tokens int32[B, T] -> (logits float32[B, T, V], cache advanced by T)."""


class Cache(Protocol):
  """A step model's cache as the loops see it: a `flax.struct.dataclass` whose `end_index`
  int32[B] counts the valid decoder positions per row (the loops rewind with `replace`)."""

  end_index: jax.Array

  def replace(self, **updates) -> 'Cache': ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
  """What a step model can do beyond `StepModel`, read ONCE by `capabilities` (the class
  docstring of `StepModel`: what each optional attribute means). The decode wing, `measure/`,
  `experiments/` and `benchmarks/` ask this, never the step model's attributes.

  Attributes:
    drafting: the name of the `drafting` registry entry that drafts with this model in a chain:
      'token' (one call per draft), 'block' (a block drafter's one call) or what the model
      declares as `drafting` (e.g. 'lookup').
    draft_calls: whether drafting calls a model (False: the source lookup, no model, c = 0).
    block_size: the most drafts of one block call, or None (not a block drafter).
    reads_target_states: an EAGLE-style or block drafter reading the target's states.
    feature_dim / feature_layers: the width of the states it reads / the target layers they come
      from (None: the final states).
    shares_target_encoder: a drafter over the target's encoder output.
    encoder_dim / encoded_dim: the encoder width a drafter reads / a target's encoder gives.
    state_dim: the width of the states a target gives (`step_states`), or None.
    step_states / step_tree / keep_path / step_at / tap_states: which optional methods it has.
    max_source_length / max_target_length: limits checked before decoding, or None.
  """

  drafting: str = 'token'
  draft_calls: bool = True
  block_size: int | None = None
  reads_target_states: bool = False
  feature_dim: int | None = None
  feature_layers: tuple[int, ...] | None = None
  shares_target_encoder: bool = False
  encoder_dim: int | None = None
  encoded_dim: int | None = None
  state_dim: int | None = None
  step_states: bool = False
  step_tree: bool = False
  keep_path: bool = False
  step_at: bool = False
  tap_states: bool = False
  max_source_length: int | None = None
  max_target_length: int | None = None


def capabilities(steps) -> Capabilities:
  """The one probe of a step model's optional attributes (`Capabilities`); `None` (no drafter
  model) has the defaults. Cached per (hashable) step model."""
  try:
    return _capabilities(steps)
  except TypeError:  # an unhashable step model: probed each time
    return _capabilities.__wrapped__(steps)


@functools.lru_cache(maxsize=256)
def _capabilities(steps) -> Capabilities:
  if steps is None:
    return Capabilities()
  get = lambda name, default=None: getattr(steps, name, default)
  block = get('block_size') or None
  reads = bool(get('reads_target_states', False))
  return Capabilities(
    drafting=get('drafting') or ('block' if block else 'token'),
    draft_calls=bool(get('draft_calls', True)),
    block_size=block,
    reads_target_states=reads,
    feature_dim=get('feature_dim') if reads else None,
    feature_layers=None if get('feature_layers') is None else tuple(get('feature_layers')),
    shares_target_encoder=bool(get('shares_target_encoder', False)),
    encoder_dim=get('encoder_dim'),
    encoded_dim=get('encoded_dim'),
    state_dim=get('state_dim'),
    step_states=hasattr(steps, 'step_states'),
    step_tree=hasattr(steps, 'step_tree'),
    keep_path=hasattr(steps, 'keep_path'),
    step_at=hasattr(steps, 'step_at'),
    tap_states=hasattr(steps, 'tap_states'),
    max_source_length=get('max_source_length'),
    max_target_length=get('max_target_length'),
  )


def as_step_model(model) -> tuple[StepModel, Any]:
  """(static steps, params) of a `T5Model`, an n-gram drafter, or anything with .steps/.params."""
  if hasattr(model, 'steps') and hasattr(model, 'params'):
    return model.steps, model.params
  raise TypeError(
    f'Cannot decode with a {type(model).__name__}: expected a T5Model, an n-gram '
    'drafter, or an object with .steps (a step model) and .params.'
  )


def encoder_of(model: tuple[StepModel, Any], target: tuple[StepModel, Any] | None = None):
  """(steps, params) whose `encode` builds `model`'s cache input: `model`'s own, or `target`'s for
  a drafter that reads the target's encoder output (`shares_target_encoder`). `model` and
  `target` are (steps, params), as `as_step_model` gave them once at the caller's entry."""
  steps, _ = model
  if not capabilities(steps).shares_target_encoder:
    return model
  if target is None:
    raise ValueError("This drafter reads the target's encoder output: pass target=.")
  target_steps, _ = target
  check_encoder_reader(steps, target_steps)
  return target


def check_encoder_reader(drafter_steps, target_steps) -> None:
  """Raises ValueError if `drafter_steps` reads the target's encoder output (`shares_target_encoder`)
  at a width other than the one `target_steps.encode` returns (e.g. a drafter distilled for a
  48M target beside that target grown wider: `t5_growth.follow_grown_encoder` moves it)."""
  drafter, target = capabilities(drafter_steps), capabilities(target_steps)
  if not drafter.shares_target_encoder:
    return
  reads, gives = drafter.encoder_dim, target.encoded_dim
  if reads is not None and gives is not None and reads != gives:
    raise ValueError(
      f"The drafter reads the target's encoder output at width encoder_dim={reads}, but the "
      f"target's encoder gives width {gives} (its d_model): it was made for another target "
      '(after growing a target, move the drafter with t5_growth.follow_grown_encoder).'
    )


def check_state_reader(drafter_steps, target_steps) -> None:
  """Raises ValueError if `drafter_steps` reads target states that `target_steps` cannot give."""
  state_source(drafter_steps, target_steps)


def state_source(drafter_steps, target_steps):
  """`target_steps` as `drafter_steps` reads its states: with the drafter's `feature_layers`
  tapped (`tap_states`), else as it is. Raises ValueError if it cannot give them."""
  drafter = capabilities(drafter_steps)
  if not drafter.reads_target_states:
    return target_steps
  layers = drafter.feature_layers
  if layers is not None:
    if not capabilities(target_steps).tap_states:
      raise ValueError(
        f"This drafter reads the target's decoder layers {tuple(layers)} (feature_layers), but "
        f'the target {type(target_steps).__name__} cannot give them (no tap_states).'
      )
    target_steps = target_steps.tap_states(layers)
  target = capabilities(target_steps)
  width = target.state_dim
  if not target.step_states or width is None:
    raise ValueError(
      "This drafter reads the target's decoder states (feature_dim is set), but the target "
      f'{type(target_steps).__name__} does not return them (no step_states / state_dim).'
    )
  if width != drafter.feature_dim:
    raise ValueError(
      f'The drafter reads target states of width feature_dim={drafter.feature_dim}, but '
      f"the target's states have width {width}: it was trained for another target."
    )
  return target_steps


def check_target(target_steps) -> None:
  """Raises ValueError if `target_steps` is a block drafter (it cannot decode alone)."""
  block = capabilities(target_steps).block_size
  if block:
    raise ValueError(
      f'This model is a block drafter (block_size={block}): it drafts for a '
      'target inside speculative_generate and cannot be the target or decode alone.'
    )


def check_block_drafter(drafter_steps, gamma: int) -> None:
  """Raises ValueError if a block drafter cannot propose `gamma` drafts in one call."""
  block = capabilities(drafter_steps).block_size
  if block and gamma > block:
    raise ValueError(
      f"gamma={gamma} exceeds the block drafter's block_size={block}: one call proposes at "
      f'most {block} drafts.'
    )


def limit(steps: StepModel, name: str) -> int | None:
  """An optional integer limit of a step model (`max_source_length`, `max_target_length`)."""
  return getattr(capabilities(steps), name)
