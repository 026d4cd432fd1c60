"""The token-tree speculative loop: `speculative_generate(..., tree=TreeSpec(...))`'s program.

Each iteration, per row:
  1. draft   a block drafter's ONE call gives the laws q_1..q_G of the gamma positions after the
             pending token seq[n] (`decode_steps.block_logits`, as chain block drafting);
  2. build   the best-first tree of `num_nodes` slots on them (`trees.best_first_tree`: the root
             seq[n] and the N - 1 most probable prefixes of depth <= gamma; no drafter call);
  3. score   one target pass over the N nodes (`step_tree`: ancestor mask, positions n + depth);
  4. verify  T = 0: follow the target's argmax down the tree (`verify_tree.greedy_tree_verify`);
             T > 0: sample along the tree (`verify_tree.sample_along_tree`, rule 1b: exact for a
             tree fixed before the target's coins, docs/method.md section 13);
  5. keep    the accepted path's keys and values moved after the root (`keep_path`), the path and
             Y emitted (`decode_steps.emit_accepted`), and the target's states at the root and the
             path handed to the drafter's next call (what it reads at the kept positions).

The tree is scored with the drafter's softmax at temperature 0 (a one-hot law would give a chain)
and with its law under the loop's sampling transform otherwise; any scores give an exact rule 1b.
Stats: `DecodeStats` with gamma = the tree's depth; `drafted` counts gamma per target call (the
depth of the tree, not its N - 1 nodes), and beta is 1 at the accepted depths and 0 after (a
tree has no single q per depth).

Axes: B batch, N node slots, G gamma (the tree's depth), V vocab, F state width.
"""

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, trees, verify_tree
from specdec_jax import sampling as sampling_lib
from specdec_jax.decode_stats import DecodeOutput, DecodeStats
from specdec_jax.step_models import PAD_ID

BUILDERS = ('block',)


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """A token tree per iteration (hashable: part of `decode.LoopSpec`).

  Attributes:
    num_nodes: N >= gamma + 1 node slots per row, the root (the pending token) included: one
      target pass scores N positions. N = gamma + 1 can hold only a chain.
    builder: how the tree is drafted: 'block', the best-first tree on a block drafter's
      per-position laws (`trees.best_first_tree`).
  """

  num_nodes: int
  builder: str = 'block'

  def __post_init__(self):
    n = self.num_nodes
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
      raise ValueError(f'TreeSpec.num_nodes must be an int >= 2, got {n!r}.')
    if self.builder not in BUILDERS:
      raise ValueError(f'TreeSpec.builder must be one of {BUILDERS}, got {self.builder!r}.')

  def check(self, *, gamma, verifier, num_drafts, draft_stop, trace, proposal, unroll_draft):
    """Raises one ValueError naming the first loop setting a tree cannot run with."""
    why = 'a tree loop verifies its own way (docs/method.md section 13)'
    if self.num_nodes < gamma + 1:
      raise ValueError(
        f'tree.num_nodes={self.num_nodes} cannot hold a path of gamma={gamma} drafts: it needs '
        f'num_nodes >= gamma + 1 = {gamma + 1}.'
      )
    if num_drafts != 1:
      raise ValueError(
        f'tree= shares prefixes in one tree per row: it needs num_drafts=1, got {num_drafts}.'
      )
    if verifier != 'token':
      raise ValueError(
        f"tree= needs verifier='token' (the default), got {verifier!r}: {why}: greedy at "
        'temperature 0, sampling along the tree above it.'
      )
    for name, value, default in [
      ('draft_stop', draft_stop, None),
      ('trace', trace, False),
      ('proposal', proposal, 'sample'),
      ('unroll_draft', unroll_draft, False),
    ]:
      if value != default:
        raise ValueError(f'tree= does not support {name}={value!r} (leave it at {default!r}).')

  def check_models(self, target_steps, draft_steps) -> None:
    """Raises one ValueError if the models cannot run this tree."""
    if not getattr(draft_steps, 'block_size', None):
      raise ValueError(
        f"tree=TreeSpec(builder='{self.builder}') builds its tree from a block drafter's "
        'per-position laws: the drafter needs block_size and step_block (a T5 with '
        'T5Config.block_size).'
      )
    if not hasattr(target_steps, 'step_tree') or not hasattr(target_steps, 'keep_path'):
      raise ValueError(
        f'tree= needs a target with step_tree and keep_path (one pass over a token tree); '
        f'{type(target_steps).__name__} has none.'
      )


