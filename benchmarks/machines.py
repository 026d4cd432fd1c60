"""The accelerators we plan for, and compile-only devices of them on any host.

A `Machine` is what one VM (or slice) shows JAX: its chip, how many devices and hosts. JAX's
compile-only client (`jax.experimental.topologies`) gives abstract devices of a named machine on
any host, a CPU included: programs lower and compile for them with the target's own compiler
(XLA:TPU from libtpu, XLA:GPU from the CUDA plugin), so their memory analysis and cost model are
the target's, and nothing runs.

  devices = machines.compile_only_devices('v4-8')           # 4 TPU v4 devices, as a v4-8 VM shows
  mesh = machines.compile_only_mesh('v4-8', data=1, model=4)
  compiled = jax.jit(f, in_shardings=...).lower(*abstract_args).compile()
  compiled.memory_analysis(), compiled.as_text()            # XLA:TPU's memory and cost model

A TPU v4 chip has two TensorCores that a VM shows as one JAX device (megacore): v4-8 is 4 chips,
4 devices on one host; v4-16 8 devices on 2 hosts; v4-32 16 devices on 4 hosts. A v5e chip has
one TensorCore: v5e-4 / v5e-8 (v5litepod-4 / -8) are 4 / 8 chips on one host. 'tpu-v4' /
'tpu-v5e' are one chip. A slice of several hosts compiles in one process (each device carries
its host's `process_index`), as each host of the real slice compiles the same program.

Off a TPU VM, libtpu (the compiler) is told it is alone on no TPU host while it starts
(`quiet_libtpu`): it then neither takes the one-process TPU lock (so several processes,
the test suite's workers, compile at once) nor prints warnings about the TPU metadata it cannot
find.
"""

import contextlib
import dataclasses
import os
from collections.abc import Sequence

import jax

from specdec_jax import sharding

GiB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip: peak dense bf16 FLOP/s, HBM bandwidth (bytes/s) and capacity (bytes;
  None where only the roofline constants are wanted)."""

  name: str
  peak_flops: float
  hbm_bandwidth: float
  hbm_bytes: int | None = None


# TPU v4: "Peak compute per chip 275 teraflops (bf16 or int8)", "HBM2 capacity and bandwidth
# 32 GiB, 1200 GBps" (https://cloud.google.com/tpu/docs/v4). TPU v5e: "197 TFLOPS" (bf16),
# "16 GB, 819 GBps" (https://cloud.google.com/tpu/docs/v5e). H100 SXM (NVIDIA's datasheet):
# BF16 Tensor Core 1,979 TFLOPS with 2:4 sparsity, so 989 dense; 80 GB HBM3 at 3.35 TB/s.
TPU_V4 = Chip('TPU v4', peak_flops=275e12, hbm_bandwidth=1.2e12, hbm_bytes=32 * GiB)
TPU_V5E = Chip('TPU v5e', peak_flops=197e12, hbm_bandwidth=819e9, hbm_bytes=16 * GiB)
H100 = Chip('H100 SXM', peak_flops=989e12, hbm_bandwidth=3.35e12, hbm_bytes=80 * GiB)
# H200: NVIDIA's H200 datasheet, "GPU memory bandwidth 4.8TB/s" (SXM and NVL); its bf16 Tensor
# Cores are H100 SXM's (989 dense TFLOPS). Timed, never planned for: no capacity given.
H200 = Chip('H200', peak_flops=989e12, hbm_bandwidth=4.8e12)

# Chips by a part of `jax.devices()[0].device_kind` as JAX reports it, tried in order. An H100
# PCIe ('NVIDIA H100 PCIe', 2 TB/s) or NVL is not an SXM: it matches nothing.
DEVICE_KINDS = (
  ('H100 80GB HBM3', H100),
  ('H200', H200),
  ('TPU v4', TPU_V4),
  ('TPU v5 lite', TPU_V5E),
  ('TPU v5e', TPU_V5E),
)


def chip_for(device_kind: str) -> Chip | None:
  """The chip of `DEVICE_KINDS` whose name part `device_kind` contains, or None (a CPU)."""
  return next((chip for part, chip in DEVICE_KINDS if part in device_kind), None)


@dataclasses.dataclass(frozen=True)
class Machine:
  """A VM or slice as JAX sees it: `devices` devices of `chip` (one per chip) on `hosts` hosts.

  `platform` is the compile-only client's ('tpu' or 'cuda'); `topology` the name it takes
  ('v4:2x2x1'); `chips_per_host` the chips of one host along the topology's axes.
  """

  name: str
  chip: Chip
  devices: int
  hosts: int
  platform: str
  topology: str
  chips_per_host: tuple[int, int, int] = (1, 1, 1)


MACHINES = {
  m.name: m
  for m in (
    Machine('tpu-v4', TPU_V4, 1, 1, 'tpu', 'v4:1x1x1'),
    Machine('v4-8', TPU_V4, 4, 1, 'tpu', 'v4:2x2x1', (2, 2, 1)),
    Machine('v4-16', TPU_V4, 8, 2, 'tpu', 'v4:2x2x2', (2, 2, 1)),
    Machine('v4-32', TPU_V4, 16, 4, 'tpu', 'v4:2x2x4', (2, 2, 1)),
    Machine('tpu-v5e', TPU_V5E, 1, 1, 'tpu', 'v5e:1x1'),
    Machine('v5e-4', TPU_V5E, 4, 1, 'tpu', 'v5e:2x2', (2, 2, 1)),
    Machine('v5e-8', TPU_V5E, 8, 1, 'tpu', 'v5e:2x4', (2, 4, 1)),
    Machine('h100', H100, 1, 1, 'cuda', '1x1x1'),
  )
}

# An H100 SXM5 80GB as XLA's GpuTargetConfigProto describes a GPU (device_description.proto);
# the values are the card's: 132 SMs, 228 KiB shared memory a SM, 50 MiB L2, 3.35 TB/s, 1.98 GHz.
_H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000 l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: 84942979072 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
dnn_version_info { major: 9 minor: 10 }
device_description_str: "NVIDIA H100 80GB HBM3"
"""


