"""The token-tree loop (`speculative_generate(..., tree=TreeSpec(...))`, specdec_jax/decode_tree.py):
greedy output equal to `generate` token for token (fake Markov models, a tiny T5 pair, and the
shipped ende48m pair with its block drafter), lossless over whole sequences at T > 0 (chi-square
of the first tokens over 100k rows against the target's exact law) with negative controls that
must fail the same test, and one clear error for each unsupported combination."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, pretrained, verify_tree
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing
from tests import fakes, helpers
from tests.decode_block_test import BLOCK, LENGTH, ROWS, STATE_TARGET, _block_t5, _pvalue
from tests.decode_test import DRAFTER, GREEDY, SIGNIFICANCE, TARGET, _source

SAMPLING = sampling_lib.SamplingConfig(temperature=1.0)
TREE = decode.TreeSpec(num_nodes=6)  # 'block': the best-first tree on BLOCK's laws
TOPK = decode.TreeSpec(num_nodes=5, builder='topk', top_k=2)  # at gamma 2


def _samples(sampling=SAMPLING, gamma=2, seed=3, tree=TREE):
  """ROWS rows of LENGTH tokens: STATE_TARGET with BLOCK ('block'), TARGET with DRAFTER ('topk')."""
  ids = jnp.zeros((ROWS, 1), jnp.int32)
  models = (STATE_TARGET, BLOCK) if tree.builder == 'block' else (TARGET, DRAFTER)
  out = decode.speculative_generate(
    *models, ids, jnp.ones_like(ids), gamma=gamma, sampling=sampling, max_new_tokens=LENGTH,
    rng=jax.random.key(seed), tree=tree,
  )  # fmt: skip
  return np.asarray(out.tokens), jax.tree.map(np.asarray, out.stats.summed())


_clean_samples = functools.cache(_samples)  # for the runs no control patches


@pytest.mark.parametrize(
  'tree, sampling',
  [
    (TREE, SAMPLING),
    pytest.param(
      TREE, sampling_lib.SamplingConfig(temperature=0.7, top_k=3), marks=pytest.mark.slow
    ),
    (TOPK, SAMPLING),
  ],
  ids=str,
)
def test_tree_loop_is_lossless(tree, sampling):
  tokens, stats = _clean_samples(sampling, tree=tree)
  assert _pvalue(tokens, sampling) > SIGNIFICANCE
  assert 0 < stats.accepted < stats.drafted  # drafts were kept and rejected: a real test


def test_a_tree_keeps_more_than_a_chain():
  """At equal depth, the best-first tree of 6 nodes keeps more per call than its 3-node chain."""
  _, tree = _clean_samples(SAMPLING, tree=TREE)
  _, chain = _clean_samples(SAMPLING, tree=decode.TreeSpec(num_nodes=3))
  assert tree.accepted / tree.target_calls > 1.5 * chain.accepted / chain.target_calls


def _redraw_on_miss(rng, tree, target_probs, *, max_depth):
  """Bug: Y drawn afresh from p at the last node instead of that node's own (missed) draw."""
  walk_rng, y_rng = jax.random.split(rng)
  result = _SAMPLE_ALONG(walk_rng, tree, target_probs, max_depth=max_depth)
  last = jnp.max(jnp.where(result.path >= 0, result.path, 0), axis=1)
  p_last = jnp.take_along_axis(target_probs, last[:, None, None], axis=1)[:, 0]
  return result._replace(next_token=sampling_lib.sample(y_rng, p_last))


def _keep_without_moving(self, cache, path, num_accepted):
  """Bug: the accepted nodes' entries left at their tree slots (only end_index advanced)."""
  del path
  return cache.replace(end_index=cache.end_index + 1 + num_accepted)


_SAMPLE_ALONG = verify_tree.sample_along_tree


@pytest.mark.parametrize(
  'target, name, bug',
  [
    (verify_tree, 'sample_along_tree', _redraw_on_miss),
    (fakes.MarkovSteps, 'keep_path', _keep_without_moving),
  ],
  ids=['redraw_on_miss', 'keep_without_moving'],
)
def test_negative_controls_fail(monkeypatch, target, name, bug):
  monkeypatch.setattr(target, name, bug)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _samples()
  monkeypatch.undo()
  jax.clear_caches()
  assert _pvalue(tokens) < SIGNIFICANCE


# ---------------------------------------------------------------------------------------------
# Greedy: the target's greedy output, token for token.


@pytest.mark.parametrize('builder', ['block', 'topk'])
def test_greedy_equals_generate_markov(builder):
  target = fakes.random_markov(seed=10)  # a long greedy output
  if builder == 'block':
    target, drafter = fakes.with_states(target), fakes.random_block_drafter(seed=6)
    tree = TREE
  else:
    drafter, tree = fakes.random_markov(seed=2), decode.TreeSpec(7, 'topk', top_k=2)
  ids, mask = _source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  chain = decode.speculative_generate(target, drafter, ids, mask, gamma=3, **kw)
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, tree=tree, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  # The tree's siblings catch what the chain's argmax path misses.
  assert int(np.sum(out.stats.accepted)) > int(np.sum(chain.stats.accepted))


