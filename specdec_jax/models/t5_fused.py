"""The fused layout of a T5 decoder: each layer's self-attention query, key and value kernels
stacked in one [D, 3, N H] kernel ('qkv'), and a gated MLP's wi_0 and wi_1 in one [D, 2, F]
('wi_fused'). A decoder call then runs one dot where the T5X layout runs three, and one where it
runs two; each output column is the same dot product, so the logits agree to float rounding and
greedy tokens are the same (tests/t5_fused_test.py). `fused_params` / `unfused_params` are the
pure transforms (jit-able; `jax.eval_shape` gives the abstract layout).

The stacked axis ('fused', never split) sits between the input and output axes, so the sharding
rules compose: over 'model', 'joined_kv' and 'mlp' split the output columns as they split each
T5X kernel, every device holds the same heads' query, key and value (and the same hidden units'
gate and input), and the fused dot needs no more communication than the three it replaces.
`sharding.param_logical_axes` names both kernels; `fuse_projections` keeps a sharded model's
params on its mesh.

  model = t5_fused.fuse_projections(model)           # any placement: one device, a mesh
  params = t5_fused.unfuse_projections(model).params  # the T5X layout again (to save, to grow)

Checkpoints, `t5_growth` and training read and write the T5X layout; decoding reads either
(`t5_layers.self_qkv`, `t5_layers.mlp`). What each layout costs: docs/performance.md, "Fused
decoder projections".
"""

import jax
import jax.numpy as jnp

from specdec_jax import sharding

_QKV = ('query', 'key', 'value')
_GATED = ('wi_0', 'wi_1')


def is_fused(params) -> bool:
  """Whether a T5 params tree holds the fused decoder layout."""
  return any('qkv' in layer['self_attention'] for layer in _decoder_layers(params))


def fused_params(params):
  """The params in the fused layout: a pure function (jit-able, `jax.eval_shape`-able); a tree
  already fused is returned as it is."""
  if is_fused(params):
    return params
  params = jax.tree.map(lambda x: x, params)  # new containers, the same arrays
  for layer in _decoder_layers(params):
    a, m = layer['self_attention'], layer['mlp']
    a['qkv'] = {'kernel': jnp.stack([a.pop(n)['kernel'] for n in _QKV], axis=1)}
    if 'wi_0' in m:
      m['wi_fused'] = {'kernel': jnp.stack([m.pop(n)['kernel'] for n in _GATED], axis=1)}
  return params


def unfused_params(params):
  """The inverse of `fused_params`: the T5X layout, the same values."""
  if not is_fused(params):
    return params
  params = jax.tree.map(lambda x: x, params)
  for layer in _decoder_layers(params):
    a, m = layer['self_attention'], layer['mlp']
    qkv = a.pop('qkv')['kernel']
    a.update({n: {'kernel': qkv[:, i]} for i, n in enumerate(_QKV)})
    if 'wi_fused' in m:
      wi = m.pop('wi_fused')['kernel']
      m.update({n: {'kernel': wi[:, i]} for i, n in enumerate(_GATED)})
  return params


def fuse_projections(model):
  """`model` (a `t5.T5Model`) in the fused layout, placed where its params are: on a mesh, every
  param as its logical axes and `model.rules` say (`sharding.param_shardings`)."""
  return _placed_like(model, fused_params(model.params))


def unfuse_projections(model):
  """`model` in the T5X layout again (to save it, to grow it), placed where its params are."""
  return _placed_like(model, unfused_params(model.params))


def _decoder_layers(params) -> list:
  return [v for k, v in params.get('decoder', {}).items() if k.startswith('layers_')]


def _placed_like(model, params):
  """`model` with `params`, put on the mesh its own params lie on (if any); `model` itself where
  `params` are its own (a layout it already has)."""
  if params is model.params:
    return model
  first = jax.tree.leaves(model.params)[0]
  mesh = getattr(getattr(first, 'sharding', None), 'mesh', None)
  if mesh is not None and mesh.size > 1:
    params = jax.device_put(params, sharding.param_shardings(params, mesh, model.rules))
  return model.replace(params=params)
