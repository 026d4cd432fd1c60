"""Tests for specdec_jax.verify_tree and specdec_jax.trees: tree verification is exactly lossless.

Two layers, each with negative controls (plausible bugs) that must fail the same check:
1. Rational oracle (tests/tree_oracle.py): each rule's law, enumerated in Fractions over every
   drafted tree and every coin, followed by sampling from the target, equals the target's joint
   law of D + 1 tokens exactly; the controls are off by a stated total variation.
2. Sampling: NUM_ROWS (three children: ROWS3) jitted rows per case, each with its own tree
   drafted in numpy from a context-dependent toy drafter. The emitted sequences (accepted path +
   Y) are compared with the rule's exact law, and the WHOLE sequences (continued by the target to
   D + 1 tokens) with the target's joint, by chi-square at SIGNIFICANCE; each control must give
   p < SIGNIFICANCE on the whole-sequence test.
Greedy verification is compared token for token with the target's argmax decoding.

Rule 1a and the sampled-tree builder are checked with three children per node (BRANCHING3) as
well as two: a sibling's law must have EVERY earlier sibling removed, which two children cannot
tell from removing only the latest one ('rrs/only_latest_removed': exact at two children, off by
TV 0.121 at three on PAIR3).
"""

import collections
import contextlib
import functools
import itertools
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import sampling, trees, verify
from specdec_jax import verify_tree as vtree
from tests import chisquare, helpers
from tests import multipath_oracle as mo
from tests import tree_oracle as to
from tests import verify_oracle as oracle

NUM_ROWS = 200_000
SIGNIFICANCE = chisquare.SIGNIFICANCE  # 1e-3
DEPTH = 2
BRANCHING = (2, 2)  # children per node at depth 0 and 1: N = 1 + 2 + 4 = 7 slots
BRANCHING3 = (3, 3)  # N = 1 + 3 + 9 = 13 slots
# The toy pair (seed, V) of the three-children tests. On the V = 4 toys two rejected siblings
# mostly leave a residual of one token, where 'rrs/only_latest_removed' changes nothing.
PAIR3 = (531, 5)
ROWS3 = 100_000  # rows of the three-children sampling tests (the control is off by TV 0.121)


@functools.cache
def _pair(seed: int = 502, vocab: int = 4) -> helpers.ToyPair:
  """The toy pair of the sampling tests: on it every control below is off by TV >= 0.037."""
  return helpers.random_toy_pair(seed, vocab=vocab, gamma=DEPTH)


def _joint(pair):
  return oracle.sequence_distribution(pair.target, DEPTH + 1, pair.vocab)


def _continued(law, pair):
  return oracle.continue_with_target(law, pair.target, DEPTH + 1)


# ----------------------------------------------------------------------------------------------
# 1. Rational oracle.


@pytest.mark.parametrize('seed', range(4))
@pytest.mark.parametrize('vocab', [3, 4])
def test_oracle_rules_are_lossless(seed, vocab):
  pair = helpers.random_toy_pair(500 + seed, vocab=vocab, gamma=DEPTH)
  joint = _joint(pair)
  topk = to.topk_tree(pair.drafter, BRANCHING)
  assert _continued(to.along_tree_law(pair.target, topk), pair) == joint
  assert _continued(to.cumulative_law(pair.target, topk), pair) == joint
  for branching in [BRANCHING, (3, 1), (1, 2), BRANCHING3]:
    assert _continued(to.rrs_law(pair.target, pair.drafter, branching), pair) == joint


def test_oracle_controls_are_lossy():
  """Exact TVs of the controls on `_pair()`, the pair the sampling tests use."""
  pair = _pair()
  joint = _joint(pair)
  topk = to.topk_tree(pair.drafter, BRANCHING)
  duplicated = {node: kids + kids[:1] for node, kids in topk.items()}
  laws = {
    'rrs/no_q_renormalize': to.rrs_law(pair.target, pair.drafter, BRANCHING, renormalize_q=False),
    'rrs/no_p_update': to.rrs_law(pair.target, pair.drafter, BRANCHING, update_p=False),
    'rrs/topk_children': to.rrs_fixed_law(pair.target, pair.drafter, topk),
    'cumulative/duplicate_siblings': to.cumulative_law(pair.target, duplicated),
  }
  tvs = {name: mo.total_variation(_continued(law, pair), joint) for name, law in laws.items()}
  assert min(tvs.values()) > 0.03, tvs
  # Rule 1b as this module runs it (follow the draw) is not fooled by a duplicate.
  assert _continued(to.along_tree_law(pair.target, duplicated), pair) == joint


