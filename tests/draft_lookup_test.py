"""Tests for specdec_jax.draft_lookup (the source-lookup drafter's kernels) and trees.graft.

`match` and `proposals` are compared, under jit, with plain-Python twins (loops over rows, source
positions and n-gram sizes) on hand-made rows (backoff 3 -> 2 -> 1, ragged and gapped sources,
n < k, the start token, no match, a match at the end of the source, more matches than branches)
and on random rows. `graft` is compared with a plain-Python twin of its documented slot rule on
random trees (best-first, scattered with padding anywhere, chains, bare roots) and random branches
sharing prefixes with the tree and with each other, too many to fit; the results must pass
`trees.check_tree` and hold exactly the tree's paths plus prefixes of the branches.
"""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, draft_lookup, drafting, trees
from specdec_jax import sampling as sampling_lib
from tests import chisquare, fakes, helpers

NGRAM, MIN_NGRAM, BRANCHES, GAMMA = 3, 1, 3, 4
LENGTH, SIZE = 10, 14  # decoder buffer L, source length S

_match = jax.jit(draft_lookup.match, static_argnames=('ngram', 'min_ngram', 'branches', 'gamma'))
_proposals = jax.jit(draft_lookup.proposals, static_argnames='gamma')


def _match_twin(seq, n, source, mask, *, ngram, min_ngram, branches, gamma):
  """Per row: the longest k with a match whose next source token is real, its latest matches."""
  starts = np.zeros((len(seq), branches), np.int32)
  available = np.zeros((len(seq), branches), np.int32)
  ks = np.zeros(len(seq), np.int32)  # the k used, 0: none
  for b in range(len(seq)):
    emitted = [int(x) for x in seq[b, 1 : n[b] + 1]]
    real = [bool(x) for x in mask[b]]
    size = len(real)
    for k in range(ngram, min_ngram - 1, -1):
      if len(emitted) < k:
        continue
      hits = [
        j
        for j in range(k, size)
        if all(real[j - k : j + 1]) and [int(x) for x in source[b, j - k : j]] == emitted[-k:]
      ]
      if hits:
        ks[b] = k
        for m, j in enumerate(sorted(hits, reverse=True)[:branches]):
          run = 0
          while j + run < size and real[j + run]:
            run += 1
          starts[b, m], available[b, m] = j, min(gamma, run)
        break
  return starts, available, ks


def _proposals_twin(source, starts, available, gamma):
  out = np.zeros(starts.shape + (gamma,), np.int32)
  for b, m in np.ndindex(starts.shape):
    j, a = starts[b, m], available[b, m]
    out[b, m, :a] = source[b, j : j + a]
  return out


def _hand_rows(rows, length=LENGTH, size=SIZE):
  """(emitted, source, mask or None) rows -> padded (seq, n, source, mask); pads are 0."""
  seq = np.zeros((len(rows), length), np.int32)
  source = np.zeros((len(rows), size), np.int32)
  mask = np.zeros((len(rows), size), np.int32)
  n = np.zeros(len(rows), np.int32)
  for b, (emitted, src, real) in enumerate(rows):
    seq[b, 1 : len(emitted) + 1] = emitted
    n[b] = len(emitted)
    source[b, : len(src)] = src
    mask[b, : len(src)] = 1 if real is None else real
  return seq, n, source, mask


