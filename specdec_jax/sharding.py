"""Logical-axis sharding of T5 params and activations over a ('data', 'model') device mesh.

Every param and the main activations name their axes with logical names; a rule set maps each name
to a mesh axis or to None (replicated), as T5X / flax partitioning does. The default rules shard the
batch over 'data', and heads, MLP hidden units and the vocabulary over 'model' (Megatron-style
tensor parallelism; the model dimension D stays whole):

  mesh = sharding.make_mesh(data=2, model=4)
  params = sharding.shard_params(params, mesh)
  input_ids, input_mask = sharding.shard_batch((input_ids, input_mask), mesh)
  with jax.set_mesh(mesh):  # turns on the activation constraints inside models/t5.py
    logits = jitted_forward(params, input_ids, input_mask, decoder_input_ids)

With no mesh set, `constrain` returns its input unchanged, so single-device code traces exactly as
if this module did not exist. A multi-host run calls `maybe_initialize_distributed()` first thing in
its main, before any other JAX call.

Logical axes: batch (B), length (T, S), embed (D), mlp (F), heads (N), kv (H), joined_kv (N*H,
the flattened heads of the attention kernels), vocab (V), layers (L), relpos_buckets.
"""

import os
from collections.abc import Mapping, Sequence

import jax
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
  ('vocab', 'model'),
  ('layers', None),
  ('relpos_buckets', None),
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
  'logits_dense': ('embed', 'vocab'),
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

  def axes(path, leaf):
    names = [str(getattr(key, 'key', key)) for key in path]
    if names[-1] == 'embedding':
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

  return jax.tree_util.tree_map_with_path(axes, params)


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


def shard_params(params, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """`params` placed on `mesh` according to `rules`."""
  return jax.device_put(params, param_shardings(params, mesh, rules))


def shard_batch(batch, mesh: Mesh, rules: Rules = DEFAULT_RULES):
  """Every array of the pytree `batch` split along its leading (batch) axis, the rest replicated."""

  def put(x):
    axes = ('batch',) + (None,) * (x.ndim - 1)
    return jax.device_put(x, NamedSharding(mesh, logical_to_mesh(axes, x.shape, mesh, rules)))

  return jax.tree.map(put, batch)


def constrain(x: jax.Array, logical_axes: Sequence[str | None], rules: Rules = DEFAULT_RULES):
  """Constrains an activation's sharding when a mesh is set (`jax.set_mesh`), else returns it.

  Only meshes whose axes are all Auto are constrained: inside `shard_map` the axes are manual, and
  Explicit meshes carry shardings in the types already.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or not mesh.are_all_axes_auto:
    return x
  return jax.lax.with_sharding_constraint(x, logical_to_mesh(logical_axes, x.shape, mesh, rules))


# Set to 1 (or 0) to say this process is (or is not) one of several hosts, overriding detection.
MULTIHOST_ENV = 'SPECDEC_MULTIHOST'


def is_multihost(environ: Mapping[str, str] | None = None) -> bool:
  """Whether this process is one of several hosts of one JAX program, from the environment.

  `SPECDEC_MULTIHOST=1` / `0` decides when set (e.g. 1 in a multi-process SLURM, Open MPI or
  Kubernetes job). Otherwise a Cloud TPU VM is multi-host when `TPU_WORKER_HOSTNAMES` lists more
  than one host (a pod slice); a single TPU VM, a GPU box or a laptop is not. Environment-only:
  the question must be answered before JAX starts its backends.

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
  return len(hosts) > 1


def maybe_initialize_distributed(environ: Mapping[str, str] | None = None) -> bool:
  """Calls `jax.distributed.initialize()` when `is_multihost(environ)`; a no-op otherwise.

  Call it at the top of a main, before anything touches a device: every host then sees the global
  device list, and `make_mesh` spans all of them. Called without arguments, `initialize` finds the
  coordinator, the process count and this process's id itself on Cloud TPU, SLURM, Open MPI and
  Kubernetes clusters.

  Args:
    environ: the environment to read; `os.environ` by default.

  Returns:
    True when it initialized the distributed runtime (False when single-host or done already).
  """
  if not is_multihost(environ) or jax.distributed.is_initialized():
    return False
  jax.distributed.initialize()
  return True
