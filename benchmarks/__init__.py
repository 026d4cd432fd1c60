"""Benchmark mains: each prints ratios measured in one run (these machines are noisy).

Every decode benchmark calls `start()` first in its main, so that its few-row dots run on the
kernels the main job uses (`specdec_jax.measure.xla_cpu`); `--noeigen_dots` keeps XLA:CPU's default.
"""

import sys

from absl import app, flags

from specdec_jax.measure import xla_cpu

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


def flags_parser(own: flags.FlagValues):
  """`app.run(main, flags_parser=benchmarks.flags_parser(FLAGS))` for a main whose flags are its
  own `FlagValues` (`flag_values=FLAGS` in each DEFINE): several benchmarks define --target,
  --dtype, ... and one process (the test suite) imports them all, so they join absl's flags only
  when the main runs, listed in --help as its own."""

  def parse(argv: list[str]) -> list[str]:
    flags.FLAGS.append_flag_values(own)
    for name in own:
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], own[name])
    argv = app.parse_flags_with_usage(argv)
    own.mark_as_parsed()
    return argv

  return parse
