"""The drafting registry: every way the loop can draft, one `Drafting` entry each.

The loop asks `of(spec, drafter_caps)` for its entry, once, at trace time: a tree spec names a
tree builder ('block' -> 'best_first_tree', 'topk' -> 'topk_tree', 'sampled' -> 'sampled_tree');
otherwise the drafter's own `Capabilities.drafting` names it ('token', 'block', ...). An entry
declares what it needs of the two models (`needs`, checked once before any work: one clear
error), its extra drafter-cache slots, the state it carries between iterations, the draft's shape
('chain' or 'tree') and, for a tree, the rule that verifies it exactly ('along': sample along the
tree, for any tree fixed before the target's coins; 'rrs': recursive rejection, for children drawn
from the node laws without replacement). A new way of drafting is one `register` call:

  drafting.register(drafting.Drafting(name='mine', shape='chain', draft=my_draft, needs=...))

`draft(drafter, view, key, spec) -> (Draft, drafter cache, carried state)`: `drafter` a
`step_models.Model`-like (steps, params) pair (steps None for an entry that calls no model),
`view` a `draft.DraftView`, `spec` the loop's `LoopSpec`.

Axes: B batch, R model rows, N nodes, G gamma, V vocab.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp

from specdec_jax import cache as cache_lib
from specdec_jax import decode_steps, draft_lookup, trees
from specdec_jax import sampling as sampling_lib
from specdec_jax.draft import Draft, DraftView
from specdec_jax.step_models import Capabilities


class Model(NamedTuple):
  """A step model's two halves as the loop holds them (steps None: no model)."""

  steps: Any
  params: Any


class DraftFn(Protocol):
  def __call__(self, drafter: Model, view: DraftView, key: jax.Array, spec) -> tuple: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Drafting:
  """A way of drafting (module docstring).

  Attributes:
    name: its registry name.
    shape: 'chain' (G drafts in a row; K paths when num_drafts > 1) or 'tree'.
    draft: the `DraftFn`.
    needs: (drafter caps, target caps) -> why these models cannot draft this way, or None.
    extra_slots: (gamma) -> drafter-cache slots beyond the loop's buffer (a block call writes
      its gamma - 1 query slots past the kept positions).
    init_state: (batch) -> the carried state before the first iteration, or None: none.
    tree_rule: a tree's exact rule, 'along' or 'rrs'; None for a chain.
    options: the chain options it honours of ('draft_stop', 'proposal', 'unroll_draft',
      'num_drafts'); a tree honours none of them (`loop_spec.TreeSpec.check` says why).
  """

  name: str
  shape: str
  draft: DraftFn
  needs: Callable[[Capabilities, Capabilities], str | None]
  extra_slots: Callable[[int], int] = lambda gamma: 0
  init_state: Callable[[int], jax.Array] | None = None
  tree_rule: str | None = None
  options: frozenset[str] = frozenset()


REGISTRY: dict[str, Drafting] = {}
# TreeSpec.builder -> its drafting entry.
TREE_BUILDERS = {
  'block': 'best_first_tree',
  'topk': 'topk_tree',
  'sampled': 'sampled_tree',
  'lookup': 'lookup_tree',
  'hybrid': 'hybrid_tree',
}


def register(entry: Drafting) -> Drafting:
  """Adds `entry` (or replaces the one of its name) and returns it."""
  REGISTRY[entry.name] = entry
  return entry


def get(name: str) -> Drafting:
  if name not in REGISTRY:
    raise ValueError(f'Unknown way of drafting {name!r}; registered: {sorted(REGISTRY)}.')
  return REGISTRY[name]


def name_of(spec, drafter_caps: Capabilities) -> str:
  """The entry a loop of `spec` drafts with: the tree builder's, else the drafter's own."""
  if spec.tree is not None:
    return TREE_BUILDERS.get(spec.tree.builder, spec.tree.builder)
  return drafter_caps.drafting


def of(spec, drafter_caps: Capabilities, target_caps: Capabilities) -> Drafting:
  """The loop's entry, its needs checked: one ValueError naming what the models lack."""
  entry = get(name_of(spec, drafter_caps))
  why = entry.needs(drafter_caps, target_caps)
  if why:
    raise ValueError(why)
  if entry.shape == 'chain':
    for option, value, default in [
      ('draft_stop', spec.draft_stop, None),
      ('proposal', spec.proposal, 'sample'),
      ('unroll_draft', spec.unroll_draft, False),
      ('num_drafts', spec.num_drafts, 1),
    ]:
      if value != default and option not in entry.options:
        raise ValueError(
          f'Drafting {entry.name!r} does not support {option}={value!r} (leave it at {default!r}).'
        )
  return entry


