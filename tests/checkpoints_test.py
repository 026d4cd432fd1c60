"""Tests of checkpoints.py's own format (orbax `save` / `restore`); the helpers the checkpoint
tests share are in tests/helpers.py."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import flax.traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scripts import import_graph
from specdec_jax import checkpoints
from specdec_jax.models import t5
from tests import helpers


def _fine_tuned(base: t5.T5Model, scale: float = 0.02, seed: int = 5) -> t5.T5Model:
  """`base` with every weight moved by a small random delta, as a fine-tune moves them."""
  leaves, treedef = jax.tree.flatten(base.params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  moved = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
  return t5.T5Model(config=base.config, params=jax.tree.unflatten(treedef, moved))


@pytest.mark.parametrize('bits', [pytest.param(8, marks=pytest.mark.slow), 6])  # 6: the shipped
def test_orbax_int8_delta_storage(tmp_path, bits):
  """A fine-tune stored as an int8 delta from its (bfloat16-stored) base: each weight within
  max|row delta| / (2 (2^(bits-1) - 1)) of the float32 one, and weights and logits nearer the
  float32 model's than a bfloat16 copy's; it follows its base's directory and refuses a different base."""
  model = helpers.random_t5('tiny-v1.1')
  checkpoints.save(model, tmp_path / 'base', storage_dtype='bfloat16')
  tuned = _fine_tuned(checkpoints.restore(tmp_path / 'base'))
  checkpoints.save(
    tuned, tmp_path / 'tuned', storage_dtype='int8-delta', delta_base=tmp_path / 'base',
    delta_bits=bits,
  )  # fmt: skip
  restored = checkpoints.restore(tmp_path / 'tuned')
  assert restored.config == tuned.config
  base = helpers.flat_params(checkpoints.restore(tmp_path / 'base').params)
  for name, want in helpers.flat_params(tuned.params).items():
    got = np.asarray(helpers.flat_params(restored.params)[name])
    assert got.dtype == np.float32
    delta = np.asarray(want) - np.asarray(base[name])
    levels = 2 ** (bits - 1) - 1
    bound = np.max(np.abs(delta), axis=-1, keepdims=True) / (2 * levels) * (1 + 1e-5) + 1e-7
    assert np.all(np.abs(got - np.asarray(want)) <= bound), name
  errors = checkpoints.delta_error(tuned, tmp_path / 'tuned')
  assert errors['max_stored'] < errors['max_bfloat16'], errors
  assert errors['mean_stored'] < errors['mean_bfloat16'], errors
  ids, mask = helpers.checkpoint_source(tuned.config.vocab_size)
  decoder = np.full((2, 5), 3)
  logits = lambda m: np.asarray(helpers.forward(m.params, ids, mask, decoder, config=m.config))
  rounded = t5.T5Model(tuned.config, jax.tree.map(lambda x: x.astype(jnp.bfloat16), tuned.params))
  off = lambda m: np.max(np.abs(logits(m) - logits(tuned)))
  assert off(restored) < off(rounded)  # nearer the float32 model's logits than bfloat16 is
  # The pair moves together (the base is found relative to the delta).
  (tmp_path / 'moved').mkdir()
  for name in ('base', 'tuned'):
    (tmp_path / name).rename(tmp_path / 'moved' / name)
  helpers.assert_params_equal(
    checkpoints.restore(tmp_path / 'moved' / 'tuned').params, restored.params
  )
  # A different checkpoint in the base's place is refused; a missing one is named.
  checkpoints.save(
    helpers.random_t5('tiny-v1.1', seed=3), tmp_path / 'base', storage_dtype='bfloat16'
  )
  (tmp_path / 'moved' / 'tuned').rename(tmp_path / 'tuned')
  helpers.raises_naming(
    lambda: checkpoints.restore(tmp_path / 'tuned'), 'not the one the delta was made'
  )
  (tmp_path / 'base').rename(tmp_path / 'gone')
  with pytest.raises(FileNotFoundError, match='int8 delta from .*base, which is missing'):
    checkpoints.restore(tmp_path / 'tuned')