def test_oracle_removing_only_the_latest_sibling_needs_three_children():
  """Sibling i + 1's law q_u without sibling i only, not without siblings 1..i: the right rule
  for two children per node, lossy from the third child on (exact TV on PAIR3)."""
  pair = _pair(*PAIR3)
  joint = _joint(pair)

  def law(branching, **bug):
    return _continued(to.rrs_law(pair.target, pair.drafter, branching, **bug), pair)

  assert law(BRANCHING3) == joint
  assert law(BRANCHING, remove_all_rejected=False) == joint
  tv = mo.total_variation(law(BRANCHING3, remove_all_rejected=False), joint)
  assert tv > 0.12, float(tv)


# ----------------------------------------------------------------------------------------------
# 2. Sampling: trees drafted in numpy, verified by the jitted kernels.


def _slots(branching):
  """Slot layout of a full tree: [(slot, parent slot, depth)], breadth first."""
  layout, frontier = [(0, -1, 0)], [0]
  for depth, k in enumerate(branching, start=1):
    nxt = []
    for parent in frontier:
      for _ in range(k):
        layout.append((len(layout), parent, depth))
        nxt.append(layout[-1][0])
    frontier = nxt
  return layout


def _gumbel_order(rng, probs, count):
  """`count` draws without replacement per row (Gumbel top-k): ids [R, count], ok [R, count]
  (False where the row's support ran out)."""
  with np.errstate(divide='ignore'):
    keys = np.log(probs) + rng.gumbel(size=probs.shape)
  order = np.argsort(-keys, axis=1, kind='stable')[:, :count]
  return order, np.isfinite(np.take_along_axis(keys, order, axis=1))


def _topk_order(probs, count):
  """The `count` most probable ids per row (ties by id) and whether each is positive."""
  order = np.argsort(-probs, axis=1, kind='stable')[:, :count]
  return order, np.take_along_axis(probs, order, axis=1) > 0


@functools.cache
def _draft_trees(pair, branching, how, seed, num_rows=NUM_ROWS):
  """`num_rows` trees of the full layout of `branching`, children of every node from the
  drafter's row at that node: 'sampled' without replacement, or 'topk' (deterministic).

  Returns:
    (Tree as numpy arrays, q f32[R, N, V], p f32[R, N, V]).
  """
  rng = np.random.default_rng(seed)
  layout = _slots(branching)
  num = len(layout)
  prefix = np.zeros((num_rows, num, DEPTH), np.int64)
  tokens = np.zeros((num_rows, num), np.int64)
  valid = np.zeros((num_rows, num), bool)
  valid[:, 0] = True
  p = np.zeros((num_rows, num, pair.vocab))
  q = np.full((num_rows, num, pair.vocab), 1.0 / pair.vocab)
  children = {s: [c for c, parent, _ in layout if parent == s] for s, _, _ in layout}
  for slot, _, depth in layout:
    code = helpers.sequence_codes(prefix[:, slot], depth, pair.vocab)
    p[:, slot] = pair.p_table[code]
    kids = children[slot]
    if not kids:
      continue
    q[:, slot] = pair.q_table[code]
    order, ok = (
      _gumbel_order(rng, q[:, slot], len(kids))
      if how == 'sampled'
      else _topk_order(q[:, slot], len(kids))
    )
    for j, kid in enumerate(kids):
      tokens[:, kid] = np.where(ok[:, j], order[:, j], 0)
      valid[:, kid] = valid[:, slot] & ok[:, j]
      prefix[:, kid] = prefix[:, slot]
      prefix[:, kid, depth] = tokens[:, kid]
  parents = np.array([parent for _, parent, _ in layout])
  depths = np.array([depth for _, _, depth in layout])
  tree = trees.Tree(
    tokens.astype(np.int32),
    np.where(valid, parents, -1).astype(np.int32),
    np.where(valid, depths, 0).astype(np.int32),
    valid,
  )
  return tree, q.astype(np.float32), p.astype(np.float32)