# ---------------------------------------------------------------------------------------------
# Chains: token by token, and a block drafter's one call.


def _chain_options(spec) -> dict:
  return dict(
    gamma=spec.gamma,
    sampling=spec.sampling,
    greedy=spec.greedy,
    stop=spec.draft_stop,
    unroll_draft=spec.unroll_draft,
    proposal=spec.proposal,
  )


def _chain(draft_fn):
  """A chain entry's draft function over `decode_steps`' `draft_fn` (looked up when traced):
  (drafts, q, cache, lengths) as the chain [pending, drafts]."""

  def run(drafter: Model, view: DraftView, key, spec):
    drafts, q, cache, lengths = draft_fn()(
      drafter.steps, drafter.params, view.cache, view.seq, view.n, key,
      target_states=view.target_states, **_chain_options(spec),
    )  # fmt: skip
    pending = decode_steps.row_slice(view.seq, view.n, 1)[:, 0]
    return Draft.chain(pending, drafts, q, lengths), cache, view.state

  return run


def _stateless(draft_fn):
  def run(drafter, view, key, spec):
    draft, cache = draft_fn(drafter, view, key, spec)
    return draft, cache, view.state

  return run


def _needs_step(drafter: Capabilities, target: Capabilities) -> str | None:
  if drafter.block_size:
    return 'a block drafter drafts by its one call (drafting entry "block")'
  return None


def _needs_block(drafter: Capabilities, target: Capabilities) -> str | None:
  if not drafter.block_size:
    return (
      "This way of drafting builds on a block drafter's per-position laws: the drafter needs "
      'block_size and step_block (a T5 with T5Config.block_size).'
    )
  return None


