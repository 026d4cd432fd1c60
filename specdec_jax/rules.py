"""The verification rules the loop runs, keyed by (rule, draft shape): one table, read once.

`rule_of(spec, drafting)` names the rule, statically: 'greedy' at temperature 0 (greedy decoding
is a set of entries here, not a branch of the loop: p and q are one-hot, so every verifier keeps
the longest prefix equal to the target's argmax and no probability vector is formed); a tree's
entry's own exact rule ('along' or 'rrs', `drafting.Drafting.tree_rule`); else the spec's
verifier name ('token', 'block', 'greedy_block', or any `verifiers.register`ed one), whose
kernels `verifiers.Verifier` holds for one path and for K paths. Each entry is

  verify(key, draft: Draft, logits f32[R, N, V], spec, state) -> (Outcome, state)

with `state` the verifier's carried state (`verifiers.Verifier.init_state`), None for most.
A new rule for a shape is one `register(rule, shape, fn)`.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, verifiers, verify_tree
from specdec_jax import sampling as sampling_lib
from specdec_jax.draft import Draft, Outcome

RULES: dict[tuple[str, str], Callable] = {}


def register(rule: str, shape: str, fn: Callable) -> Callable:
  RULES[(rule, shape)] = fn
  return fn


def shape_of(spec, drafting) -> str:
  """The draft's shape, in Python at trace time: 'tree', 'paths' (K > 1) or 'chain'."""
  if drafting.shape == 'tree':
    return 'tree'
  return 'paths' if spec.num_drafts > 1 else 'chain'


def rule_of(spec, drafting) -> str:
  """The rule a loop of `spec` verifies its drafts by (module docstring)."""
  if spec.greedy:
    return 'greedy'
  if drafting.tree_rule is not None:
    return drafting.tree_rule
  return spec.verifier


def get(rule: str, shape: str) -> Callable:
  """The entry for (rule, shape); a named verifier's chain / paths entry for its name."""
  if (rule, shape) in RULES:
    return RULES[(rule, shape)]
  if rule in verifiers.REGISTRY and shape in _NAMED:
    return _NAMED[shape]
  rules = sorted({r for r, s in RULES if s == shape} | set(verifiers.names()))
  raise ValueError(f'No rule {rule!r} verifies a {shape} draft; choose one of {rules}.')


# Chains and K paths. Every named verifier ('token', 'block', ...) is one entry per shape that
# reads `verifiers.get(spec.verifier)`'s kernels, looked up when the loop is traced.


def _greedy_chain(key, draft: Draft, logits, spec, state):
  del key, spec
  tau, y, beta, nonfinite = decode_steps.verify_greedy_drafts(draft.drafts, logits, draft.lengths)
  return Outcome(tau, y, beta, nonfinite), state


def _named_chain(key, draft: Draft, logits, spec, state):
  tau, y, beta, nonfinite, state = decode_steps.verify_drafts(
    key, draft.drafts, draft.q, logits, spec, draft.lengths, state
  )
  return Outcome(tau, y, beta, nonfinite), state


def _greedy_paths(key, draft: Draft, logits, spec, state):
  del key
  path, tau, y, beta, nonfinite = decode_steps.verify_greedy_paths(
    draft.drafts, logits, spec.num_drafts
  )
  return Outcome(tau, y, beta, nonfinite, path), state


def _named_paths(key, draft: Draft, logits, spec, state):
  path, tau, y, beta, nonfinite = decode_steps.verify_paths(
    key, draft.drafts, draft.q, logits, spec
  )
  return Outcome(tau, y, beta, nonfinite, path), state


_NAMED = {'chain': _named_chain, 'paths': _named_paths}
register('greedy', 'chain', _greedy_chain)
register('greedy', 'paths', _greedy_paths)


# Trees (docs/method.md section 13): the accepted path's slots, tau, Y; beta 1 at the accepted
# depths (a tree has no single q per depth); nonfinite from the target's logits.


def _tree_outcome(result: verify_tree.TreeResult, logits, gamma) -> Outcome:
  depth = jnp.arange(gamma)[None]
  beta = (depth < result.num_accepted[:, None]).astype(jnp.float32)
  nonfinite = ~jnp.isfinite(jnp.sum(logits, axis=(1, 2)))
  return Outcome(result.num_accepted, result.next_token, beta, nonfinite, result.path)


def _greedy_tree(key, draft: Draft, logits, spec, state):
  del key
  with jax.named_scope('verify'):
    ids = sampling_lib.argmax(logits)
    result = verify_tree.greedy_tree_verify(draft.tree, ids, max_depth=spec.gamma)
    return _tree_outcome(result, logits, spec.gamma), state


def _along_tree(key, draft: Draft, logits, spec, state):
  with jax.named_scope('verify'):
    p = sampling_lib.logits_to_probs(logits, spec.sampling)
    result = verify_tree.sample_along_tree(key, draft.tree, p, max_depth=spec.gamma)
    return _tree_outcome(result, logits, spec.gamma), state


def _rrs_tree(key, draft: Draft, logits, spec, state):
  with jax.named_scope('verify'):
    p = sampling_lib.logits_to_probs(logits, spec.sampling)
    result = verify_tree.recursive_rejection_verify(
      key, draft.tree, draft.q, p, max_depth=spec.gamma, max_children=max(spec.tree.branching)
    )
    return _tree_outcome(result, logits, spec.gamma), state


register('greedy', 'tree', _greedy_tree)
register('along', 'tree', _along_tree)
register('rrs', 'tree', _rrs_tree)