def _emitted(tree, result):
  """Emitted sequences [R, D + 1] (path tokens, then Y; zero padded) and their lengths."""
  path, tau, y = (np.asarray(x) for x in result)
  path_tok = np.where(
    path >= 0, np.take_along_axis(np.asarray(tree.tokens), np.maximum(path, 0), 1), 0
  )
  seqs = np.concatenate([path_tok, np.zeros_like(path_tok[:, :1])], axis=1)
  seqs[np.arange(len(tau)), tau] = y
  return seqs, tau + 1


def _pvalues(pair, tree, result, law=None):
  """(p-value of the emitted sequences under `law` or None, p-value of the whole sequences
  continued by the target under the target's joint)."""
  seqs, lengths = _emitted(tree, result)
  law_p = None
  if law is not None:
    codes = helpers.sequence_codes(seqs, lengths, pair.vocab)
    law_p = helpers.codes_pvalue(codes, law, pair.vocab, DEPTH + 1)
  whole = helpers.continue_with_target(pair, seqs, lengths, np.random.default_rng(7))
  codes = helpers.sequence_codes(whole, DEPTH + 1, pair.vocab)
  return law_p, helpers.codes_pvalue(codes, _joint(pair), pair.vocab, DEPTH + 1)


@contextlib.contextmanager
def _swapped(pieces):
  """verify_tree with `pieces` ({name: function}) in place of its own while a kernel is traced."""
  with contextlib.ExitStack() as stack:
    for name, fn in pieces.items():
      stack.enter_context(mock.patch.object(vtree, name, fn))
    yield


@functools.partial(jax.jit, static_argnames=('control', 'max_children'))
def _rrs_run(rng, tree, q, p, control='', max_children=max(BRANCHING)):
  """`recursive_rejection_verify` traced here, with a control's piece swapped in."""
  pieces = {
    '': {},
    'no_q_renormalize': {'draft_after_rejection': lambda q, token: q},
    'no_p_update': {'residual_after_rejection': lambda p, q: p},
    'only_latest_removed': {'node_trials': _trials_removing_only_the_latest},
  }[control]
  with _swapped(pieces):
    return vtree.recursive_rejection_verify.__wrapped__(
      rng, tree, q, p, max_depth=DEPTH, max_children=max_children
    )


def _trials_removing_only_the_latest(coins, p_node, q_node, children, child_tokens):
  """Bug: `verify_tree.node_trials` where sibling i + 1's law is q_u without sibling i only
  (`draft_after_rejection(q_node, token)`), not q_i without it."""

  def trial(carry, inputs):
    p_i, q_i, chosen = carry
    coin, child, token = inputs
    tried = (chosen < 0) & (child >= 0)
    p_x = jnp.take_along_axis(p_i, token[:, None], axis=1)[:, 0]
    q_x = jnp.take_along_axis(q_i, token[:, None], axis=1)[:, 0]
    accepted = tried & (coin < verify.token_acceptance(p_x, q_x))
    rejected = (tried & ~accepted)[:, None]
    p_i = jnp.where(rejected, vtree.residual_after_rejection(p_i, q_i), p_i)
    q_i = jnp.where(rejected, vtree.draft_after_rejection(q_node, token), q_i)
    return (p_i, q_i, jnp.where(accepted, child, chosen)), None

  chosen = jnp.full(children.shape[:1], -1, jnp.int32)
  (p_last, _, chosen), _ = jax.lax.scan(
    trial, (p_node, q_node, chosen), (coins, children.T, child_tokens.T)
  )
  return chosen, p_last


@jax.jit
def _redraw_on_miss(rng, tree, p):
  """Bug: Y is a fresh draw from p at the last node, not that node's own (missed) draw."""
  walk_rng, y_rng = jax.random.split(rng)
  result = vtree.sample_along_tree(walk_rng, tree, p, max_depth=DEPTH)
  last = jnp.max(jnp.where(result.path >= 0, result.path, 0), axis=1)
  p_last = jnp.take_along_axis(p, last[:, None, None], axis=1)[:, 0]
  return result._replace(next_token=sampling.sample(y_rng, p_last))


