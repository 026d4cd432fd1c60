"""T5 models of public shapes with synthetic weights: the benchmarks' one way to build them.

  config = synthetic.shape('t5-11b')                       # a t5.CONFIGS name, checked
  config = synthetic.shape('t5-11b', dtype='bfloat16')     # the same in bfloat16 activations
  target = synthetic.model(config, dtype='bfloat16', weights='constant')
  drafter = synthetic.model(synthetic.shape('t5-small'), dtype='bfloat16', weights='random', seed=1)

A call's time does not depend on the weights' values, so the benchmarks time models of the
papers' shapes without their checkpoints. Both kinds are built in the model's dtype, leaf by leaf:
no float32 copy of the whole model (45 GB for T5 11B) is ever made.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from specdec_jax.models import t5

WEIGHTS = ('constant', 'random')


def shape(name: str, dtype: str | None = None) -> t5.T5Config:
  """The T5 shape `t5.CONFIGS[name]`, in `dtype` (activations and cache) if given; ValueError
  naming the known shapes."""
  if name not in t5.CONFIGS:
    raise ValueError(f'Unknown T5 shape {name!r}; one of: {", ".join(t5.CONFIGS)}.')
  config = t5.CONFIGS[name]
  return config if dtype is None else dataclasses.replace(config, dtype=dtype)


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
  shapes = jax.eval_shape(lambda key: t5.init_params(key, config), jax.random.key(0))
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
