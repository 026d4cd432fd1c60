"""The token-tree speculative loop: `speculative_generate(..., tree=TreeSpec(...))`'s program.

Each iteration, per row:
  1-2. draft a tree rooted at the pending token seq[n], by the spec's builder:
     'block': a block drafter's ONE call gives the laws q_1..q_G of the gamma positions after
             seq[n] (`decode_steps.block_logits`, as chain block drafting), and the best-first
             tree of `num_nodes` slots is built on them (`trees.best_first_tree`: the N - 1 most
             probable prefixes of depth <= gamma);
     'topk': an autoregressive drafter's call catches it up on the kept tokens and gives its law
             after seq[n]; each depth then expands the top_k best frontier nodes into their top_k
             children with ONE batched call over top_k copies of each row's drafter cache
             (`trees.topk_tree`); N = 1 + top_k * gamma;
     'sampled': the block drafter's one call, then `branching[d]` children per node of depth d
             DRAWN without replacement from q_{d+1} (`trees.sampled_tree`; at T = 0 its top
             tokens);
  3. score   one target pass over the N nodes (`step_tree`: ancestor mask, positions n + depth);
  4. verify  T = 0: follow the target's argmax down the tree (`verify_tree.greedy_tree_verify`);
             T > 0: sample along the tree (`verify_tree.sample_along_tree`, rule 1b: exact for a
             tree fixed before the target's coins, docs/method.md section 13); a 'sampled' tree by
             recursive rejection (`verify_tree.recursive_rejection_verify`, rule 1a);
  5. keep    the accepted path's keys and values moved after the root (`keep_path`), the path and
             Y emitted (`decode_steps.emit_accepted`), and the target's states at the root and the
             path handed to the drafter's next call (what it reads at the kept positions).

Either tree is scored with the drafter's softmax at temperature 0 (a one-hot law would give a chain)
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

from specdec_jax import cache as cache_lib
from specdec_jax import decode_steps, trees, verify_tree
from specdec_jax import sampling as sampling_lib
from specdec_jax.decode_stats import DecodeOutput, DecodeStats
from specdec_jax.step_models import PAD_ID

BUILDERS = ('block', 'topk', 'sampled')


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """A token tree per iteration (hashable: part of `decode.LoopSpec`).

  Attributes:
    num_nodes: N >= gamma + 1 node slots per row, the root (the pending token) included: one
      target pass scores N positions. N = gamma + 1 can hold only a chain.
    builder: how the tree is drafted (module docstring): 'block', the best-first tree on a block
      drafter's per-position laws (`trees.best_first_tree`); 'topk', an autoregressive drafter's
      top_k children per node, depth by depth (`trees.topk_tree`; N = 1 + top_k * gamma).
    top_k: children per expanded node and frontier width of 'topk' (unread by the others).
    branching: 'sampled': children per node at depths 0..gamma-1 (gamma = its length; N the full
      tree's size, `trees.full_tree_size`); unread by the others.
  """

  num_nodes: int
  builder: str = 'block'
  top_k: int = 2
  branching: tuple[int, ...] = ()

  def __post_init__(self):
    n = self.num_nodes
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
      raise ValueError(f'TreeSpec.num_nodes must be an int >= 2, got {n!r}.')
    if self.builder not in BUILDERS:
      raise ValueError(f'TreeSpec.builder must be one of {BUILDERS}, got {self.builder!r}.')
    k = self.top_k
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
      raise ValueError(f'TreeSpec.top_k must be an int >= 1, got {k!r}.')
    branching = tuple(self.branching)
    if any(not isinstance(b, int) or isinstance(b, bool) or b < 1 for b in branching):
      raise ValueError(f'TreeSpec.branching must hold ints >= 1, got {self.branching!r}.')
    if (self.builder == 'sampled') != bool(branching):
      raise ValueError(
        f"TreeSpec.branching is for builder='sampled' (and it needs one), got builder="
        f'{self.builder!r}, branching={self.branching!r}.'
      )
    object.__setattr__(self, 'branching', branching)

  def check(self, *, gamma, verifier, num_drafts, draft_stop, trace, proposal, unroll_draft):
    """Raises one ValueError naming the first loop setting a tree cannot run with."""
    why = 'a tree loop verifies its own way (docs/method.md section 13)'
    if self.num_nodes < gamma + 1:
      raise ValueError(
        f'tree.num_nodes={self.num_nodes} cannot hold a path of gamma={gamma} drafts: it needs '
        f'num_nodes >= gamma + 1 = {gamma + 1}.'
      )
    if self.builder == 'sampled' and (
      len(self.branching) != gamma or self.num_nodes != trees.full_tree_size(self.branching)
    ):
      raise ValueError(
        f"tree=TreeSpec(builder='sampled', branching={self.branching}) draws a full tree of "
        f'depth {len(self.branching)} and {trees.full_tree_size(self.branching)} nodes: pass '
        f'gamma={len(self.branching)} and num_nodes={trees.full_tree_size(self.branching)}, got '
        f'gamma={gamma}, num_nodes={self.num_nodes}.'
      )
    if self.builder == 'topk' and self.num_nodes != 1 + self.top_k * gamma:
      raise ValueError(
        f"tree=TreeSpec(builder='topk', top_k={self.top_k}) at gamma={gamma} has "
        f'1 + top_k * gamma = {1 + self.top_k * gamma} nodes: pass that num_nodes, got '
        f'{self.num_nodes}.'
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
    block = bool(getattr(draft_steps, 'block_size', None))
    if self.builder == 'topk' and (block or getattr(draft_steps, 'reads_target_states', False)):
      raise ValueError(
        "tree=TreeSpec(builder='topk') expands the tree with an autoregressive drafter's step; "
        "this drafter is a block drafter or reads the target's states: use builder='block' for "
        'a block drafter.'
      )
    if self.builder in ('block', 'sampled') and not block:
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


def check_loop(spec) -> None:
  """Raises one ValueError if a `decode.LoopSpec`'s tree cannot run with its other settings."""
  if not isinstance(spec.tree, TreeSpec):
    raise ValueError(f'tree must be a decode.TreeSpec or None, got {spec.tree!r}.')
  spec.tree.check(
    gamma=spec.gamma, verifier=spec.verifier, num_drafts=spec.num_drafts,
    draft_stop=spec.draft_stop, trace=spec.trace, proposal=spec.proposal,
    unroll_draft=spec.unroll_draft,
  )  # fmt: skip


class _State(NamedTuple):
  """The tree loop's carry (B rows, L the buffer length)."""

  seq: jax.Array  # int32[B, L] start token, then emitted tokens
  n: jax.Array  # int32[B] tokens emitted
  done: jax.Array  # bool[B]
  target_cache: Any
  draft_cache: Any
  stats: DecodeStats  # [B], gamma = the tree's depth
  iteration: jax.Array  # int32[]
  # 'block': the target's states at the last root and its kept path, [B, G + 1, F], from the
  # last root's position; 'topk': None.
  target_states: decode_steps.TargetStates | None
  last_root: jax.Array  # int32[B] the last iteration's n (-1 before the first)


def tree_loop(
  target_steps, target_params, draft_steps, draft_params, input_ids, input_mask, rng, *, spec
) -> DecodeOutput:
  """The tree loop, traced inside `decode.speculative_loop`'s jit (spec.tree is set)."""
  gamma, tree_spec = spec.gamma, spec.tree
  batch = input_ids.shape[0]
  block = tree_spec.builder in ('block', 'sampled')  # a block drafter, reading states
  target_cache, draft_cache = decode_steps.init_caches(
    target_steps, target_params, draft_steps, draft_params, input_ids, input_mask,
    spec.buffer_length,
    draft_cache_len=spec.buffer_length + decode_steps.drafting_of(draft_steps).extra_slots(gamma),
  )  # fmt: skip
  last_root = jnp.full((batch,), -1, jnp.int32)
  target_states = None
  if block:
    states = jnp.zeros((batch, gamma + 1, draft_steps.feature_dim), jnp.float32)
    target_states = decode_steps.TargetStates(states, last_root)
  state = _State(
    seq=jnp.zeros((batch, spec.buffer_length), jnp.int32).at[:, 0].set(target_steps.start_id),
    n=jnp.zeros((batch,), jnp.int32),
    done=jnp.zeros((batch,), bool),
    target_cache=target_cache,
    draft_cache=draft_cache,
    stats=DecodeStats.zeros(batch, gamma),
    iteration=jnp.zeros((), jnp.int32),
    target_states=target_states,
    last_root=last_root,
  )

  def body(state: _State) -> _State:
    draft_rng, verify_rng = jax.random.split(jax.random.fold_in(rng, state.iteration))
    # 1-2. The drafter's tree (and, for rule 1a, the law each node's children were drawn from).
    draft = _DRAFTS[tree_spec.builder]
    tree, draft_cache, node_laws = draft(draft_steps, draft_params, state, draft_rng, spec=spec)
    # 3. One target pass over the tree.
    with jax.named_scope('target'):
      target_logits, *node_states, target_cache = target_steps.step_tree(
        target_params, tree, state.target_cache, gamma, return_states=block
      )
    # 4. Verify.
    with jax.named_scope('verify'):
      nonfinite = ~jnp.isfinite(jnp.sum(target_logits, axis=(1, 2)))
      if spec.greedy:
        ids = sampling_lib.argmax(target_logits)
        result = verify_tree.greedy_tree_verify(tree, ids, max_depth=gamma)
      elif node_laws is None:
        p = sampling_lib.logits_to_probs(target_logits, spec.sampling)
        result = verify_tree.sample_along_tree(verify_rng, tree, p, max_depth=gamma)
      else:
        p = sampling_lib.logits_to_probs(target_logits, spec.sampling)
        result = verify_tree.recursive_rejection_verify(
          verify_rng, tree, node_laws, p, max_depth=gamma,
          max_children=max(tree_spec.branching),
        )  # fmt: skip
    # 5. Keep the path: the target's cache, the emitted tokens, the states the drafter reads.
    target_cache = target_steps.keep_path(target_cache, result.path, result.num_accepted)
    drafts = trees.path_tokens(tree, result.path)
    seq, n, done, target_cache = decode_steps.emit_accepted(
      state.seq, state.n, state.done, target_cache, drafts, result.num_accepted,
      result.next_token, eos_id=target_steps.eos_id, max_new_tokens=spec.max_new_tokens,
    )  # fmt: skip
    target_states = None
    if block:  # the drafter reads the target's states at the root and the kept path
      kept = jnp.concatenate([jnp.zeros_like(result.path[:, :1]), jnp.maximum(result.path, 0)], 1)
      kept_states = jnp.take_along_axis(node_states[0].astype(jnp.float32), kept[..., None], 1)
      target_states = decode_steps.TargetStates(kept_states, state.n)
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
      target_states=target_states,
      last_root=state.n,
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  m = spec.max_new_tokens
  tokens = state.seq[:, 1 : m + 1]
  tokens = jnp.where(jnp.arange(m) < state.n[:, None], tokens, PAD_ID)
  return DecodeOutput(tokens=tokens, lengths=state.n, stats=state.stats, trace=None)


def _scores(logits, spec) -> jax.Array:
  """The drafter's law a tree is built on: its softmax at temperature 0 (a one-hot law would
  give a chain), its law under the loop's sampling transform otherwise."""
  if spec.greedy:
    return jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  return sampling_lib.logits_to_probs(logits, spec.sampling)


def _draft_block_tree(draft_steps, draft_params, state: _State, rng, *, spec):
  """'block' / 'sampled': one block drafter call, then the best-first tree on its laws, or the
  tree drawn from them: (tree, draft cache, each node's law for 'sampled', else None)."""
  logits, draft_cache = decode_steps.block_logits(
    draft_steps, draft_params, state.draft_cache, state.seq, state.n, state.target_states,
    gamma=spec.gamma,
  )  # fmt: skip
  with jax.named_scope('tree'):
    pending = decode_steps.row_slice(state.seq, state.n, 1)[:, 0]
    q = _scores(logits, spec)
    if spec.tree.builder == 'block':
      return trees.best_first_tree(pending, q, spec.tree.num_nodes), draft_cache, None
    branching = spec.tree.branching
    tree = trees.sampled_tree(None if spec.greedy else rng, pending, q, branching)
    return tree, draft_cache, trees.node_laws(q, branching)


def _draft_topk_tree(draft_steps, draft_params, state: _State, rng, *, spec):
  """'topk': a catch-up call on the kept tokens (seq[last_root + 1 ..], its law after seq[n]),
  then one batched call per depth on top_k copies of each row's cache: (tree, draft cache, the
  row's own, holding positions 0..n; None: no node laws)."""
  del rng  # deterministic
  gamma, top_k = spec.gamma, spec.tree.top_k
  start = state.last_root + 1  # the drafter holds positions < start; seq[start..n] are new
  tokens = decode_steps.row_slice(state.seq, start, gamma + 1)
  logits, _, cache = decode_steps.drafter_call(
    draft_steps, draft_params, tokens, None, state.draft_cache.replace(end_index=start),
    logits_at=jnp.clip(state.n - start, min=0, max=gamma),
  )  # fmt: skip
  cache = cache.replace(end_index=state.n + 1)
  batch = tokens.shape[0]

  def expand(tokens, from_node, frontier_cache):
    """The law after each of the K new frontier nodes: each continues its parent's cache row."""
    k_in = frontier_cache.end_index.shape[0] // batch
    rows = (jnp.arange(batch)[:, None] * k_in + from_node).reshape(-1)
    frontier_cache = cache_lib.take_rows(frontier_cache, rows, same_source=k_in == top_k)
    with jax.named_scope('drafter'):
      logits, frontier_cache = draft_steps.step(draft_params, tokens.reshape(-1, 1), frontier_cache)
    return _scores(logits[:, 0], spec).reshape(batch, top_k, -1), frontier_cache

  with jax.named_scope('tree'):
    tree, _ = trees.topk_tree(
      decode_steps.row_slice(state.seq, state.n, 1)[:, 0], _scores(logits[:, 0], spec), expand,
      cache, top_k=top_k, max_depth=gamma,
    )  # fmt: skip
  return tree, cache, None


_DRAFTS = {'block': _draft_block_tree, 'sampled': _draft_block_tree, 'topk': _draft_topk_tree}