@jax.jit
def _cumulative_run(rng, tree, p):
  """Rule 1b in SGLang's cumulative form (tree_oracle.cumulative_law): one coin per node, the
  first child c_i with coin <= S_i = p(c_1) + .. + p(c_i); if none, Y ~ p off the children."""
  coin_rng, y_rng = jax.random.split(rng)
  batch, num = tree.tokens.shape
  coins = jax.random.uniform(coin_rng, (batch, num))
  slots = jnp.arange(num)
  node = jnp.zeros((batch,), jnp.int32)
  stopped = jnp.zeros((batch,), bool)
  path = []
  for _ in range(DEPTH):
    p_node = jnp.take_along_axis(p, node[:, None, None], axis=1)[:, 0]
    is_child = (tree.parents == node[:, None]) & tree.valid
    mass = jnp.where(is_child, jnp.take_along_axis(p_node, tree.tokens, axis=1), 0.0)
    cumulative = jnp.cumsum(mass, axis=1)  # children in slot order
    coin = jnp.take_along_axis(coins, node[:, None], axis=1)
    hit = is_child & (coin <= cumulative)
    child = jnp.min(jnp.where(hit, slots, num), axis=1)
    found = ~stopped & (child < num)
    path.append(jnp.where(found, child, -1))
    stopped = stopped | ~found
    node = jnp.where(found, child, node)
  p_node = jnp.take_along_axis(p, node[:, None, None], axis=1)[:, 0]
  is_child = (tree.parents == node[:, None]) & tree.valid
  off = (
    jnp.ones_like(p_node)
    .at[jnp.arange(batch)[:, None], jnp.where(is_child, tree.tokens, 0)]
    .min(jnp.where(is_child, 0.0, 1.0))
  )
  path = jnp.stack(path, axis=1)
  return vtree.TreeResult(path, jnp.sum(path >= 0, axis=1), sampling.sample(y_rng, p_node * off))


def _with_duplicated_sibling(tree):
  """Slot 2 (the root's second child) and its subtree re-labelled as a copy of slot 1's."""
  tokens = np.array(tree.tokens)
  tokens[:, 2] = tokens[:, 1]
  tokens[:, 5:7] = tokens[:, 3:5]
  valid = np.array(tree.valid)
  valid[:, [2, 5, 6]] = valid[:, [1, 3, 4]]
  return tree._replace(tokens=tokens, valid=valid)


def test_sample_along_tree_matches_oracle():
  """Rule 1b on the drafter's top-k tree (the same for every row: the root context is fixed)."""
  pair = _pair()
  tree, _, p = _draft_trees(pair, BRANCHING, 'topk', 0)
  result = vtree.sample_along_tree(jax.random.key(1), tree, p, max_depth=DEPTH)
  law = to.along_tree_law(pair.target, to.topk_tree(pair.drafter, BRANCHING))
  law_p, whole_p = _pvalues(pair, tree, result, law)
  assert law_p > SIGNIFICANCE and whole_p > SIGNIFICANCE, (law_p, whole_p)


def test_sample_along_best_first_trees_is_lossless():
  """Rule 1b on per-row best-first trees (DDTree's builder on random per-row block laws)."""
  pair = _pair()
  rng = np.random.default_rng(3)
  block = rng.dirichlet(np.ones(pair.vocab), size=(NUM_ROWS, DEPTH)).astype(np.float32)
  tree = trees.best_first_tree(jnp.zeros(NUM_ROWS, jnp.int32), block, num_nodes=6)
  prefix_rows = _node_rows(pair, tree)
  result = vtree.sample_along_tree(jax.random.key(2), tree, prefix_rows, max_depth=DEPTH)
  _, whole_p = _pvalues(pair, tree, result)
  assert whole_p > SIGNIFICANCE
  assert np.mean(np.asarray(result.num_accepted)) > 0.3  # trees that are actually followed


