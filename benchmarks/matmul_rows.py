r"""Why the (gamma+1)-position target pass is not free on a CPU: matmul cost by row count.

  python -m benchmarks.matmul_rows                 # the shipped target's and the 48M's shapes
  python -m benchmarks.matmul_rows --shapes=512x8000 --rows=1,4,5,6,8
  python -m benchmarks.matmul_rows --shapes=128x8000,512x32128 --rows=1,2,4,8 --tied [--noeigen_dots]

A decoder step multiplies 1 row per sequence by each weight matrix; the verification pass
multiplies gamma + 1 rows. On a TPU/GPU both cost one read of the weights. Here XLA:CPU picks its
kernel by the row count, so the cost is a step function of it: prints, for each weight shape
[I, O], the time of `x[M, I] @ W[I, O]` inside a jitted loop (`timing.time_call` of a
`lax.fori_loop`, two loop lengths differenced) for each M, and its ratio to M = 1.

Past runs: docs/performance.md, "Few-row dots".

`--tied` also times each shape as a tied output layer reads it: the embedding [O, I], contracted
on its last axis (T5 v1.0, our distilled drafters). With few-row dots on XLA's Eigen kernels (the
main job's, `benchmarks.start()`), that layout is pathological from 2 rows on; docs/performance.md
("Few-row dots") has the numbers.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

import benchmarks
from specdec_jax.measure import timing

# This main's own flags (`benchmarks.run`).
FLAGS = flags.FlagValues()
_SHAPES = flags.DEFINE_list(
  'shapes',
  ['256x8000', '256x1024', '1024x256', '512x8000', '512x1024'],
  'Weight shapes IxO.',
  flag_values=FLAGS,
)
_ROWS = flags.DEFINE_list(
  'rows', ['1', '2', '3', '4', '5', '6', '8', '12'], 'Row counts M.', flag_values=FLAGS
)
_REPEATS = flags.DEFINE_integer(
  'repeats', 5, 'Timings per point (the median is printed).', flag_values=FLAGS
)
_TIED = flags.DEFINE_bool(
  'tied', False, 'Also time each shape as a tied embedding [O, I].', flag_values=FLAGS
)


@functools.partial(jax.jit, static_argnames='tied')
def _loop(x: jax.Array, w: jax.Array, n: jax.Array, tied: bool = False) -> jax.Array:
  """n dependent matmuls x @ w (each feeds a scalar of its output into the next); `tied`: w is
  [O, I] (an embedding), read transposed."""
  spec = 'mi,oi->mo' if tied else 'mi,io->mo'

  def body(i, x):
    y = jnp.einsum(spec, x, w)
    return x + 1e-9 * jnp.sum(y, axis=-1, keepdims=True)

  return jax.lax.fori_loop(0, n, body, x)


def _microseconds(m: int, w: jax.Array, repeats: int, tied: bool = False) -> float:
  """Median over `repeats` of (time of 2n calls - time of n calls) / n, n calls taking ~50 ms."""
  x = jax.random.normal(jax.random.key(1), (m, w.shape[1 if tied else 0]), jnp.float32)

  def seconds(calls):
    return timing.time_call(lambda: _loop(x, w, jnp.int32(calls), tied), 1)[1]

  n = max(100, int(0.05 / max(seconds(100) / 100, 1e-7)))  # the first call compiles
  return 1e6 * float(np.median([(seconds(2 * n) - seconds(n)) / n for _ in range(repeats)]))


def main(argv):
  del argv
  benchmarks.start()  # before JAX starts
  rows = [int(m) for m in _ROWS.value]
  print('weight [I, O]: us at each M (ratio to M = 1)')
  for shape in _SHAPES.value:
    i, o = (int(d) for d in shape.split('x'))
    for tied in (False, True)[: 1 + _TIED.value]:
      dims = (o, i) if tied else (i, o)
      w = 0.05 * jax.random.normal(jax.random.key(0), dims, jnp.float32)
      costs = {m: _microseconds(m, w, _REPEATS.value, tied) for m in rows}
      base = costs[rows[0]]
      cells = '  '.join(f'M={m}: {us:6.1f} ({us / base:.2f})' for m, us in costs.items())
      print(f'{shape + " tied" * tied:>15}: {cells}', flush=True)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
