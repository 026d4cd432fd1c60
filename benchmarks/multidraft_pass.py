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

Measured 2026-11-25 on 2 cores of an AMD EPYC (Zen 3), `python -m benchmarks.multidraft_pass`
(3.4 min; a 48M target step 15.9 ms here; the K = 1 rows, where both layouts are the same pass,
show the noise: 0.91 and 1.11):

  gamma  K  rows  tree (no mask)  rows/tree
    3    1  2.07  2.28            0.91
    3    2  2.93  2.40            1.22
    3    4  3.35  1.86            1.80
    5    1  1.87  1.69            1.11
    5    2  2.56  2.45            1.04
    5    4  3.11  2.80            1.11

On this CPU a tree pass would cost up to 1.8x less than K rows at gamma 3 (each row reads its
own copy of the prefix cache; the tree reads one); at gamma 5 the two are within the noise. The
loop uses rows: it needs no change to the model (a tree needs a per-node attention mask over the
new positions and per-node positions for T5's relative attention bias), and on a TPU/GPU, where a
pass of a few dozen positions costs about one step either way, the layouts cost the same. A tree
layout is the next step where K x (gamma + 1) positions are not free.
"""

from absl import app, flags, logging

import benchmarks
from specdec_jax import pretrained, timing

_PAIR = flags.DEFINE_string('pair', 'ende48m', 'Shipped pair whose target is measured.')
_GAMMAS = flags.DEFINE_list('gammas', ['3', '5'], 'Drafted tokens per path.')
_PATHS = flags.DEFINE_list('paths', ['1', '2', '4'], 'Draft paths K.')
_SOURCE_LENGTH = flags.DEFINE_integer('source_length', 32, 'Source tokens (all real).')


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)
  target = pretrained.load(_PAIR.value).target
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
  app.run(main)
