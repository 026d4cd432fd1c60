"""Tests of benchmarks/machines.py: the machines' table, meshes by name, and compile-only TPU
devices as a real VM shows them (skipped where libtpu is absent)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import topologies
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks import machines
from tests import helpers

_TPUS = [name for name, m in machines.MACHINES.items() if m.platform == 'tpu']


def test_get_and_with_devices_name_the_choices():
  assert machines.get('v4-8').devices == 4
  with pytest.raises(ValueError, match=r"Unknown machine 'v4-9'; choose one of \["):
    machines.get('v4-9')
  assert machines.with_devices('tpu-v4', 4).name == 'v4-8'
  assert machines.with_devices('v4-8', 16).name == 'v4-32'
  assert machines.with_devices('tpu-v5e', 4).name == 'v5e-4'
  assert machines.with_devices('v5e-8', 1).name == 'tpu-v5e'
  with pytest.raises(ValueError, match=r'No TPU v4 machine has 3 devices; the ones known have'):
    machines.with_devices('tpu-v4', 3)


def test_chip_by_device_kind():
  assert machines.chip_for('NVIDIA H100 80GB HBM3').hbm_bandwidth == 3.35e12
  assert machines.chip_for('NVIDIA H200').hbm_bandwidth == 4.8e12
  assert machines.chip_for('TPU v4').hbm_bandwidth == 1.2e12
  assert machines.chip_for('TPU v5 lite').hbm_bandwidth == 819e9
  for unknown in ('cpu', 'NVIDIA H100 PCIe', 'NVIDIA A100-SXM4-40GB'):
    assert machines.chip_for(unknown) is None


def test_parse_machine_mesh():
  assert machines.parse_machine_mesh('v4-8:1x4, v5e-8:2x4,h100:1x1') == [
    ('v4-8', 1, 4),
    ('v5e-8', 2, 4),
    ('h100', 1, 1),
  ]
  with pytest.raises(ValueError, match='MACHINE:DATAxMODEL'):
    machines.parse_machine_mesh('v4-8')
  with pytest.raises(ValueError, match='DATAxMODEL'):
    machines.parse_machine_mesh('v4-8:1x0')
  with pytest.raises(ValueError, match='Unknown machine'):
    machines.parse_machine_mesh('v9-8:1x4')


def test_compile_for_items_with_and_without_a_mesh():
  assert machines.parse_machines('v4-8:1x4,tpu-v4, h100') == [
    ('v4-8', (1, 4)),
    ('tpu-v4', None),
    ('h100', None),
  ]
  with pytest.raises(ValueError, match=r'v4-8 has 4 devices; the mesh 2x4 has 8'):
    machines.parse_machines('v4-8:2x4')
  # An item without a mesh takes the planned one, on the machine of its chip with as many devices.
  assert machines.for_mesh('tpu-v4', None, (1, 4)) == ('v4-8', 1, 4)
  assert machines.for_mesh('tpu-v4', None) == ('tpu-v4', 1, 1)
  assert machines.for_mesh('v4-8', None) == ('v4-8', 1, 4)  # unplanned: every device on 'model'
  assert machines.for_mesh('v4-8', (2, 2), (1, 1)) == ('v4-8', 2, 2)


def test_a_missing_compiler_is_one_error_naming_the_install_line(monkeypatch):
  def absent(*args, **kwargs):
    raise RuntimeError('Unable to load the TPU compiler')

  monkeypatch.setattr(topologies, 'get_topology_desc', absent)
  with pytest.raises(RuntimeError, match=r"v4-8 needs its compiler .*pip install 'jax\[tpu\]=="):
    machines.compile_only_devices('v4-8')


@helpers.needs_libtpu
@pytest.mark.parametrize('name', _TPUS)
def test_compile_only_devices_are_what_a_real_vm_shows(name, monkeypatch):
  for key in ('TPU_ACCELERATOR_TYPE', 'TPU_WORKER_HOSTNAMES', 'ALLOW_MULTIPLE_LIBTPU_LOAD'):
    monkeypatch.delenv(key, raising=False)
  machine = machines.get(name)
  devices = machines.compile_only_devices(name)
  assert len(devices) == machine.devices
  assert len({d.process_index for d in devices}) == machine.hosts
  kind = {'TPU v4': 'TPU v4', 'TPU v5e': 'TPU v5 lite'}[machine.chip.name]
  assert {d.device_kind for d in devices} == {kind}
  assert machines.on_devices(devices).startswith(f'{kind} x{machine.devices} ')
  # libtpu was told what it needed while it started, and nothing of it is left behind.
  assert 'TPU_ACCELERATOR_TYPE' not in os.environ and 'TPU_WORKER_HOSTNAMES' not in os.environ


@helpers.needs_libtpu
def test_a_slice_of_two_hosts_compiles_in_one_process():
  mesh = machines.compile_only_mesh('v4-16', data=2, model=4)
  x = jax.ShapeDtypeStruct((8, 256), jnp.float32, sharding=NamedSharding(mesh, P('data', 'model')))
  w = jax.ShapeDtypeStruct((256, 128), jnp.float32, sharding=NamedSharding(mesh, P('model')))
  compiled = jax.jit(lambda x, w: x @ w).lower(x, w).compile()
  # Each device holds its shard: x 4 x 64, w 64 x 128 (float32).
  assert compiled.memory_analysis().argument_size_in_bytes >= 4 * (4 * 64 + 64 * 128)
  assert 'all-reduce' in compiled.as_text()  # the contraction over 'model' crosses devices


_QUIET_SCRIPT = """
import jax
from benchmarks import machines
assert [len(machines.compile_only_devices(n)) for n in ('tpu-v4', 'v5e-8')] == [1, 8]
machines.simulate_cpu_devices(3)
assert jax.device_count() == 3 and jax.default_backend() == 'cpu', jax.devices()
print('QUIET_OK')
"""


@helpers.needs_libtpu
def test_libtpu_starts_without_a_word_and_cpu_devices_are_simulated():
  env = {k: v for k, v in os.environ.items() if not k.startswith(('TPU_', 'XLA_', 'JAX_PLAT'))}
  result = subprocess.run(
    [sys.executable, '-c', _QUIET_SCRIPT],
    cwd=helpers._REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert result.returncode == 0 and 'QUIET_OK' in result.stdout, result.stderr[-3000:]
  assert result.stderr == '', result.stderr[-3000:]
