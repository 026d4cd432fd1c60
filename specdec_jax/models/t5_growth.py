"""Growing a trained T5 into a larger one that computes the same function (Net2Net, Chen et al.
2016), so that a larger target starts training where a smaller one stopped.

`grow(model, config, rng)` returns a `T5Model` of `config` whose outputs equal `model`'s (up to
float rounding) for every input. Allowed changes, any combination:
- d_model times an integer k: each residual dimension is copied k times. RMSNorm is unchanged
  (the mean of squares of k copies is the mean of squares); a kernel that writes to the residual
  stream has its output columns copied, a kernel that reads from it has its input rows divided
  by k. The k copies of a read row get zero-sum noise (`noise`, relative to the kernel's RMS), so
  the copies differ from the first gradient on while their sum, hence the function, is unchanged.
- more heads (same d_kv) and a wider d_ff: the new heads / hidden units are randomly
  initialised (`t5.init_params` of `config`) and their output rows are zero.
- more encoder or decoder layers: new layers are spread between the old ones (old layer i of n
  goes to position floor(i * m / n) of m) and start as the identity: every kernel writing to the
  residual stream (attention `out`, mlp `wo`) is zero.

A tied output layer (T5 v1.0 layout) scales logits by d_model^-1/2, so such a model grows in
depth, heads and d_ff only; so does a decoder over another model's encoder (a distilled drafter).

`follow_grown_encoder(drafter, encoder_dim, rng)` is the same move for a decoder over another
model's encoder (`num_encoder_layers=0`, a distilled drafter): when that model is grown, its
encoder output is the old one with each dimension copied k times, so the drafter's
cross-attention key/value rows are copied and divided by k, and over the grown target's encoder
it computes what it computed over the old one: its distillation to the grown target starts from
there.

`follow_grown_states(drafter, feature_dim, rng)` is the same for a drafter reading the target's
decoder states (EAGLE-style or block): the grown target's final states are copies too.

`add_feature_input(model, feature_dim, rng)` makes a decoder an EAGLE-style one (it reads the
target's decoder states, `T5Config.feature_dim`) that starts computing what it computed;
`add_block_queries(model, block_size, rng)` makes that a block drafter (`T5Config.block_size`).
`drafter_from_target(target, config, layers, rng)` builds such a drafter at the target's width
from the target's own embeddings, decoder layers and output layer (EAGLE's construction).

`grown_config(config, 't5_1_1-xxl')` is `config` with a named shape of `CONFIGS` (its vocabulary,
numerics and lengths kept), and `grow_placed` grows into it where the grown model will run: one
jitted program from the small params whose outputs are the grown params, sharded on a mesh by the
project's rules and cast to the requested dtype, so that an 11B model is never whole in host
memory (nor on one device). A 48M target grown to `t5_1_1-xxl` shapes costs in every kernel what
an 11B T5 costs, and computes what the 48M one computed: the paper's cost with a shipped pair's
outputs (`pretrained.grow_pair`).
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from specdec_jax import sharding
from specdec_jax.models import t5
from specdec_jax.models.t5_config import CONFIGS, T5Config

# The fields of a T5 shape: what `grown_config` takes from a named config.
_SHAPE = ('d_model', 'd_kv', 'd_ff', 'num_heads', 'num_encoder_layers', 'num_decoder_layers')

# Kernels that write into the residual stream (output axis d_model).
_WRITERS = ('out', 'wo')


def _check(old: T5Config, new: T5Config) -> int:
  """The width factor k; raises ValueError for a change `grow` cannot make exactly."""
  problems = []
  if new.d_model % old.d_model:
    problems.append(f'd_model {new.d_model} is not a multiple of {old.d_model}')
  for name in ('num_heads', 'd_ff', 'num_encoder_layers', 'num_decoder_layers'):
    if getattr(new, name) < getattr(old, name):
      problems.append(f'{name} shrinks ({getattr(old, name)} -> {getattr(new, name)})')
  same = (
    'd_kv',
    'vocab_size',
    'feed_forward',
    'tie_word_embeddings',
    'relative_attention_num_buckets',
    'relative_attention_max_distance',
    'encoder_dim',
    'feature_dim',
    'block_size',
    'block_attention',
  )
  problems += [
    f'{name} differs ({getattr(old, name)} -> {getattr(new, name)})'
    for name in same
    if getattr(old, name) != getattr(new, name)
  ]
  if old.tie_word_embeddings and new.d_model != old.d_model:
    problems.append('a wider d_model with tied word embeddings (the logits scale with d_model)')
  if old.num_encoder_layers == 0 and new.num_encoder_layers:
    problems.append("an encoder added to a decoder over another model's encoder")
  if old.num_encoder_layers == 0 and new.d_model != old.d_model:
    # Its cross-attention reads the other model's encoder output, which is not widened.
    problems.append("a wider d_model for a decoder over another model's encoder")
  if problems:
    raise ValueError('Cannot grow this T5 into the requested shape: ' + '; '.join(problems) + '.')
  return new.d_model // old.d_model


def _read(w: jax.Array, k: int, key: jax.Array, noise: float) -> jax.Array:
  """A kernel [d, n] reading a k-times copied stream -> [k * d, n]: rows / k plus zero-sum noise
  (relative to the kernel's RMS), so that the copies differ while their sum is unchanged; k = 1
  returns w as it is."""
  if k == 1:
    return w
  w = w / k
  eps = jax.random.normal(key, (k, *w.shape)) * noise * jnp.sqrt(jnp.mean(w**2))
  return (w[None] + eps - eps.mean(0)).reshape(k * w.shape[0], *w.shape[1:])


def _layer_positions(old: int, new: int) -> list[int]:
  return [i * new // old for i in range(old)]


def _into(old_w, new_w, *, rows_from_old: bool):
  """old_w in the top-left corner of new_w (new rows / columns: new_w's, or zero)."""
  out = new_w if rows_from_old else jnp.zeros_like(new_w)
  return out.at[: old_w.shape[0], : old_w.shape[1]].set(old_w)


def _identity(layer):
  """A fresh layer whose residual writes are zero."""
  return {
    name: {
      dense: {'kernel': jnp.zeros_like(p['kernel'])} if dense in _WRITERS else p
      for dense, p in sub.items()
    }
    if 'scale' not in sub
    else sub
    for name, sub in layer.items()
  }


@dataclasses.dataclass
class _Growth:
  """Widening by k: kernels that read the residual stream get noisy copies of their rows (one key
  each, from `keys`), kernels that write to it copies of their columns."""

  k: int
  keys: object  # an iterator of PRNG keys
  noise: float

  def read(self, w):
    return _read(w, self.k, next(self.keys), self.noise)

  def write(self, w):
    """A kernel [n, d] writing to the residual stream -> [n, k * d]: columns copied."""
    return jnp.tile(w, (1, self.k))

  def kernel(self, name: str, w, new_w):
    if name in _WRITERS:  # [heads*d_kv | d_ff, d]: the new heads' / units' rows are zero
      return _into(self.write(w), new_w, rows_from_old=False)
    # query/key/value/wi: [d, heads*d_kv | d_ff] (cross-attention reads the grown encoder output)
    return _into(self.read(w), new_w, rows_from_old=True)

  def layer(self, old_layer, new_layer):
    out = {}
    for name, sub in new_layer.items():
      if name not in old_layer:
        out[name] = sub
      elif 'scale' in sub:  # an RMSNorm
        out[name] = {'scale': jnp.tile(old_layer[name]['scale'], self.k)}
      else:  # attention or mlp: a dict of dense layers
        out[name] = {
          dense: {'kernel': self.kernel(dense, old_layer[name][dense]['kernel'], p['kernel'])}
          for dense, p in sub.items()
        }
    return out

  def stack(self, old_part, new_part, norm: str, num_heads: int, n_old: int, n_new: int):
    """An encoder or decoder: the old layers spread over the new depth, fresh identities between."""
    rel = new_part['relpos_bias']['rel_embedding']
    out = {
      'relpos_bias': {
        'rel_embedding': rel.at[:num_heads].set(old_part['relpos_bias']['rel_embedding'])
      },
      norm: {'scale': jnp.tile(old_part[norm]['scale'], self.k)},
    }
    placed = dict(zip(_layer_positions(n_old, n_new), range(n_old)))
    for i in range(n_new):
      new_layer = new_part[f'layers_{i}']
      out[f'layers_{i}'] = (
        self.layer(old_part[f'layers_{placed[i]}'], new_layer)
        if i in placed
        else _identity(new_layer)
      )
    return out


def grow(model: t5.T5Model, config: T5Config, rng: jax.Array, noise: float = 1e-2) -> t5.T5Model:
  """`model` grown to `config`, computing the same function (see the module docstring).

  Raises:
    ValueError: a change that cannot be made exactly (narrower, other d_kv or vocab, tied
      embeddings, a width that is not a multiple), naming every problem.
  """
  old = model.config
  init_key, noise_key = jax.random.split(rng)
  fresh = t5.init_params(init_key, config)
  # One noise key per kernel that reads the residual.
  growth = _Growth(_check(old, config), iter(jax.random.split(noise_key, 4096)), noise)

  def stack(part: str, norm: str, n_old: int, n_new: int):
    return growth.stack(model.params[part], fresh[part], norm, old.num_heads, n_old, n_new)

  params = {
    'token_embedder': {'embedding': growth.write(model.params['token_embedder']['embedding'])},
    'decoder': stack('decoder', 'decoder_norm', old.num_decoder_layers, config.num_decoder_layers),
  }
  if old.num_encoder_layers:
    params['encoder'] = stack(
      'encoder', 'encoder_norm', old.num_encoder_layers, config.num_encoder_layers
    )
  if not old.tie_word_embeddings:
    params['decoder']['logits_dense'] = {
      'kernel': growth.read(model.params['decoder']['logits_dense']['kernel'])
    }
  # An EAGLE-style or block drafter's own inputs (they write into the stream) and state predictor.
  extras = {'feature_in': growth.write, 'block_queries': growth.write, 'feature_out': growth.read}
  for name, widen in extras.items():
    if name in model.params['decoder']:
      ((leaf, w),) = model.params['decoder'][name].items()
      params['decoder'][name] = {leaf: widen(w)}
  return t5.T5Model(config=config, params=params)


def follow_grown_encoder(
  model: t5.T5Model, encoder_dim: int, rng: jax.Array, noise: float = 1e-2
) -> t5.T5Model:
  """A decoder over another model's encoder, made to read that encoder after `grow` widened it.

  Over the grown model's encoder output the result computes what `model` computed over the old
  one (up to float rounding and `noise`): each cross-attention key / value kernel [d, n] becomes
  [k * d, n] with rows / k for k = encoder_dim / model.config.encoder_dim (`grow`'s copies).

  Raises:
    ValueError: `model` has an encoder of its own, or encoder_dim is not a multiple of its
      encoder_dim.
  """
  old = model.config
  if old.num_encoder_layers or not old.encoder_dim or encoder_dim % old.encoder_dim:
    raise ValueError(
      "follow_grown_encoder needs a decoder over another model's encoder (num_encoder_layers=0) "
      f'and an encoder_dim that is a multiple of its own; got num_encoder_layers='
      f'{old.num_encoder_layers}, encoder_dim {old.encoder_dim} -> {encoder_dim}.'
    )
  k = encoder_dim // old.encoder_dim
  keys = iter(jax.random.split(rng, 2 * old.num_decoder_layers))
  decoder = dict(model.params['decoder'])
  for i in range(old.num_decoder_layers):
    layer = dict(decoder[f'layers_{i}'])
    cross = dict(layer['encoder_decoder_attention'])
    for name in ('key', 'value'):
      cross[name] = {'kernel': _read(cross[name]['kernel'], k, next(keys), noise)}
    layer['encoder_decoder_attention'] = cross
    decoder[f'layers_{i}'] = layer
  config = dataclasses.replace(old, encoder_dim=encoder_dim)
  return t5.T5Model(config=config, params={**model.params, 'decoder': decoder})


def follow_grown_states(
  model: t5.T5Model, feature_dim: int, rng: jax.Array, noise: float = 1e-2
) -> t5.T5Model:
  """A drafter reading a target's decoder states (EAGLE-style or block: `feature_dim`), made to
  read them after `grow` widened that target: its grown final states are the old ones with each
  dimension copied k times (as its encoder output is), so the feature input's rows are copied and
  divided by k (`_read`) and a state predictor's (`feature_out`) columns copied; over the grown
  target's states it computes what it computed (up to float rounding and `noise`).

  Raises:
    ValueError: `model` reads no states or several layers' (`feature_layers`), or feature_dim is
      not a multiple of its feature_dim.
  """
  old = model.config
  if old.feature_layers is not None:
    raise ValueError(
      f"follow_grown_states: this drafter reads several of the target's layers (feature_layers "
      f'{old.feature_layers}), whose indices and states growth moves; distil one for the grown '
      'target instead.'
    )
  if not old.feature_dim or feature_dim % old.feature_dim:
    raise ValueError(
      "follow_grown_states needs a drafter reading a target's states (feature_dim) and a width "
      f'that is a multiple of it; got feature_dim {old.feature_dim} -> {feature_dim}.'
    )
  k = feature_dim // old.feature_dim
  decoder = dict(model.params['decoder'])
  decoder['feature_in'] = {'kernel': _read(decoder['feature_in']['kernel'], k, rng, noise)}
  if 'feature_out' in decoder:
    decoder['feature_out'] = {'kernel': jnp.tile(decoder['feature_out']['kernel'], (1, k))}
  config = dataclasses.replace(old, feature_dim=feature_dim)
  return t5.T5Model(config=config, params={**model.params, 'decoder': decoder})


def add_feature_input(model: t5.T5Model, feature_dim: int, rng: jax.Array) -> t5.T5Model:
  """`model` as an EAGLE-style decoder reading target states of width `feature_dim`
  (`T5Config.feature_dim`) that computes exactly what `model` computed: the feature input
  projection starts at zero; the state predictor (`feature_out`) is randomly initialised.

  Raises:
    ValueError: `model` already reads target states.
  """
  if model.config.feature_dim is not None:
    raise ValueError(f'The model already reads features (feature_dim {model.config.feature_dim}).')
  config = dataclasses.replace(model.config, feature_dim=feature_dim)
  fresh = t5.init_params(rng, config)['decoder']
  decoder = dict(
    model.params['decoder'],
    feature_in={'kernel': jnp.zeros_like(fresh['feature_in']['kernel'])},
    feature_out=fresh['feature_out'],
  )
  return t5.T5Model(config=config, params={**model.params, 'decoder': decoder})


def add_block_queries(
  model: t5.T5Model, block_size: int, rng: jax.Array, attention: str = 'causal'
) -> t5.T5Model:
  """An EAGLE-style decoder made a block drafter (`T5Config.block_size`, its slots attending to
  each other as `attention` says: `T5Config.block_attention`): its query slots
  (`decoder/block_queries`) randomly initialised, its state predictor dropped; the pending
  token's output, draft 1, is computed as `model` computed it.

  Raises:
    ValueError: `model` does not read target states, or is a block drafter already.
  """
  if model.config.feature_dim is None or model.config.block_size is not None:
    raise ValueError(
      'add_block_queries needs an EAGLE-style decoder (feature_dim set, block_size None), got '
      f'feature_dim {model.config.feature_dim}, block_size {model.config.block_size}.'
    )
  config = dataclasses.replace(model.config, block_size=block_size, block_attention=attention)
  decoder = dict(model.params['decoder'])
  decoder.pop('feature_out')
  decoder['block_queries'] = t5.init_params(rng, config)['decoder']['block_queries']
  return t5.T5Model(config=config, params={**model.params, 'decoder': decoder})


def drafter_from_target(
  target: t5.T5Model, config: T5Config, layers: tuple[int, ...], rng: jax.Array
) -> t5.T5Model:
  """A drafter of `config` (a decoder over the target's encoder, `num_encoder_layers=0`, reading
  its states: EAGLE-style or block) made of the target's own parts, as EAGLE builds its drafter:
  the target's token embeddings, its decoder layers `layers` (config.num_decoder_layers of them,
  in that order), relative-position table, final norm and output layer; the state input starts
  at zero, so it starts computing what those layers of the target compute on the tokens alone,
  in the target's representation space (its query slots or state predictor new).
  `trainer.OptimizerConfig.frozen` can keep the embeddings and output layer the target's (its
  checkpoint still stores its own copy of them).

  Raises:
    ValueError: a config whose shape is not the target's (d_model, heads, d_kv, d_ff, feed
      forward, vocabulary, output layer), that is not a decoder over the target's encoder reading
      its states, or layers that are not the target's.
  """
  old = target.config
  same = ('d_model', 'd_kv', 'num_heads', 'd_ff', 'feed_forward', 'vocab_size',
          'tie_word_embeddings', 'relative_attention_num_buckets')  # fmt: skip
  problems = [f'{f} {getattr(config, f)} (the target: {getattr(old, f)})'
              for f in same if getattr(config, f) != getattr(old, f)]  # fmt: skip
  if config.num_encoder_layers or config.encoder_dim != old.d_model:
    problems.append(
      f'num_encoder_layers {config.num_encoder_layers}, encoder_dim {config.encoder_dim} '
      f"(a decoder over the target's encoder: 0 and {old.d_model})"
    )
  taps = config.feature_layers or (old.num_decoder_layers - 1,)
  if config.feature_dim != old.d_model * len(taps):
    problems.append(
      f"feature_dim {config.feature_dim} (it reads the target's states: {old.d_model} x "
      f'{len(taps)} layers)'
    )
  if not all(i < old.num_decoder_layers for i in taps):
    problems.append(f'feature_layers {taps} (the target has {old.num_decoder_layers} layers)')
  if len(layers) != config.num_decoder_layers or not all(
    0 <= i < old.num_decoder_layers for i in layers
  ):
    problems.append(
      f"layers {tuple(layers)}: {config.num_decoder_layers} of the target's decoder layers "
      f'0..{old.num_decoder_layers - 1}'
    )
  if problems:
    raise ValueError('drafter_from_target: ' + '; '.join(problems) + '.')
  fresh = t5.init_params(rng, config)['decoder']
  dec = target.params['decoder']
  decoder = {
    **{k: dec[k] for k in ('relpos_bias', 'decoder_norm', 'logits_dense') if k in dec},
    **{f'layers_{j}': dec[f'layers_{i}'] for j, i in enumerate(layers)},
    **{k: fresh[k] for k in ('feature_out', 'block_queries') if k in fresh},
    'feature_in': {'kernel': jnp.zeros_like(fresh['feature_in']['kernel'])},
  }
  params = {'token_embedder': target.params['token_embedder'], 'decoder': decoder}
  return t5.T5Model(config=config, params=params)


def grown_config(config: T5Config, name: str) -> T5Config:
  """`config` with the shape (d_model, d_kv, d_ff, heads, layers) of `CONFIGS[name]`; its
  vocabulary, feed-forward, numerics and lengths kept (a 48M target of an 8,000-piece vocabulary
  grown to `t5_1_1-xxl` keeps its vocabulary).

  Raises:
    ValueError: an unknown name, or a shape `grow` cannot reach exactly from `config` (every
      problem named, with the names of `CONFIGS` it can reach).
  """
  if name not in CONFIGS:
    raise ValueError(f'Unknown T5 shape {name!r}; known: {", ".join(sorted(CONFIGS))}.')
  new = dataclasses.replace(config, **{f: getattr(CONFIGS[name], f) for f in _SHAPE})
  try:
    _check(config, new)
  except ValueError as e:
    raise ValueError(f'{e} Shapes this model grows to: {", ".join(reachable(config))}.') from None
  return new


def reachable(config: T5Config) -> list[str]:
  """The names of `CONFIGS` whose shape `grow` reaches exactly from `config`."""
  out = []
  for name, shape in CONFIGS.items():
    try:
      _check(config, dataclasses.replace(config, **{f: getattr(shape, f) for f in _SHAPE}))
    except ValueError:
      continue
    out.append(name)
  return out


def grow_placed(
  model: t5.T5Model,
  config: T5Config,
  rng: jax.Array,
  *,
  mesh=None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  param_dtype: str | None = None,
  noise: float = 1e-2,
) -> t5.T5Model:
  """`grow(model, config, rng, noise)` built where it runs: one jitted program takes the small
  params and writes the grown ones straight into their places, on `mesh` sharded by `rules`
  (`sharding.param_shardings`; the grown model's activations follow the same rules), or on the
  default device without a mesh, in `param_dtype` (None: the small params' dtype). The fresh
  params of the new heads, units and layers are drawn on the devices too. The small params are
  copied whole to every device of the mesh first.
  """
  build, _ = _builder(model, config, mesh, rules, param_dtype, noise)
  args = (model.params, rng)
  if mesh is not None:
    args = sharding.replicated(args, mesh)
  return t5.T5Model(config=config, params=build(*args), rules=rules)


def lower_grow(
  model: t5.T5Model,
  config: T5Config,
  *,
  mesh=None,
  rules: sharding.Rules = sharding.DEFAULT_RULES,
  param_dtype: str | None = None,
  noise: float = 1e-2,
) -> tuple[jax.stages.Lowered, t5.T5Model]:
  """The program `grow_placed` runs, lowered and not run, and the grown model it would give (its
  params `jax.ShapeDtypeStruct`s with their shardings). `model.params` may be abstract; on a
  compile-only mesh (`machines.compile_only_mesh`) `lowered.compile().memory_analysis()` is what
  building the grown model needs per device there.
  """
  build, out = _builder(model, config, mesh, rules, param_dtype, noise)
  on = lambda x: jax.ShapeDtypeStruct(
    x.shape, x.dtype, sharding=None if mesh is None else NamedSharding(mesh, P())
  )
  params = jax.tree.map(on, model.params)
  key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=on(jnp.zeros(())).sharding)
  lowered = build.lower(params, key)
  shapes = build.eval_shape(params, key)
  if out is not None:
    shapes = jax.tree.map(
      lambda s, h: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=h), shapes, out
    )
  return lowered, t5.T5Model(config=config, params=shapes, rules=rules)


def _builder(model, config, mesh, rules, param_dtype, noise):
  """(the jitted program `(small params, key) -> grown params`, its out_shardings or None)."""
  old = model.config
  grown = lambda params, key: grow(t5.T5Model(config=old, params=params), config, key, noise).params
  dtype = param_dtype or jax.tree.leaves(model.params)[0].dtype
  out = None
  if mesh is not None:
    shapes = jax.eval_shape(grown, model.params, jax.random.key(0))
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, dtype), shapes)
    out = sharding.param_shardings(shapes, mesh, rules)
  cast = lambda params, key: jax.tree.map(lambda x: x.astype(dtype), grown(params, key))
  return jax.jit(cast, out_shardings=out), out