def test_orbax_int8_delta_errors(tmp_path):
  model = helpers.random_t5('tiny-v1.1')
  checkpoints.save(model, tmp_path / 'base')
  with pytest.raises(ValueError, match='delta_base is needed'):
    checkpoints.save(model, tmp_path / 'a', storage_dtype='int8-delta')
  with pytest.raises(ValueError, match='delta_base is needed'):
    checkpoints.save(model, tmp_path / 'b', delta_base=tmp_path / 'base')
  for bits in (1, 9, 6.0):
    with pytest.raises(ValueError, match=r'delta_bits must be an int in \[2, 8\]'):
      checkpoints.save(
        model, tmp_path / 'd', storage_dtype='int8-delta', delta_base=tmp_path / 'base',
        delta_bits=bits,
      )  # fmt: skip
  other = helpers.random_t5('tiny-v1.0')
  helpers.raises_naming(
    lambda: checkpoints.save(
      other, tmp_path / 'c', storage_dtype='int8-delta', delta_base=tmp_path / 'base'
    ),
    'does not match the model at',
  )


def test_orbax_shared_with_a_base_stores_each_shared_array_once(tmp_path):
  """A drafter built from its target (its embeddings and output layer the target's, frozen)
  saved `shared_with` the target: those two arrays are not written, and it restores bit for bit
  from the pair; a base that no longer holds them, or a missing one, is refused by name."""
  from specdec_jax.models import t5_growth

  target = helpers.random_t5('tiny-v1.1')
  checkpoints.save(target, tmp_path / 'target', storage_dtype='bfloat16')
  target = checkpoints.restore(tmp_path / 'target')
  config = dataclasses.replace(
    target.config, num_encoder_layers=0, num_decoder_layers=1, encoder_dim=target.config.d_model,
    feature_dim=target.config.d_model, block_size=4,
  )  # fmt: skip
  drafter = t5_growth.drafter_from_target(target, config, (1,), jax.random.key(1))
  drafter = drafter.replace(params=jax.tree.map(np.asarray, drafter.params))
  drafter.params['decoder']['layers_0'] = jax.tree.map(
    lambda x: x + 0.01, drafter.params['decoder']['layers_0']
  )  # trained: no longer the target's layer
  checkpoints.save(
    drafter, tmp_path / 'block', storage_dtype='bfloat16', shared_with=tmp_path / 'target'
  )
  checkpoints.save(drafter, tmp_path / 'alone', storage_dtype='bfloat16')
  meta = json.loads((tmp_path / 'block' / 'shared.json').read_text())
  assert meta['base'] == '../target'
  assert meta['names'] == [  # every array still the target's (its norm and position table too)
    'decoder/decoder_norm/scale', 'decoder/logits_dense/kernel',
    'decoder/relpos_bias/rel_embedding', 'token_embedder/embedding',
  ]  # fmt: skip
  size = lambda d: sum(f.stat().st_size for f in (d / 'params').rglob('*') if f.is_file())
  assert size(tmp_path / 'block') < 0.8 * size(tmp_path / 'alone')
  helpers.assert_params_equal(
    checkpoints.restore(tmp_path / 'block').params, checkpoints.restore(tmp_path / 'alone').params
  )
  # Another checkpoint in the target's place is refused; a missing one is named.
  (tmp_path / 'target').rename(tmp_path / 'kept')
  other = helpers.random_t5('tiny-v1.1', seed=3)
  checkpoints.save(other.replace(params=jax.tree.map(lambda x: x + 0.5, other.params)),
                   tmp_path / 'target')  # fmt: skip
  helpers.raises_naming(
    lambda: checkpoints.restore(tmp_path / 'block'), 'no longer holds what they were'
  )
  (tmp_path / 'target').rename(tmp_path / 'other')
  with pytest.raises(FileNotFoundError, match='takes 4 params from .*target, which is missing'):
    checkpoints.restore(tmp_path / 'block')
  # Nothing in common, or a delta too: one error each.
  with pytest.raises(ValueError, match='no param of this model equals one of its params'):
    checkpoints.save(drafter, tmp_path / 'x', shared_with=tmp_path / 'other')
  with pytest.raises(ValueError, match='shared_with and int8-delta'):
    checkpoints.save(
      drafter, tmp_path / 'y', storage_dtype='int8-delta', delta_base=tmp_path / 'kept',
      shared_with=tmp_path / 'kept',
    )  # fmt: skip


