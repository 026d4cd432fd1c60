"""XLA:CPU's matmul kernels for the decode loops' few-row dots.

jaxlib 0.10's XLA:CPU hands every dot of more than one row to YNNPACK (a `ynn_fusion` in the
compiled module) and a 1-row dot to its own gemv. For the speculative loop's (gamma+1)-row target
pass that choice is costly: YNNPACK packs the weights on every call, so a 4-row dot over the 48M
target's weights costs 3-4.7x the 1-row one, where the memory-bound kernel XLA uses with YNNPACK's
dot fusion off (Eigen) costs 1.2-1.7x. Measured on 2 cores of an AMD EPYC Zen 3, debsumm48m,
source length 256, `timing.step_costs` (the distilled drafter):

  default:                      pass cost 2.17 (gamma 3) / 2.06-2.16 (gamma 5); target step 13.2-14.3 ms
  YNN's fusions off (this one): pass cost 1.49-1.62 (gamma 3) / 1.40-1.66 (gamma 5); step 13.0-14.0 ms

The 1-row step does not change, so both loops' absolute times are what they were but the pass,
and with it every speculative method, is cheaper. The main job and the decode benchmarks call
`prefer_eigen_dots()` before JAX starts; library code never does (it only reads what the process
was started with). Setting the flag yourself (any value of it in XLA_FLAGS) wins.
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
  from jax._src import xla_bridge

  flags = os.environ.get('XLA_FLAGS', '')
  if 'xla_cpu_experimental_ynn_fusion_type' in flags:
    return False
  if xla_bridge.backends_are_initialized():
    logging.warning('prefer_eigen_dots: a JAX backend has started; XLA_FLAGS left as they are.')
    return False
  os.environ['XLA_FLAGS'] = f'{flags} {FLAG}'.strip()
  return True
