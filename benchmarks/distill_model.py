"""A distillation step on a mesh without the hardware: per-device bytes of the compiled step and
the teacher's forward on the roofline, from abstract sharded models (the library part of `python
-m benchmarks.distill_plan`, which simulates the devices, reads its flags and prints). Chips and
machines: `benchmarks.machines`.
"""

import functools
import time
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from benchmarks import machines, memory_model, synthetic
from specdec_jax import sharding
from specdec_jax.models import t5
from specdec_jax.training import distill, distill_loss, trainer


def abstract_distill_batch(mesh, *, batch: int, source_length: int, target_length: int) -> dict:
  """A live-teacher distillation batch (`batching.batch_arrays`' fields: int32 inputs / targets,
  bool masks) as shape structs split over 'data' as `trainer.compile_step` takes it."""
  fields = {
    'inputs': ((batch, source_length), jnp.int32),
    'input_mask': ((batch, source_length), jnp.bool_),
    'targets': ((batch, target_length), jnp.int32),
    'target_mask': ((batch, target_length), jnp.bool_),
  }
  return {
    name: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding.batch_sharding(mesh, len(shape)))
    for name, (shape, dtype) in fields.items()
  }


def lower_distill_step(
  teacher: t5.T5Model,
  state: trainer.TrainState,
  shardings: trainer.TrainState,
  mesh,
  *,
  student_config: t5.T5Config,
  optimizer_config: trainer.OptimizerConfig,
  divergence: str,
  batch: int,
  source_length: int,
  target_length: int,
) -> jax.stages.Lowered:
  """One distillation step with the live teacher (its encoder and decoder run in the step),
  lowered for `mesh` as `distill.distill_and_evaluate` compiles it (`trainer.compile_step`: the
  state donated, the batch split over 'data'), from abstract inputs.

  Args:
    teacher: an `abstract_model` (params carrying their shardings).
    state, shardings: `trainer.abstract_state`'s.
  """
  step = trainer.compile_step(
    functools.partial(
      distill_loss.distill_step,
      student_config=student_config,
      optimizer_config=optimizer_config,
      divergence=divergence,
    ),
    mesh,
    shardings,
    jax.tree.map(lambda x: x.sharding, teacher),
  )
  rows = abstract_distill_batch(
    mesh, batch=batch, source_length=source_length, target_length=target_length
  )
  with jax.set_mesh(mesh):
    return step.lower(state, rows, teacher)


def forward_cost(
  model: t5.T5Model,
  mesh,
  *,
  batch: int,
  source_length: int,
  target_length: int,
  rules=sharding.DEFAULT_RULES,
) -> memory_model.CallCost:
  """FLOPs and HBM bytes per chip of one teacher-forced forward (`t5.forward`: the encoder over
  S source tokens, the decoder and output layer over T target tokens per row), as the live
  teacher of a distillation step runs it.

  FLOPs: 2 x the chip's share of each kernel x the tokens it multiplies (encoder kernels: the
  encoder tokens; the cross-attention key / value kernels: the encoder tokens; every other
  decoder kernel and the tied embedding as output layer: the decoder tokens) + attention, 2
  matmuls of 2 x queries x keys x N x H per row and layer (encoder S x S, decoder self T x T,
  cross T x S). Bytes: the chip's shard of every param, read once (activations are not counted:
  at these batches the call is compute-bound, as `CallCost.bound` says).
  """
  config = model.config
  local_batch, local_heads = NamedSharding(
    mesh, sharding.logical_to_mesh(('batch', 'heads'), (batch, config.num_heads), mesh, rules)
  ).shard_shape((batch, config.num_heads))
  source_tokens, target_tokens = local_batch * source_length, local_batch * target_length
  flops = weight_bytes = 0
  for path, leaf in jax.tree_util.tree_leaves_with_path(model.params):
    names = [str(getattr(k, 'key', k)) for k in path]
    size = int(np.prod(memory_model.local_shape(leaf)))
    weight_bytes += size * jnp.dtype(leaf.dtype).itemsize
    if names[0] == 'encoder' or (
      'encoder_decoder_attention' in names and names[-2] in ('key', 'value')
    ):
      tokens = source_tokens
    elif names[0] == 'decoder' or (names[-1] == 'embedding' and config.tie_word_embeddings):
      tokens = target_tokens
    else:
      tokens = 0  # the input embedding: a gather
    if names[-1] in ('kernel', 'embedding'):
      flops += 2.0 * size * tokens
  per_row = config.num_encoder_layers * source_length**2 + config.num_decoder_layers * (
    target_length**2 + target_length * source_length
  )
  flops += 4.0 * local_batch * local_heads * config.d_kv * per_row
  return memory_model.CallCost(flops=flops, bytes=weight_bytes)