# (emitted, source, mask or None: a prefix mask), expected start, expected available.
HAND_CASES = {
  'trigram, two matches latest first, gamma caps': (
    ([4, 5, 6, 7], [5, 6, 7, 8, 9, 5, 6, 7, 2, 1], None),
    [8, 3, 0],
    [2, 4, 0],
  ),
  'backoff to the bigram': (([2, 6, 7], [3, 7, 4, 6, 7, 5, 7, 8], None), [5, 0, 0], [3, 0, 0]),
  'backoff to the unigram': (([2, 9, 7], [3, 7, 4, 6, 7, 5, 7, 8], None), [7, 5, 2], [1, 3, 4]),
  'matches at the end are none and do not stop the backoff': (
    ([5, 6, 7], [7, 1, 5, 6, 7], None),
    [1, 0, 0],
    [4, 0, 0],
  ),
  'only at the end: no match': (([5, 6, 7], [5, 6, 7], None), [0, 0, 0], [0, 0, 0]),
  'padding is never matched even with the same id': (
    ([3, 0], [0, 8, 9], None),
    [1, 0, 0],
    [2, 0, 0],
  ),
  'n < k; the start token is not emitted': (([5], [0, 5, 6, 5, 8], None), [4, 2, 0], [1, 3, 0]),
  'n = 0: no match': (([], [0, 1, 2], None), [0, 0, 0], [0, 0, 0]),
  'more matches than branches': (
    ([7], [7, 1, 7, 2, 7, 3, 7, 4], None),
    [7, 5, 3],
    [1, 3, 4],
  ),
  'a gap in the mask splits runs': (
    ([7, 6], [6, 7, 6, 6, 7, 9], [1, 1, 0, 1, 1, 1]),
    [4, 1, 0],
    [2, 1, 0],
  ),
  'empty source': (([1, 2, 3], [], None), [0, 0, 0], [0, 0, 0]),
}


def test_match_hand_made_cases():
  names = list(HAND_CASES)
  seq, n, source, mask = _hand_rows([HAND_CASES[k][0] for k in names])
  config = dict(ngram=NGRAM, min_ngram=MIN_NGRAM, branches=BRANCHES, gamma=GAMMA)
  start, available = map(np.asarray, _match(seq, n, source, mask, **config))
  twin_start, twin_available, _ = _match_twin(seq, n, source, mask, **config)
  for b, name in enumerate(names):
    _, want_start, want_available = HAND_CASES[name]
    assert start[b].tolist() == want_start, name
    assert available[b].tolist() == want_available, name
    assert twin_start[b].tolist() == want_start, name  # the twin agrees with the hand too
    assert twin_available[b].tolist() == want_available, name


def test_match_min_ngram_stops_the_backoff():
  seq, n, source, mask = _hand_rows([([9, 7], [7, 5], None), ([6, 7], [6, 7, 5], None)])
  start, available = _match(
    seq, n, source, mask.astype(bool), ngram=3, min_ngram=2, branches=2, gamma=GAMMA
  )
  assert np.asarray(start).tolist() == [[0, 0], [2, 0]]
  assert np.asarray(available).tolist() == [[0, 0], [1, 0]]


def test_match_and_proposals_random_rows():
  rng = np.random.default_rng(60)
  batch, vocab = 600, 3
  seq = rng.integers(0, vocab, (batch, LENGTH)).astype(np.int32)
  seq[:, 0] = 0  # the start token
  n = rng.integers(0, LENGTH, batch).astype(np.int32)
  source = rng.integers(0, vocab, (batch, SIZE)).astype(np.int32)
  real_len = rng.integers(0, SIZE + 1, batch)
  prefix = np.arange(SIZE) < real_len[:, None]
  gapped = rng.random((batch, SIZE)) < 0.8
  mask = np.where((np.arange(batch) % 2 == 0)[:, None], prefix, gapped)
  config = dict(ngram=NGRAM, min_ngram=MIN_NGRAM, branches=BRANCHES, gamma=GAMMA)
  start, available = _match(seq, n, source, mask, **config)
  tokens = np.asarray(_proposals(source, start, available, gamma=GAMMA))
  start, available = np.asarray(start), np.asarray(available)
  twin_start, twin_available, ks = _match_twin(seq, n, source, mask, **config)
  np.testing.assert_array_equal(start, twin_start)
  np.testing.assert_array_equal(available, twin_available)
  np.testing.assert_array_equal(tokens, _proposals_twin(source, twin_start, twin_available, GAMMA))
  # The random rows cover every backoff level, ragged and full sources, gamma-capped spans.
  assert set(ks.tolist()) == {0, 1, 2, 3}
  assert (available[:, 0] == GAMMA).any() and (
    (available[:, 0] > 0) & (available[:, 0] < GAMMA)
  ).any()
  assert (available[:, BRANCHES - 1] > 0).any()
  assert start.dtype == available.dtype == tokens.dtype == np.int32


