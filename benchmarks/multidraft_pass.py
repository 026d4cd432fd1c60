r"""How to score K draft paths in one target pass: K rows of gamma + 1 positions, or one tree.

  python -m benchmarks.multidraft_pass                       # shipped ende48m target
  python -m benchmarks.multidraft_pass --pair=ende --gammas=3 --paths=2,4

`speculative_generate(..., num_drafts=K)` runs each source row as K rows of the target, each
scoring its path's gamma + 1 positions (the pending token and gamma drafts) with its own copy of
the prefix cache ("rows"). The alternative is one tree per source row: the pending token and the
K x gamma drafted nodes as 1 + K*gamma positions of ONE row, with an attention mask keeping each
node to its own path ("tree"). This prints, in target steps (one position, batch 1), the cost of
a rows pass (batch K, gamma + 1 positions) and of a tree pass of the same nodes *without* its
mask (batch 1, 1 + K*gamma positions: a lower bound of the tree's cost, which also needs a
per-node mask and positions for the relative attention bias). All costs are measured inside a
jitted loop (`timing.step_seconds`), one after another in one run.

Past runs: docs/performance.md, "K rows or a tree".
"""

from absl import flags

import benchmarks
from specdec_jax.measure import timing

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_PAIR = flags.DEFINE_string(
  'pair', 'ende48m', 'Shipped pair whose target is measured.', flag_values=FLAGS
)
_GAMMAS = flags.DEFINE_list('gammas', ['3', '5'], 'Drafted tokens per path.', flag_values=FLAGS)
_PATHS = flags.DEFINE_list('paths', ['1', '2', '4'], 'Draft paths K.', flag_values=FLAGS)
_SOURCE_LENGTH = flags.DEFINE_integer(
  'source_length', 32, 'Source tokens (all real).', flag_values=FLAGS
)


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  benchmarks.quiet_checkpoint_logs()  # orbax logs every file it reads at INFO
  target = benchmarks.load_pair(_PAIR.value).target
  kw = dict(source_length=_SOURCE_LENGTH.value, cache_len=96)
  step = timing.step_seconds(target, batch_size=1, **kw)
  print(f'{_PAIR.value} target: one step {step * 1e3:.2f} ms')
  print(f'{"gamma":>5} {"K":>3} {"rows (K x (G+1))":>17} {"tree (1 + K*G)":>15} {"rows/tree":>9}')
  for gamma in map(int, _GAMMAS.value):
    for k in map(int, _PATHS.value):
      rows = timing.step_seconds(target, batch_size=k, num_tokens=gamma + 1, **kw)
      tree = timing.step_seconds(target, batch_size=1, num_tokens=1 + k * gamma, **kw)
      print(f'{gamma:5d} {k:3d} {rows / step:17.2f} {tree / step:15.2f} {rows / tree:9.2f}')


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
