"""The TPU compile gate: every program of the project compiled by XLA:TPU, without a TPU.

libtpu's compile-only client (`benchmarks.machines`) gives the abstract devices of one TPU v4
chip and of a v4-8 (4 chips); on each of one chip, a 1x4 and a 2x2 mesh of them, with the
project's sharding rules (the target over 'model' by `sharding.param_shardings`, the drafter and
the student replicated, the batch over 'data'), a tiny T5 pair's programs compile:

  generate           temperature 0, and 1 with top-k and top-p;
  speculative        every verifier (`_VERIFIERS`) at temperature 1 with top-k / top-p, the
                     trace on and the draft unrolled; draft_stop; temperature 0; 2 draft paths
                     with every verifier of `verify_multipath.VERIFIERS`; a block drafter (one
                     call drafts gamma tokens) at temperatures 0 and 1, on 2x2 and one chip,
                     as a chain and as a token tree; the token-tree loop with a top-2 tree;
  training step      `trainer.train_step` (dropout, label smoothing) on the train state
                     `trainer.compile_step` places (params over 'model');
  distillation step  `distill_loss.distill_step`, the live teacher over 'model' and the student
                     replicated (`benchmarks.distill_model`, as `distill_plan --compile_for` runs).

By default the 2x2 mesh compiles one program of each of the loop's shapes (`_DEFAULT`: generate,
the chain with trace and unrolled draft, the greedy program with draft_stop, K paths, a tree; the
fused decoder layout's generate), every verifier's kernels alone, the block drafter, training and
distillation; the loop around each other verifier, and the programs on one chip and 1x4 (generate
at T=0 aside), with `pytest -m slow`. A program that stops compiling for a TPU fails here. Nothing
runs. The paper's configuration is tests/tpu_paper_test.py. Skipped where libtpu is absent (it comes with `pip install -e '.[test]'`).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import pytest

from tests import helpers

pytest.importorskip('libtpu', reason=helpers.NO_LIBTPU)

from benchmarks import distill_model, machines, memory_model, synthetic  # noqa: E402
from experiments.configs import distill_drafter  # noqa: E402
from specdec_jax import decode, verifiers, verify_multipath  # noqa: E402
from specdec_jax.models import t5  # noqa: E402
from specdec_jax.sampling import SamplingConfig  # noqa: E402
from specdec_jax.training import trainer  # noqa: E402

# The 2x2 mesh (both axes split: the batch over 'data', the target over 'model') compiles the
# loop's programs of `_DEFAULT` by default (the loop's every shape: chain with trace and unrolled
# draft, the greedy program with draft_stop, K paths, a tree, generate) and every verifier's
# kernels alone (`test_every_verifier_kernel_compiles_for_tpu`); the loop around another
# verifier's kernel is the same program, so those loops compile with -m slow, as does every
# program on one chip and 1x4 except generate at T=0 (docs/results.md section 15).
MESHES = [('v4-8', 2, 2), ('v4-8', 1, 4), ('tpu-v4', 1, 1)]
_ALWAYS = ('generate-T0',)
_DEFAULT = (
  'generate-T0',
  'generate-T1-topk-topp',
  'speculative-T0-draft_stop',
  'speculative-token-T1-topk-topp-trace-unrolled',
  'speculative-token-T1-2-paths',
  'speculative-tree-topk-T1-topk-topp',
  'speculative-tree-topk-T0',
)


def _meshes(always: bool = False, on_2x2: bool = True) -> list:
  """MESHES as parameters: the 2x2 mesh in the default suite where `on_2x2`, the others slow
  unless `always`."""
  marks = [] if always else [pytest.mark.slow]
  first = [] if on_2x2 else [pytest.mark.slow]
  return [
    pytest.param(m, id=f'{m[0]}:{m[1]}x{m[2]}', marks=first if m == MESHES[0] else marks)
    for m in MESHES
  ]


_GREEDY = SamplingConfig(temperature=0.0)
_SAMPLED = SamplingConfig(temperature=1.0, top_k=5, top_p=0.9)
_SHAPE = dict(max_new_tokens=4)
_GAMMA = 2
# Every verifier the single-path loop runs.
_VERIFIERS = verifiers.names()


def _speculative(verifier, sampling, **options):
  """A `decode.speculative_loop` of `LoopSpec` options (the trace among them, which
  `lower_speculative` leaves off), lowered as `lower_speculative` lowers it."""

  def lower(target, drafter, ids):
    spec = decode.LoopSpec(sampling=sampling, gamma=_GAMMA, verifier=verifier, **_SHAPE, **options)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return decode.speculative_loop.lower(
      target.steps, target.params, drafter.steps, drafter.params, ids, ids, key, spec=spec
    )

  return lower


def _public(**options):
  """`decode.lower_speculative` with these options (the public lowering: trace off)."""
  return lambda t, d, ids: decode.lower_speculative(
    t, d, ids, ids, gamma=_GAMMA, **_SHAPE, **options
  )


def _decode_programs() -> dict:
  """name -> lower(target, drafter, ids): the loops' programs, each option at least once."""
  programs = {
    'generate-T0': lambda t, d, ids: decode.lower_generate(t, ids, ids, sampling=_GREEDY, **_SHAPE),
    'generate-T1-topk-topp': lambda t, d, ids: decode.lower_generate(
      t, ids, ids, sampling=_SAMPLED, **_SHAPE
    ),
    'speculative-T0-draft_stop': _public(sampling=_GREEDY, draft_stop=0.5),
    'speculative-token-T1-draft_stop': _public(sampling=_SAMPLED, draft_stop=0.5),
  }
  for verifier in _VERIFIERS:
    programs[f'speculative-{verifier}-T1-topk-topp-trace-unrolled'] = _speculative(
      verifier, _SAMPLED, trace=True, unroll_draft=True
    )
  for verifier in verify_multipath.VERIFIERS:
    programs[f'speculative-{verifier}-T1-2-paths'] = _public(
      verifier=verifier, sampling=_SAMPLED, num_drafts=2
    )
  # The token-tree loop with an autoregressive drafter's top-2 tree (1 + 2 gamma nodes).
  topk = decode.TreeSpec(num_nodes=1 + 2 * _GAMMA, builder='topk', top_k=2)
  for name, sampling in [('T1-topk-topp', _SAMPLED), ('T0', _GREEDY)]:
    programs[f'speculative-tree-topk-{name}'] = _public(sampling=sampling, tree=topk)
  return programs