def _node_rows(pair, tree):
  """The target's row at every node of `tree` (numpy lookup by the node's prefix): f32[R, N, V]."""
  tokens, parents, depth = (np.asarray(x) for x in tree[:3])
  num = tokens.shape[1]
  prefix = np.zeros(tokens.shape + (DEPTH,), np.int64)
  rows = np.arange(tokens.shape[0])
  for slot in range(1, num):
    parent = np.maximum(parents[:, slot], 0)
    prefix[:, slot] = prefix[rows, parent]
    d = np.clip(depth[:, slot], 1, DEPTH) - 1
    prefix[rows, slot, d] = tokens[:, slot]
  codes = np.stack(
    [helpers.sequence_codes(prefix[:, s], depth[:, s], pair.vocab) for s in range(num)], 1
  )
  return pair.p_table[codes].astype(np.float32)


@pytest.mark.parametrize(
  'seed, vocab, branching',
  [
    (502, 4, BRANCHING),
    pytest.param(503, 3, BRANCHING, marks=pytest.mark.slow),  # drafter rows of support 1
    (*PAIR3, BRANCHING3),
  ],
  ids=['pairs', 'pairs-v3', 'triples'],
)
def test_recursive_rejection_matches_oracle(seed, vocab, branching):
  """Rule 1a on trees sampled without replacement; on the V = 3 toy some nodes' drafter rows
  have one token, so some children slots are padding. With three children per node (PAIR3) the
  third sibling is tried against q_u without both earlier ones."""
  pair = _pair(seed, vocab)
  rows = ROWS3 if branching == BRANCHING3 else NUM_ROWS
  tree, q, p = _draft_trees(pair, branching, 'sampled', 0, rows)
  result = vtree.recursive_rejection_verify(
    jax.random.key(1), tree, q, p, max_depth=DEPTH, max_children=max(branching)
  )
  if branching == BRANCHING:  # the controls' harness traces the public kernel unchanged
    for a, b in zip(_rrs_run(jax.random.key(1), tree, q, p), result):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  law = to.rrs_law(pair.target, pair.drafter, branching)
  law_p, whole_p = _pvalues(pair, tree, result, law)
  assert law_p > SIGNIFICANCE and whole_p > SIGNIFICANCE, (law_p, whole_p)
  assert np.asarray(tree.valid).all() == (vocab != 3)
  # Third children are accepted (slot 3 at depth 1; slots 6, 9, 12 at depth 2): a real test.
  path = np.asarray(result.path)
  third = [np.mean(path[:, 0] == 3), np.mean(np.isin(path[:, 1], [6, 9, 12]))]
  assert branching != BRANCHING3 or min(third) > 0.01, third


def test_cumulative_form_is_exact_with_distinct_siblings():
  """The positive twin of the duplicate-sibling control: the same code on distinct siblings."""
  pair = _pair()
  tree, _, p = _draft_trees(pair, BRANCHING, 'topk', 0)
  _, whole_p = _pvalues(pair, tree, _cumulative_run(jax.random.key(4), tree, p))
  assert whole_p > SIGNIFICANCE


def _control_run(name):
  pair = _pair()
  key = jax.random.key(5)
  if name == 'rrs/only_latest_removed':  # three children per node
    pair = _pair(*PAIR3)
    tree, q, p = _draft_trees(pair, BRANCHING3, 'sampled', 0, ROWS3)
    return pair, tree, _rrs_run(key, tree, q, p, 'only_latest_removed', max(BRANCHING3))
  if name.startswith('rrs/'):
    how = 'topk' if name == 'rrs/topk_children' else 'sampled'
    tree, q, p = _draft_trees(pair, BRANCHING, how, 0)
    control = '' if name == 'rrs/topk_children' else name.split('/')[1]
    return pair, tree, _rrs_run(key, tree, q, p, control)
  tree, _, p = _draft_trees(pair, BRANCHING, 'topk', 0)
  if name == 'along/redraw_on_miss':
    return pair, tree, _redraw_on_miss(key, tree, p)
  tree = _with_duplicated_sibling(tree)
  return pair, tree, _cumulative_run(key, tree, p)


CONTROLS = (
  'rrs/no_q_renormalize',
  'rrs/no_p_update',
  'rrs/only_latest_removed',
  'rrs/topk_children',
  'along/redraw_on_miss',
  'cumulative/duplicate_siblings',
)