def test_match_checks_its_static_arguments():
  args = _hand_rows([([1], [1, 2], None)])
  with pytest.raises(ValueError, match='min_ngram'):
    draft_lookup.match(*args, ngram=2, min_ngram=3, branches=1, gamma=1)
  with pytest.raises(ValueError, match='branches'):
    draft_lookup.match(*args, ngram=2, min_ngram=1, branches=0, gamma=1)


# ----------------------------------------------------------------------------------------------
# graft.

NUM_NODES, MAX_DEPTH = 13, 5  # N slots; the grafted tree's depth bound
NUM_BRANCHES, BRANCH_LENGTH = 4, 7  # M, D > MAX_DEPTH: the deepest tokens are dropped

_graft = jax.jit(trees.graft, static_argnames='max_depth')


def _graft_twin(tree, branches, lengths, max_depth):
  """graft's documented rule, row by row: follow a child with the token, else the lowest padding
  slot after the current node, else drop the rest of the branch."""
  tokens, parents, depth, valid = (np.array(x) for x in tree)
  num_nodes = tokens.shape[1]
  for b in range(tokens.shape[0]):
    for m in range(branches.shape[1]):
      node = 0
      for i in range(min(int(lengths[b, m]), branches.shape[2], max_depth)):
        token = branches[b, m, i]
        kids = [u for u in range(num_nodes) if valid[b, u] and parents[b, u] == node]
        kids = [u for u in kids if tokens[b, u] == token]
        if kids:
          node = kids[0]
          continue
        free = [u for u in range(node + 1, num_nodes) if not valid[b, u]]
        if not free:
          break
        u = free[0]
        tokens[b, u], parents[b, u], depth[b, u], valid[b, u] = token, node, i + 1, True
        node = u
  return trees.Tree(tokens, parents, depth, valid)


def _paths(tree, b):
  """Row b's root paths as token tuples (the root excluded), one per valid node."""
  tokens, parents, _, valid = (np.asarray(x)[b] for x in tree)
  out = {0: ()}
  for u in range(1, len(tokens)):  # parents come first
    if valid[u]:
      out[u] = out[parents[u]] + (int(tokens[u]),)
  return out


def _chain(pending, drafts, num_nodes):
  """trees.chain in numpy, padding slots appended up to num_nodes: pending [B], drafts [B, G]."""
  batch, gamma = np.shape(drafts)
  tokens = np.zeros((batch, num_nodes), np.int32)
  tokens[:, 0], tokens[:, 1 : gamma + 1] = pending, drafts
  slot = np.arange(num_nodes)
  on = np.broadcast_to(slot <= gamma, (batch, num_nodes))
  return trees.Tree(tokens, np.where(on, slot - 1, -1), np.where(on, slot, 0), on.copy())


def _sparse_probs(rng, shape, zero):
  """Random laws over the last axis with about a `zero` share of exact zeros (never all)."""
  probs = rng.random(shape) * (rng.random(shape) >= zero)
  probs[..., 0] += probs.sum(-1) == 0
  return (probs / probs.sum(-1, keepdims=True)).astype(np.float32)


