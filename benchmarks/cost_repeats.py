r"""How many timed runs the main job's cost phase needs: c, c_fixed and the pass cost of a shipped
pair's drafter from `timing.step_costs` at two `repeats` settings, interleaved, their spread over
trials and the seconds each measurement takes.

  python -m benchmarks.cost_repeats                         # ende48m's distilled, gamma 3: 7 vs 15
  python -m benchmarks.cost_repeats --pretrained=debsumm48m --drafter=block --gamma=8

The main job's shapes (batch 1, the config's source and output lengths: --source_length,
--max_new_tokens) and its one round (`evaluation.model_costs`). The first measurement of a run
also compiles the programs (its seconds include that). Past runs: docs/performance.md,
"How many repeats".
"""

import time

import numpy as np
from absl import flags

import benchmarks
from specdec_jax import decode
from specdec_jax.measure import timing

FLAGS = flags.FlagValues()
_DIR = flags.DEFINE_string('pretrained', 'ende48m', 'Shipped pair.', flag_values=FLAGS)
_DRAFTER = flags.DEFINE_string('drafter', 'distilled', "The pair's drafter.", flag_values=FLAGS)
_GAMMA = flags.DEFINE_integer('gamma', 3, 'Draft length.', flag_values=FLAGS)
_SOURCE = flags.DEFINE_integer('source_length', 64, 'Source positions.', flag_values=FLAGS)
_NEW = flags.DEFINE_integer('max_new_tokens', 64, "The loop's output length.", flag_values=FLAGS)
_REPEATS = flags.DEFINE_list('repeats', ['7', '15'], 'Settings compared.', flag_values=FLAGS)
_TRIALS = flags.DEFINE_integer('trials', 4, 'Measurements per setting.', flag_values=FLAGS)

NAMES = ('c', 'c_fixed', 'pass_cost')


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  pair = benchmarks.load_pair(_DIR.value)
  drafter = pair.drafters[_DRAFTER.value]
  settings = [int(r) for r in _REPEATS.value]
  print(f'{_DIR.value} {_DRAFTER.value}, gamma {_GAMMA.value}: step_costs, one round', flush=True)
  found = {r: [] for r in settings}
  for trial in range(_TRIALS.value):
    for repeats in settings:
      start = time.perf_counter()
      m = timing.step_costs(
        pair.target, drafter, batch_size=1, source_length=_SOURCE.value, gamma=_GAMMA.value,
        cache_len=decode.buffer_length(_NEW.value, _GAMMA.value), rounds=1, repeats=repeats,
      )  # fmt: skip
      found[repeats].append([m[n] for n in NAMES] + [time.perf_counter() - start])
      cells = ' '.join(f'{n} {v:.4f}' for n, v in zip(NAMES, found[repeats][-1]))
      print(
        f'repeats {repeats:3d}, trial {trial}: {cells}, {found[repeats][-1][-1]:.1f} s', flush=True
      )
  for repeats, rows in found.items():
    a = np.array(rows)
    cells = ', '.join(f'{n} {m:.4f} +- {s:.4f}' for n, m, s in
                      zip(NAMES, a.mean(0), a.std(0, ddof=1)))  # fmt: skip
    later = f'{np.median(a[1:, -1]):.1f}' if len(a) > 1 else '-'
    print(f'repeats {repeats:3d}: {cells} (mean +- sd over {len(a)} trials); {later} s each')


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