def xla_forward_cost(model: t5.T5Model, *, batch: int, source_length: int, target_length: int):
  """XLA's `cost_analysis()` of the lowered, unsharded `t5.forward`: {'flops', 'bytes accessed'}
  (global, one device; to check `forward_cost` on a 1x1 mesh; XLA also counts elementwise
  work)."""
  config, params = model.config, synthetic.unsharded(model).params
  source = jax.ShapeDtypeStruct((batch, source_length), jnp.int32)
  target = jax.ShapeDtypeStruct((batch, target_length), jnp.int32)
  forward = jax.jit(lambda p, s, t: t5.forward(p, s, s, t, config=config))
  cost = forward.lower(params, source, target).cost_analysis()
  return {k: float(cost[k]) for k in ('flops', 'bytes accessed')}


def distill_rows(
  teacher_config: t5.T5Config,
  distill_config,
  meshes: list[tuple[str, int, int]],
  batches: list[int],
  *,
  teacher_param_dtype: str,
  source_length: int,
  target_length: int,
  compile_dtype: str | None = 'float32',
  compile_for: Collection[machines.Chip] = (),
  log=lambda row: None,
) -> list[dict]:
  """The distillation plan: a row per (machine, DATAxMODEL mesh) of `meshes` (machines of
  `benchmarks.machines.MACHINES`) and batch size, bytes per device.

  The teacher has `teacher_config`'s shapes (and compute dtype), params in `teacher_param_dtype`
  sharded by `sharding.DEFAULT_RULES`; the student, its optimizer, divergence and placement are
  `distill_config`'s (a `distill_drafter` config, completed by `distill.student_config_for`).

  Args:
    compile_dtype: on simulated XLA:CPU devices, compile the step with the teacher's params in
      'float32' (XLA:CPU would otherwise hold a float32 copy of the bf16 weights among its
      temporaries; the teacher computes in float32 either way, so the temporaries are the planned
      program's activations), 'params' (as planned), or None (no compilation).
    compile_for: what is compiled by its own compiler (XLA:TPU) for the machine's compile-only
      devices, as planned: chips (every row of a machine of the chip), and (machine name, data,
      model) rows; fits is then that compiler's verdict: 'yes'
      if it compiled the step and its peak fits the chip's HBM, 'no' if not (or if it refused the
      step for want of memory: `out_of_memory`). The other rows compile on XLA:CPU devices.
    log: called with each row as it is made.

  Returns:
    Dicts: machine, mesh, batch, compiler ('cpu' or the machine's platform); teacher (its
    params), state (the student's params, AdamW moments and step counters), batch_bytes (the
    rows: int32 ids, bool masks); with a compile, `memory_model.compile_memory`'s bytes and
    total = teacher + state + batch_bytes + output + temp - alias (the compiled program's own
    total when compiled as planned), and compile_seconds; fits on the machine's chip (on
    XLA:CPU, `memory_model.fits(teacher + state + batch_bytes, total)`); forward, the teacher's
    `forward_cost`, with forward_seconds and forward_bound on the chip; student_forward, the
    student's (its backward costs about twice as much again).
  """
  shape = dict(source_length=source_length, target_length=target_length)
  rows = []
  for name, data, model in meshes:
    machine = machines.get(name)
    if data * model != machine.devices:
      raise ValueError(
        f'{name} has {machine.devices} devices; a {data}x{model} mesh has {data * model}.'
      )
    own = machine.chip in compile_for or (name, data, model) in compile_for
    mesh, teacher, student_config, state, step = _mesh_plan(
      machine,
      data,
      model,
      own,
      teacher_config,
      distill_config,
      teacher_param_dtype=teacher_param_dtype,
      compile_dtype=compile_dtype,
      **shape,
    )
    for batch in batches:
      row = dict(machine=machine.name, mesh=f'{data}x{model}', batch=batch)
      row['compiler'] = machine.platform if own else 'cpu'
      row.update(
        _bytes_and_costs(teacher, state, mesh, machine.chip, student_config, batch, **shape)
      )
      if own or compile_dtype is not None:
        start = time.time()
        row.update(
          memory_model.compile_memory(step(batch=batch)), compile_seconds=time.time() - start
        )
      row['fits'] = _fits(row, machine.chip, own)
      log(row)
      rows.append(row)
  return rows


