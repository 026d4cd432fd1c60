"""The token-tree loop (`speculative_generate(..., tree=TreeSpec(...))`, specdec_jax/decode_tree.py)
on fake Markov models: lossless over whole sequences at T > 0 for each builder (chi-square of the
first tokens over 100k rows against the target's exact law) with negative controls that must
fail the same test, greedy output equal to `generate` token for token, one program per shape.
The sampled tree (rule 1a) also at T != 1 with top-k and with top-p, where the law its children
are drawn from is not the drafter's softmax (a control hands rule 1a the softmax), and with three
children per node, where a sibling's law must have every earlier sibling removed.
The T5 models and the errors: tests/decode_tree_t5_test.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import decode, trees, verify_tree
from specdec_jax import sampling as sampling_lib
from specdec_jax.measure import timing
from tests import fakes
from tests.chisquare import SIGNIFICANCE
from tests.fakes import (
  BLOCK,
  DRAFTER,
  SEQUENCE_LENGTH,
  SEQUENCE_ROWS,
  STATE_TARGET,
  TARGET,
  sequence_pvalue,
)
from tests.helpers import GREEDY, ragged_source

SAMPLING = sampling_lib.SamplingConfig(temperature=1.0)
TREE = decode.TreeSpec(num_nodes=6)  # 'block': the best-first tree on BLOCK's laws
TOPK = decode.TreeSpec(num_nodes=5, builder='topk', top_k=2)  # at gamma 2
SAMPLED = decode.TreeSpec(num_nodes=7, builder='sampled', branching=(2, 2))  # drawn from BLOCK
SAMPLED3 = decode.TreeSpec(num_nodes=13, builder='sampled', branching=(3, 3))
TOP_K = sampling_lib.SamplingConfig(temperature=0.7, top_k=3)
# Nodes whose top-p law keeps fewer than 3 tokens get padding children.
TOP_P = sampling_lib.SamplingConfig(temperature=0.7, top_p=0.9)
# Fewer rows for the T != 1 cases: the bugs they are for are off by TV >= 0.05 (chi-square p
# below 1e-100 at these sizes).
CASE_ROWS = {(SAMPLED, TOP_K): 30_000, (SAMPLED3, TOP_P): 20_000}


def _samples(sampling=SAMPLING, gamma=2, seed=3, tree=TREE, rows=SEQUENCE_ROWS):
  """`rows` rows of SEQUENCE_LENGTH tokens: STATE_TARGET with BLOCK ('block', 'sampled'), TARGET
  with DRAFTER ('topk')."""
  ids = jnp.zeros((rows, 1), jnp.int32)
  models = (TARGET, DRAFTER) if tree.builder == 'topk' else (STATE_TARGET, BLOCK)
  out = decode.speculative_generate(
    *models, ids, jnp.ones_like(ids), gamma=gamma, sampling=sampling,
    max_new_tokens=SEQUENCE_LENGTH, rng=jax.random.key(seed), tree=tree,
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
    (SAMPLED, SAMPLING),
    (SAMPLED, TOP_K),
    (SAMPLED3, TOP_P),
  ],
  ids=str,
)
def test_tree_loop_is_lossless(tree, sampling):
  rows = CASE_ROWS.get((tree, sampling), SEQUENCE_ROWS)
  tokens, stats = _clean_samples(sampling, tree=tree, rows=rows)
  assert sequence_pvalue(tokens, sampling) > SIGNIFICANCE
  assert 0 < stats.accepted < stats.drafted  # drafts were kept and rejected: a real test


def test_a_sampled_tree_keeps_more_than_a_chain():
  """At equal depth and T = 1, the tree of 7 nodes drawn from BLOCK's laws keeps more per call
  than its 3-node chain (measured: 1.01 against 0.53 drafts a call)."""
  _, tree = _clean_samples(SAMPLING, tree=SAMPLED)
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


def _laws_of_other_depths(probs, branching):
  """Bug: rule 1a given each node's law from the wrong depth (the block's positions reversed)."""
  return _NODE_LAWS(probs[:, ::-1], branching)


_SAMPLE_ALONG, _NODE_LAWS = verify_tree.sample_along_tree, trees.node_laws
_LOGITS_TO_PROBS = sampling_lib.logits_to_probs


@pytest.mark.parametrize(
  'tree, target, name, bug',
  [
    pytest.param(TREE, verify_tree, 'sample_along_tree', _redraw_on_miss, marks=pytest.mark.slow),
    pytest.param(
      TREE, fakes.MarkovSteps, 'keep_path', _keep_without_moving, marks=pytest.mark.slow
    ),
    pytest.param(  # the default suite's: verify_tree_test.py (rrs/no_q_renormalize)
      SAMPLED, verify_tree, 'draft_after_rejection', lambda q, token: q, marks=pytest.mark.slow
    ),
    pytest.param(SAMPLED, trees, 'node_laws', _laws_of_other_depths, marks=pytest.mark.slow),
  ],
  ids=['redraw_on_miss', 'keep_without_moving', 'no_q_renormalize', 'laws_of_other_depths'],
)
def test_negative_controls_fail(monkeypatch, tree, target, name, bug):
  monkeypatch.setattr(target, name, bug)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _samples(tree=tree)
  monkeypatch.undo()
  jax.clear_caches()
  assert sequence_pvalue(tokens) < SIGNIFICANCE


def test_negative_control_softmax_node_laws_fails(monkeypatch):
  """Bug: rule 1a handed the drafter's softmax (its logits before the loop's sampling transform)
  as each node's law while the tree is drawn from the transformed law. At T = 1 without top-k or
  top-p the two are one law, so only a run at T != 1 with a top-k (or top-p) can see it. The
  default suite's tree-loop control: a bug of the loop's own, which no kernel test can see."""
  softmax_of = {}  # id(transformed probs) -> (those probs, the softmax of their logits)

  def logits_to_probs(logits, config):
    probs = _LOGITS_TO_PROBS(logits, config)
    softmax_of[id(probs)] = probs, jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    return probs

  def softmax_node_laws(probs, branching):
    transformed, softmax = softmax_of.get(id(probs), (None, None))
    assert transformed is probs, 'the loop handed node_laws a law other than logits_to_probs gave'
    return _NODE_LAWS(softmax, branching)

  monkeypatch.setattr(sampling_lib, 'logits_to_probs', logits_to_probs)
  monkeypatch.setattr(trees, 'node_laws', softmax_node_laws)
  jax.clear_caches()  # the loop must be traced again with the bug
  tokens, _ = _samples(TOP_K, tree=SAMPLED, rows=CASE_ROWS[SAMPLED, TOP_K])
  monkeypatch.undo()
  jax.clear_caches()
  assert sequence_pvalue(tokens, TOP_K) < SIGNIFICANCE


# ---------------------------------------------------------------------------------------------
# Greedy: the target's greedy output, token for token.


@pytest.mark.parametrize('builder', ['block', 'topk', 'sampled'])
def test_greedy_equals_generate_markov(builder):
  target = fakes.random_markov(seed=10)  # a long greedy output
  if builder != 'topk':
    target, drafter = fakes.with_states(target), fakes.random_block_drafter(seed=6)
    tree = TREE if builder == 'block' else decode.TreeSpec(15, 'sampled', branching=(2, 2, 2))
  else:
    drafter, tree = fakes.random_markov(seed=2), decode.TreeSpec(7, 'topk', top_k=2)
  ids, mask = ragged_source(vocab=4)
  kw = dict(sampling=GREEDY, max_new_tokens=12, rng=None)
  ref = decode.generate(target, ids, mask, **kw)
  chain = decode.speculative_generate(target, drafter, ids, mask, gamma=3, **kw)
  out = decode.speculative_generate(target, drafter, ids, mask, gamma=3, tree=tree, **kw)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
  np.testing.assert_array_equal(out.lengths, ref.lengths)
  # The tree's siblings catch what the chain's argmax path misses.
  assert int(np.sum(out.stats.accepted)) > int(np.sum(chain.stats.accepted))


# ---------------------------------------------------------------------------------------------
# Errors before any work.


def test_one_program_per_shape():
  """Other weights and another key, same shapes: the tree loop is not compiled again."""
  ids, mask = ragged_source(vocab=4)
  kw = dict(gamma=2, sampling=SAMPLING, max_new_tokens=6, tree=TREE)
  decode.speculative_generate(STATE_TARGET, BLOCK, ids, mask, rng=jax.random.key(0), **kw)
  with timing.compiles() as compiled:
    for seed in (1, 2):
      other = fakes.random_block_drafter(seed=seed + 10)
      decode.speculative_generate(STATE_TARGET, other, ids, mask, rng=jax.random.key(seed), **kw)
  assert compiled == []
