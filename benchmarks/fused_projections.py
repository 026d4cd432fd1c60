r"""The target's decoder projections fused or not (`t5_fused.fuse_projections`): what each layout's
autoregressive step and speculative iteration cost, and the speedups they give, in one run.

  python -m benchmarks.fused_projections                 # pretrained/ende48m, distilled g3, greedy
  python -m benchmarks.fused_projections --drafter=block --gamma=4 --sentences=16
  python -m benchmarks.fused_projections --pretrained=debsumm48m --source_length=256 --max_new_tokens=40

Every test sentence (batch 1, greedy) is decoded by each (layout, method) in turn, --rounds times,
so that a slow spell of a shared machine falls on all of them alike; the target is the pair's in
the T5X layout and fused (models/t5_fused.py: its q/k/v kernels stacked [D, 3, N H], one dot; its
gated MLP's wi_0/wi_1 [D, 2, F], one dot), the drafter the same in both. Prints ms per target
call, ms per token, and each layout's speedup against its own autoregressive decoding; the tokens
of both layouts are compared.

With --compile_for, nothing runs: a T5 shape's decoder call (one position, and gamma + 1) is
compiled for each machine and mesh named, in both layouts, sharded by the default rules
(`sharding.param_shardings`: 'joined_kv' and 'mlp' over 'model'), and XLA:TPU's estimated cycles
of the call are compared (`benchmarks.tpu_costs`; collectives count 0 there):

  python -m benchmarks.fused_projections --compile_for=tpu-v4,v4-8:1x4,v4-8:2x2 --shape=t5_1_1-large

Past runs: docs/performance.md, "Fused decoder projections".
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from benchmarks import machines, synthetic, tpu_costs
from specdec_jax import decode, pretrained
from specdec_jax.measure import timing
from specdec_jax.models import t5, t5_fused
from specdec_jax.sampling import SamplingConfig

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'ende48m', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_DRAFTER = flags.DEFINE_string('drafter', 'distilled', "The pair's drafter.", flag_values=FLAGS)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.', flag_values=FLAGS)
_SENTENCES = flags.DEFINE_integer('sentences', 16, 'Shipped test sentences.', flag_values=FLAGS)
_ROUNDS = flags.DEFINE_integer('rounds', 3, 'Timed passes over the sentences.', flag_values=FLAGS)
_MAX_NEW = flags.DEFINE_integer('max_new_tokens', 64, 'Most tokens per row.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 64, 'Sources padded (and cut) to this many tokens.', flag_values=FLAGS
)
_COMPILE_FOR = benchmarks.define_compile_for(
  "The decoder call of --shape in both layouts: XLA:TPU's estimated cycles.", FLAGS
)
_SHAPE = flags.DEFINE_string(
  'shape', 't5_1_1-large', 'With --compile_for: the T5 shape (t5.CONFIGS).', flag_values=FLAGS
)
_BATCH = flags.DEFINE_integer('batch', 8, 'With --compile_for: rows a call.', flag_values=FLAGS)


def call_cycles(
  machine: str,
  mesh: tuple[int, int],
  config,
  *,
  fused: bool,
  positions: int,
  batch: int,
  source_length: int = 64,
) -> int:
  """XLA:TPU's estimated cycles of one decoder call of `positions` positions a row on `machine`
  with a (data, model) `mesh`: the params in bfloat16, sharded by the default rules, in the
  fused layout or T5X's; the cache (source_length + 64 slots) replicated, as is the batch."""
  devices = machines.compile_only_mesh(machine, *mesh)
  model = synthetic.abstract_model(config, devices, param_dtype='bfloat16', shard=True, fused=fused)
  cache_len = source_length + 64
  cache = synthetic.abstract_cache(
    model, devices, batch=batch, source_length=source_length, cache_len=cache_len
  )
  tokens = jax.ShapeDtypeStruct(
    (batch, positions),
    jnp.int32,
    sharding=jax.sharding.NamedSharding(devices, jax.sharding.PartitionSpec()),
  )
  step = functools.partial(t5.decode, config=config, rules=model.rules)
  with jax.set_mesh(devices):
    lowered = jax.jit(step).lower(model.params, tokens, cache)
  tag = f'{machine}:{mesh[0]}x{mesh[1]}'
  return tpu_costs.compile_lowered(lowered, tag=tag).program.cycles()


