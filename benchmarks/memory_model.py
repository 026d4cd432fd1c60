"""Per-device memory and a roofline of the decode loops, from abstract sharded models: the library
part of `python -m benchmarks.memory_plan` (which simulates the devices, reads its flags and
prints; its docstring has the method). The chips and machines are `benchmarks.machines`'.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from benchmarks import synthetic
from benchmarks.machines import H100, TPU_V4, TPU_V5E, Chip
from specdec_jax import analysis, decode, sharding
from specdec_jax import sampling as sampling_lib
from specdec_jax.models import t5

# The chips whose HBM a plan's `fits` judges (their constants and sources: benchmarks/machines.py).
PLAN_CHIPS = (TPU_V4, TPU_V5E, H100)

# (label, alpha at temperature 0, alpha at temperature 1).
ALPHAS = (
  ('paper T5-small (EnDe)', 0.75, 0.62),  # Leviathan et al. 2023, Table 3.
  ('ours debsumm distilled', 0.66, 0.54),  # docs/results.md section 3.
  ('ours ende48m distilled', 0.49, 0.48),  # docs/results.md section 3.
)

_KV_AXES = ('layers', 'batch', 'length', 'heads', 'kv')


def local_shape(x) -> tuple[int, ...]:
  """The shape of one device's shard of `x` (a `ShapeDtypeStruct` with a sharding, or not)."""
  sharding_ = getattr(x, 'sharding', None)
  return tuple(x.shape) if sharding_ is None else tuple(sharding_.shard_shape(x.shape))


def bytes_per_device(tree) -> int:
  """Bytes of the largest shard of every leaf, summed: what one device holds of `tree`."""
  return sum(
    int(np.prod(local_shape(x))) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)
  )


def cache_shapes(
  config: t5.T5Config, *, batch: int, buffer_len: int, source_length: int
) -> dict[str, tuple[int, ...]]:
  """Shapes of one decoder cache's keys (values alike): self [L, B, buffer_len, N, H] and
  cross [L, B, S, N, H] (`t5.init_cache`)."""
  heads = (config.num_heads, config.d_kv)
  return {
    'self': (config.num_decoder_layers, batch, buffer_len) + heads,
    'cross': (config.num_decoder_layers, batch, source_length) + heads,
  }


def cache_bytes_per_device(
  config: t5.T5Config,
  mesh,
  *,
  batch: int,
  buffer_len: int,
  source_length: int,
  rules=sharding.DEFAULT_RULES,
) -> dict[str, int]:
  """Bytes of one device's shard of a decoder cache: {'self': keys + values, 'cross': ...}.

  L x 2 x B x length x N x H x dtype bytes, with B and N divided as `rules` shard the cache axes
  ('layers', 'batch', 'length', 'heads', 'kv') on `mesh` (an axis stays whole where the mesh axis
  does not divide it).
  """
  itemsize = jnp.dtype(config.dtype).itemsize
  out = {}
  for name, shape in cache_shapes(
    config, batch=batch, buffer_len=buffer_len, source_length=source_length
  ).items():
    spec = sharding.logical_to_mesh(_KV_AXES, shape, mesh, rules)
    out[name] = 2 * int(np.prod(NamedSharding(mesh, spec).shard_shape(shape))) * itemsize
  return out


def fits(lower_bound: int, upper_bound: int, chips=PLAN_CHIPS) -> dict[str, str]:
  """Per chip (by name) of `chips`: 'yes' if `upper_bound` bytes fit its HBM, 'no' if even
  `lower_bound` bytes do not, else 'maybe'."""
  if lower_bound > upper_bound:
    raise ValueError(f'lower_bound {lower_bound} exceeds upper_bound {upper_bound}.')
  return {
    chip.name: 'yes'
    if upper_bound <= chip.hbm_bytes
    else ('no' if lower_bound > chip.hbm_bytes else 'maybe')
    for chip in chips
  }


@dataclasses.dataclass(frozen=True)
class CallCost:
  """One model call on one chip: FLOPs and HBM bytes read."""

  flops: float
  bytes: float

  def seconds(self, chip: Chip) -> float:
    """Roofline time: the call is bound by compute or by HBM bandwidth, whichever is slower."""
    return max(self.flops / chip.peak_flops, self.bytes / chip.hbm_bandwidth)

  def bound(self, chip: Chip) -> str:
    return 'compute' if self.flops / chip.peak_flops > self.bytes / chip.hbm_bandwidth else 'memory'