def _mesh_plan(
  machine,
  data,
  model,
  own,
  teacher_config,
  distill_config,
  *,
  teacher_param_dtype,
  compile_dtype,
  **shape,
):
  """(mesh, teacher, student config, student state, the step lowered at a batch size) of one
  machine's mesh: compile-only devices of `machine` when `own`, else XLA:CPU's."""
  optimizer_config = trainer.OptimizerConfig.from_config(distill_config)
  if own:
    mesh = machines.compile_only_mesh(machine.name, data, model)
  else:
    mesh = sharding.make_mesh(data, model)
  teacher = synthetic.abstract_model(
    teacher_config, mesh, param_dtype=teacher_param_dtype, shard=True
  )
  student_config = distill.student_config_for(distill_config, teacher)
  state, shardings = trainer.abstract_state(
    student_config, optimizer_config, mesh, distill_config.student_sharding
  )
  compiled_teacher = teacher
  if not own and compile_dtype == 'float32':
    compiled_teacher = synthetic.with_dtype(teacher, 'float32')
  step = functools.partial(
    lower_distill_step,
    compiled_teacher,
    state,
    shardings,
    mesh,
    student_config=student_config,
    optimizer_config=optimizer_config,
    divergence=distill_config.divergence,
    **shape,
  )
  return mesh, teacher, student_config, state, step


def _bytes_and_costs(teacher, state, mesh, chip, student_config, batch, **shape) -> dict:
  """A row's bytes per device (teacher, state, batch_bytes) and the teacher's and student's
  forward costs on `chip`."""
  sharding.check_batch(batch, mesh)
  cost = forward_cost(teacher, mesh, batch=batch, **shape)
  return dict(
    teacher=memory_model.bytes_per_device(teacher.params),
    state=memory_model.bytes_per_device(state),
    batch_bytes=memory_model.bytes_per_device(abstract_distill_batch(mesh, batch=batch, **shape)),
    forward=cost,
    forward_seconds=cost.seconds(chip),
    forward_bound=cost.bound(chip),
    student_forward=forward_cost(
      t5.T5Model(student_config, state.params), mesh, batch=batch, **shape
    ),
  )


def _fits(row: dict, chip: machines.Chip, own_compiler: bool) -> str:
  """The row's verdict on `chip` (adds its total where the step compiled)."""
  lower = row['teacher'] + row['state'] + row['batch_bytes']
  if 'argument' in row:
    row['total'] = lower + row['output'] + row['temp'] - row['alias']
  if own_compiler:
    return 'yes' if 'argument' in row and row['peak'] <= chip.hbm_bytes else 'no'
  return memory_model.fits(lower, max(lower, row.get('total', lower)), [chip])[chip.name]
