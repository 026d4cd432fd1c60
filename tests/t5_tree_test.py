"""Tests of models/t5_tree.py: a T5 pass over a token tree gives, at every node, the logits of a
plain sequential decode of that node's root-to-node path (float32 tolerance), with controls that
must fail the same comparison (positions from the slot; a causal mask over the slots), and
`keep_path` leaves the cache a plain decode of the accepted path would have."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import cache as cache_lib
from specdec_jax import trees
from specdec_jax.measure import timed_loops
from specdec_jax.models import t5, t5_tree
from tests import helpers

TOLERANCE = 1e-4  # float32 logits of a tiny T5: tree pass vs sequential decode
MAX_DECODE_LEN = 24
NUM_NODES, DEPTH = 9, 3
COMMITTED = (3, 6)  # ragged rows: committed lengths before the root


@functools.partial(jax.jit, static_argnames=('config',))
def _prefill(params, ids, mask, decoder_inputs, *, config):
  """The cache after decoding `decoder_inputs`, rewound to the COMMITTED lengths."""
  encoded = t5.encode(params, ids, mask, config=config)
  cache = t5.init_cache(params, encoded, mask, config=config, max_decode_len=MAX_DECODE_LEN)
  _, cache = t5.decode(params, decoder_inputs, cache, config=config)
  return cache_lib.rewind(cache, jnp.array(COMMITTED))


@functools.cache
def _setup(name='tiny-v1.1'):
  """(model, the committed cache [2 rows], their decoder inputs [2, 7] (seq[b, L_b] the root),
  a best-first tree per row)."""
  model = helpers.tiny_t5(name, 0)
  config = model.config
  rng = np.random.default_rng(0)
  ids = jnp.asarray(rng.integers(2, config.vocab_size, size=(2, 7)), jnp.int32)
  mask = jnp.asarray(np.arange(7)[None] < np.array([[7], [5]]))
  seq = rng.integers(2, config.vocab_size, size=(2, 7))
  seq[:, 0] = config.decoder_start_token_id
  seq = jnp.asarray(seq, jnp.int32)
  cache = _prefill(model.params, ids, mask, seq[:, :6], config=config)
  roots = seq[jnp.arange(2), jnp.array(COMMITTED)]
  # Half the mass on one token per depth: a deep chain with siblings hanging off it.
  spread = rng.dirichlet(np.ones(config.vocab_size) * 0.05, size=(2, DEPTH))
  peak = np.eye(config.vocab_size)[rng.integers(config.vocab_size, size=(2, DEPTH))]
  probs = (0.5 * spread + 0.5 * peak).astype(np.float32)
  tree = jax.jit(trees.best_first_tree, static_argnums=2)(roots, jnp.asarray(probs), NUM_NODES)
  trees.check_tree(tree, DEPTH)
  return model, cache, seq, tree


def _node_paths(tree, row):
  """{slot: root-to-node tokens (root first)} of row's valid nodes."""
  tokens, parents, valid = (np.asarray(x)[row] for x in (tree.tokens, tree.parents, tree.valid))
  paths = {0: [int(tokens[0])]}
  for u in range(1, len(tokens)):
    if valid[u]:
      paths[u] = paths[int(parents[u])] + [int(tokens[u])]
  return paths


_decode = jax.jit(t5.decode, static_argnames=('config',))


@functools.partial(jax.jit, static_argnames=('config',))
def _decode_rows(params, tokens, cache, rows, *, config):
  return t5.decode(params, tokens, cache_lib.take_rows(cache, rows), config=config)[0]


def _sequential_logits(model, cache, tree):
  """Each valid node's logits from a plain decode of its path on its row's cache, in one call
  (paths right-padded: causal decoding makes the padding unread): {(row, slot): f32[V]}."""
  nodes = [(row, slot, path) for row in range(2) for slot, path in _node_paths(tree, row).items()]
  rows = jnp.array([row for row, _, _ in nodes])
  tokens = jnp.array([path + [0] * (DEPTH + 1 - len(path)) for _, _, path in nodes], jnp.int32)
  logits = np.asarray(_decode_rows(model.params, tokens, cache, rows, config=model.config))
  return {(row, slot): logits[i, len(path) - 1] for i, (row, slot, path) in enumerate(nodes)}


@functools.partial(jax.jit, static_argnames=('config', 'control'))
def _tree_logits(params, tree, cache, *, config, control=''):
  """The tree pass, or a control: positions from the slot ('slot_positions'), or a causal mask
  over the node slots instead of the ancestor mask ('causal_mask')."""
  if not control:
    logits, _ = t5.T5Steps(config).step_tree(params, tree, cache, DEPTH)
    return logits
  slot = jnp.broadcast_to(jnp.arange(tree.tokens.shape[1]), tree.tokens.shape)
  layout = t5_tree.layout(
    tree._replace(depth=slot) if control == 'slot_positions' else tree,
    cache.end_index,
    cache.max_decode_len,
    DEPTH,
  )
  if control == 'causal_mask':
    attend = jnp.arange(cache.max_decode_len)[None, None] < (
      cache.end_index[:, None, None] + 1 + slot[:, :, None]
    )
    layout = layout.replace(mask=attend)
  logits, _ = t5.decode(params, tree.tokens, cache, config=config, layout=layout)
  return logits