def test_orbax_errors(tmp_path):
  model = helpers.random_t5('tiny-v1.0')
  with pytest.raises(FileNotFoundError, match='config.json is missing'):
    checkpoints.restore(tmp_path)
  with pytest.raises(FileExistsError):
    checkpoints.save(model, tmp_path)
  mismatched = t5.T5Model(config=t5.CONFIGS['tiny-v1.1'], params=model.params)
  with pytest.raises(ValueError, match=r"missing parameter 'decoder/layers_0/mlp/wi_0/kernel'"):
    checkpoints.save(mismatched, tmp_path / 'mismatched')
  assert not (tmp_path / 'mismatched').exists()


def test_orbax_nonfinite_weight_names_the_parameter(tmp_path):
  model = helpers.random_t5('tiny-v1.0')
  flat = helpers.flat_params(model.params)
  flat['token_embedder/embedding'] = flat['token_embedder/embedding'].at[5, 1].set(jnp.inf)
  broken = t5.T5Model(config=model.config, params=flax.traverse_util.unflatten_dict(flat, sep='/'))
  checkpoints.save(broken, tmp_path / 'model')
  helpers.raises_naming(
    lambda: checkpoints.restore(tmp_path / 'model'),
    f"Parameter 'token_embedder/embedding' of {tmp_path / 'model'} has 1 non-finite value(s)",
  )
  helpers.assert_params_equal(
    checkpoints.restore(tmp_path / 'model', allow_nonfinite=True).params, broken.params
  )


# After a failed restore orbax's background I/O still calls into its closed asyncio loop; that
# noise is orbax's, and the ValueError is what this test checks.
@pytest.mark.filterwarnings('ignore::pytest.PytestUnraisableExceptionWarning')
@pytest.mark.parametrize('damage', ['array data', 'array metadata', 'config.json'])
def test_orbax_damaged_checkpoint_names_the_directory(tmp_path, damage):
  directory = tmp_path / 'model'
  checkpoints.save(helpers.random_t5('tiny-v1.0'), directory)
  if damage == 'array data':
    # The ocdbt data files (`.../d/<hash>`) hold the arrays' bytes.
    damaged = [f for f in (directory / 'params').rglob('*') if f.is_file() and f.parent.name == 'd']
    assert damaged
    for file in damaged:
      file.write_bytes(bytes(range(256)) * (file.stat().st_size // 256 + 1))
    needle = f'Cannot restore the orbax checkpoint at {directory};'
  elif damage == 'array metadata':
    (directory / 'params' / '_METADATA').write_text('{"tree_metadata": ')
    needle = f'Cannot restore the orbax checkpoint at {directory};'
  else:
    (directory / 'config.json').write_text('{"vocab_size": 32,')
    needle = f'{directory / "config.json"} is not valid JSON'
  helpers.raises_naming(lambda: checkpoints.restore(directory), needle)


def test_orbax_restore_storage_and_compute_dtypes(tmp_path):
  model = helpers.random_t5('tiny-v1.1')
  checkpoints.save(model, tmp_path / 'model')
  half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
  stored = checkpoints.restore(tmp_path / 'model', param_dtype='bfloat16')
  assert stored.config == model.config
  helpers.assert_params_equal(stored.params, half)
  computed = checkpoints.restore(tmp_path / 'model', dtype='bfloat16')  # as saved: float32
  assert computed.config.dtype == 'bfloat16'
  helpers.assert_params_equal(computed.params, model.params)
  with pytest.raises(ValueError, match='param_dtype must be one of'):
    checkpoints.restore(tmp_path / 'model', param_dtype='int4')


_CHECKPOINT_MODULES = tuple(
  f'specdec_jax.checkpoints{leaf}' for leaf in ('.common', '', '.hf', '.t5x')
)


def test_checkpoint_modules_import_without_cycles():
  """common <- hf, t5x <- the package, even inside functions (scripts/import_graph reads them)."""
  edges = import_graph.graph(Path(__file__).parents[1])
  graph = {m: edges[m] & set(_CHECKPOINT_MODULES) for m in _CHECKPOINT_MODULES}
  common, package, hf, t5x = _CHECKPOINT_MODULES
  assert graph[common] == set()
  assert graph[hf] == graph[t5x] == {common}
  assert graph[package] == {common, hf, t5x}
  for order in (_CHECKPOINT_MODULES, _CHECKPOINT_MODULES[::-1]):
    code = ';'.join(f'import {module}' for module in order)
    subprocess.run([sys.executable, '-c', code], check=True, cwd=Path(__file__).parents[1])
