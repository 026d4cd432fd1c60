"""The token-tree loop on T5 models (specdec_jax/decode_tree.py, models/t5_tree.py): greedy output
equal to `generate` token for token on a tiny random T5 pair and on the shipped ende48m pair with
its block and distilled drafters, and one clear error for each unsupported combination. The
loop's distribution tests (fake models) are tests/decode_tree_test.py."""

import jax
import numpy as np
import pytest

from specdec_jax import decode, drafting, pretrained, step_models
from tests import helpers
from tests.fakes import BLOCK
from tests.helpers import GREEDY, ragged_source, tiny_block_t5


# (block-short: a chain-sized tree of 5 nodes at gamma 4 and 1 new token, where the block call, 2
# gamma wide, is wider than the loop's buffer; the drafter's cache has `Drafting.extra_slots`.)
@pytest.mark.parametrize(
  'builder', ['block', 'block-short', pytest.param('topk', marks=pytest.mark.slow)]
)
def test_greedy_equals_generate_t5(tiny_pair, builder):
  target, drafter = tiny_pair
  tree, gamma, max_new_tokens = decode.TreeSpec(num_nodes=7, builder='topk', top_k=2), 3, 16
  if builder == 'block':
    drafter, tree = tiny_block_t5(target), decode.TreeSpec(num_nodes=8)
  if builder == 'block-short':
    drafter, tree, gamma, max_new_tokens = tiny_block_t5(target), decode.TreeSpec(num_nodes=5), 4, 1
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=max_new_tokens, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=gamma, tree=tree, **kw)
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
  drafter = tiny_block_t5(target)
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=4, rng=None, gamma=3)
  tree = decode.TreeSpec(num_nodes=6)
  run = lambda *models, **extra: decode.speculative_generate(*models, ids, mask, **{**kw, **extra})
  cases = [
    (dict(tree=decode.TreeSpec(num_nodes=3)), r'num_nodes=3 cannot hold .* num_nodes >= gamma \+ 1 = 4'),
    (dict(tree=tree, num_drafts=2), 'needs num_drafts=1, got 2'),
    (dict(tree=tree, verifier='block'), "needs verifier='token'"),
    (dict(tree=tree, verifier='greedy_block'), "needs verifier='token'"),
    (dict(tree=tree, draft_stop=0.3), 'does not support draft_stop=0.3'),
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
    spec = decode.LoopSpec(sampling=GREEDY, max_new_tokens=4, gamma=3, tree=tree)
    drafting.of(spec, step_models.capabilities(BLOCK.steps), step_models.Capabilities())
  with pytest.raises(ValueError, match=r'pass gamma=2 and num_nodes=7, got gamma=3, num_nodes=7'):
    run(target, drafter, tree=decode.TreeSpec(7, 'sampled', branching=(2, 2)))
  for bad, message in [
    (dict(num_nodes=1), 'num_nodes must be an int >= 2'),
    (dict(num_nodes=7, branching=(2, 2)), "branching is for builder='sampled'"),
    (dict(num_nodes=7, builder='sampled'), "branching is for builder='sampled'"),
    (dict(num_nodes=7, builder='sampled', branching=(2, 0)), 'branching must hold ints >= 1'),
    (dict(num_nodes=8, builder='heap'), 'builder must be one of'),
    (dict(num_nodes=8, builder='topk', top_k=0), 'top_k must be an int >= 1'),
  ]:
    with pytest.raises(ValueError, match=message):
      decode.TreeSpec(**bad)


def test_a_tree_loop_records_its_kept_paths_in_the_trace(tiny_pair):
  """trace=True with a tree: each iteration's kept path (tau drafts, then Y) is what it emitted,
  and the emitted pieces, in order, are the output; the same tokens as without the trace."""
  target, _ = tiny_pair
  drafter = tiny_block_t5(target)
  ids, mask = ragged_source(vocab=target.config.vocab_size)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=None, gamma=3, tree=decode.TreeSpec(8))
  out = decode.speculative_generate(target, drafter, ids, mask, trace=True, **kw)
  plain = decode.speculative_generate(target, drafter, ids, mask, **kw)
  np.testing.assert_array_equal(out.tokens, plain.tokens)
  trace = jax.tree.map(np.asarray, out.trace)
  for row in range(ids.shape[0]):
    pieces = []
    for it in range(trace.emitted.shape[1]):
      tau, emitted = trace.num_accepted[row, it], trace.emitted[row, it]
      kept = [*trace.drafts[row, it, :tau], trace.next_token[row, it]]
      pieces += kept[:emitted]
    length = int(out.lengths[row])
    assert pieces[:length] == np.asarray(out.tokens)[row, :length].tolist()
  assert trace.num_accepted.max() > 0  # some iteration kept a draft
