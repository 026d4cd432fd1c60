"""T5 models of public shapes, with synthetic weights or abstract: the benchmarks' one way to build them.

  config = synthetic.shape('t5-11b')                       # a t5.CONFIGS name, checked
  config = synthetic.shape('t5-11b', dtype='bfloat16')     # the same in bfloat16 activations
  one_layer = synthetic.drafter_config('one-layer', config)  # a drafter's shape over a target
  target = synthetic.model(config, dtype='bfloat16', weights='constant')
  drafter = synthetic.model(synthetic.shape('t5-small'), dtype='bfloat16', weights='random', seed=1)

A call's time does not depend on the weights' values, so the benchmarks time models of the
papers' shapes without their checkpoints. Both kinds are built in the model's dtype, leaf by leaf:
no float32 copy of the whole model (45 GB for T5 11B) is ever made.

What a benchmark compiles without running is built here too, as `jax.ShapeDtypeStruct`s
(nothing allocated), each placed on a mesh or a device where the program will run:

  target = synthetic.abstract_model(config, mesh, param_dtype='bfloat16', shard=True)
  cache = synthetic.abstract_cache(target, batch=1, source_length=64, cache_len=72)
  ids = synthetic.abstract_batch(mesh, batch=8, source_length=64)
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specdec_jax import sharding
from specdec_jax.models import t5, t5_fused

WEIGHTS = ('constant', 'random')


def shape(name: str, dtype: str | None = None) -> t5.T5Config:
  """The T5 shape `t5.CONFIGS[name]`, in `dtype` (activations and cache) if given; ValueError
  naming the known shapes."""
  if name not in t5.CONFIGS:
    raise ValueError(f'Unknown T5 shape {name!r}; one of: {", ".join(t5.CONFIGS)}.')
  config = t5.CONFIGS[name]
  return config if dtype is None else dataclasses.replace(config, dtype=dtype)


# A block drafter's shape (`drafter_config`'s `block[:NAME]`): the shipped ones' depth, and the
# most drafts a call.
BLOCK_LAYERS, BLOCK_SIZE = 2, 16


def drafter_config(name: str, target: t5.T5Config) -> t5.T5Config:
  """A drafter's shape: a `t5.CONFIGS` name, `one-layer[:NAME]` (one decoder layer of NAME's
  width, default t5-small, over the target's encoder, in the target's vocabulary), or
  `block[:NAME]` (a block drafter: `BLOCK_LAYERS` decoder layers of NAME's width over the
  target's encoder, reading its states, `BLOCK_SIZE` drafts a call, as the shipped `block`
  drafters are built)."""
  kind, _, width = name.partition(':')
  if kind in ('one-layer', 'block'):
    base = shape(width or 't5-small')
    config = dataclasses.replace(
      base,
      vocab_size=target.vocab_size,
      num_encoder_layers=0,
      num_decoder_layers=1,
      encoder_dim=target.d_model,
    )
    if kind == 'block':
      config = dataclasses.replace(
        config,
        num_decoder_layers=BLOCK_LAYERS,
        feature_dim=target.d_model,
        block_size=BLOCK_SIZE,
      )
    return config
  config = shape(name)
  if config.vocab_size != target.vocab_size:
    raise ValueError(
      f'Drafter {name!r} has vocabulary {config.vocab_size}, the target {target.vocab_size}: '
      'a drafter must share the target vocabulary.'
    )
  return config


def model(config: t5.T5Config, *, dtype: str, weights: str = 'random', seed: int = 0):
  """`config` in `dtype` (params and activations) with synthetic params.

  Args:
    config: the shape.
    dtype: 'float32' or 'bfloat16'.
    weights: 'constant': every matrix 1/sqrt(its rows), vectors 1 (every logit equal: greedy
      decoding emits token 0, never EOS). 'random': drawn leaf by leaf, the embedding N(0, 1),
      matrices N(0, 1 / rows), norm scales 1; the EOS token's output weights zero, so its logit
      is 0, below the largest of the others (whose mean is 0): no row stops before its limit.
    seed: the draws' seed ('random').

  Returns:
    A `t5.T5Model`.
  """
  if weights not in WEIGHTS:
    raise ValueError(f'weights must be one of {WEIGHTS}, got {weights!r}.')
  config = dataclasses.replace(config, dtype=dtype)
  shapes = _param_shapes(config)
  if weights == 'constant':
    fill = lambda s: jnp.full(s.shape, s.shape[0] ** -0.5 if len(s.shape) > 1 else 1.0, dtype)
    return t5.T5Model(config=config, params=jax.jit(lambda: jax.tree.map(fill, shapes))())
  paths, treedef = jax.tree_util.tree_flatten_with_path(shapes)
  keys = jax.random.split(jax.random.key(seed), len(paths))
  leaves = []
  for key, (path, leaf) in zip(keys, paths):
    if leaf.ndim == 1:
      leaves.append(jnp.ones(leaf.shape, dtype))
    else:
      scale = 1.0 if 'embedding' in jax.tree_util.keystr(path) else leaf.shape[0] ** -0.5
      leaves.append(_normal(key, scale, leaf.shape, dtype))
  params = jax.tree.unflatten(treedef, leaves)
  eos = config.eos_token_id
  if config.tie_word_embeddings:
    table = params['token_embedder']['embedding']
    params['token_embedder']['embedding'] = table.at[eos].set(0)
  else:
    kernel = params['decoder']['logits_dense']['kernel']
    params['decoder']['logits_dense']['kernel'] = kernel.at[:, eos].set(0)
  return t5.T5Model(config=config, params=params)


@functools.partial(jax.jit, static_argnums=(2, 3))
def _normal(key, scale, shape, dtype):
  return jax.random.normal(key, shape, dtype) * scale


def _param_shapes(config: t5.T5Config):
  """`t5.init_params`' tree of `config` as shape structs (its initialisers' dtypes)."""
  return jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))


def _placed(tree, where):
  """`tree`'s shape structs as they are (`where` None), on one device, or replicated on a mesh."""
  if where is None:
    return tree
  on = (
    jax.sharding.SingleDeviceSharding(where)
    if isinstance(where, jax.Device)
    else NamedSharding(where, P())
  )
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=on), tree)


