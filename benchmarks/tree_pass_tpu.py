r"""A token tree's target pass priced by XLA:TPU's cost model, against a chain pass (issue 48).

  python -m benchmarks.tree_pass_tpu --target=t5-11b --nodes=16,32,64 --compile_for=tpu-v4
  python -m benchmarks.tree_pass_tpu --target=t5-small --nodes=4 --dtype=float32   # a smoke run
  PYTHONPATH=/tmp/gpu_site python -m benchmarks.tree_pass_tpu --target=t5-11b --compile_for=h100
      # XLA:GPU (no cost model): the kernels a pass launches and its temporaries

Nothing runs: for one chip of --compile_for (`machines.compile_only_devices`), batch 1, each
program is the timed path's own, compiled instead of timed (as `benchmarks.paper_scale_tpu`):
the target's step and its chain pass of N positions (`timed_loops.repeated_steps`), and its pass over
a token tree of N nodes (`timed_loops.repeated_tree_passes`: `step_tree`, the tree loop's pass, with
the ancestor mask and positions from each node's depth over a cache of --cache_len slots). Each
row: the estimated cycles of one pass over those of one step ('pass cost', the paper's unit), the
tree's over the chain's, XLA:TPU's temporaries of each program, and the layout copies one pass
runs (the tree's must be no more than the chain's: a cache written in a layout its attention does not read is
copied at every layer, as `cache.select_write` fixed for chains; tests/tree_pass_tpu_test.py). Every number is a compiler's estimate
(`tpu_costs`), not a timing. Compiled for an H100 (`--compile_for=h100`, the CUDA plugin as
`benchmarks.drafter_kernels` says), where XLA has no cost model, each row counts instead the
kernels one pass launches (`hlo_text.launches` of the loop's body and condition) and the
programs' temporaries.
"""

import os

import jax
import jax.numpy as jnp
from absl import flags

import benchmarks
from benchmarks import hlo_text, machines, paper_scale_tpu, synthetic
from specdec_jax import trees
from specdec_jax.measure import tables, timed_loops

FLAGS = flags.FlagValues()
_COMPILE_FOR = benchmarks.define_compile_for('One TPU chip, or h100.', FLAGS, default='tpu-v4')
_TARGET = flags.DEFINE_string('target', 't5-11b', 'A `t5.CONFIGS` shape.', flag_values=FLAGS)
_DTYPE = flags.DEFINE_enum(
  'dtype', 'bfloat16', ['bfloat16', 'float32'], 'Params and activations.', flag_values=FLAGS
)
_NODES = flags.DEFINE_list('nodes', ['16', '32', '64'], 'Node budgets N.', flag_values=FLAGS)
_DEPTH = flags.DEFINE_integer('depth', 8, "The trees' depth.", flag_values=FLAGS)
_SOURCE = flags.DEFINE_integer('source_length', 64, 'Source positions.', flag_values=FLAGS)
_CACHE_LEN = flags.DEFINE_integer('cache_len', 192, 'Decoder cache slots.', flag_values=FLAGS)

TABLE = (
  tables.Column('nodes', width=5),
  tables.Column('chain', 'chain pass', fmt='.3f', width=10),
  tables.Column('tree', 'tree pass', fmt='.3f', width=9),
  tables.Column('ratio', 'tree / chain', fmt='.3f', width=12),
  tables.Column('chain_temp_mib', 'chain temp MiB', fmt='.1f', width=14),
  tables.Column('tree_temp_mib', 'tree temp MiB', fmt='.1f', width=13),
  tables.Column('chain_copies', 'chain copies', fmt='d', width=12),
  tables.Column('tree_copies', 'tree copies', fmt='d', width=11),
)


def _placed(shape, dtype, device):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))


def tree_cycles(setup, model, *, nodes: int, depth: int, cache_len: int):
  """`paper_scale_tpu.LoopCost` of `model`'s passes over a token tree of `nodes` slots."""
  cache = synthetic.abstract_cache(
    model, setup.device, batch=setup.batch, source_length=setup.source_length, cache_len=cache_len
  )
  shape = (setup.batch, nodes)
  tree = trees.Tree(
    *(_placed(shape, jnp.int32, setup.device) for _ in range(3)),
    _placed(shape, jnp.bool_, setup.device),
  )
  compiled = setup.compile(
    timed_loops.repeated_tree_passes, model.steps, model.params, cache, setup.position(), tree,
    max_depth=depth, loop_length=_placed((), jnp.int32, setup.device),
  )  # fmt: skip
  return paper_scale_tpu.loop_cost(compiled)


