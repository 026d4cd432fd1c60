"""Logical-axis sharding of T5 params and activations over a ('data', 'model') device mesh.

Every param and the main activations name their axes with logical names; a rule set maps each name
to a mesh axis or to None (replicated), as T5X / flax partitioning does. The default rules shard the
batch over 'data', and heads, MLP hidden units and the vocabulary over 'model' (Megatron-style
tensor parallelism; the model dimension D stays whole):

  mesh = sharding.make_mesh(data=2, model=4)
  params = jax.device_put(params, sharding.param_shardings(params, mesh))
  input_ids, input_mask = sharding.from_host((input_ids, input_mask), mesh)
  with jax.set_mesh(mesh):  # turns on the activation constraints inside models/t5_layers.py
    logits = jitted_forward(params, input_ids, input_mask, decoder_input_ids)

A train state (params, and an optimizer's moments of each param) is placed the same way:
`tree_shardings` shards every leaf named like a T5 param by its rule and replicates scalars.

With no mesh set, `constrain` returns its input unchanged, so single-device code traces exactly as
if this module did not exist. A multi-host run calls `maybe_initialize_distributed()` first thing in
its main, before any other JAX call.

Logical axes: batch (B), length (T, S), embed (D), mlp (F), heads (N), kv (H), joined_kv (N*H,
the flattened heads of the attention kernels), vocab (V), layers (L), relpos_buckets, fused (the
stacked kernels of the fused decoder layout, models/t5_fused.py: never split).
"""

import glob
import os
import pathlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

Rules = tuple[tuple[str, str | None], ...]

DEFAULT_RULES: Rules = (
  ('batch', 'data'),
  ('length', None),
  ('embed', None),
  ('mlp', 'model'),
  ('heads', 'model'),
  ('kv', None),
  ('joined_kv', 'model'),
  ('fused', None),
  ('vocab', 'model'),
  ('layers', None),
  ('relpos_buckets', None),
)

# A model replicated over the mesh: its params (which have no 'batch' axis) whole on every device,
# and its activations split only by rows over 'data', so its program needs no collective
# (`T5Model.rules`: a replicated drafter beside a target sharded over 'model').
REPLICATED_RULES: Rules = tuple(
  (name, 'data' if name == 'batch' else None) for name, _ in DEFAULT_RULES
)

# Logical axes of a '.../<module>/kernel' param, by module name (T5X names, as `t5.init_params` builds them).
_KERNEL_AXES = {
  'query': ('embed', 'joined_kv'),
  'key': ('embed', 'joined_kv'),
  'value': ('embed', 'joined_kv'),
  'out': ('joined_kv', 'embed'),
  'wi': ('embed', 'mlp'),
  'wi_0': ('embed', 'mlp'),
  'wi_1': ('embed', 'mlp'),
  'wo': ('mlp', 'embed'),
  # The fused decoder layout (models/t5_fused.py): the stacked kernels' own axis is never split,
  # so 'joined_kv' / 'mlp' split each of them as they split the T5X kernels.
  'qkv': ('embed', 'fused', 'joined_kv'),
  'wi_fused': ('embed', 'fused', 'mlp'),
  'logits_dense': ('embed', 'vocab'),
  # An EAGLE-style drafter reads the target's states [feature_dim, d_model] and predicts the next
  # ones [d_model, feature_dim]: model widths, replicated as 'embed' is.
  'feature_in': ('embed', 'embed'),
  'feature_out': ('embed', 'embed'),
}


def param_logical_axes(params):
  """The logical axes of every T5 param.

  Name-based, so any T5 tree works: one without an encoder (a drafter over the target's encoder),
  or one whose cross-attention key / value kernels read an encoder of another width
  ([encoder_dim, N*H]: their input axis is 'embed', which the default rules replicate).

  Args:
    params: a T5 params pytree (arrays or anything with `.ndim`, e.g. `jax.ShapeDtypeStruct`).

  Returns:
    A pytree of the same structure whose leaves are `PartitionSpec`s of logical axis names.
  """

  return jax.tree_util.tree_map_with_path(lambda path, leaf: _axes(_names(path), leaf), params)


def _names(path) -> list[str]:
  """The keys of a pytree path as strings: dict keys, attribute names, sequence indices."""
  return [str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))) for k in path]