_PROGRAMS = _decode_programs()


@functools.cache
def _mesh(name: str, data: int, model: int):
  return machines.compile_only_mesh(name, data, model)


def _tiny(name: str, mesh, *, shard: bool, fused: bool = False) -> t5.T5Model:
  """A tiny T5 of one layer a side (every kind of param, the fastest compile), abstract params
  on `mesh`: sharded by the default rules or replicated; in the fused decoder layout or T5X's."""
  config = dataclasses.replace(t5.CONFIGS[name], num_encoder_layers=1, num_decoder_layers=1)
  return synthetic.abstract_model(config, mesh, param_dtype='float32', shard=shard, fused=fused)


def _check_on_tpu(compiled, mesh) -> dict:
  """The program was compiled for `mesh`'s TPU devices; its memory per device."""
  devices = set(mesh.devices.flat)
  for s in jax.tree.leaves(compiled.input_shardings):
    assert s.device_set <= devices and {d.device_kind for d in s.device_set} == {'TPU v4'}, s
  stats = memory_model.memory_stats(compiled)
  assert 0 < stats['peak'] < machines.TPU_V4.hbm_bytes, stats
  return stats


def _ids(mesh):
  return synthetic.abstract_batch(mesh, 2, 8)


@pytest.mark.parametrize(
  'mesh_name, program',
  [
    pytest.param(*mesh.values, program, id=f'{program}-{mesh.id}', marks=mesh.marks)
    for program in _PROGRAMS
    for mesh in _meshes(always=program in _ALWAYS, on_2x2=program in _DEFAULT)
  ],
)
def test_decode_loop_compiles_for_tpu(mesh_name, program):
  mesh = _mesh(*mesh_name)
  target, drafter = _tiny('tiny-v1.1', mesh, shard=True), _tiny('tiny-v1.0', mesh, shard=False)
  with jax.set_mesh(mesh):
    compiled = _PROGRAMS[program](target, drafter, _ids(mesh)).compile()
  stats = _check_on_tpu(compiled, mesh)
  # Each device holds its shard of the target: a quarter of the 'model'-split params on 1x4.
  shards = memory_model.bytes_per_device(target.params)
  assert stats['argument'] >= shards, (stats, shards)


