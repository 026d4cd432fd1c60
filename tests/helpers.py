"""Plain helpers the tests share: tiny random T5 models, the shipped-pair checks, and what two or
more test files need (a test file imports helper modules, never another test file): checkpoint
fixtures and checks.

  from tests import helpers

  target = helpers.tiny_t5('tiny-v1.1')                     # t5.init_params(key(0), config)
  drafter = helpers.tiny_t5('tiny-v1.0', seed=1, num_encoder_layers=0, encoder_dim=32)

  @helpers.needs_pair('ende')                               # skipped where pretrained/ende is not
  def test_something_on_the_shipped_pair(): ...

Fixtures built on them (a loaded shipped pair, the tiny target/drafter pair) are in conftest.py.
"""

import dataclasses
import math
import os
import pathlib
import random
import socket
import subprocess
import sys

import flax.serialization
import flax.traverse_util
import jax
import numpy as np
import pytest
import tensorstore as ts

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


# -------------------------------------------------------------------------------------------------
# Checkpoints: what the checkpoint tests share (checkpoints_test, checkpoints_hf_test,
# checkpoints_t5x_test, checkpoints_sharded_test).

# Written by T5X itself and shipped in the repo (origin and license: tests/testdata/README.md).
T5X_TINY = _REPO / 'tests' / 'testdata' / 't5x_tiny' / 'checkpoint_0'
HF_TOL = 1e-4  # float32, ours (XLA) vs HF (PyTorch)


def flat_params(params) -> dict:
  """{'a/b/c': leaf} of a params tree."""
  return flax.traverse_util.flatten_dict(params, sep='/')


def assert_params_equal(got, want):
  """Same names, dtypes and bits."""
  got, want = flat_params(got), flat_params(want)
  assert sorted(got) == sorted(want)
  for name in want:
    assert np.asarray(got[name]).dtype == np.asarray(want[name]).dtype, name
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(want[name]), err_msg=name)


def random_t5(name: str, seed: int = 0, dtype: str = 'float32') -> t5.T5Model:
  """`t5.CONFIGS[name]` in `dtype` (config and params), params from `t5.init_params(key(seed))`."""
  config = dataclasses.replace(t5.CONFIGS[name], dtype=dtype)
  params = t5.init_params(jax.random.key(seed), config)
  return t5.T5Model(config=config, params=jax.tree.map(lambda x: x.astype(dtype), params))


def checkpoint_source(vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """int64[2, 11] ids and mask; row 1 is padded after 7 tokens."""
  ids = np.random.default_rng(seed).integers(2, vocab, size=(2, 11))
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  return ids * mask, mask


def with_value(array, value, index: int = 3) -> np.ndarray:
  """A copy of `array` with one entry set to `value`."""
  array = np.array(array)
  array.flat[index] = value
  return array


def raises_naming(call, *needles: str) -> str:
  """Runs `call`, which must raise one ValueError whose one-line message holds every needle."""
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert '\n' not in message
  for needle in needles:
    assert needle in message, (needle, message)
  return message


def _chunk_shape(shape: tuple[int, ...], target_elements: int) -> list[int]:
  """T5X's `_choose_chunk_shape`: divisors of each dimension, largest dimension shrunk first."""
  factors = [[i for i in range(1, n + 1) if n % i == 0] for n in shape]
  while math.prod(f[-1] for f in factors) > target_elements:
    max(factors, key=lambda f: f[-1]).pop()
  return [f[-1] for f in factors]


def write_t5x_tensorstore_checkpoint(
  state: dict, directory: pathlib.Path, inline: tuple[str, ...] = (), storage: dict | None = None
):
  """Writes `state` ({'target': params, 'state': ...}) as T5X's Checkpointer does.

  Each array goes to a gzip-compressed zarr directory named by its dotted path
  ('target.encoder.layers_0.attention.key.kernel'), written by tensorstore; the msgpack
  `checkpoint` file holds {'version': 3, 'optimizer': state} with each such array replaced by its
  tensorstore spec, whose path is relative to the checkpoint directory. Scalars and the arrays
  named in `inline` stay in the msgpack, as T5X keeps unpartitioned arrays. `storage` overrides
  zarr metadata fields (dtype, compressor, order, ...) that T5X itself leaves at their defaults.
  """
  directory.mkdir(parents=True)

  def write(path: tuple[str, ...], array: np.ndarray):
    if array.ndim == 0 or '/'.join(path) in inline:
      return array
    spec = {
      'driver': 'zarr',
      'dtype': array.dtype.name,
      'kvstore': {'driver': 'file', 'path': '.'.join(path)},
      # T5X aims at 64 MiB chunks; 1024 elements make the larger arrays span several files.
      'metadata': {
        'compressor': {'id': 'gzip'},
        'shape': list(array.shape),
        'chunks': _chunk_shape(array.shape, target_elements=1024),
        **(storage or {}),
      },
    }
    if storage and 'dtype' in storage:
      del spec['dtype']  # the metadata's dtype (e.g. big-endian '>f4') is the stored one
    if array.ndim < 2:
      spec['metadata'].pop('order', None)  # tensorstore refuses 'F' for 1-D arrays (same as 'C')
    absolute = {**spec, 'kvstore': {'driver': 'file', 'path': str(directory / '.'.join(path))}}
    ts.open(absolute, create=True, open=True).result().write(array).result()
    return ts.Spec(spec).to_json()

  flat = flax.traverse_util.flatten_dict(state)
  written = flax.traverse_util.unflatten_dict({p: write(p, a) for p, a in flat.items()})
  contents = flax.serialization.msgpack_serialize({'version': 3, 'optimizer': written})
  (directory / 'checkpoint').write_bytes(contents)


def t5x_state(params) -> dict:
  """A T5X optimizer state dict: the params as `target`, plus Adafactor-like state to skip."""
  params = jax.tree.map(np.asarray, params)
  slots = jax.tree.map(lambda x: {'v_row': np.zeros((1,), x.dtype)}, params)
  return {'target': params, 'state': {'step': np.int32(7), 'param_states': slots}}
