"""Benchmark mains: each prints ratios measured in one run (these machines are noisy).

Every decode benchmark calls `start()` first in its main, so that its few-row dots run on the
kernels the main job uses (`specdec_jax.xla_cpu`); `--noeigen_dots` keeps XLA:CPU's default.
"""

from absl import flags

from specdec_jax import xla_cpu

_EIGEN_DOTS = flags.DEFINE_bool(
  'eigen_dots',
  True,
  "Few-row dots on XLA's own kernels, as the main job runs them (xla_cpu.prefer_eigen_dots); "
  "--noeigen_dots for XLA:CPU's default (YNNPACK).",
)


def start() -> None:
  """The XLA:CPU options of --eigen_dots; call before JAX starts (first thing in main)."""
  if _EIGEN_DOTS.value:
    xla_cpu.prefer_eigen_dots()