def compiler_table(items, config, *, gamma: int, batch: int) -> None:
  """`call_cycles` of both layouts at 1 and gamma + 1 positions on each (machine, mesh)."""
  print(f'{_SHAPE.value}, batch {batch}, bfloat16: XLA:TPU estimated cycles of one decoder call')
  print('machine      mesh  positions        t5x      fused  fused / t5x')
  for machine, mesh in items:
    mesh = mesh or (1, machines.get(machine).devices)
    for positions in (1, gamma + 1):
      cycles = {
        f: call_cycles(machine, mesh, config, fused=f, positions=positions, batch=batch)
        for f in (False, True)
      }
      print(
        f'{machine:10s} {mesh[0]}x{mesh[1]:<3d} {positions:9d} {cycles[False]:10d} '
        f'{cycles[True]:10d} {cycles[True] / cycles[False]:12.3f}',
        flush=True,
      )


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  items = benchmarks.compile_for(_COMPILE_FOR)
  if items:
    config = synthetic.shape(_SHAPE.value, 'bfloat16')
    compiler_table(items, config, gamma=_GAMMA.value, batch=_BATCH.value)
    return
  pair = pretrained.load(_DIR.value)
  drafter = pair.drafters[_DRAFTER.value]
  sources = [s for s, _ in pair.test_pairs()[: _SENTENCES.value]]
  encode = lambda s: pair.tokenizer.encode_batch([s], _SOURCE_LENGTH.value, truncate=True)
  batches = [tuple(map(jnp.asarray, encode(s))) for s in sources]  # on device before the clock
  kw = dict(sampling=SamplingConfig(temperature=0.0), rng=None, max_new_tokens=_MAX_NEW.value)
  targets = {'t5x': pair.target, 'fused': t5_fused.fuse_projections(pair.target)}
  methods = {}
  for layout, target in targets.items():
    methods[layout, 'autoregressive'] = lambda ids, mask, t=target: decode.generate(
      t, ids, mask, **kw
    )
    methods[layout, _DRAFTER.value] = lambda ids, mask, t=target: decode.speculative_generate(
      t, drafter, ids, mask, gamma=_GAMMA.value, **kw
    )
  seconds = dict.fromkeys(methods, 0.0)
  calls, tokens, lengths = {}, {}, {}
  for key, run in methods.items():  # compile, count
    outs = [run(*b) for b in batches]
    calls[key] = sum(int(o.stats.target_calls.sum()) for o in outs)
    tokens[key] = [np.asarray(o.tokens) for o in outs]
    lengths[key] = sum(int(o.lengths.sum()) for o in outs)
  num_tokens = lengths['t5x', 'autoregressive']  # greedy: every method's
  for _ in range(_ROUNDS.value):
    for ids, mask in batches:
      for key, run in methods.items():
        seconds[key] += timing.timed(lambda: run(ids, mask).tokens, f'{key}')[1]
  same = all(
    all(np.array_equal(a, b) for a, b in zip(tokens['t5x', m], tokens['fused', m]))
    for m in ('autoregressive', _DRAFTER.value)
  )
  print(
    f'{_DIR.value}: {len(sources)} test sentences, batch 1, greedy, {_DRAFTER.value} at gamma '
    f'{_GAMMA.value}, {_ROUNDS.value} rounds in turn; the same tokens in both layouts: {same}'
  )
  for layout in targets:
    ar = seconds[layout, 'autoregressive']
    for method in ('autoregressive', _DRAFTER.value):
      s = seconds[layout, method] / _ROUNDS.value
      print(
        f'  {layout:5s} {method:14s} {1e3 * s / calls[layout, method]:6.2f} ms per target call '
        f'{1e3 * s / num_tokens:6.2f} ms per token  speedup {ar / seconds[layout, method]:.3f}x',
        flush=True,
      )
  ratios = [seconds['fused', m] / seconds['t5x', m] for m in ('autoregressive', _DRAFTER.value)]
  print(f'seconds, fused / t5x: autoregressive {ratios[0]:.3f}, {_DRAFTER.value} {ratios[1]:.3f}')


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