@pytest.mark.parametrize('name', CONTROLS)
def test_negative_controls_fail(name):
  pair, tree, result = _control_run(name)
  _, whole_p = _pvalues(pair, tree, result)
  assert whole_p < SIGNIFICANCE, whole_p


def test_duplicated_sibling_does_not_fool_follow_draws():
  """This module's rule 1b follows the draw: a duplicated sibling only wastes its slot."""
  pair = _pair()
  tree, _, p = _draft_trees(pair, BRANCHING, 'topk', 0)
  result = vtree.sample_along_tree(
    jax.random.key(5), _with_duplicated_sibling(tree), p, max_depth=DEPTH
  )
  _, whole_p = _pvalues(pair, tree, result)
  assert whole_p > SIGNIFICANCE


# ----------------------------------------------------------------------------------------------
# Greedy.


def test_greedy_is_the_targets_argmax_decoding():
  """On random best-first trees: the emitted tokens are the target's argmax chain, and the path
  is the longest tree path along it."""
  pair = helpers.random_toy_pair(520, vocab=4, gamma=DEPTH)
  rows = 2000
  rng = np.random.default_rng(0)
  block = rng.dirichlet(np.ones(pair.vocab) * 0.5, size=(rows, DEPTH)).astype(np.float32)
  tree = trees.best_first_tree(jnp.zeros(rows, jnp.int32), block, num_nodes=5)
  p = _node_rows(pair, tree)
  ids = jnp.asarray(np.argmax(p, axis=-1), jnp.int32)  # lowest id on ties, as _argmax_chain
  result = vtree.greedy_tree_verify(tree, ids, max_depth=DEPTH)
  seqs, lengths = _emitted(tree, result)
  chain = np.array(_argmax_chain(pair.target, DEPTH + 1, pair.vocab))
  for seq, length in zip(seqs, lengths):
    np.testing.assert_array_equal(seq[:length], chain[:length])
  tokens, parents, valid = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.valid))
  for r in range(rows):  # the longest: no child of the last node carries the next argmax
    node = 0 if lengths[r] == 1 else int(np.asarray(result.path)[r, lengths[r] - 2])
    assert not np.any(valid[r] & (parents[r] == node) & (tokens[r] == chain[lengths[r] - 1]))
  assert set(lengths) == {1, 2, 3}
  # Rule 1b on one-hot rows (temperature 0) is the greedy rule.
  one_hot = jax.nn.one_hot(ids, pair.vocab)
  sampled = vtree.sample_along_tree(jax.random.key(0), tree, one_hot, max_depth=DEPTH)
  for a, b in zip(sampled, result):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _argmax_chain(model, length, vocab):
  """The argmax chain with numpy's tie rule (lowest id), as the kernel inputs above use."""
  seq = ()
  for _ in range(length):
    seq = seq + (int(np.argmax([float(x) for x in model[seq]])),)
  return seq


# ----------------------------------------------------------------------------------------------
# Builders and structure.


def _brute_force_top_prefixes(probs, budget):
  """All prefixes of depth 1..D by product of q_i(v_i), best first (ties by prefix order)."""
  depth, vocab = probs.shape
  scored = []
  for d in range(1, depth + 1):
    for prefix in itertools.product(range(vocab), repeat=d):
      score = np.prod([probs[i, v] for i, v in enumerate(prefix)])
      if score > 0:
        scored.append((score, prefix))
  scored.sort(key=lambda x: -x[0])
  return [prefix for _, prefix in scored[:budget]]


def _prefixes(tree, row):
  tokens, parents, valid = (np.asarray(x)[row] for x in (tree.tokens, tree.parents, tree.valid))
  out = {}
  for slot in range(1, len(tokens)):
    if valid[slot]:
      out[slot] = out.get(parents[slot], ()) + (int(tokens[slot]),)
  return list(out.values())