LAUNCH_TABLE = (
  tables.Column('nodes', width=5),
  tables.Column('chain', 'chain launches', fmt='d', width=14),
  tables.Column('tree', 'tree launches', fmt='d', width=13),
  tables.Column('chain_temp_mib', 'chain temp MiB', fmt='.1f', width=14),
  tables.Column('tree_temp_mib', 'tree temp MiB', fmt='.1f', width=13),
)


def _pass_launches(compiled) -> tuple[int, float]:
  """(kernels one pass launches: the loop's body and condition, temporaries MiB) of a compiled
  `timed_loops.repeated_*` program (one loop at its top level)."""
  hlo = compiled.as_text()
  ((body, condition),) = hlo_text.while_loops(hlo)
  count = sum(hlo_text.launches(hlo, c)['total'] for c in (body, condition))
  return count, compiled.memory_analysis().temp_size_in_bytes / 2**20


def launch_rows(machine: str, target: str, *, dtype: str, nodes, depth, source_length, cache_len):
  """A row per N on a GPU machine (no cost model): each pass's kernel launches and temporaries."""
  device = machines.compile_only_devices(machine)[0]
  model = synthetic.abstract_model(synthetic.shape(target, dtype), device)
  cache = synthetic.abstract_cache(
    model, device, batch=1, source_length=source_length, cache_len=cache_len
  )
  position, loop = _placed((1,), jnp.int32, device), _placed((), jnp.int32, device)
  for n in nodes:
    chain = jax.jit(timed_loops.repeated_steps, static_argnames=('steps', 'num_tokens')).lower(
      model.steps, model.params, cache, position, num_tokens=n, loop_length=loop
    )
    tree = trees.Tree(
      *(_placed((1, n), jnp.int32, device) for _ in range(3)), _placed((1, n), jnp.bool_, device)
    )
    tree = jax.jit(timed_loops.repeated_tree_passes, static_argnames=('steps', 'max_depth')).lower(
      model.steps, model.params, cache, position, tree, max_depth=depth, loop_length=loop
    )
    (chain, chain_temp), (tree, tree_temp) = (_pass_launches(p.compile()) for p in (chain, tree))
    yield dict(nodes=n, chain=chain, tree=tree, chain_temp_mib=chain_temp, tree_temp_mib=tree_temp)


def rows(machine: str, target: str, *, dtype: str, nodes, depth, source_length, cache_len):
  """A row per N: chain and tree pass costs in target steps."""
  device = machines.compile_only_devices(machine)[0]
  setup = paper_scale_tpu.Setup(device, machine, dtype=dtype, source_length=source_length)
  model = synthetic.abstract_model(synthetic.shape(target, dtype), device)
  calls = lambda n: paper_scale_tpu.call_cycles(setup, model, positions=n, cache_len=cache_len)
  step = calls(1).per_iteration
  for n in nodes:
    chain = calls(n)
    tree = tree_cycles(setup, model, nodes=n, depth=depth, cache_len=cache_len)
    yield dict(
      nodes=n,
      chain=chain.per_iteration / step,
      tree=tree.per_iteration / step,
      ratio=tree.per_iteration / chain.per_iteration,
      chain_temp_mib=chain.temp_bytes / 2**20,
      tree_temp_mib=tree.temp_bytes / 2**20,
      chain_copies=chain.copies,
      tree_copies=tree.copies,
    )


def main(argv):
  del argv
  machine = benchmarks.compile_for(_COMPILE_FOR, one_chip=True)
  gpu = machines.get(machine).platform != 'tpu'
  if gpu:  # no CUDA libraries are needed to compile, nor checked
    os.environ.setdefault('JAX_SKIP_CUDA_CONSTRAINTS_CHECK', '1')
  what = (
    "XLA:GPU's kernels a pass launches" if gpu else "XLA:TPU's estimated cycles per pass / per step"
  )
  print(f'{_TARGET.value} ({_DTYPE.value}) on one {machine} chip, compile-only, batch 1, '
        f'source {_SOURCE.value}, cache {_CACHE_LEN.value}; trees of depth {_DEPTH.value}; '
        f'{what}', flush=True)  # fmt: skip
  table, make = (LAUNCH_TABLE, launch_rows) if gpu else (TABLE, rows)
  print(tables.format_header(table), flush=True)
  for row in make(
    machine, _TARGET.value, dtype=_DTYPE.value, nodes=[int(n) for n in _NODES.value],
    depth=_DEPTH.value, source_length=_SOURCE.value, cache_len=_CACHE_LEN.value,
  ):  # fmt: skip
    print(tables.format_line(row, table), flush=True)


if __name__ == '__main__':
  benchmarks.run(main, FLAGS)
