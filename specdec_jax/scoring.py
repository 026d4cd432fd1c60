"""How each draft shape is scored and kept: one target pass, then the accepted path committed.

  score(target, draft, cache, done, spec, with_states) -> Scored
  commit(outcome, draft, scored, drafter_cache, target, spec)
      -> (the kept path's drafts i32[B, G], target cache, drafter cache, states or None)

'chain' and 'paths' are scored by the chain pass (`decode_steps.target_pass`: the pending token
and the drafts at consecutive positions, causal; narrowed where drafts were cut short), so a chain
never pays for a tree's mask, key positions or path move. K paths are K chains, one per model row:
commit moves every row onto the kept path (`decode_steps.follow`). A 'tree' is scored by the
target's `step_tree` (ancestor mask, positions n + depth) and committed by `keep_path` (the
accepted nodes' keys and values moved after the root). The states a drafter reads come back at
the root and the kept path, G + 1 positions from the old n, whatever the shape.

Axes: B batch, R model rows, N nodes, G gamma, V vocab, F state width.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, trees
from specdec_jax.draft import Draft, Outcome


class Scored(NamedTuple):
  """A target pass's result: logits f32[R, N, V], states f32[R, N, F] or None, the cache."""

  logits: jax.Array
  states: jax.Array | None
  cache: Any


@dataclasses.dataclass(frozen=True)
class Shape:
  name: str
  score: Callable[..., Scored]
  commit: Callable[..., tuple]


def _score_chain(target, draft: Draft, cache, done, spec, with_states) -> Scored:
  del spec
  return Scored(
    *decode_steps.target_pass(
      target.steps, target.params, draft.tokens, cache, draft.lengths, done,
      with_states=with_states,
    )
  )  # fmt: skip


def _commit_chain(outcome: Outcome, draft: Draft, scored: Scored, drafter_cache, target, spec):
  del outcome, target, spec
  return draft.drafts, scored.cache, drafter_cache, scored.states


def _commit_paths(outcome: Outcome, draft: Draft, scored: Scored, drafter_cache, target, spec):
  del target
  return decode_steps.follow(
    outcome.path, draft.drafts, scored.cache, drafter_cache, scored.states, spec.num_drafts
  )


def _score_tree(target, draft: Draft, cache, done, spec, with_states) -> Scored:
  del done
  with jax.named_scope('target'):
    logits, *states, cache = target.steps.step_tree(
      target.params, draft.tree, cache, spec.gamma, return_states=with_states
    )
  return Scored(logits, states[0] if states else None, cache)


def _commit_tree(outcome: Outcome, draft: Draft, scored: Scored, drafter_cache, target, spec):
  del spec
  cache = target.steps.keep_path(scored.cache, outcome.path, outcome.tau)
  states = None
  if scored.states is not None:  # the drafter reads the target's states at the root and the path
    path = outcome.path
    kept = jnp.concatenate([jnp.zeros_like(path[:, :1]), jnp.maximum(path, 0)], 1)
    states = jnp.take_along_axis(scored.states.astype(jnp.float32), kept[..., None], 1)
  return trees.path_tokens(draft.tree, outcome.path), cache, drafter_cache, states


SHAPES = {
  'chain': Shape('chain', _score_chain, _commit_chain),
  'paths': Shape('paths', _score_chain, _commit_paths),
  'tree': Shape('tree', _score_tree, _commit_tree),
}