@pytest.mark.parametrize('num_nodes', [2, 5, 9, 16])
def test_best_first_tree_is_the_top_prefixes(num_nodes):
  rng = np.random.default_rng(num_nodes)
  probs = rng.dirichlet(np.ones(4), size=(8, 3))
  probs[0, 0] = [0.5, 0.5, 0.0, 0.0]  # row 0: few positive prefixes at depth 1
  probs[0, 1:] = [0.0, 1.0, 0.0, 0.0]
  tree = trees.best_first_tree(jnp.arange(8), jnp.asarray(probs, jnp.float32), num_nodes)
  trees.check_tree(tree, max_depth=3)
  np.testing.assert_array_equal(np.asarray(tree.tokens[:, 0]), np.arange(8))
  for row in range(8):
    expected = _brute_force_top_prefixes(probs[row], num_nodes - 1)
    assert _prefixes(tree, row) == expected, row
  assert int(np.asarray(tree.valid[0]).sum()) == min(num_nodes, 1 + 2 + 2 + 2)


def test_topk_tree_expands_the_best_frontier():
  """One batched call per depth after the root; the tree is the frontier rule, by brute force."""
  codes = helpers.code_offsets(5, 3)[3]  # prefixes of length 0..2
  table = np.random.default_rng(0).dirichlet(np.ones(5), size=codes).astype(np.float32)
  code_of = lambda prefix: helpers.sequence_codes(np.array([prefix or [0]]), len(prefix), 5)[0]
  calls = []

  def expand(tokens, from_node, prefixes):
    calls.append(tokens.shape)
    prefixes = jnp.take_along_axis(prefixes, from_node[..., None], axis=1)
    prefixes = jnp.concatenate([prefixes, tokens[..., None]], axis=-1)
    depth = prefixes.shape[-1]
    codes = helpers.code_offsets(5, 3)[depth] + jnp.sum(prefixes * 5 ** jnp.arange(depth)[::-1], -1)
    return jnp.asarray(table)[codes], prefixes

  pending = jnp.zeros((1,), jnp.int32)
  root = jnp.asarray(table[:1])
  no_prefix = jnp.zeros((1, 1, 0), jnp.int32)
  tree, _ = trees.topk_tree(pending, root, expand, no_prefix, top_k=2, max_depth=3)
  trees.check_tree(tree, max_depth=3)
  assert calls == [(1, 2), (1, 2)]
  frontier = [((), 1.0)]
  expected = []
  for _ in range(3):
    cands = []
    for prefix, score in frontier:
      q = table[code_of(prefix)].astype(np.float64)
      for t in sorted(range(5), key=lambda t: (-q[t], t))[:2]:
        cands.append((prefix + (t,), score * q[t]))
    frontier = sorted(cands, key=lambda c: -c[1])[:2]
    expected += [prefix for prefix, _ in frontier]
  assert _prefixes(tree, 0) == expected


def test_sampled_tree_draws_without_replacement():
  """`trees.sampled_tree`'s ordered children of a node are distributed as draws one by one from
  q_d with the earlier ones removed (chi-square over the ordered pairs at the root and at a depth-1
  node), every node's own; with rng None they are q_d's top tokens."""
  q = np.array([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]], np.float32)
  rows = 50_000
  probs = jnp.broadcast_to(q, (rows, 2, 4))
  tree = jax.jit(trees.sampled_tree, static_argnums=3)(
    jax.random.key(0), jnp.zeros(rows, jnp.int32), probs, (2, 2)
  )
  trees.check_tree(tree, max_depth=2)
  tokens = np.asarray(tree.tokens)
  for depth, (a, b) in [(0, (1, 2)), (1, (3, 4))]:
    exact = {
      (x, y): q[depth, x] * q[depth, y] / (1 - q[depth, x])
      for x in range(4)
      for y in range(4)
      if x != y
    }
    observed = collections.Counter(zip(tokens[:, a].tolist(), tokens[:, b].tolist()))
    assert chisquare.pvalue(observed, exact) > SIGNIFICANCE, depth
  # The two depth-1 nodes draw their children independently of each other.
  assert np.mean(tokens[:, 3] == tokens[:, 5]) < 0.5
  top = trees.sampled_tree(None, jnp.zeros(1, jnp.int32), jnp.asarray(q)[None], (2, 2))
  np.testing.assert_array_equal(top.tokens[0], [0, 0, 1, 3, 2, 3, 2])
  np.testing.assert_array_equal(
    trees.node_laws(jnp.asarray(q)[None], (2, 2))[0], q[[0, 1, 1, 1, 1, 1, 1]]
  )