def abstract_model(
  config: t5.T5Config,
  where: jax.sharding.Mesh | jax.sharding.AbstractMesh | jax.Device | None = None,
  *,
  param_dtype: str | None = None,
  shard: bool = False,
  rules=sharding.DEFAULT_RULES,
  fused: bool = False,
) -> t5.T5Model:
  """A `T5Model` whose params are `jax.ShapeDtypeStruct`s: nothing is allocated.

  Args:
    config: the shape (its dtype: the activations').
    where: a mesh (each param carries its `NamedSharding`: by `rules` with `shard`, else
      replicated), a device (a `SingleDeviceSharding`), or None (no sharding: the default device).
    param_dtype: the params' dtype (default: `config.dtype`).
    shard: with a mesh, shard the params by `rules`.
    rules: logical-axis rules (`sharding.DEFAULT_RULES`).
    fused: the fused decoder layout (models/t5_fused.py), else T5X's.
  """
  shapes = _param_shapes(config)
  if fused:
    shapes = jax.eval_shape(t5_fused.fused_params, shapes)
  shapes = jax.tree.map(
    lambda s: jax.ShapeDtypeStruct(s.shape, param_dtype or config.dtype), shapes
  )
  if shard and where is not None and not isinstance(where, jax.Device):
    shardings = sharding.param_shardings(shapes, where, rules)
    params = jax.tree.map(
      lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), shapes, shardings
    )
  else:
    params = _placed(shapes, where)
  # Activations constrained by the params' rules: a replicated model by REPLICATED_RULES (no
  # 'model' axis: its layers run whole on each device, with no collective).
  placed = shard and where is not None and not isinstance(where, jax.Device)
  return t5.T5Model(
    config=config, params=params, rules=rules if placed else sharding.REPLICATED_RULES
  )


def abstract_cache(
  model: t5.T5Model, where=None, *, batch: int, source_length: int, cache_len: int
):
  """The `t5.DecodeCache` that `t5.init_cache` builds for `model` (abstract or not) over an
  all-real [batch, source_length] source (a drafter without an encoder over the target's encoder
  output, of width `encoder_dim`), as shape structs placed as `abstract_model`'s `where`."""
  config = model.config
  width = config.encoder_dim or config.d_model
  encoded = jax.ShapeDtypeStruct((batch, source_length, width), config.dtype)
  mask = jax.ShapeDtypeStruct((batch, source_length), jnp.bool_)
  init = functools.partial(t5.init_cache, config=config, max_decode_len=cache_len)
  return _placed(jax.eval_shape(init, model.params, encoded, mask), where)


def abstract_batch(mesh, batch: int, source_length: int, rules=sharding.DEFAULT_RULES):
  """int32[B, S] input ids / mask as a `ShapeDtypeStruct` split over 'data' as
  `sharding.global_batch` would place them."""
  shape = (batch, source_length)
  spec = sharding.logical_to_mesh(('batch', None), shape, mesh, rules)
  return jax.ShapeDtypeStruct(shape, jnp.int32, sharding=NamedSharding(mesh, spec))


def with_dtype(model, dtype: str):
  """`model` with params and activations in `dtype`, abstract (its params' shardings kept) or
  concrete; a concrete model whose activations are already in `dtype` (its params as loaded), and
  anything but a `T5Model` (an n-gram drafter), as it is."""
  if not isinstance(model, t5.T5Model):
    return model
  abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(model.params))
  if not abstract and model.config.dtype == dtype:
    return model

  def cast(x):
    if isinstance(x, jax.ShapeDtypeStruct):
      return jax.ShapeDtypeStruct(x.shape, dtype, sharding=getattr(x, 'sharding', None))
    return x.astype(dtype)

  params = jax.tree.map(cast, model.params)
  return t5.T5Model(config=dataclasses.replace(model.config, dtype=dtype), params=params)


def unsharded(model: t5.T5Model) -> t5.T5Model:
  """An abstract `model` with its params' shardings dropped: the whole of every leaf, as on one
  device."""
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), model.params)
  return t5.T5Model(config=model.config, params=params)
