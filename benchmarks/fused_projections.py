r"""The target's decoder projections fused or not (`t5.fuse_projections`): what each layout's
autoregressive step and speculative iteration cost, and the speedups they give, in one run.

  python -m benchmarks.fused_projections                 # pretrained/ende48m, distilled g3, greedy
  python -m benchmarks.fused_projections --drafter=block --gamma=4 --sentences=16
  python -m benchmarks.fused_projections --pretrained=debsumm48m --source_length=256 --max_new_tokens=40

Every test sentence (batch 1, greedy) is decoded by each (layout, method) in turn, --rounds times,
so that a slow spell of a shared machine falls on all of them alike; the target is the pair's in
the T5X layout and fused (its q/k/v kernels one [D, 3 N H] dot, its gated MLP's wi_0/wi_1 one
[D, 2 F] dot), the drafter the same in both. Prints ms per target call, ms per token, and each
layout's speedup against its own autoregressive decoding; the tokens of both layouts are compared.

Past runs: docs/performance.md, "Fused decoder projections".
"""

import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from specdec_jax import decode, pretrained
from specdec_jax.measure import timing
from specdec_jax.models import t5
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


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  pair = pretrained.load(_DIR.value)
  drafter = pair.drafters[_DRAFTER.value]
  sources = [s for s, _ in pair.test_pairs()[: _SENTENCES.value]]
  encode = lambda s: pair.tokenizer.encode_batch([s], _SOURCE_LENGTH.value, truncate=True)
  batches = [tuple(map(jnp.asarray, encode(s))) for s in sources]  # on device before the clock
  kw = dict(sampling=SamplingConfig(temperature=0.0), rng=None, max_new_tokens=_MAX_NEW.value)
  targets = {'t5x': pair.target, 'fused': t5.fuse_projections(pair.target)}
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
