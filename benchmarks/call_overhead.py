r"""What one decode call costs before and beside its tokens: wall time of `generate` and
`speculative_generate` for one shipped test sentence, by max_new_tokens.

  python -m benchmarks.call_overhead                        # pretrained/ende48m, gamma 3, greedy
  python -m benchmarks.call_overhead --pretrained=ende --gamma=4

max_new_tokens=1 is the per-call cost (encoder, cache set-up, dispatch, transfers) that every
call pays once whatever the method; the main job's speedups (whole sentences) include it, the
formula's per-iteration prediction does not. Median of --repeats calls after a compile call.

Past runs: docs/performance.md, "A call's fixed cost".
"""

import jax
from absl import flags

import benchmarks
from specdec_jax import decode
from specdec_jax.measure import timing
from specdec_jax.sampling import SamplingConfig

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'ende48m', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.', flag_values=FLAGS)
_SENTENCE = flags.DEFINE_integer('sentence', 0, 'Which shipped test sentence.', flag_values=FLAGS)
_LENGTHS = flags.DEFINE_list(
  'max_new_tokens', ['1', '2', '16', '64'], 'Token limits.', flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer('repeats', 12, 'Timed calls per point (median).', flag_values=FLAGS)


def _ms(fn, repeats: int) -> float:
  return 1e3 * timing.time_call(fn, repeats)[1]  # its first call compiles


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  pair = benchmarks.load_pair(_DIR.value)
  source = pair.test_pairs()[_SENTENCE.value][0]
  ids, mask = pair.tokenizer.encode_batch([source], 64, truncate=True)
  kw = dict(sampling=SamplingConfig(temperature=0.0), rng=jax.random.key(0))
  print(f'{_DIR.value}: {source!r}, gamma {_GAMMA.value}, greedy; ms per call')
  for n in map(int, _LENGTHS.value):
    out = decode.generate(pair.target, ids, mask, max_new_tokens=n, **kw)
    ar = _ms(
      lambda: decode.generate(pair.target, ids, mask, max_new_tokens=n, **kw).tokens,
      _REPEATS.value,
    )
    cells = [f'autoregressive {ar:6.1f}']
    for name in (pair.recommended, 'bigram'):
      drafter = pair.drafters[name]
      ms = _ms(
        lambda: decode.speculative_generate(
          pair.target, drafter, ids, mask, gamma=_GAMMA.value, max_new_tokens=n, **kw
        ).tokens,
        _REPEATS.value,
      )
      cells.append(f'{name} {ms:6.1f}')
    print(f'max_new_tokens {n:3d} ({int(out.lengths[0])} tokens): ' + '  '.join(cells), flush=True)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
