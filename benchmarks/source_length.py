r"""Does the source length set the pass cost? Target step, (gamma+1)-position pass and drafter
cost of a shipped pair, measured in the loop (`timing.step_costs`) at several source lengths.

  python -m benchmarks.source_length                                   # debsumm, 32..256 tokens
  python -m benchmarks.source_length --pretrained=ende --source_lengths=16,64

Every decoder position cross-attends over all S source positions, so S adds the same work to a
step and to each position of a pass; the pass cost (pass / step) is what the walltime formula
needs. Each line is the median of --rounds interleaved rounds.

Past runs: docs/performance.md, "Few-row dots".
"""

from absl import flags

import benchmarks
from specdec_jax import decode
from specdec_jax.measure import timing

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string(
  'pretrained', 'debsumm48m', 'Shipped pair (name or directory).', flag_values=FLAGS
)
_DRAFTER = flags.DEFINE_string(
  'drafter', None, 'A drafter of the pair (default: recommended).', flag_values=FLAGS
)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft tokens per iteration.', flag_values=FLAGS)
_LENGTHS = flags.DEFINE_list(
  'source_lengths', ['32', '64', '128', '256'], 'Source tokens S.', flag_values=FLAGS
)
_MAX_NEW = flags.DEFINE_integer(
  'max_new_tokens', 40, 'Sets the decoder cache length.', flag_values=FLAGS
)
_ROUNDS = flags.DEFINE_integer(
  'rounds', 3, 'Interleaved rounds per length (median).', flag_values=FLAGS
)


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  benchmarks.quiet_checkpoint_logs()  # orbax logs every file it reads at INFO
  pair = benchmarks.load_pair(_DIR.value)
  name = _DRAFTER.value or pair.recommended
  gamma = _GAMMA.value
  print(f'{pair.directory}: drafter {name}, gamma {gamma}')
  for length in map(int, _LENGTHS.value):
    costs = timing.step_costs(
      pair.target,
      pair.drafters[name],
      batch_size=1,
      source_length=length,
      gamma=gamma,
      cache_len=decode.buffer_length(_MAX_NEW.value, gamma),
      rounds=_ROUNDS.value,
    )
    print(
      f'S {length:4d}: target step {costs["target_step"] * 1e3:5.2f} ms, '
      f'pass {costs["target_pass"] * 1e3:5.2f} ms = {costs["pass_cost"]:.2f} steps, '
      f'drafter step {costs["drafter_step"] * 1e3:5.2f} ms, c {costs["c"]:.3f} '
      f'(+ {costs["c_fixed"]:.3f} fixed)',
      flush=True,
    )


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