_CHAIN_OPTIONS = frozenset({'draft_stop', 'proposal', 'unroll_draft', 'num_drafts'})
register(
  Drafting(
    name='token', shape='chain', draft=_chain(lambda: decode_steps.draft), needs=_needs_step,
    options=_CHAIN_OPTIONS,
  )
)  # fmt: skip
register(
  Drafting(
    name='block', shape='chain', draft=_chain(lambda: decode_steps.draft_block),
    needs=_needs_block,
    extra_slots=lambda gamma: gamma - 1, options=_CHAIN_OPTIONS,
  )
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Trees (docs/method.md section 13).


def _scores(logits, spec) -> jax.Array:
  """The drafter's law a tree is built on: its softmax at temperature 0 (a one-hot law would
  give a chain), its law under the loop's sampling transform otherwise."""
  if spec.greedy:
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  return sampling_lib.logits_to_probs(logits, spec.sampling)


def _block_laws(drafter: Model, view: DraftView, spec):
  """A block drafter's one call: (the scores of its gamma positions f32[B, G, V], the pending
  tokens i32[B], its cache)."""
  logits, cache = decode_steps.block_logits(
    drafter.steps, drafter.params, view.cache, view.seq, view.n, view.target_states,
    gamma=spec.gamma,
  )  # fmt: skip
  with jax.named_scope('tree'):
    pending = decode_steps.row_slice(view.seq, view.n, 1)[:, 0]
    return _scores(logits, spec), pending, cache


def _draft_best_first(drafter: Model, view: DraftView, key, spec):
  """'best_first_tree': the N - 1 most probable prefixes of the block call's laws."""
  del key  # deterministic
  q, pending, cache = _block_laws(drafter, view, spec)
  with jax.named_scope('tree'):
    return Draft.of_tree(trees.best_first_tree(pending, q, spec.tree.num_nodes)), cache


def _draft_sampled(drafter: Model, view: DraftView, key, spec):
  """'sampled_tree': branching[d] children per node of depth d drawn without replacement from
  the block call's law q_{d+1} (its top tokens at temperature 0)."""
  q, pending, cache = _block_laws(drafter, view, spec)
  with jax.named_scope('tree'):
    branching = spec.tree.branching
    tree = trees.sampled_tree(None if spec.greedy else key, pending, q, branching)
    return Draft.of_tree(tree, trees.node_laws(q, branching)), cache


def _draft_topk(drafter: Model, view: DraftView, key, spec):
  """'topk_tree': a catch-up call on the kept tokens (seq[last_root + 1 ..], its law after
  seq[n]), then one batched call per depth on top_k copies of each row's cache. Carries the
  last root (the n of the iteration before, -1 before the first)."""
  del key  # deterministic
  steps, params = drafter
  gamma, top_k = spec.gamma, spec.tree.top_k
  start = view.state + 1  # the drafter holds positions < start; seq[start..n] are new
  tokens = decode_steps.row_slice(view.seq, start, gamma + 1)
  logits, _, cache = decode_steps.drafter_call(
    steps, params, tokens, None, view.cache.replace(end_index=start),
    logits_at=jnp.clip(view.n - start, min=0, max=gamma),
  )  # fmt: skip
  cache = cache.replace(end_index=view.n + 1)
  batch = tokens.shape[0]

  def expand(tokens, from_node, frontier_cache):
    """The law after each of the K new frontier nodes: each continues its parent's cache row."""
    k_in = frontier_cache.end_index.shape[0] // batch
    rows = (jnp.arange(batch)[:, None] * k_in + from_node).reshape(-1)
    frontier_cache = cache_lib.take_rows(frontier_cache, rows, same_source=k_in == top_k)
    with jax.named_scope('drafter'):
      logits, frontier_cache = steps.step(params, tokens.reshape(-1, 1), frontier_cache)
    return _scores(logits[:, 0], spec).reshape(batch, top_k, -1), frontier_cache

  with jax.named_scope('tree'):
    tree, _ = trees.topk_tree(
      decode_steps.row_slice(view.seq, view.n, 1)[:, 0], _scores(logits[:, 0], spec), expand,
      cache, top_k=top_k, max_depth=gamma,
    )  # fmt: skip
  return Draft.of_tree(tree), cache, view.n


def _needs_topk(drafter: Capabilities, target: Capabilities) -> str | None:
  if drafter.block_size or drafter.reads_target_states:
    return (
      "tree=TreeSpec(builder='topk') expands the tree with an autoregressive drafter's step; "
      "this drafter is a block drafter or reads the target's states: use builder='block' for "
      'a block drafter.'
    )
  return _needs_tree_pass(target)


def _needs_block_tree(name):
  def needs(drafter: Capabilities, target: Capabilities) -> str | None:
    if not drafter.block_size:
      return (
        f"tree=TreeSpec(builder='{name}') builds its tree from a block drafter's "
        'per-position laws: the drafter needs block_size and step_block (a T5 with '
        'T5Config.block_size).'
      )
    return _needs_tree_pass(target)

  return needs


def _needs_tree_pass(target: Capabilities) -> str | None:
  if not (target.step_tree and target.keep_path):
    return 'tree= needs a target with step_tree and keep_path (one pass over a token tree).'
  return None


register(
  Drafting(
    name='best_first_tree', shape='tree', draft=_stateless(_draft_best_first),
    needs=_needs_block_tree('block'), extra_slots=lambda gamma: gamma - 1, tree_rule='along',
  )
)  # fmt: skip
register(
  Drafting(
    name='sampled_tree', shape='tree', draft=_stateless(_draft_sampled),
    needs=_needs_block_tree('sampled'), extra_slots=lambda gamma: gamma - 1, tree_rule='rrs',
  )
)  # fmt: skip
register(
  Drafting(
    name='topk_tree', shape='tree', draft=_draft_topk, needs=_needs_topk,
    init_state=lambda batch: jnp.full((batch,), -1, jnp.int32), tree_rule='along',
  )
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Source lookup (`draft_lookup`): a chain, a tree of its M latest matches, and a hybrid tree.


def _draft_hybrid(drafter: Model, view: DraftView, key, spec):
  """'hybrid_tree': the block drafter's best-first tree of N - M * gamma nodes on its one call's
  laws, and the M lookup branches grafted under the same root: one target pass scores both. Fixed
  before the target's coins (rule 1b, docs/method.md section 13)."""
  del key
  q, pending, cache = _block_laws(drafter, view, spec)
  model_nodes = spec.tree.num_nodes - spec.tree.branches * spec.gamma
  with jax.named_scope('tree'):
    tree = trees.best_first_tree(pending, q, model_nodes)
  return Draft.of_tree(draft_lookup.graft_matches(tree, view, spec)), cache


def _needs_lookup_tree(drafter: Capabilities, target: Capabilities) -> str | None:
  if drafter.drafting != 'lookup':
    return (
      "tree=TreeSpec(builder='lookup') grafts source matches under the root: pass the drafter "
      "draft_lookup.source_lookup(target) (for a block drafter's tree beside them: builder='hybrid')."
    )
  return _needs_tree_pass(target)


register(
  Drafting(name='lookup', shape='chain', draft=draft_lookup.draft_chain, needs=lambda d, t: None)
)
register(
  Drafting(
    name='lookup_tree', shape='tree', draft=draft_lookup.draft_tree, needs=_needs_lookup_tree,
    tree_rule='along',
  )
)  # fmt: skip
register(
  Drafting(
    name='hybrid_tree', shape='tree', draft=_stateless(_draft_hybrid),
    needs=_needs_block_tree('hybrid'), extra_slots=lambda gamma: gamma - 1, tree_rule='along',
  )
)  # fmt: skip