def _ordered_law(q, count):
  """{ordered draws: probability} of `count` draws from q without replacement, one by one."""
  law = {}
  for draws in itertools.permutations(range(len(q)), count):
    prob, left = 1.0, 1.0
    for t in draws:
      prob, left = prob * q[t] / left, left - q[t]
    law[draws] = prob
  return law


def test_sampled_tree_draws_ordered_triples():
  """Three children per node: the ordered triples at the root, at the first and at the last
  depth-1 node are distributed as draws one by one from q_d with the earlier ones removed (chi-
  square over 24 ordered triples each; pairs alone cannot tell a third draw with only the second
  removed). Breadth-first slots: node 1's children are slots 4..6, node 3's slots 10..12."""
  q = np.array([[0.4, 0.3, 0.2, 0.1], [0.05, 0.15, 0.35, 0.45]], np.float32)
  rows = 50_000
  probs = jnp.broadcast_to(q, (rows, 2, 4))
  tree = jax.jit(trees.sampled_tree, static_argnums=3)(
    jax.random.key(1), jnp.zeros(rows, jnp.int32), probs, BRANCHING3
  )
  tokens = np.asarray(tree.tokens)
  for depth, slots in [(0, [1, 2, 3]), (1, [4, 5, 6]), (1, [10, 11, 12])]:
    observed = collections.Counter(map(tuple, tokens[:, slots].tolist()))
    assert chisquare.pvalue(observed, _ordered_law(q[depth], 3)) > SIGNIFICANCE, slots
  trees.check_tree(tree, max_depth=2)
  np.testing.assert_array_equal(
    np.asarray(tree.parents[0]), [-1, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
  )
  assert np.mean(np.all(tokens[:, 4:7] == tokens[:, 10:13], axis=1)) < 0.2  # nodes draw apart


def test_structure_helpers():
  tree = trees.Tree(
    jnp.array([[7, 1, 2, 3, 0]]),
    jnp.array([[-1, 0, 0, 1, -1]]),
    jnp.array([[0, 1, 1, 2, 0]]),
    jnp.array([[True, True, True, True, False]]),
  )
  trees.check_tree(tree, max_depth=2)
  np.testing.assert_array_equal(
    trees.children_table(tree, 3)[0], [[1, 2, -1], [3, -1, -1], [-1, -1, -1], [-1] * 3, [-1] * 3]
  )
  expected = np.array(
    [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [0, 0, 0, 0, 0]], bool
  )
  np.testing.assert_array_equal(trees.ancestor_mask(tree, 2)[0], expected)
  chain = trees.chain(jnp.array([5]), jnp.array([[1, 2]]))
  trees.check_tree(chain, max_depth=2)
  np.testing.assert_array_equal(trees.ancestor_mask(chain, 2)[0], np.tril(np.ones((3, 3), bool)))


@pytest.mark.parametrize(
  'change, message',
  [
    (dict(parents=[[0, 0, 0]]), 'node 0 must be the root'),
    (dict(parents=[[-1, 2, 0]]), 'parent slot in 0..u-1'),
    (dict(depth=[[0, 1, 2]]), 'depth must be the parent depth'),
    (dict(tokens=[[0, 4, 4]]), 'distinct'),
    (dict(valid=[[True, False, True]], parents=[[-1, -1, 1]], depth=[[0, 0, 2]]), 'padding parent'),
  ],
)
def test_check_tree_names_the_broken_invariant(change, message):
  base = dict(tokens=[[0, 4, 5]], parents=[[-1, 0, 0]], depth=[[0, 1, 1]], valid=[[True] * 3])
  base.update(change)
  with pytest.raises(ValueError, match=message):
    trees.check_tree(trees.Tree(*(np.array(base[k]) for k in trees.Tree._fields)), max_depth=2)


def test_bad_shapes_are_one_clear_error():
  tree = trees.chain(jnp.array([0]), jnp.array([[1, 2]]))
  with pytest.raises(ValueError, match='target_probs'):
    vtree.sample_along_tree(jax.random.key(0), tree, jnp.ones((1, 4, 3)), max_depth=2)
  with pytest.raises(ValueError, match='target_ids'):
    vtree.greedy_tree_verify(tree, jnp.zeros((1, 2), jnp.int32), max_depth=2)