class _State(NamedTuple):
  """The tree loop's carry (B rows, L the buffer length)."""

  seq: jax.Array  # int32[B, L] start token, then emitted tokens
  n: jax.Array  # int32[B] tokens emitted
  done: jax.Array  # bool[B]
  target_cache: Any
  draft_cache: Any
  stats: DecodeStats  # [B], gamma = the tree's depth
  iteration: jax.Array  # int32[]
  target_states: decode_steps.TargetStates  # at the root and the kept path: [B, G + 1, F]


def tree_loop(
  target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, rng, *, spec
) -> DecodeOutput:
  """The tree loop, traced inside `decode.speculative_loop`'s jit (spec.tree is set)."""
  gamma, tree_spec = spec.gamma, spec.tree
  batch = input_ids.shape[0]
  target_cache, draft_cache = decode_steps.init_caches(
    target_steps, target_params, draft_steps, draft_params, input_ids, input_mask,
    spec.buffer_length,
  )  # fmt: skip
  states = jnp.zeros((batch, gamma + 1, draft_steps.feature_dim), jnp.float32)
  state = _State(
    seq=jnp.zeros((batch, spec.buffer_length), jnp.int32).at[:, 0].set(target_steps.start_id),
    n=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    target_cache=target_cache,
    draft_cache=draft_cache,
    stats=DecodeStats.zeros(batch, gamma),
    iteration=jnp.zeros((), jnp.int32),
    target_states=decode_steps.TargetStates(states, jnp.full((batch,), -1, jnp.int32)),
  )

  def body(state: _State) -> _State:
    verify_rng = jax.random.fold_in(rng, state.iteration)
    pending = decode_steps.row_slice(state.seq, state.n, 1)[:, 0]
    # 1-2. One drafter call, then the best-first tree on its laws.
    logits, draft_cache = decode_steps.block_logits(
      draft_steps, draft_params, state.draft_cache, state.seq, state.n, state.target_states,
      gamma=gamma,
    )  # fmt: skip
    with jax.named_scope('tree'):
      if spec.greedy:
        scores = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
      else:
        scores = sampling_lib.logits_to_probs(logits, spec.sampling)
      tree = trees.best_first_tree(pending, scores, tree_spec.num_nodes)
    # 3. One target pass over the tree.
    with jax.named_scope('target'):
      target_logits, node_states, target_cache = target_steps.step_tree(
        target_params, tree, state.target_cache, gamma, return_states=True
      )
    # 4. Verify.
    with jax.named_scope('verify'):
      nonfinite = ~jnp.isfinite(jnp.sum(target_logits, axis=(1, 2)))
      if spec.greedy:
        ids = sampling_lib.argmax(target_logits)
        result = verify_tree.greedy_tree_verify(tree, ids, max_depth=gamma)
      else:
        p = sampling_lib.logits_to_probs(target_logits, spec.sampling)
        result = verify_tree.sample_along_tree(verify_rng, tree, p, max_depth=gamma)
    # 5. Keep the path: the target's cache, the emitted tokens, the states the drafter reads.
    target_cache = target_steps.keep_path(target_cache, result.path, result.num_accepted)
    drafts = trees.path_tokens(tree, result.path)
    seq, n, done, target_cache = decode_steps.emit_accepted(
      state.seq, state.n, state.done, target_cache, drafts, result.num_accepted,
      result.next_token, eos_id=target_steps.eos_id, max_new_tokens=spec.max_new_tokens,
    )  # fmt: skip
    kept = jnp.concatenate([jnp.zeros_like(result.path[:, :1]), jnp.maximum(result.path, 0)], 1)
    kept_states = jnp.take_along_axis(node_states.astype(jnp.float32), kept[:, :, None], axis=1)
    depth = jnp.arange(gamma)[None]
    beta = (depth < result.num_accepted[:, None]).astype(jnp.float32)
    return state._replace(
      seq=seq,
      n=n,
      done=done,
      target_cache=target_cache,
      draft_cache=draft_cache,
      stats=state.stats.accumulate(~state.done, result.num_accepted, beta, nonfinite),
      iteration=state.iteration + 1,
      target_states=decode_steps.TargetStates(kept_states, state.n),
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  m = spec.max_new_tokens
  tokens = state.seq[:, 1 : m + 1]
  tokens = jnp.where(jnp.arange(m) < state.n[:, None], tokens, PAD_ID)
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats, trace=None)
