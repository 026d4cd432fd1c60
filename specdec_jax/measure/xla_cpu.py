"""XLA:CPU's matmul kernels for the decode loops' few-row dots.

jaxlib 0.10's XLA:CPU hands every dot of more than one row to YNNPACK (a `ynn_fusion` in the
compiled module) and a 1-row dot to its own gemv. For the speculative loop's (gamma+1)-row target
pass that choice is costly on a target whose weights do not fit in cache; with YNNPACK's fusions
off the same dots run on XLA's own (Eigen) kernels: the pass, and with it every speculative
method, gets cheaper while the 1-row step does not change. `python -m benchmarks.source_length
--source_lengths=64,256 --gamma=G [--noeigen_dots]` measures both; docs/performance.md ("Few-row
dots") has the measurements. The main job and the decode benchmarks call
`prefer_eigen_dots()` before JAX starts; library code never does (it only reads what the process
was started with). Setting the flag yourself (any value of it in XLA_FLAGS) wins.

A tied output layer (T5 v1.0: the embedding read transposed) ran many times slower on Eigen
from two rows on than on one; `t5_layers.logits` reads it through a transposed copy on a CPU
since, and it costs what an untied layer does (docs/performance.md, "Few-row dots").

`prefer_eigen_dots` imports JAX's private `xla_bridge`, the package's one private JAX import: JAX
has no public way to ask whether a backend has started without starting one, and XLA_FLAGS set
after that are read too late.
"""

import logging
import os

FLAG = '--xla_cpu_experimental_ynn_fusion_type='


def prefer_eigen_dots() -> bool:
  """Turns YNNPACK's fusions off for this process's XLA:CPU programs; returns whether it did.

  Must run before JAX starts its backends (the main job calls it before parsing its config). It
  does nothing when XLA_FLAGS already sets `xla_cpu_experimental_ynn_fusion_type`, and warns and
  does nothing when a backend has started (the flag would be read too late to matter).
  """
  from jax._src import xla_bridge  # private: see the module docstring

  flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_cpu_experimental_ynn_fusion_type' in flags:
    return False
  if xla_bridge.backends_are_initialized():
    logging.warning('prefer_eigen_dots: a JAX backend has started; XLA_FLAGS left as they are.')
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {FLAG}'.strip()
  return True
