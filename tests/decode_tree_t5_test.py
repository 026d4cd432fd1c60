"""The token-tree loop on T5 models (specdec_jax/decode_tree.py, models/t5_tree.py): greedy output
equal to `generate` token for token on a tiny random T5 pair and on the shipped ende48m pair with
its block and distilled drafters; at T > 0 the whole sequences of a sampled tree with padding
slots through the real T5 tree pass (`t5_tree.layout`, `trees.ancestor_mask`, `keep_path`) match
the target's exact law (chi-square); and one clear error for each unsupported combination. The
loop's distribution tests on fake models are tests/decode_tree_test.py."""

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import cache as cache_lib
from specdec_jax import decode, drafting, pretrained, step_models
from specdec_jax import sampling as sampling_lib
from specdec_jax.models import t5_tree
from tests import chisquare, helpers
from tests.chisquare import SIGNIFICANCE
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
# T > 0: the real tree pass, chi-square of whole sequences against the target's exact law.

# A tiny T5 pair of 8 tokens (target seed 1, block drafter seed 8) and a source on which the
# target's next tokens depend on the earlier ones: the controls below move its law (a source
# whose law barely reads the earlier tokens hides them).
T5_VOCAB, T5_SOURCE = 8, ((2, 6, 4, 3),)
T5_ROWS, T5_LENGTH = 4000, 3  # the first 3 tokens: one to three iterations a row at gamma 2
T5_SAMPLING = sampling_lib.SamplingConfig(temperature=0.8, top_k=3)
# Four children at the root drawn from a top-3 law: slot 4 and its children (slots 11, 12) are
# padding in every row, between live nodes; the depth-1 nodes draw 2 of their 3 tokens.
T5_TREE = decode.TreeSpec(num_nodes=13, builder='sampled', branching=(4, 2))


@functools.cache
def _t5_pair():
  target = helpers.tiny_t5('tiny-v1.1', seed=1, vocab_size=T5_VOCAB)
  return target, tiny_block_t5(target, seed=8, vocab_size=T5_VOCAB)


@functools.cache
def _t5_exact_law():
  """{first T5_LENGTH tokens: probability} of the target's own sampling under T5_SAMPLING on
  T5_SOURCE (EOS, then PAD), from one teacher-forced pass over every prefix shorter than
  T5_LENGTH (right-padded: the decoder is causal, the padding is unread)."""
  target, _ = _t5_pair()
  cfg = target.config
  prefixes = [p for n in range(T5_LENGTH) for p in itertools.product(range(T5_VOCAB), repeat=n)]
  inputs = [[cfg.decoder_start_token_id, *p, *[0] * (T5_LENGTH - 1 - len(p))] for p in prefixes]
  ids = jnp.tile(jnp.asarray(T5_SOURCE, jnp.int32), (len(prefixes), 1))
  logits = helpers.forward(
    target.params, ids, jnp.ones_like(ids), jnp.asarray(inputs, jnp.int32), config=cfg
  )
  logits = np.asarray(logits)[np.arange(len(prefixes)), [len(p) for p in prefixes]]
  probs = np.asarray(sampling_lib.logits_to_probs(logits, T5_SAMPLING), np.float64)
  after = dict(zip(prefixes, probs / probs.sum(-1, keepdims=True)))
  law = {(): 1.0}
  for _ in range(T5_LENGTH):
    grown = {}
    for prefix, prob in law.items():
      if cfg.eos_token_id in prefix:
        grown[prefix + (step_models.PAD_ID,)] = prob
        continue
      for y in np.flatnonzero(after[prefix]):
        grown[prefix + (int(y),)] = prob * after[prefix][y]
    law = grown
  return law


def _t5_tree_pvalue(seed=0):
  """(chi-square p-value of T5_ROWS rows' first T5_LENGTH tokens against the target's exact law,
  tokens per target call)."""
  target, drafter = _t5_pair()
  ids = jnp.tile(jnp.asarray(T5_SOURCE, jnp.int32), (T5_ROWS, 1))
  out = decode.speculative_generate(
    target, drafter, ids, jnp.ones_like(ids), gamma=2, sampling=T5_SAMPLING,
    max_new_tokens=T5_LENGTH, rng=jax.random.key(seed), tree=T5_TREE,
  )  # fmt: skip
  exact = _t5_exact_law()
  observed = collections.Counter(map(tuple, np.asarray(out.tokens).tolist()))
  stats = jax.tree.map(np.asarray, out.stats.summed())
  return chisquare.pvalue(observed, exact), float(stats.accepted / stats.target_calls)


def test_sampled_tree_on_t5_is_lossless():
  """Rule 1a on the real T5 tree pass, with padding slots (T5_TREE) at T = 0.8 with top-k."""
  assert T5_SAMPLING.top_k < T5_TREE.branching[0]  # padding children in every tree
  pvalue, accepted_per_call = _t5_tree_pvalue()
  assert pvalue > SIGNIFICANCE, pvalue
  assert accepted_per_call > 0.5  # paths are kept (measured: 0.8 drafts a call): a real test


def _keep_without_moving(cache, path, num_accepted):
  """Bug: the accepted nodes' keys and values left at their tree slots (end_index advanced)."""
  del path
  return cache_lib.rewind(cache, cache.end_index + 1 + num_accepted)


def _positions_from_slots(tree, end_index, num_slots, max_depth):
  """Bug: a node's position taken from its slot, not its depth."""
  slot = jnp.broadcast_to(jnp.arange(tree.tokens.shape[1]), tree.tokens.shape)
  depth = jnp.where(tree.valid, slot, 0)
  return _LAYOUT(tree._replace(depth=depth), end_index, num_slots, max_depth)


_LAYOUT = t5_tree.layout


@pytest.mark.slow  # ~10-20 CPU-s each; the default suite's tree-loop control: decode_tree_test
@pytest.mark.parametrize(
  'name, bug',
  [('keep_path', _keep_without_moving), ('layout', _positions_from_slots)],
  ids=['keep_without_moving', 'positions_from_slots'],
)
def test_t5_negative_controls_fail(monkeypatch, name, bug):
  monkeypatch.setattr(t5_tree, name, bug)
  jax.clear_caches()  # the loop must be traced again with the bug
  pvalue, _ = _t5_tree_pvalue()
  monkeypatch.undo()
  jax.clear_caches()
  assert pvalue < SIGNIFICANCE


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
