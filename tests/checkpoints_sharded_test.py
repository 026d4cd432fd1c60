"""Loading checkpoints straight onto a (data=2, model=4) mesh of 8 CPU devices: the same params
and logits as a single-device load, each slice a device holds read once and nothing else read."""

from tests import helpers

# Runs in a fresh interpreter: the device count is fixed when jax initialises. The fixture is T5X's
# own test checkpoint (vocab 32128, D 8, 4 heads of 3, F 16) rewritten in T5X's tensorstore layout;
# on model=4 its embedding, output layer, attention and MLP kernels and relative-position tables
# are split, its layer norm scales replicated.
_SCRIPT = """
import collections, math, tempfile, pathlib
import flax.serialization, jax, numpy as np
from jax.sharding import PartitionSpec as P
from specdec_jax import checkpoints, sharding
from specdec_jax.checkpoints import common as checkpoint_utils, hf as checkpoints_hf, t5x as checkpoints_t5x
from specdec_jax.models import t5
from tests.helpers import T5X_TINY, t5x_state, write_t5x_tensorstore_checkpoint

assert jax.device_count() == 8, jax.devices()
tmp = pathlib.Path(tempfile.mkdtemp())
raw = flax.serialization.msgpack_restore(T5X_TINY.read_bytes())['optimizer']['target']
write_t5x_tensorstore_checkpoint(t5x_state(raw), tmp / 't5x')
single = checkpoints.load_t5x(tmp / 't5x')
config = single.config
mesh = sharding.make_mesh(data=2, model=4)
flat_single = checkpoint_utils.flatten(single.params)
expected_shardings = checkpoint_utils.shardings_by_name(config, mesh)

rng = np.random.default_rng(0)
ids = rng.integers(2, config.vocab_size, (4, 9)).astype(np.int32)
mask = np.ones_like(ids)
mask[1, 5:] = 0
targets = rng.integers(2, config.vocab_size, (4, 6)).astype(np.int32)
forward = jax.jit(t5.forward, static_argnames='config')
want = np.asarray(forward(single.params, ids * mask, mask, targets, config=config))
assert np.abs(want).max() > 1e-3

def check(model, reads, name):
  flat = checkpoint_utils.flatten(model.params)
  assert sorted(flat) == sorted(flat_single), name
  split = 0
  for path, array in flat.items():
    target = expected_shardings[path]
    assert array.sharding.is_equivalent_to(target, array.ndim), (name, path, array.sharding)
    np.testing.assert_array_equal(np.asarray(array), np.asarray(flat_single[path]), err_msg=path)
    split += not target.is_fully_replicated
    if reads is None:
      continue
    # Exactly the distinct slices the devices hold, each read once: a quarter of a split param.
    index_map = target.addressable_devices_indices_map(array.shape)
    held = collections.Counter(
      tuple((s.start, s.stop, s.step) for s in index) for index in index_map.values())
    got = collections.Counter(reads[path])
    assert set(got) == set(held) and set(got.values()) == {1}, (name, path, got, held)
    if not target.is_fully_replicated:
      assert len(got) == 4 and all(
        math.prod(len(range(*slice(*s).indices(n))) for s, n in zip(key, array.shape))
        == array.size // 4 for key in got), (name, path, got)
  assert split >= 10, split
  with jax.set_mesh(mesh):
    got = np.asarray(forward(model.params, ids * mask, mask, targets, config=config))
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0, err_msg=name)

def key(index, transposed=False):
  index = index[::-1] if transposed else index
  return tuple((s.start, s.stop, s.step) for s in index)

# T5X (tensorstore/zarr): every read goes through read_tensorstore_slice.
reads = collections.defaultdict(list)
read_tensorstore_slice = checkpoints_t5x.read_tensorstore_slice
def counting_tensorstore(store, index):
  dotted = store.kvstore.path.rstrip('/').rsplit('/', 1)[-1]
  reads[dotted.removeprefix('target.').replace('.', '/')].append(key(index))
  return read_tensorstore_slice(store, index)
checkpoints_t5x.read_tensorstore_slice = counting_tensorstore
check(checkpoints.load_t5x(tmp / 't5x', mesh=mesh), reads, 't5x')

# HF (safetensors): every read goes through read_safetensors_slice, in HF's (transposed) layout.
checkpoints.save_hf_t5(single, tmp / 'hf')
theirs = {name: (ours, transposed) for ours, (name, transposed) in
          checkpoints.hf_names(config).items()}
reads = collections.defaultdict(list)
read_safetensors_slice = checkpoints_hf.read_safetensors_slice
def counting_safetensors(handle, name, index):
  ours, transposed = theirs[name]
  reads[ours].append(key(index, transposed))
  return read_safetensors_slice(handle, name, index)
checkpoints_hf.read_safetensors_slice = counting_safetensors
check(checkpoints.load_hf_t5(tmp / 'hf', mesh=mesh), reads, 'hf')

# Our own format: orbax restores onto the target shardings.
checkpoints.save(single, tmp / 'orbax')
check(checkpoints.restore(tmp / 'orbax', mesh=mesh), None, 'orbax')

# bfloat16 params for a float32 model, sharded; and a bfloat16 model whose params are float32.
half = checkpoints.load_t5x(tmp / 't5x', mesh=mesh, param_dtype='bfloat16')
assert half.config.dtype == 'float32'
for path, array in checkpoint_utils.flatten(half.params).items():
  assert array.dtype == jax.numpy.bfloat16 and array.sharding == expected_shardings[path], path
  np.testing.assert_array_equal(
    np.asarray(array), np.asarray(flat_single[path]).astype(jax.numpy.bfloat16), err_msg=path)
mixed = checkpoints.load_hf_t5(tmp / 'hf', mesh=mesh, dtype='bfloat16', param_dtype='float32')
assert mixed.config.dtype == 'bfloat16'
assert {x.dtype for x in jax.tree.leaves(mixed.params)} == {np.dtype('float32')}

# A NaN in a split param is found on the sharded arrays, and named.
broken = dict(raw)
broken['decoder'] = jax.tree.map(np.array, raw['decoder'])
broken['decoder']['layers_1']['mlp']['wo']['kernel'][13, 2] = np.nan
write_t5x_tensorstore_checkpoint(t5x_state(broken), tmp / 'broken')
try:
  checkpoints.load_t5x(tmp / 'broken', mesh=mesh)
except ValueError as e:
  assert "'decoder/layers_1/mlp/wo/kernel'" in str(e) and 'has 1 non-finite' in str(e), e
else:
  raise AssertionError('no error for a NaN weight')
print('SHARDED_LOAD_OK')
"""


def test_loading_onto_a_mesh_reads_only_held_slices_and_matches_one_device():
  helpers.run_on_cpu_devices(_SCRIPT, 'SHARDED_LOAD_OK')