def get(name: str) -> Machine:
  """The machine called `name` (a key of `MACHINES`); ValueError naming the known ones."""
  if name not in MACHINES:
    raise ValueError(f'Unknown machine {name!r}; choose one of {sorted(MACHINES)}.')
  return MACHINES[name]


def with_devices(name: str, devices: int) -> Machine:
  """The machine of `name`'s chip that shows `devices` devices: 'tpu-v4' with 4 is a v4-8 (how a
  mesh's size picks the slice); ValueError naming the sizes there are."""
  chip = get(name).chip
  same = {m.devices: m for m in MACHINES.values() if m.chip is chip}
  if devices not in same:
    raise ValueError(
      f'No {chip.name} machine has {devices} devices; the ones known have {sorted(same)} '
      f'({", ".join(m.name for m in same.values())}).'
    )
  return same[devices]


def install_line(name: str) -> str:
  """The pip line that brings the compiler of machine `name` into this Python."""
  machine, version = get(name), jax.__version__
  if machine.platform == 'tpu':
    return f"pip install 'jax[tpu]=={version}' (libtpu; no TPU needed to compile)"
  return (
    f'pip install --target /tmp/gpu_site jax-cuda13-plugin=={version} '
    f'jax-cuda13-pjrt=={version}, then run with PYTHONPATH=/tmp/gpu_site (no GPU needed)'
  )


@contextlib.contextmanager
def quiet_libtpu():
  """Wraps whatever first starts libtpu in a process (a compile-only topology, or JAX trying its
  TPU backend) on a host without TPU chips: libtpu may then load beside other processes' libtpu
  (ALLOW_MULTIPLE_LIBTPU_LOAD; there is no TPU to share) and is told the metadata it would
  otherwise look for and warn about on stderr (an accelerator type, one worker). Variables already
  set are kept; the environment is restored after, so nothing else (e.g.
  `sharding.wants_distributed`) sees them. On a TPU VM this changes nothing."""
  quiet = {
    'ALLOW_MULTIPLE_LIBTPU_LOAD': '1',
    'TPU_ACCELERATOR_TYPE': 'v4-8',
    'TPU_WORKER_HOSTNAMES': 'localhost',
  }
  added = (
    {} if sharding.on_cloud_tpu_vm() else {k: v for k, v in quiet.items() if k not in os.environ}
  )
  os.environ.update(added)
  try:
    yield
  finally:
    for key in added:
      os.environ.pop(key, None)