def _axes(names: list[str], leaf) -> P:
  """The logical axes of the T5 param at `names` (by its last one or two names)."""
  if names[-1] == 'embedding' and len(names) > 1 and names[-2] == 'block_queries':
    spec = ('length', 'embed')  # a block drafter's per-offset query slots: replicated
  elif names[-1] == 'embedding':
    spec = ('vocab', 'embed')
  elif names[-1] == 'rel_embedding':
    spec = ('heads', 'relpos_buckets')
  elif names[-1] == 'scale':
    spec = ('embed',)
  elif names[-1] == 'kernel' and len(names) > 1 and names[-2] in _KERNEL_AXES:
    spec = _KERNEL_AXES[names[-2]]
  else:
    raise ValueError(f'No logical axes are known for the T5 param {"/".join(names)}.')
  if len(spec) != leaf.ndim:
    raise ValueError(f'T5 param {"/".join(names)} has {leaf.ndim} axes, expected {spec}.')
  return P(*spec)


def logical_to_mesh(
  logical_axes: Sequence[str | None], shape: Sequence[int], mesh, rules: Rules = DEFAULT_RULES
) -> P:
  """The mesh `PartitionSpec` of an array with the given logical axes.

  An axis stays unsharded when its rule says None, when the mesh lacks the rule's mesh axis or an
  earlier axis of the array already took it, or when the mesh axis size does not divide the
  axis length (e.g. 6 heads over model=4: replicated rather than padded).

  Args:
    logical_axes: one logical name (or None) per array axis.
    shape: the array's shape.
    mesh: a `Mesh` or `AbstractMesh`.
    rules: (logical name, mesh axis or None) pairs.

  Returns:
    A `PartitionSpec` of mesh axis names.
  """
  if len(logical_axes) != len(shape):
    raise ValueError(f'Logical axes {tuple(logical_axes)} do not match shape {tuple(shape)}.')
  rule = dict(rules)
  used, spec = set(), []
  for name, size in zip(logical_axes, shape):
    if name is not None and name not in rule:
      raise ValueError(f'No sharding rule for logical axis {name!r}.')
    axis = None if name is None else rule[name]
    if axis is None or axis not in mesh.shape or axis in used or size % mesh.shape[axis]:
      spec.append(None)
    else:
      used.add(axis)
      spec.append(axis)
  return P(*spec)


def make_mesh(data: int, model: int, *, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, model) mesh over the first data * model devices, with automatic (GSPMD) axes."""
  if data < 1 or model < 1:
    raise ValueError(f'Mesh axis sizes must be >= 1, got data={data}, model={model}.')
  devices = list(jax.devices() if devices is None else devices)
  if len(devices) < data * model:
    raise ValueError(f'A {data}x{model} mesh needs {data * model} devices, have {len(devices)}.')
  return jax.make_mesh(
    (data, model),
    ('data', 'model'),
    axis_types=(AxisType.Auto, AxisType.Auto),
    devices=devices[: data * model],
  )


def param_shardings(params, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """A pytree of `NamedSharding`s matching `params` (see `param_logical_axes`)."""
  return jax.tree.map(
    lambda axes, x: NamedSharding(mesh, logical_to_mesh(axes, x.shape, mesh, rules)),
    param_logical_axes(params),
    params,
  )


def tree_shardings(tree, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """A `NamedSharding` for every array of a pytree that holds T5 params, whole or as copies:
  a train state, whose optimizer keeps moments of each param under the param's own path end
  ('.../mu/decoder/layers_0/mlp/wi/kernel'). Such leaves are sharded by their param's rule
  (`param_logical_axes`), scalars (a step, a count) are replicated, and any other leaf raises.
  """

  def place(path, leaf):
    spec = P() if leaf.ndim == 0 else _axes(_names(path), leaf)
    return NamedSharding(mesh, logical_to_mesh(tuple(spec), leaf.shape, mesh, rules))

  return jax.tree_util.tree_map_with_path(place, tree)


def constrain(x: jax.Array, logical_axes: Sequence[str | None], rules: Rules = DEFAULT_RULES):
  """Constrains an activation's sharding when a mesh is set (`jax.set_mesh`), else returns it.

  Only meshes whose axes are all Auto are constrained: inside `shard_map` the axes are manual, and
  Explicit meshes carry shardings in the types already.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not mesh.are_all_axes_auto:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_mesh(logical_axes, x.shape, mesh, rules))


