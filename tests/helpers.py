"""Plain helpers the tests share: tiny random T5 models and the shipped-pair checks.

  from tests import helpers

  target = helpers.tiny_t5('tiny-v1.1')                     # t5.init_params(key(0), config)
  drafter = helpers.tiny_t5('tiny-v1.0', seed=1, num_encoder_layers=0, encoder_dim=32)

  @helpers.needs_pair('ende')                               # skipped where pretrained/ende is not
  def test_something_on_the_shipped_pair(): ...

Fixtures built on them (a loaded shipped pair, the tiny target/drafter pair) are in conftest.py.
"""

import dataclasses
import os
import pathlib
import random
import socket
import subprocess
import sys

import jax
import pytest

from benchmarks import machines
from specdec_jax import pretrained
from specdec_jax.models import t5

# `t5.forward`, `encode` and `decode_forward` jitted: one compiled program per config and
# shapes, where op-by-op execution compiles each op (hundreds of small programs per call).
forward = jax.jit(t5.forward, static_argnames=('config',))
encode = jax.jit(t5.encode, static_argnames=('config',))
decode_forward = jax.jit(t5.decode_forward, static_argnames=('config',))


def tiny_t5(config: str | t5.T5Config = 'tiny-v1.1', seed: int = 0, **overrides) -> t5.T5Model:
  """A T5Model with `t5.init_params(jax.random.key(seed), config)`.

  Args:
    config: a name of `t5.CONFIGS` or a T5Config.
    seed: the init key's seed.
    **overrides: fields of the config to replace (`dataclasses.replace`), e.g. d_model=16.
  """
  if isinstance(config, str):
    config = t5.CONFIGS[config]
  if overrides:
    config = dataclasses.replace(config, **overrides)
  return t5.T5Model(config=config, params=t5.init_params(jax.random.key(seed), config))


_EN = {'red': 'rote', 'big': 'große', 'old': 'alte', 'small': 'kleine'}
_NOUNS = {'cat': 'Katze', 'house': 'Haus', 'dog': 'Hund', 'tree': 'Baum'}
_VERBS = {'sees': 'sieht', 'likes': 'mag', 'finds': 'findet'}


def fixture_pairs(n: int, seed: int) -> list[tuple[str, str]]:
  """`n` synthetic EN->DE sentence pairs ('The red cat sees 12 birds.' -> 'Die rote Katze sieht
  12 Vögel.'): a corpus a tiny model learns in a few steps."""
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    adj, noun, verb = rng.choice(list(_EN)), rng.choice(list(_NOUNS)), rng.choice(list(_VERBS))
    count = rng.randint(2, 99)
    out.append(
      (
        f'The {adj} {noun} {verb} {count} birds.',
        f'Die {_EN[adj]} {_NOUNS[noun]} {_VERBS[verb]} {count} Vögel.',
      )
    )
  return out


def shipped(name: str = 'ende') -> bool:
  """Whether this checkout ships the pair `pretrained/<name>` (its manifest and its target)."""
  directory = pretrained.ROOT / name
  return (directory / 'pair.json').exists() and (directory / 'target').exists()


def needs_pair(name: str = 'ende'):
  """A mark that skips a test (or a parameter) where `pretrained/<name>` is not shipped."""
  return pytest.mark.skipif(not shipped(name), reason=f'pretrained/{name} not shipped')


# XLA:TPU's compiler (libtpu) compiles for abstract TPU devices on any host (benchmarks.machines).
try:
  import libtpu  # noqa: F401  (a small Python module beside libtpu.so)

  HAS_LIBTPU = True
except ImportError:
  HAS_LIBTPU = False
NO_LIBTPU = (
  "libtpu (XLA:TPU's compiler) is not installed: pip install -e '.[test]' brings it, or "
  + machines.install_line('tpu-v4')
)


def needs_libtpu(test):
  """Skips `test` (a test or a mark target) where libtpu is absent, naming the install line."""
  return pytest.mark.skipif(not HAS_LIBTPU, reason=NO_LIBTPU)(test)


_REPO = pathlib.Path(__file__).resolve().parents[1]


def _with_devices(devices: int) -> str:
  """This run's XLA_FLAGS (tests/conftest.py's among them) with `devices` host devices."""
  flags = os.environ.get('XLA_FLAGS', '')
  return f'{flags} --xla_force_host_platform_device_count={devices}'.strip()


def run_on_cpu_devices(script: str, done: str, *, devices: int = 8, timeout: int = 600) -> str:
  """Runs `script` in a fresh interpreter that sees `devices` CPU devices (the device count is
  fixed when JAX starts, so it cannot change in this process) and asserts it exited 0 having
  printed `done`; returns its stdout."""
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS=_with_devices(devices),
  )
  result = subprocess.run(
    [sys.executable, '-c', script],
    cwd=_REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
  )
  assert result.returncode == 0 and done in result.stdout, result.stdout + result.stderr[-4000:]
  return result.stdout


def run_as_two_hosts_and_one(
  script: str, out: pathlib.Path, *args: str, timeout: int = 900
) -> None:
  """Runs `script` three times at once, as `python script PROCESS_ID PORT OUT_DIR *args`: as the
  2 processes of one job (PROCESS_ID 0 and 1, 4 CPU devices each, OUT_DIR `out/multi`, joining
  over localhost at PORT) and as one process on one device (PROCESS_ID -1, `out/one`); asserts
  that each exited 0 with DONE as its last line."""
  out.mkdir(parents=True, exist_ok=True)
  (out / 'script.py').write_text(script)
  with socket.socket() as s:
    s.bind(('localhost', 0))
    port = str(s.getsockname()[1])
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(_REPO))
  procs = []
  for name, pid, devices in (('multi', 0, 4), ('multi', 1, 4), ('one', -1, 1)):
    (out / name).mkdir(exist_ok=True)
    procs.append(
      subprocess.Popen(
        [sys.executable, str(out / 'script.py'), str(pid), port, str(out / name), *args],
        cwd=_REPO,
        env=dict(env, XLA_FLAGS=_with_devices(devices)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  try:
    outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, output in zip(procs, outputs):
    assert p.returncode == 0 and output.rstrip().endswith('DONE'), output[-6000:]
