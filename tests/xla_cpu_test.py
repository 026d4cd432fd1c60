"""`xla_cpu.prefer_eigen_dots`: a few-row dot leaves YNNPACK only when the flag is set in time."""

import os
import subprocess
import sys

import pytest

# Prints whether the call changed XLA_FLAGS, then whether a 4-row dot compiled to a YNNPACK fusion.
_SCRIPT = """
import sys
from specdec_jax.measure import xla_cpu
import jax, jax.numpy as jnp
applied = xla_cpu.prefer_eigen_dots() if sys.argv[1] == 'call' else None
dot = jax.jit(lambda x, w: jnp.tanh(x @ w))
text = dot.lower(jnp.ones((4, 512)), jnp.ones((512, 512))).compile().as_text()
print(applied, 'ynn_fusion' in text)
"""


def _run(mode: str, xla_flags: str = '') -> str:
  env = dict(os.environ, JAX_PLATFORMS='cpu', XLA_FLAGS=xla_flags)
  done = subprocess.run(
    [sys.executable, '-c', _SCRIPT, mode], env=env, capture_output=True, text=True, check=True
  )
  return done.stdout.split()


@pytest.mark.parametrize(
  'mode, xla_flags, want',
  [
    ('skip', '', ['None', 'True']),  # XLA:CPU's default: a 4-row dot goes to YNNPACK
    ('call', '', ['True', 'False']),
    # The user's own value of the flag wins (here: YNNPACK's dot fusion kept).
    ('call', '--xla_cpu_experimental_ynn_fusion_type=dot', ['False', 'True']),
  ],
)
def test_prefer_eigen_dots_moves_few_row_dots_off_ynnpack(mode, xla_flags, want):
  assert _run(mode, xla_flags) == want


def test_prefer_eigen_dots_after_the_backend_started_changes_nothing():
  import jax

  from specdec_jax.measure import xla_cpu

  jax.devices()  # this test process's backend has started
  before = os.environ.get('XLA_FLAGS')
  assert not xla_cpu.prefer_eigen_dots()
  assert os.environ.get('XLA_FLAGS') == before