def compile_only_devices(name: str) -> list[jax.Device]:
  """The abstract devices of machine `name`, as many as a real VM of it shows JAX.

  Programs compile for them (`jax.jit(...).lower(...).compile()`) and never run. Raises
  RuntimeError naming the install line when the compiler (libtpu, or the CUDA plugin) is absent.
  """
  from jax.experimental import topologies

  machine = get(name)
  try:
    if machine.platform == 'tpu':
      with quiet_libtpu():
        topology = topologies.get_topology_desc(
          topology_name=machine.topology,
          platform='tpu',
          chip_config_name='megacore' if machine.chip is TPU_V4 else 'default',
          chips_per_host_bounds=machine.chips_per_host,
          num_slices=1,
          wrap=(False, False, False),
        )
    else:
      topology = topologies.get_topology_desc(
        platform='cuda', target_config=_H100_TARGET, topology=machine.topology
      )
  except (NotImplementedError, RuntimeError, ValueError) as e:
    raise RuntimeError(
      f'Compiling for {name} needs its compiler in this Python: {install_line(name)}. ({e})'
    ) from e
  devices = list(topology.devices)
  if len(devices) != machine.devices:  # a libtpu that reads the topology otherwise
    raise RuntimeError(
      f'{name}: the compile-only client gave {len(devices)} devices, a real VM shows '
      f'{machine.devices} (topology {machine.topology!r}).'
    )
  return devices


def compile_only_mesh(name: str, data: int, model: int) -> jax.sharding.Mesh:
  """A (data, model) mesh (`sharding.make_mesh`) over the compile-only devices of `name`."""
  return sharding.make_mesh(data, model, devices=compile_only_devices(name))


def simulate_cpu_devices(count: int) -> None:
  """JAX on XLA:CPU alone, showing `count` devices: what a plan compiled for a mesh of simulated
  CPU devices needs. Call it before anything starts a JAX backend; where one has started (a test
  calling a main), a CPU backend of at least `count` devices is kept, else RuntimeError."""
  try:
    jax.config.update('jax_platforms', 'cpu')
    jax.config.update('jax_num_cpu_devices', count)
  except RuntimeError as e:
    if jax.default_backend() != 'cpu' or jax.device_count() < count:
      raise RuntimeError(
        f'{count} simulated CPU devices are needed, and JAX started with {jax.devices()}: call '
        'simulate_cpu_devices before any JAX operation.'
      ) from e


def parse_machines(text: str, *, mesh_required: bool = False):
  """'v4-8:1x4,tpu-v4' -> [('v4-8', (1, 4)), ('tpu-v4', None)]: `MACHINE[:DATAxMODEL]` items, the
  one convention of every benchmark's --compile_for (and of distill_plan's --machines), machines
  checked, meshes read by `sharding.parse_mesh`. A mesh given must cover the machine's devices;
  None where an item names none (ValueError with `mesh_required`)."""
  out = []
  for item in text.split(','):
    name, _, mesh = item.strip().partition(':')
    machine = get(name)
    if mesh.strip().lower() in ('', 'auto'):
      if mesh_required:
        raise ValueError(f'Machine meshes are MACHINE:DATAxMODEL (e.g. v4-8:2x2), got {item!r}.')
      out.append((name, None))
      continue
    data, model = sharding.parse_mesh(mesh)
    if data * model != machine.devices:
      raise ValueError(
        f'{name} has {machine.devices} devices; the mesh {data}x{model} has {data * model} '
        f'(an item is MACHINE:DATAxMODEL over all its devices, e.g. {name}:1x{machine.devices}).'
      )
    out.append((name, (data, model)))
  return out


def parse_machine_mesh(text: str) -> list[tuple[str, int, int]]:
  """'v4-8:1x4,h100:1x1' -> [('v4-8', 1, 4), ('h100', 1, 1)]: `parse_machines` with every mesh
  given."""
  return [(name, *mesh) for name, mesh in parse_machines(text, mesh_required=True)]


def for_mesh(name: str, mesh: tuple[int, int] | None, planned: tuple[int, int] | None = None):
  """(machine name, data, model) of one `parse_machines` item: its own mesh; else the `planned`
  mesh (a benchmark's --mesh) on the machine of `name`'s chip with that many devices ('tpu-v4'
  planned 1x4: a v4-8); else all of the machine's devices on 'model' (1 x devices)."""
  if mesh is not None:
    return (name, *mesh)
  if planned is None:
    return name, 1, get(name).devices
  data, model = planned
  return with_devices(name, data * model).name, data, model


def on_devices(devices: Sequence[jax.Device]) -> str:
  """'TPU v4 x4 (1 host)': what a list of devices is, for headers."""
  hosts = len({d.process_index for d in devices})
  return f'{devices[0].device_kind} x{len(devices)} ({hosts} host{"s" if hosts > 1 else ""})'