def call_cost(
  model: t5.T5Model,
  mesh,
  *,
  batch: int,
  positions: int,
  buffer_len: int,
  source_length: int,
  rules=sharding.DEFAULT_RULES,
) -> CallCost:
  """FLOPs and HBM bytes per chip of one decoder call scoring `positions` tokens per row.

  Bytes: the chip's shard of every decoder param except the cross-attention key / value kernels
  (they only build the cache), the embedding rows gathered (the whole table when the output layer
  is tied to it), and the chip's shard of the decoder cache, read in full (masked slots too).
  FLOPs: 2 x matmul params x tokens over the chip's shards (every kernel, and the tied
  embedding as the output layer) + attention, 2 matmuls of 2 x T x N x H x keys per row and
  layer, over buffer_len self-attention and source_length cross-attention keys.

  Args:
    model: a `T5Model` whose params carry shardings (`synthetic.abstract_model`).
    mesh: the mesh the cache is sharded on.
    batch: B, rows of the call (global).
    positions: T, tokens per row.
    buffer_len: decoder cache slots per row.
    source_length: S, encoder positions.
  """
  config = model.config
  kv = cache_shapes(config, batch=batch, buffer_len=buffer_len, source_length=source_length)
  kv_local = {
    name: NamedSharding(mesh, sharding.logical_to_mesh(_KV_AXES, shape, mesh, rules)).shard_shape(
      shape
    )
    for name, shape in kv.items()
  }
  _, local_batch, _, local_heads, _ = kv_local['self']
  tokens = local_batch * positions
  weight_bytes = matmul_params = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(model.params['decoder']):
    names = [str(getattr(k, 'key', k)) for k in path]
    if 'encoder_decoder_attention' in names and names[-2] in ('key', 'value'):
      continue
    size = int(np.prod(local_shape(leaf)))
    weight_bytes += size * jnp.dtype(leaf.dtype).itemsize
    if names[-1] == 'kernel':
      matmul_params += size
  table = model.params['token_embedder']['embedding']
  itemsize = jnp.dtype(table.dtype).itemsize
  if config.tie_word_embeddings:
    table_size = int(np.prod(local_shape(table)))
    weight_bytes += table_size * itemsize
    matmul_params += table_size
  else:
    weight_bytes += tokens * table.shape[1] * itemsize
  cache_bytes = sum(
    cache_bytes_per_device(
      config, mesh, batch=batch, buffer_len=buffer_len, source_length=source_length, rules=rules
    ).values()
  )
  keys = buffer_len + source_length
  attention = config.num_decoder_layers * 4 * tokens * local_heads * config.d_kv * keys
  return CallCost(flops=2.0 * matmul_params * tokens + attention, bytes=weight_bytes + cache_bytes)


def call_bytes(config: t5.T5Config, *, batch: int, positions: int, cache_len: int, source_length):
  """HBM bytes one decoder call of `config` (params in its dtype) reads on one device: `call_cost`
  of a 1x1 mesh over the first device."""
  mesh = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
  abstract = synthetic.abstract_model(config, mesh)
  return call_cost(
    abstract, mesh, batch=batch, positions=positions, buffer_len=cache_len,
    source_length=source_length,
  ).bytes  # fmt: skip


def xla_step_cost(model: t5.T5Model, *, batch: int, positions: int, buffer_len: int, source_length):
  """XLA's `cost_analysis()` of one lowered, unsharded decoder call: {'flops', 'bytes accessed'}.

  Global (one device), for checking `call_cost` on a 1x1 mesh; XLA also counts elementwise work,
  and its bytes count every operand of every op (activations included).
  """
  model = synthetic.unsharded(model)
  config, params = model.config, model.params
  cache = synthetic.abstract_cache(
    model, batch=batch, cache_len=buffer_len, source_length=source_length
  )
  tokens = jax.ShapeDtypeStruct((batch, positions), jnp.int32)
  step = jax.jit(lambda p, t, c: t5.decode(p, t, c, config=config))
  cost = step.lower(params, tokens, cache).cost_analysis()
  return {k: float(cost[k]) for k in ('flops', 'bytes accessed')}


def predict(
  target: t5.T5Model,
  drafter: t5.T5Model,
  mesh,
  chip: Chip,
  *,
  batch: int,
  gamma: int,
  max_new_tokens: int,
  source_length: int,
) -> dict:
  """Roofline times of the three calls of the loops on `chip`, c, the pass cost, and the speedup
  of `analysis` at each alpha of `ALPHAS`.

  The target step is autoregressive decoding's call (its cache holds M + 2 slots); the pass and
  the drafter step are the speculative loop's (M + G + 2 slots, `decode.buffer_length`).
  """
  ar_len = decode.buffer_length(max_new_tokens, 0)
  spec_len = decode.buffer_length(max_new_tokens, gamma)
  common = dict(batch=batch, source_length=source_length)
  costs = {
    'target_step': call_cost(target, mesh, positions=1, buffer_len=ar_len, **common),
    'target_pass': call_cost(target, mesh, positions=gamma + 1, buffer_len=spec_len, **common),
    'drafter_step': call_cost(drafter, mesh, positions=1, buffer_len=spec_len, **common),
  }
  seconds = {name: cost.seconds(chip) for name, cost in costs.items()}
  c = seconds['drafter_step'] / seconds['target_step']
  pass_cost = seconds['target_pass'] / seconds['target_step']
  speedups = []
  for label, *alphas in ALPHAS:
    for temperature, alpha in zip((0, 1), alphas):
      speedups.append(
        dict(
          alpha_source=label,
          temperature=temperature,
          alpha=alpha,
          paper=float(analysis.walltime_improvement(alpha, gamma, c)),
          roofline=float(analysis.walltime_improvement_measured(alpha, gamma, c, pass_cost)),
          best_gamma=int(analysis.optimal_gamma(alpha, c)),
        )
      )
  return dict(
    costs=costs,
    seconds=seconds,
    bounds={name: cost.bound(chip) for name, cost in costs.items()},
    c=c,
    pass_cost=pass_cost,
    iteration=gamma * seconds['drafter_step'] + seconds['target_pass'],
    speedups=speedups,
  )