def _scattered_trees(rng, rows, vocab):
  """Random trees with padding slots anywhere: each slot is padding with probability 0.3, else
  a child of a random earlier node (depth < MAX_DEPTH) with a token its siblings lack."""
  tokens, parents = np.zeros((rows, NUM_NODES), np.int32), np.full((rows, NUM_NODES), -1)
  depth, valid = np.zeros((rows, NUM_NODES), np.int32), np.zeros((rows, NUM_NODES), bool)
  tokens[:, 0], valid[:, 0] = rng.integers(0, vocab, rows), True
  for b, u in np.ndindex(rows, NUM_NODES - 1):
    u += 1
    hosts = [v for v in range(u) if valid[b, v] and depth[b, v] < MAX_DEPTH]
    if rng.random() < 0.3:
      continue
    parent = hosts[rng.integers(len(hosts))]
    taken = {tokens[b, v] for v in range(u) if valid[b, v] and parents[b, v] == parent}
    free = [x for x in range(vocab) if x not in taken]
    if free:
      tokens[b, u], parents[b, u] = free[rng.integers(len(free))], parent
      depth[b, u], valid[b, u] = depth[b, parent] + 1, True
  return trees.Tree(tokens, parents, depth, valid)


def _random_trees(rng, rows):
  """`rows` trees of each kind, all N slots: best-first (padding at the end), scattered (padding
  anywhere), chains of MAX_DEPTH tokens and bare roots (padding at the end)."""
  vocab = 3
  pending = lambda: rng.integers(0, vocab, rows).astype(np.int32)
  best = jax.jit(trees.best_first_tree, static_argnums=2)(
    jnp.asarray(pending()), jnp.asarray(_sparse_probs(rng, (rows, 4, vocab), 0.4)), NUM_NODES
  )
  scattered = _scattered_trees(rng, rows, vocab)
  chain = _chain(pending(), rng.integers(0, vocab, (rows, MAX_DEPTH)), NUM_NODES)
  root = _chain(pending(), np.zeros((rows, 0), np.int32), NUM_NODES)
  kinds = [best, scattered, chain, root]
  return trees.Tree(*(np.concatenate([np.asarray(t[f]) for t in kinds]) for f in range(4)))


def _random_branches(rng, tree):
  """Per row M branches: an existing root path extended at random, a copy of an earlier branch
  changed from a random position on, or random tokens; random lengths 0..D."""
  batch, vocab = tree.tokens.shape[0], 3
  branches = rng.integers(0, vocab, (batch, NUM_BRANCHES, BRANCH_LENGTH)).astype(np.int32)
  for b in range(batch):
    paths = list(_paths(tree, b).values())
    for m in range(NUM_BRANCHES):
      kind = rng.integers(3)
      if kind == 0:
        path = paths[rng.integers(len(paths))]
        branches[b, m, : len(path)] = path
      elif kind == 1 and m > 0:
        cut = rng.integers(BRANCH_LENGTH + 1)
        branches[b, m, :cut] = branches[b, rng.integers(m), :cut]
  lengths = rng.integers(0, BRANCH_LENGTH + 1, (batch, NUM_BRANCHES)).astype(np.int32)
  return branches, lengths