def _max_error(model, cache, tree, control=''):
  logits = np.asarray(_tree_logits(model.params, tree, cache, config=model.config, control=control))
  reference = _sequential_logits(model, cache, tree)
  return max(np.max(np.abs(logits[row, slot] - ref)) for (row, slot), ref in reference.items())


def test_tree_pass_equals_sequential_decode_of_each_path():
  model, cache, _, tree = _setup()
  assert int(np.asarray(tree.depth).max()) == DEPTH  # deep enough for positions to matter
  assert _max_error(model, cache, tree) < TOLERANCE


@pytest.mark.parametrize('control', ['slot_positions', 'causal_mask'])
def test_controls_fail(control):
  model, cache, _, tree = _setup()
  assert _max_error(model, cache, tree, control) > 100 * TOLERANCE


def test_step_tree_leaves_end_index_and_refuses_drafters():
  model, cache, _, tree = _setup()
  _, new_cache = _step_tree(model.params, tree, cache, config=model.config)
  np.testing.assert_array_equal(new_cache.end_index, COMMITTED)
  drafter = t5.T5Steps(dataclasses.replace(model.config, feature_dim=32))
  with pytest.raises(ValueError, match='step_tree is a target pass'):
    drafter.step_tree(model.params, tree, cache, DEPTH)


@functools.partial(jax.jit, static_argnames=('config',))
def _step_tree(params, tree, cache, *, config):
  return t5.T5Steps(config).step_tree(params, tree, cache, DEPTH)


def _deepest_path(tree, row):
  """The slots from depth 1 to the row's last deepest node."""
  parents, depth = (np.asarray(x)[row] for x in (tree.parents, tree.depth))
  node = int(np.flatnonzero(depth == depth.max())[-1])
  path = []
  while node > 0:
    path.append(node)
    node = int(parents[node])
  return path[::-1]


def test_keep_path_leaves_the_cache_of_a_plain_decode():
  """Row 0 keeps its deepest path (slots not in order 1, 2, ..), row 1 only its first node: the
  next token's logits and the kept keys/values equal those of decoding the kept chain."""
  model, cache, seq, tree = _setup()
  steps = t5.T5Steps(model.config)
  _, written = _step_tree(model.params, tree, cache, config=model.config)
  kept = [_deepest_path(tree, 0), _deepest_path(tree, 1)[:1]]
  assert kept[0] != list(range(1, DEPTH + 1))  # a path that actually moves
  path = jnp.array([p + [-1] * (DEPTH - len(p)) for p in kept], jnp.int32)
  num_accepted = jnp.array([len(p) for p in kept], jnp.int32)
  compact = jax.jit(steps.keep_path)(written, path, num_accepted)
  np.testing.assert_array_equal(compact.end_index, np.array(COMMITTED) + 1 + num_accepted)
  nxt = jnp.array([[5], [7]], jnp.int32)
  logits, _ = _decode(model.params, nxt, compact, config=model.config)
  for row in range(2):
    chain = [_node_paths(tree, row)[p] for p in [0] + kept[row]][-1]
    row_cache = cache_lib.take_rows(cache, jnp.array([row]))
    want, want_cache = _decode(
      model.params,
      jnp.array([chain + [int(nxt[row, 0])]], jnp.int32),
      row_cache,
      config=model.config,
    )
    np.testing.assert_allclose(logits[row, 0], want[0, -1], atol=TOLERANCE)
    end = COMMITTED[row] + len(chain)
    np.testing.assert_allclose(
      compact.self_k[:, row, :end], want_cache.self_k[:, 0, :end], atol=TOLERANCE
    )


def test_repeated_tree_passes_is_the_tree_pass():
  """`timed_loops.repeated_tree_passes` (what the benchmarks time and compile for a TPU) runs
  `step_tree`: one loop iteration gives its logits at every node."""
  model, cache, _, tree = _setup()
  row = cache_lib.take_rows(cache, jnp.array([1]))
  one = jax.tree.map(lambda x: x[1:], tree)
  looped = timed_loops.repeated_tree_passes(
    model.steps, model.params, row, row.end_index, one, max_depth=DEPTH, loop_length=1
  )
  direct = _tree_logits(model.params, one, row, config=model.config)
  np.testing.assert_allclose(looped, direct, atol=1e-6)