def memory_stats(compiled: jax.stages.Compiled) -> dict[str, int]:
  """Bytes per device of a compiled program (`memory_analysis()`): argument, output, alias (the
  outputs written over donated arguments), temp, and peak (the compiler's own peak of what is
  live at once)."""
  stats = compiled.memory_analysis()
  return dict(
    argument=stats.argument_size_in_bytes,
    output=stats.output_size_in_bytes,
    alias=stats.alias_size_in_bytes,
    temp=stats.temp_size_in_bytes,
    peak=stats.peak_memory_in_bytes,
  )


def compile_memory(lowered: jax.stages.Lowered) -> dict:
  """`memory_stats` of `lowered` compiled, or {'out_of_memory': the compiler's message} where the
  compiler refuses it for want of memory (XLA:TPU checks the program against its chip's HBM;
  XLA:CPU never refuses)."""
  try:
    compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if 'RESOURCE_EXHAUSTED' not in str(e):
      raise
    return {'out_of_memory': str(e).strip().splitlines()[0]}
  return memory_stats(compiled)


def compile_loops(
  target: t5.T5Model,
  drafter: t5.T5Model,
  mesh,
  *,
  batch: int,
  source_length: int,
  max_new_tokens: int,
  gamma: int,
  sampling: sampling_lib.SamplingConfig,
) -> dict:
  """`memory_analysis()` of both decode loops compiled for `mesh` from abstract inputs.

  Returns:
    {'autoregressive': stats, 'speculative': stats}, each `compile_memory`'s (bytes per device),
    with inputs, the arguments that are not params (ids, mask, PRNG key), where it compiled.
  """
  ids = synthetic.abstract_batch(mesh, batch, source_length)
  with jax.set_mesh(mesh):
    lowered = {
      'autoregressive': decode.lower_generate(
        target, ids, ids, sampling=sampling, max_new_tokens=max_new_tokens
      ),
      'speculative': decode.lower_speculative(
        target,
        drafter,
        ids,
        ids,
        gamma=gamma,
        verifier='token',
        sampling=sampling,
        max_new_tokens=max_new_tokens,
      ),
    }
    out = {}
    for (name, low), models in zip(lowered.items(), ([target], [target, drafter])):
      row = out[name] = compile_memory(low)
      if 'argument' in row:
        row['inputs'] = row['argument'] - sum(bytes_per_device(m.params) for m in models)
  return out


def memory_rows(target, drafter, mesh, compiled: dict | None, *, chip=None, **shape) -> list[dict]:
  """A row per loop: params, caches, compiled bytes per device and the fits verdicts.

  Args:
    target, drafter: `synthetic.abstract_model`s.
    compiled: `compile_loops` output (of these models, or of them in float32: its temporaries
      then bound this pair's), or None (params + caches only).
    chip: the `machines.Chip` whose compiler compiled these very models (XLA:TPU): fits is then
      that compiler's verdict, {chip name: 'yes' if it compiled the loop and its peak fits the
      HBM, else 'no'}. None: `compiled` is XLA:CPU's, and fits judges every chip of
      `PLAN_CHIPS` by bounds.
    shape: batch, source_length, max_new_tokens, gamma.

  Returns:
    Dicts of bytes per device: params, caches, the compiled stats, and total = params + inputs
    + output + temp - alias (the compiled program's own total when it compiled these params);
    and fits, `fits(params + caches, total)` (or the compiler's verdict, with `chip`).
  """
  batch, source_length = shape['batch'], shape['source_length']
  rows = []
  for loop, models, gamma in (
    ('autoregressive', (target,), 0),
    ('speculative', (target, drafter), shape['gamma']),
  ):
    buffer_len = decode.buffer_length(shape['max_new_tokens'], gamma)
    params = sum(bytes_per_device(m.params) for m in models)
    caches = sum(
      sum(
        cache_bytes_per_device(
          m.config, mesh, batch=batch, buffer_len=buffer_len, source_length=source_length
        ).values()
      )
      for m in models
    )
    row = dict(loop=loop, batch=batch, params=params, caches=caches)
    if compiled is not None:
      row.update(compiled[loop])
    if 'argument' in row:
      row['total'] = params + row['inputs'] + row['output'] + row['temp'] - row['alias']
    if chip is not None:
      fit = 'argument' in row and row['peak'] <= chip.hbm_bytes
      row['fits'] = {chip.name: 'yes' if fit else 'no'}
    elif 'total' in row:
      row['fits'] = fits(params + caches, max(row['total'], params + caches))
    else:
      row['fits'] = fits(params + caches, params + caches)
    rows.append(row)
  return rows
