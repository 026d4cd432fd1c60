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

The exception is a tied output layer (T5 v1.0: the embedding read transposed), which Eigen runs
many times slower from two rows on than one (docs/performance.md, "Few-row dots"): the decode
loops' drafter reads one row of its first call (`t5.decode(logits_at=)`), and a tied *target*'s
pass reads them all, so `check_tied_target` warns (the main job and `benchmarks.paper_scale` call
it) and names the value that keeps YNNPACK's dots.

`prefer_eigen_dots` imports JAX's private `xla_bridge`, the package's one private JAX import: JAX
has no public way to ask whether a backend has started without starting one, and XLA_FLAGS set
after that are read too late.
"""

import logging
import os
import re

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


def eigen_dots() -> bool:
  """Whether this process's XLA:CPU programs run few-row dots on Eigen (the flag set empty, as
  `prefer_eigen_dots` sets it; the last value in XLA_FLAGS counts)."""
  values = re.findall(
    r'--xla_cpu_experimental_ynn_fusion_type=(\S*)', os.environ.get('XLA_FLAGS', '')
  )
  return bool(values) and values[-1] == ''


def check_tied_target(config) -> None:
  """Warns when a target with a tied output layer (`config.tie_word_embeddings`: T5 v1.0) runs on
  a CPU with few-row dots on Eigen: its (gamma+1)-row pass then reads the embedding transposed on a
  kernel that costs many times its one row from two rows on (docs/performance.md, "Few-row dots"),
  and speculative decoding loses to autoregressive decoding for that alone."""
  import jax

  if not getattr(config, 'tie_word_embeddings', False) or not eigen_dots():
    return
  if jax.default_backend() != 'cpu':
    return
  logging.warning(
    'The target ties its output layer to its embedding, and few-row dots run on Eigen '
    '(prefer_eigen_dots): its (gamma+1)-position pass will be slow. Keep YNNPACK for dots with '
    'XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=individual_dot (set before starting).'
  )