def parse_mesh(spec: str, *, platform: str | None = None) -> tuple[int, int]:
  """(data, model) of a `DATAxMODEL` mesh spec such as '1x4' or '2x4'.

  'auto' (or '') is 1x1 on CPU and 1xN over all N devices on an accelerator: the paper's setting,
  batch 1 with the model split over every chip (`platform` defaults to jax's default backend).
  """
  spec = spec.strip().lower()
  if spec in ('', 'auto'):
    platform = platform or jax.default_backend()
    return (1, 1) if platform == 'cpu' else (1, jax.device_count())
  parts = spec.split('x')
  if len(parts) != 2 or not all(p.isdigit() and int(p) >= 1 for p in parts):
    raise ValueError(
      f"A mesh is 'DATAxMODEL' with sizes >= 1 (e.g. '1x4'), or 'auto'; got {spec!r}."
    )
  return int(parts[0]), int(parts[1])


def mesh_from_spec(spec: str, batch_size: int | None = None, rules: Rules = DEFAULT_RULES) -> Mesh:
  """The mesh of a `DATAxMODEL` / 'auto' spec (`parse_mesh`) over the first devices; with
  `batch_size`, raises ValueError unless the batch splits evenly over its 'data' axis."""
  mesh = make_mesh(*parse_mesh(spec))
  if batch_size is not None:
    check_batch(batch_size, mesh, rules)
  return mesh


def replicated(tree, mesh: Mesh):
  """Every array of `tree` copied whole onto every device of `mesh`."""
  return jax.device_put(tree, NamedSharding(mesh, P()))


# How a model's params go on a mesh: 'model' shards them by the rules, 'replicated' copies them
# whole to every device, 'auto' replicates a model under REPLICATE_BELOW params (each device then
# runs it without collectives: t5_1_1-small's 6 heads do not even split over model=4).
PLACEMENTS = ('model', 'replicated', 'auto')
REPLICATE_BELOW = 1_000_000_000


def check_placement(how: str, what: str = 'placement') -> None:
  """Raises ValueError naming `what` unless `how` is one of `PLACEMENTS`."""
  if how not in PLACEMENTS:
    raise ValueError(f"{what} must be 'model', 'replicated' or 'auto', got {how!r}.")


def rules_for(how: str, num_params: int) -> Rules:
  """The rules that place a model of `num_params` params as `how` (one of `PLACEMENTS`) says."""
  check_placement(how)
  if how == 'auto':
    how = 'model' if num_params >= REPLICATE_BELOW else 'replicated'
  return DEFAULT_RULES if how == 'model' else REPLICATED_RULES


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: Rules = DEFAULT_RULES) -> NamedSharding:
  """The sharding of a [B, ...] batch: rows over the mesh axis of 'batch' ('data'), rest whole."""
  axis = dict(rules).get('batch')
  return NamedSharding(mesh, P(axis if axis in mesh.shape else None, *([None] * (ndim - 1))))