@pytest.mark.parametrize(
  'program',
  [
    'generate-T0',
    # The speculative loop calls the same decoder layers (slow: generate-T0 compiles them).
    pytest.param('speculative-token-T1-draft_stop', marks=pytest.mark.slow),
  ],
)
def test_the_fused_layout_compiles_for_tpu(program):
  """The fused decoder layout (models/t5_fused.py) on the v4-8's 2x2 mesh: the target's stacked
  kernels split over 'model' by its rules, the drafter's replicated."""
  mesh = _mesh('v4-8', 2, 2)
  target = _tiny('tiny-v1.1', mesh, shard=True, fused=True)
  drafter = _tiny('tiny-v1.1', mesh, shard=False, fused=True)
  qkv = target.params['decoder']['layers_0']['self_attention']['qkv']['kernel']
  assert qkv.sharding.spec == jax.sharding.PartitionSpec(None, None, 'model'), qkv.sharding
  with jax.set_mesh(mesh):
    compiled = _PROGRAMS[program](target, drafter, _ids(mesh)).compile()
  _check_on_tpu(compiled, mesh)


@pytest.mark.parametrize(
  'mesh_name', [m for m in _meshes() if m.id in ('v4-8:2x2', 'tpu-v4:1x1')]
)  # one chip: -m slow (the 2x2 mesh compiles the same program, sharded)
@pytest.mark.parametrize('tree', [None, decode.TreeSpec(num_nodes=8)], ids=['chain', 'tree'])
@pytest.mark.parametrize(
  'sampling',
  [_SAMPLED, pytest.param(_GREEDY, marks=pytest.mark.slow)],  # T0: the fast path, slow-marked
  ids=['T1-topk-topp', 'T0'],
)
def test_block_drafting_compiles_for_tpu(mesh_name, sampling, tree):
  """The loop with a block drafter (one call drafts gamma tokens, `decode_steps.draft_block`):
  the drafter over the target's encoder, reading its states, replicated; as a chain, and as the
  token-tree loop's best-first tree of 8 nodes (`drafting`)."""
  mesh = _mesh(*mesh_name)
  target = _tiny('tiny-v1.1', mesh, shard=True)
  width = target.config.d_model
  config = dataclasses.replace(
    t5.CONFIGS['tiny-v1.0'], num_encoder_layers=0, num_decoder_layers=1, encoder_dim=width,
    feature_dim=width, block_size=4,
  )  # fmt: skip
  drafter = synthetic.abstract_model(config, mesh, param_dtype='float32', shard=False)
  with jax.set_mesh(mesh):
    lowered = decode.lower_speculative(
      target, drafter, _ids(mesh), _ids(mesh), gamma=4, sampling=sampling, tree=tree, **_SHAPE
    )
    compiled = lowered.compile()
  _check_on_tpu(compiled, mesh)