@pytest.mark.parametrize('builder', ['block', pytest.param('topk', marks=pytest.mark.slow)])
def test_greedy_equals_generate_t5(tiny_pair, builder):
  target, drafter = tiny_pair
  tree = decode.TreeSpec(num_nodes=7, builder='topk', top_k=2)
  if builder == 'block':
    drafter, tree = _block_t5(target), decode.TreeSpec(num_nodes=8)
  ids, mask = _source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=16, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, tree=tree, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)


@pytest.mark.slow  # ~40 CPU-s
@pytest.mark.parametrize('name', [pytest.param('ende48m', marks=helpers.needs_pair('ende48m'))])
def test_shipped_pair_greedy_equals_generate(name):
  pair = pretrained.load(name)
  sources = [s for s, _ in pair.test_pairs()[:4]]
  ids, mask = pair.tokenizer.encode_batch(sources, 64, truncate=True)
  kw = dict(sampling=GREEDY, max_new_tokens=48, rng=None)
  ref = decode.generate(pair.target, ids, mask, **kw)
  for drafter, tree in [
    ('block', decode.TreeSpec(num_nodes=12)),
    ('distilled', decode.TreeSpec(num_nodes=9, builder='topk', top_k=2)),
  ]:
    drafter = pair.drafters[drafter]
    chain = decode.speculative_generate(pair.target, drafter, ids, mask, gamma=4, **kw)
    out = decode.speculative_generate(pair.target, drafter, ids, mask, gamma=4, tree=tree, **kw)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    tree_calls, chain_calls = (int(np.sum(o.stats.target_calls)) for o in (out, chain))
    assert tree_calls <= chain_calls, (tree.builder, tree_calls, chain_calls)


# ---------------------------------------------------------------------------------------------
# Errors before any work.


def test_errors(tiny_pair):
  target, plain_drafter = tiny_pair
  drafter = _block_t5(target)
  ids, mask = _source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=4, rng=None, gamma=3)
  tree = decode.TreeSpec(num_nodes=6)
  run = lambda *models, **extra: decode.speculative_generate(*models, ids, mask, **{**kw, **extra})
  cases = [
    (dict(tree=decode.TreeSpec(num_nodes=3)), r'num_nodes=3 cannot hold .* num_nodes >= gamma \+ 1 = 4'),
    (dict(tree=tree, num_drafts=2), 'needs num_drafts=1, got 2'),
    (dict(tree=tree, verifier='block'), "needs verifier='token'"),
    (dict(tree=tree, verifier='greedy_block'), "needs verifier='token'"),
    (dict(tree=tree, draft_stop=0.3), 'does not support draft_stop=0.3'),
    (dict(tree=tree, trace=True), 'does not support trace=True'),
    (dict(tree=tree, proposal='argmax'), "does not support proposal='argmax'"),
    (dict(tree='block'), 'tree must be a decode.TreeSpec'),
  ]  # fmt: skip
  for extra, message in cases:
    with pytest.raises(ValueError, match=message):
      run(target, drafter, **extra)
  with pytest.raises(ValueError, match="block drafter's per-position laws"):
    run(target, plain_drafter, tree=tree)
  topk = decode.TreeSpec(num_nodes=7, builder='topk', top_k=2)
  with pytest.raises(ValueError, match="builder='topk'.*is a block drafter"):
    run(target, drafter, tree=topk)
  with pytest.raises(
    ValueError, match=r'1 \+ top_k \* gamma = 7 nodes: pass that num_nodes, got 8'
  ):
    run(target, plain_drafter, tree=decode.TreeSpec(num_nodes=8, builder='topk', top_k=2))
  with pytest.raises(ValueError, match='target with step_tree'):
    tree.check_models(object(), BLOCK.steps)
  for bad, message in [
    (dict(num_nodes=1), 'num_nodes must be an int >= 2'),
    (dict(num_nodes=8, builder='sampled'), 'builder must be one of'),
    (dict(num_nodes=8, builder='topk', top_k=0), 'top_k must be an int >= 1'),
  ]:
    with pytest.raises(ValueError, match=message):
      decode.TreeSpec(**bad)


def test_one_program_per_shape():
  """Other weights and another key, same shapes: the tree loop is not compiled again."""
  ids, mask = _source(vocab=4)
  kw = dict(gamma=2, sampling=SAMPLING, max_new_tokens=6, tree=TREE)
  decode.speculative_generate(STATE_TARGET, BLOCK, ids, mask, rng=jax.random.key(0), **kw)
  with timing.compiles() as compiled:
    for seed in (1, 2):
      other = fakes.random_block_drafter(seed=seed + 10)
      decode.speculative_generate(STATE_TARGET, other, ids, mask, rng=jax.random.key(seed), **kw)
  assert compiled == []