def check_batch(batch_size: int, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> None:
  """Raises ValueError unless the batch splits evenly over the mesh axis that holds rows."""
  axis = dict(rules).get('batch')
  size = mesh.shape.get(axis, 1) if axis else 1
  if batch_size % size:
    raise ValueError(
      f'Batch size {batch_size} does not divide over the mesh axis {axis!r} of size {size}: '
      f'use a multiple of {size}.'
    )


def local_rows(batch_size: int, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> range:
  """The rows of a global [batch_size, ...] batch that this process's devices hold (one
  contiguous range: a process's devices hold adjacent 'data' shards)."""
  check_batch(batch_size, mesh, rules)
  indices = batch_sharding(mesh, 1, rules).addressable_devices_indices_map((batch_size,))
  starts = [idx[0].start or 0 for idx in indices.values()]
  stops = [batch_size if idx[0].stop is None else idx[0].stop for idx in indices.values()]
  rows = range(min(starts), max(stops))
  if sum(len(range(a, b)) for a, b in sorted(set(zip(starts, stops)))) != len(rows):
    raise ValueError(f'The rows this process holds on {mesh} are not contiguous: {indices}.')
  return rows


def global_batch(
  make_rows: Callable[[range], Any], batch_size: int, mesh: Mesh, rules: Rules = DEFAULT_RULES
):
  """A batch split over `mesh` whose rows each process makes for itself.

  `make_rows(rows)` returns this process's rows (e.g. tokenizes only its share of the sentences):
  a pytree (a tuple, a dict) of arrays of shape [len(rows), ...]. Every process calls this with
  the same arguments; the result is the same pytree of global `jax.Array`s of shape
  [batch_size, ...], rows over the 'batch' axis.
  """
  rows = local_rows(batch_size, mesh, rules)
  local = make_rows(rows)

  def build(x):
    x = np.asarray(x)
    if x.shape[0] != len(rows):
      raise ValueError(f'make_rows({rows}) gave {x.shape[0]} rows, expected {len(rows)}.')
    shape = (batch_size,) + x.shape[1:]
    sharding = batch_sharding(mesh, x.ndim, rules)

    def piece(index):
      first = index[0].start or 0
      stop = batch_size if index[0].stop is None else index[0].stop
      return x[(slice(first - rows.start, stop - rows.start),) + tuple(index[1:])]

    return jax.make_array_from_callback(shape, sharding, piece)

  return jax.tree.map(build, local)


def from_host(batch, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """A batch that every process holds whole on its host (the same values everywhere, e.g. an
  evaluation batch) as global arrays split over 'data' (`global_batch`: each process places only
  its own rows)."""
  sizes = {len(x) for x in jax.tree.leaves(batch)}
  if len(sizes) != 1:
    raise ValueError(f'The arrays of a batch must have as many rows each, got {sorted(sizes)}.')
  return global_batch(
    lambda rows: jax.tree.map(lambda x: x[rows.start : rows.stop], batch), sizes.pop(), mesh, rules
  )


def is_main_process() -> bool:
  """True on the process that prints and writes files (process 0; the only one on one host)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (a no-op on one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


# Set to 1 (or 0) to say this process is (or is not) one of several hosts, overriding detection.
MULTIHOST_ENV = 'SPECDEC_MULTIHOST'


_GOOGLE_PCI_VENDOR = '0x1ae0'  # TPU chips show on the PCI bus under Google's vendor id


def on_cloud_tpu_vm() -> bool:
  """Whether this machine has TPU chips (a Cloud TPU VM): a PCI device of Google's vendor id, read
  before any backend starts (as JAX's own detection reads it), or the TPU runtime's environment."""
  for vendor in glob.glob('/sys/bus/pci/devices/*/vendor'):
    try:
      if pathlib.Path(vendor).read_text().strip() == _GOOGLE_PCI_VENDOR:
        return True
    except OSError:
      continue
  return bool(os.environ.get('TPU_ACCELERATOR_TYPE') or os.environ.get('TPU_WORKER_HOSTNAMES'))


def wants_distributed(environ: Mapping[str, str] | None = None) -> bool:
  """Whether a main should call `jax.distributed.initialize()` (and let JAX find the cluster).

  `SPECDEC_MULTIHOST=1` / `0` decides when set (e.g. 1 in a multi-process SLURM, Open MPI or
  Kubernetes job, which JAX detects). Otherwise: on a Cloud TPU VM, yes, and JAX's own cluster
  detection (the VM's metadata, or GKE's `TPU_WORKER_HOSTNAMES`) finds the slice's hosts; a single
  TPU VM is a slice of one. Anywhere else (a GPU box, a laptop), no.

  Args:
    environ: the environment to read; `os.environ` by default.
  """
  environ = os.environ if environ is None else environ
  flag = environ.get(MULTIHOST_ENV, '').strip().lower()
  if flag:
    if flag not in ('0', '1', 'false', 'true'):
      raise ValueError(f'{MULTIHOST_ENV} must be 1 or 0 (true / false), got {flag!r}.')
    return flag in ('1', 'true')
  hosts = [h for h in environ.get('TPU_WORKER_HOSTNAMES', '').split(',') if h.strip()]
  return len(hosts) > 1 or on_cloud_tpu_vm()


def maybe_initialize_distributed(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  environ: Mapping[str, str] | None = None,
) -> bool:
  """Starts JAX's distributed runtime when this process is one of several; call it first thing in
  a main, before anything touches a device: every host then sees the global device list, and
  `make_mesh` spans all of them.

  With `coordinator_address` (e.g. 'localhost:12355', with `num_processes` and `process_id`): a
  cluster set up by hand, as the 2-process tests do on one machine. Without: see
  `wants_distributed`; `jax.distributed.initialize()` then finds the coordinator, the process count
  and this process's id itself (Cloud TPU, SLURM, Open MPI, Kubernetes). On CPU the collectives
  between processes run over gloo.

  Returns:
    True when it initialized the distributed runtime (False when not wanted or done already).
  """
  if jax.distributed.is_initialized():
    return False
  if coordinator_address is None and not wants_distributed(environ):
    return False
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address, num_processes, process_id)
  return True
