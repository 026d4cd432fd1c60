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


@pytest.mark.parametrize(
  'xla_flags, tied, eigen, warns',
  [
    ('--xla_cpu_experimental_ynn_fusion_type=', True, True, True),  # prefer_eigen_dots' setting
    (  # the last value counts
      '--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_experimental_ynn_fusion_type=dot',
      True, False, False,
    ),
    ('--xla_cpu_experimental_ynn_fusion_type=individual_dot', True, False, False),
    ('', True, False, False),  # XLA:CPU's default
    ('--xla_cpu_experimental_ynn_fusion_type=', False, True, False),  # untied (T5 v1.1)
  ],
)  # fmt: skip
def test_a_tied_target_on_eigen_dots_is_warned_of(
  monkeypatch, caplog, xla_flags, tied, eigen, warns
):
  import types

  from specdec_jax.measure import xla_cpu

  monkeypatch.setenv('XLA_FLAGS', xla_flags)
  assert xla_cpu.eigen_dots() == eigen
  with caplog.at_level('WARNING'):
    xla_cpu.check_tied_target(types.SimpleNamespace(tie_word_embeddings=tied))
  assert ('ties its output layer' in caplog.text) == warns