def test_graft_random_trees_and_branches():
  rng = np.random.default_rng(61)
  tree = _random_trees(rng, rows=60)
  branches, lengths = _random_branches(rng, tree)
  grafted = trees.Tree(*map(np.asarray, _graft(tree, branches, lengths, max_depth=MAX_DEPTH)))
  trees.check_tree(grafted, MAX_DEPTH)
  twin = _graft_twin(tree, branches, lengths, MAX_DEPTH)
  for got, want in zip(grafted, twin, strict=True):
    np.testing.assert_array_equal(got, want)
  assert grafted.tokens.dtype == grafted.parents.dtype == grafted.depth.dtype == np.int32
  clipped = np.minimum(lengths, MAX_DEPTH)
  rows = tree.tokens.shape[0] // 4  # best-first, scattered, chain, root: _random_trees' order
  outcomes = set()
  for b in range(tree.tokens.shape[0]):
    old, new = _paths(tree, b), _paths(grafted, b)
    for u, path in old.items():  # the tree's nodes keep their slots
      assert new[u] == path
    wanted = {
      tuple(branches[b, m, :i]) for m in range(NUM_BRANCHES) for i in range(clipped[b, m] + 1)
    }
    assert set(new.values()) <= set(old.values()) | wanted  # nothing invented
    assert len(set(new.values())) == len(new)  # one node per path: siblings distinct
    kept = [
      tuple(branches[b, m, : clipped[b, m]]) in set(new.values()) for m in range(NUM_BRANCHES)
    ]
    # A branch is kept whole unless the slots ran out; with the padding at the end (all kinds but
    # the scattered trees) that means every slot is taken, and only when they were too few.
    if not all(kept) and not rows <= b < 2 * rows:
      assert grafted.valid[b].all()
    if not rows <= b < 2 * rows:
      assert all(kept) == (len(wanted - set(old.values())) <= (~tree.valid[b]).sum())
    outcomes.add((b // rows, all(kept)))
  assert outcomes == {(kind, whole) for kind in range(4) for whole in (True, False)}


def _tree(tokens, parents, depth, valid):
  """One row's tree from lists: [N] fields."""
  ints = (np.asarray(x, np.int32) for x in (tokens, parents, depth))
  return trees.Tree(*ints, np.asarray(valid, bool))


def test_graft_hand_made_cases():
  n = NUM_NODES
  bare = lambda token: _tree([token] + [0] * (n - 1), [-1] * n, [0] * n, [1] + [0] * (n - 1))
  chain = trees.Tree(*(x[0] for x in _chain([9], [[1, 2]], n)))
  # Padding at slot 1, then 7 -> 8 in slots 2, 3 and root children in every slot after.
  full = _tree(
    [0, 0, 7, 8] + list(range(10, 19)), [-1, -1, 0, 2] + [0] * 9, [0, 0, 1, 2] + [1] * 9,
    [1, 0] + [1] * 11,
  )  # fmt: skip
  tree = trees.Tree(*map(np.stack, zip(bare(5), chain, full, bare(4), strict=True)))
  branches = np.array(
    [
      [[1, 2, 3, 0], [1, 2, 4, 0], [1, 2, 3, 0]],  # 4 beside 3; the third adds nothing
      [[1, 2, 3, 4], [1, 5, 0, 0], [0, 0, 0, 0]],  # along the chain, then a new suffix
      [[7, 8, 9, 0], [3, 0, 0, 0], [7, 6, 0, 0]],  # 9 and 6: no padding slot after the parent
      [[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]],  # three equal branches: one path
    ]
  )
  lengths = np.array([[3, 3, 2], [4, 2, 0], [3, 1, 2], [4, 4, 4]])
  got = trees.Tree(*map(np.asarray, _graft(tree, branches, lengths, max_depth=4)))
  trees.check_tree(got, 4)
  pad = lambda xs, value: list(xs) + [value] * (n - len(xs))
  assert got.tokens.tolist() == [
    pad([5, 1, 2, 3, 4], 0),
    pad([9, 1, 2, 3, 4, 5], 0),
    [0, 3, 7, 8] + list(range(10, 19)),
    pad([4, 1, 1, 1, 1], 0),
  ]
  assert got.parents.tolist() == [
    pad([-1, 0, 1, 2, 2], -1),
    pad([-1, 0, 1, 2, 3, 1], -1),
    [-1, 0, 0, 2] + [0] * 9,
    pad([-1, 0, 1, 2, 3], -1),
  ]
  assert got.depth.tolist() == [
    pad([0, 1, 2, 3, 3], 0),
    pad([0, 1, 2, 3, 4, 2], 0),
    [0, 1, 1, 2] + [1] * 9,
    pad([0, 1, 2, 3, 4], 0),
  ]
  assert got.valid.sum(axis=1).tolist() == [5, 6, 13, 5]


def test_lookup_tree_from_matches():
  """match -> proposals -> graft under a bare root: the lookup drafter's tree, equal
  continuations merged."""
  seq, n, source, mask = _hand_rows(
    [
      ([4, 7], [7, 1, 2, 9, 7, 1, 2, 7, 1, 3], None),
      ([8], [8, 5], None),
      ([3], [3, 6, 6, 3, 6, 6, 3, 6, 6], None),  # three matches, two continuations
      ([2, 2], [1, 1], None),  # no match: a bare root
    ]
  )
  start, available = _match(
    seq, n, source, mask, ngram=NGRAM, min_ngram=MIN_NGRAM, branches=BRANCHES, gamma=GAMMA
  )
  tokens = _proposals(source, start, available, gamma=GAMMA)
  assert np.asarray(tokens).tolist() == [
    [[1, 3, 0, 0], [1, 2, 7, 1], [1, 2, 9, 7]],
    [[5, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
    [[6, 6, 0, 0], [6, 6, 3, 6], [6, 6, 3, 6]],
    [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]],
  ]
  pending = seq[np.arange(4), n]
  root = _chain(pending, np.zeros((4, 0), np.int32), NUM_NODES)
  assert NUM_NODES == 1 + BRANCHES * GAMMA  # every branch fits
  tree = _graft(root, tokens, available, max_depth=GAMMA)
  trees.check_tree(tree, GAMMA)
  paths = [sorted(_paths(tree, b).values()) for b in range(4)]
  assert paths[0] == sorted(
    [(), (1,), (1, 3), (1, 2), (1, 2, 7), (1, 2, 7, 1), (1, 2, 9), (1, 2, 9, 7)]
  )
  assert paths[1] == [(), (5,)]
  assert paths[2] == [(), (6,), (6, 6), (6, 6, 3), (6, 6, 3, 6)]
  assert paths[3] == [()]


# ---------------------------------------------------------------------------------------------
# The drafter in the loop: a chain, a tree of its matches, a hybrid tree (`drafting` entries
# 'lookup', 'lookup_tree', 'hybrid_tree').

_ROWS, _LENGTH = 20_000, 4  # whole-sequence chi-square over the first 4 tokens
_SIGNIFICANCE = 1e-3
_TARGET = fakes.random_markov(seed=1)
_STATE_TARGET = fakes.with_states(_TARGET)
_BLOCK = fakes.random_block_drafter(seed=5)
_T1 = sampling_lib.SamplingConfig(temperature=1.0)
_TOPP = sampling_lib.SamplingConfig(temperature=0.7, top_p=0.9)


def _lookup_sources(rows, vocab=4, length=9, seed=0):
  """Sources of random ids over the fake's vocabulary, ragged (every row has >= 3 real tokens),
  so that emitted suffixes often match."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, vocab, size=(rows, length)).astype(np.int32)
  mask = np.arange(length)[None] < rng.integers(3, length + 1, size=rows)[:, None]
  return jnp.asarray(np.where(mask, ids, 0)), jnp.asarray(mask)


def _decode(how, sampling, *, rows=_ROWS, length=_LENGTH, seed=3, **kw):
  ids, mask = _lookup_sources(rows)
  target = _STATE_TARGET if how == 'hybrid' else _TARGET
  drafter = _BLOCK if how == 'hybrid' else draft_lookup.source_lookup(_TARGET, ngram=2)
  if how != 'chain':
    kw['tree'] = decode.TreeSpec(
      num_nodes=9 if how == 'hybrid' else 5, builder=how, branches=2, ngram=2
    )
  return decode.speculative_generate(
    target, drafter, ids, mask, gamma=2, sampling=sampling, max_new_tokens=length,
    rng=jax.random.key(seed), **kw,
  )  # fmt: skip


def _pvalue(tokens, sampling):
  exact = fakes.exact_prefix_distribution(_TARGET, _LENGTH, sampling)
  observed = collections.Counter(map(tuple, np.asarray(tokens).tolist()))
  return chisquare.pvalue(observed, exact)


@pytest.mark.parametrize(
  'how, sampling',
  [
    ('chain', _T1),
    pytest.param('chain', _TOPP, marks=pytest.mark.slow),  # the tree below covers top-p
    ('lookup', _TOPP),
    ('hybrid', _T1),
  ],
  ids=str,
)
def test_lookup_decoding_is_lossless(how, sampling):
  """Whole sequences of 4 tokens over 20k rows against the target's exact law (chi-square,
  significance 1e-3); drafts were kept and rejected."""
  out = _decode(how, sampling)
  assert _pvalue(out.tokens, sampling) > _SIGNIFICANCE
  stats = out.stats.summed()
  assert 0 < int(stats.accepted) < int(stats.drafted)


def test_negative_control_a_soft_lookup_law_fails(monkeypatch):
  """Bug: the chain verified against a smoothed law (half one-hot, half uniform) instead of the
  one-hot law its drafts came from: the same chi-square rejects it."""
  real = draft_lookup.draft_chain

  def soft(drafter, view, key, spec):
    draft, cache, state = real(drafter, view, key, spec)
    return draft.replace(q=0.5 * draft.q + 0.5 / draft.q.shape[-1]), cache, state

  entry = drafting.REGISTRY['lookup']
  monkeypatch.setitem(drafting.REGISTRY, 'lookup', dataclasses.replace(entry, draft=soft))
  jax.clear_caches()
  out = _decode('chain', _T1)
  monkeypatch.undo()
  jax.clear_caches()
  assert _pvalue(out.tokens, _T1) < _SIGNIFICANCE


@pytest.mark.parametrize('how', ['chain', 'lookup', 'hybrid'])
def test_greedy_lookup_decoding_is_generate(how):
  """Temperature 0: the target's greedy output token for token, with drafts kept (the sources
  hold the greedy output, so the lookup matches)."""
  target = fakes.random_markov(seed=10)  # its greedy output runs past 12 tokens
  target = fakes.with_states(target) if how == 'hybrid' else target
  ids = jnp.zeros((6, 1), jnp.int32)
  greedy = sampling_lib.SamplingConfig(temperature=0.0)
  ref = decode.generate(
    target, ids, jnp.ones_like(ids), sampling=greedy, max_new_tokens=12, rng=None
  )
  out_tokens = np.asarray(ref.tokens)
  source = jnp.asarray(np.concatenate([np.full((6, 2), 3), out_tokens], 1), jnp.int32)
  mask = jnp.arange(source.shape[1])[None] < jnp.arange(8, 14)[:, None]  # ragged
  drafter = _BLOCK if how == 'hybrid' else draft_lookup.source_lookup(target)
  kw = {}
  if how != 'chain':
    kw['tree'] = decode.TreeSpec(num_nodes=10, builder=how, branches=2)
  ref = decode.generate(target, source, mask, sampling=greedy, max_new_tokens=12, rng=None)
  out = decode.speculative_generate(
    target, drafter, source, mask, gamma=3, sampling=greedy, max_new_tokens=12, rng=None, **kw
  )
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  assert int(out.stats.summed().accepted) > 0


def test_lookup_errors():
  ids, mask = _lookup_sources(2)
  lookup = draft_lookup.source_lookup(_TARGET)
  kw = dict(gamma=2, sampling=_T1, max_new_tokens=4, rng=jax.random.key(0))
  run = lambda drafter, **extra: decode.speculative_generate(
    _TARGET, drafter, ids, mask, **kw, **extra
  )
  with pytest.raises(ValueError, match="'lookup' does not support num_drafts=2"):
    run(lookup, num_drafts=2)
  with pytest.raises(ValueError, match='does not support draft_stop'):
    run(lookup, draft_stop=0.5)
  with pytest.raises(ValueError, match="verifier='greedy_block' .* a source lookup"):
    run(lookup, verifier='greedy_block')
  with pytest.raises(ValueError, match='pass the drafter draft_lookup.source_lookup'):
    run(fakes.random_markov(seed=2), tree=decode.TreeSpec(5, 'lookup', branches=2))
  with pytest.raises(ValueError, match="branches is for builder='lookup' or 'hybrid'"):
    decode.TreeSpec(5, 'lookup')
  with pytest.raises(ValueError, match='needs num_nodes >= 6'):
    tree = decode.TreeSpec(5, 'hybrid', branches=2)
    decode.speculative_generate(_STATE_TARGET, _BLOCK, ids, mask, tree=tree, **kw)


def test_the_main_job_item_adds_lookup_rows_and_costs_no_drafter_call():
  """`config.lookup`: the 'lookup' drafter's chain rows join the plan (no tree rows: its trees
  are benchmarks.lookup_loop's); greedy block verification is refused before any row runs; its
  costs are the target's alone (c = c_fixed = c_alone = 0)."""
  from experiments.configs import ende
  from specdec_jax.measure import evaluation, timing

  if not helpers.shipped('ende'):
    pytest.skip('pretrained/ende not shipped')
  config = ende.get_config('runlocal')
  config.drafters, config.lookup, config.tree_nodes = ('trigram',), True, (5,)
  plan = evaluation.prepare(config)
  assert ('lookup', 4) in plan.groups
  assert all(name != 'lookup' for name, *_ in plan.tree_groups)
  config.verifiers = ('greedy_block',)
  with pytest.raises(ValueError, match="Drafter 'lookup'.*a source lookup"):
    evaluation.prepare(config)
  target = helpers.tiny_t5('tiny-v1.1')
  costs = timing.step_costs(
    target, draft_lookup.source_lookup(target), batch_size=1, source_length=8, gamma=2,
    cache_len=16, rounds=1, repeats=1, loop_lengths=(2, 4),
  )  # fmt: skip
  assert costs['c'] == costs['c_fixed'] == costs['c_alone'] == 0.0
  assert costs['pass_cost'] > 0


@pytest.mark.slow  # ~2 CPU-min a pair: 100 test sentences, plain, then three lookup shapes
@pytest.mark.parametrize('name', ['ende48m', 'debsumm48m'])
def test_lookup_drafting_is_greedy_decoding_on_the_shipped_test_sets(name):
  """The source-lookup chain, its 4-branch tree and the hybrid tree (the block drafter's 9-node
  best-first tree and 2 lookup branches) decode each shipped 48M pair's first 100 test sentences
  as the target's greedy decoding, token for token (batch 20)."""
  from specdec_jax import pretrained

  if not helpers.shipped(name):
    pytest.skip(f'pretrained/{name} not shipped')
  pair = pretrained.load(name)
  lookup = draft_lookup.source_lookup(pair.target)
  kw = dict(sampling=sampling_lib.SamplingConfig(temperature=0.0), max_new_tokens=64, rng=None)
  rows = [
    (lookup, dict(gamma=3)),
    (lookup, dict(gamma=3, tree=decode.TreeSpec(13, 'lookup', branches=4))),
    (pair.drafters['block'], dict(gamma=3, tree=decode.TreeSpec(15, 'hybrid', branches=2))),
  ]
  sources = [s for s, _ in pair.test_pairs()[:100]]
  for start in range(0, len(sources), 20):
    ids, mask = pair.tokenizer.encode_batch(sources[start : start + 20], 128, truncate=True)
    ref = np.asarray(decode.generate(pair.target, ids, mask, **kw).tokens)
    for drafter, extra in rows:
      out = decode.speculative_generate(pair.target, drafter, ids, mask, **kw, **extra)
      np.testing.assert_array_equal(np.asarray(out.tokens), ref, err_msg=str(extra))