@pytest.mark.parametrize('mesh_name', _meshes())
def test_training_step_compiles_for_tpu(mesh_name):
  mesh = _mesh(*mesh_name)
  config = dataclasses.replace(t5.CONFIGS['tiny-v1.1'], num_encoder_layers=1, num_decoder_layers=1)
  optimizer = trainer.OptimizerConfig(warmup_steps=2, num_train_steps=10)
  state, shardings = trainer.abstract_state(config, optimizer, mesh, 'model')
  step = trainer.compile_step(
    functools.partial(
      trainer.train_step,
      model_config=config,
      optimizer_config=optimizer,
      label_smoothing=0.1,
      dropout_rate=0.1,
    ),
    mesh,
    shardings,
  )
  batch = distill_model.abstract_distill_batch(mesh, batch=2, source_length=8, target_length=6)
  with jax.set_mesh(mesh):
    compiled = step.lower(state, batch).compile()
  stats = _check_on_tpu(compiled, mesh)
  assert stats['alias'] >= memory_model.bytes_per_device(state), stats  # the state is donated


@pytest.mark.parametrize('mesh_name', _meshes())  # 1x4, one chip: -m slow (2x2 the same step)
def test_distillation_step_compiles_for_tpu(mesh_name):
  student = 'paper,student.d_model=16,student.num_heads=2,student.d_kv=8,student.d_ff=32'
  (row,) = distill_model.distill_rows(
    dataclasses.replace(t5.CONFIGS['tiny-v1.0'], num_encoder_layers=1, num_decoder_layers=1),
    distill_drafter.get_config(student),
    [mesh_name],
    [2],
    teacher_param_dtype='bfloat16',
    source_length=8,
    target_length=6,
    compile_for={machines.TPU_V4},
  )
  assert row['compiler'] == 'tpu' and row['fits'] == 'yes', row
  assert row['argument'] >= row['teacher'] + row['state'] + row['batch_bytes'], row


@pytest.mark.parametrize('paths', [1, 2], ids=['one-path', '2-paths'])
def test_every_verifier_kernel_compiles_for_tpu(paths):
  """Each registered verifier's kernel alone, for one drafted path and (where it has one) K
  paths, on the 2x2 mesh with the batch over 'data': the loops around them are the token
  verifier's programs above (the other verifiers' whole loops: -m slow)."""
  mesh = _mesh('v4-8', 2, 2)
  batch, gamma, vocab = 2, _GAMMA, t5.CONFIGS['tiny-v1.1'].vocab_size
  rows = lambda *shape: jax.sharding.NamedSharding(
    mesh, jax.sharding.PartitionSpec('data', *[None] * len(shape))
  )
  spec = lambda dtype, *shape: jax.ShapeDtypeStruct((batch, *shape), dtype, sharding=rows(*shape))
  key = jax.eval_shape(lambda: jax.random.key(0))
  path = (paths,) if paths > 1 else ()
  drafts = spec(jnp.int32, *path, gamma)
  q, p = spec(jnp.float32, *path, gamma, vocab), spec(jnp.float32, *path, gamma + 1, vocab)
  compiled = 0
  for name in _VERIFIERS:
    verifier = verifiers.get(name)
    if paths > 1 and verifier.multipath is None:
      continue
    if paths > 1:
      lowered = jax.jit(verifier.multipath).lower(key, drafts, q, p)
    else:
      init = verifier.init_state
      state = None if init is None else jax.eval_shape(lambda i=init: i(batch, gamma))
      lengths = spec(jnp.int32)
      lowered = jax.jit(verifier.verify).lower(key, drafts, q, p, lengths, state)
    with jax.set_mesh(mesh):
      _check_on_tpu(lowered.compile(), mesh)
    compiled += 1
  assert compiled == (len(_VERIFIERS) if paths == 1 else len(verify_multipath.VERIFIERS))


def test_every_verifier_and_option_is_in_the_gate():
  """The program list follows the verifiers: a new one is compiled without editing this file."""
  names = ' '.join(_PROGRAMS)
  for verifier in _VERIFIERS:
    assert f'speculative-{verifier}-T1-topk-topp-trace-unrolled' in names
  for option in ('T0', 'topk-topp', 'trace', 'unrolled', 'draft_stop', '2-paths', 'tree'):
    assert option in names, option
