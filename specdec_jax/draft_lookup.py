"""Source lookup: the kernels of a drafter that copies from the row's own source (prompt lookup for
an encoder-decoder pair).

The drafter proposes what followed, in the row's source (the encoder's input ids), the latest
occurrence of the last k emitted tokens, k = `ngram` down to `min_ngram` (the longest k with a
match wins, as vLLM's n-gram proposer backs off). It needs one vocabulary for the source and the
output (T5's), has no parameters, and its law is one-hot at each proposed token. It is fixed
before the target's coins, so a tree of its branches is exact under rule 1b
(`verify_tree.sample_along_tree`), and a chain under token verification with a one-hot q.

- `match`: per row, the M latest source positions that follow the emitted suffix, and how many
  tokens each can propose.
- `proposals`: the proposed tokens, i32[B, M, G]. Graft them under a root with `trees.graft`
  (which also merges branches with equal tokens: distinct siblings).

Both are pure, jit-able and vectorized over the batch, with static shapes: no host sync.

Axes: B batch, L decoder buffer, S source length, M branches (matches), G gamma (tokens proposed
per branch).
"""

import dataclasses

import jax
import jax.numpy as jnp

from specdec_jax import decode_steps, trees
from specdec_jax.draft import Draft


def match(
  seq: jax.Array,
  n: jax.Array,
  source: jax.Array,
  source_mask: jax.Array,
  *,
  ngram: int,
  min_ngram: int,
  branches: int,
  gamma: int,
) -> tuple[jax.Array, jax.Array]:
  """The M latest source positions that continue the row's longest matching emitted suffix.

  A k-gram MATCH of row b at source position j (the position of the first proposed token) is
  `source[b, j-k : j] == seq[b, n-k+1 : n+1]` (the last k emitted tokens, the pending token
  `seq[b, n]` last) where the k matched positions AND position j are real (`source_mask`): one
  run of real tokens holds the matched span and at least one token to propose. So a match at the
  very end of the real source (nothing follows) is no match: it neither takes a branch nor stops
  the backoff. Per row, k is the longest in `ngram .. min_ngram` with at least one match; the
  row's matches of that k are returned latest (largest j) first, all distinct j.

  - Padding (`source_mask` 0): never matched and never proposed; the mask need not be a prefix,
    a span just never crosses a padding position. Pad ids are compared like any id, so a real
    source token equal to the pad id is an ordinary token.
  - The start token `seq[b, 0]` is not an emitted token and never takes part: a row with n < k
    has no k-gram (it backs off to k <= n), and a row with n = 0 has no match at all.
  - Equal continuations are NOT merged: two occurrences of one phrase give two branches with the
    same tokens (`trees.graft` merges them into one path, so the tree's siblings stay distinct;
    the M branches may then hold fewer distinct paths).
  - The source's EOS, when it is real, is an ordinary token: it may be matched and proposed.

  Args:
    seq: i32[B, L], the decoder buffer: the start token, then the emitted tokens; `seq[b, n[b]]`
      is the pending (last committed) token.
    n: i32[B], tokens emitted per row, 0 <= n < L.
    source: i32[B, S], the encoder's input ids (one vocabulary with the decoder's).
    source_mask: bool or 0/1 int [B, S], True at real source tokens.
    ngram: the longest suffix tried, >= min_ngram.
    min_ngram: the shortest suffix tried, >= 1.
    branches: M >= 1, matches returned per row.
    gamma: G >= 1, the most tokens one branch proposes.

  Returns:
    (start, available): i32[B, M] each. `start[b, m]` is the m-th latest match's j (0 where
    there is none); `available[b, m] = min(G, real tokens from j to the end of j's run of real
    tokens)`, which is `min(G, real_len - j)` for a prefix mask: >= 1 at a match, 0 where none.
  """
  if not 1 <= min_ngram <= ngram:
    raise ValueError(f'need 1 <= min_ngram <= ngram, got min_ngram={min_ngram}, ngram={ngram}')
  if branches < 1 or gamma < 1:
    raise ValueError(f'need branches >= 1 and gamma >= 1, got {branches} and {gamma}')
  batch, length = seq.shape
  size = source.shape[1]
  real = source_mask.astype(bool)
  positions = jnp.arange(size, dtype=jnp.int32)

  def back(x, d, fill):  # x[b, j - 1 - d], `fill` where j - 1 - d < 0: static shifts
    pad = jnp.full((batch, d + 1), fill, x.dtype)
    return jnp.concatenate([pad, x[:, : size - d - 1]], axis=1)

  # Matching the last d + 1 emitted tokens at j means e_0 & ... & e_d, where e_d compares the
  # d-th emitted token from the end, seq[n - d] (emitted: n - d >= 1), with source[j - 1 - d].
  hit = real  # position j itself must be real: a token to propose
  best = jnp.zeros((batch, size), bool)
  for d in range(ngram):
    index = n - d
    token = jnp.take_along_axis(seq, jnp.clip(index, 0, length - 1)[:, None], axis=1)  # [B, 1]
    hit = hit & (back(source, d, 0) == token) & back(real, d, False) & (index >= 1)[:, None]
    if d + 1 >= min_ngram:  # k = d + 1 grows: a longer k that matches anywhere wins
      best = jnp.where(hit.any(axis=1, keepdims=True), hit, best)

  # The latest M matches: top_k over the positions (S >= M padded with misses).
  keyed = jnp.where(best, positions, -1)
  if size < branches:
    keyed = jnp.pad(keyed, ((0, 0), (0, branches - size)), constant_values=-1)
  top, _ = jax.lax.top_k(keyed, branches)  # [B, M], latest first, -1: none
  found = top >= 0
  start = jnp.where(found, top, 0).astype(jnp.int32)
  # End of each position's run of real tokens: the first padding position at or after j.
  gap = jnp.where(real, size, positions)
  run_end = jax.lax.cummin(gap, axis=1, reverse=True)
  ends = jnp.take_along_axis(run_end, start, axis=1)
  available = jnp.where(found, jnp.minimum(gamma, ends - start), 0).astype(jnp.int32)
  return start, available


def proposals(source: jax.Array, start: jax.Array, available: jax.Array, gamma: int) -> jax.Array:
  """The proposed tokens `source[b, start + i]` for i < available, 0 past it: i32[B, M, G].

  Args:
    source: i32[B, S], the encoder's input ids.
    start, available: i32[B, M], from `match`.
    gamma: G, static.
  """
  batch, size = source.shape
  offset = jnp.arange(gamma, dtype=jnp.int32)
  index = jnp.clip(start[:, :, None] + offset, 0, size - 1)
  tokens = source[jnp.arange(batch)[:, None, None], index]
  return jnp.where(offset < available[:, :, None], tokens, 0).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# The drafter: a step model with no parameters and no cache, and its drafting entries.


@dataclasses.dataclass(frozen=True)
class LookupSteps:
  """The source-lookup drafter as a step model: it calls no model (`drafting = 'lookup'`: the
  loop drafts with `draft_chain`), encodes nothing and keeps no cache.

  Attributes:
    vocab_size, start_id, eos_id: the target's (one vocabulary for source and output).
    ngram, min_ngram: the longest and shortest emitted suffix matched (`match`).
  """

  vocab_size: int
  start_id: int = 0
  eos_id: int = 1
  ngram: int = 3
  min_ngram: int = 1
  drafting = 'lookup'
  draft_calls = False

  def encode(self, params, input_ids, input_mask):
    del params, input_ids, input_mask
    return None

  def init_cache(self, params, encoded, input_mask, max_decode_len):
    del params, encoded, input_mask, max_decode_len
    return None


@dataclasses.dataclass(frozen=True)
class SourceLookup:
  """A source-lookup drafter: `speculative_generate(target, source_lookup(target), ...)`."""

  steps: LookupSteps
  params: dict = dataclasses.field(default_factory=dict)


def source_lookup(target, *, ngram: int = 3, min_ngram: int = 1) -> SourceLookup:
  """The source-lookup drafter for `target` (a T5Model or step model): it proposes, after each
  row's last `ngram` .. `min_ngram` emitted tokens, what followed their latest occurrence in the
  row's own source, with a one-hot law."""
  if not 1 <= min_ngram <= ngram:
    raise ValueError(f'source_lookup needs 1 <= min_ngram <= ngram, got {min_ngram}, {ngram}.')
  steps = target.steps if hasattr(target, 'steps') else target
  return SourceLookup(LookupSteps(steps.vocab_size, steps.start_id, steps.eos_id, ngram, min_ngram))


def _branches(view, spec, *, ngram, min_ngram, branches):
  """(tokens i32[B, M, G], available i32[B, M]) of the M latest matches."""
  with jax.named_scope('lookup'):
    start, available = match(
      view.seq, view.n, view.source_ids, view.source_mask,
      ngram=ngram, min_ngram=min_ngram, branches=branches, gamma=spec.gamma,
    )  # fmt: skip
    return proposals(view.source_ids, start, available, spec.gamma), available


def draft_chain(drafter, view, key, spec):
  """'lookup': the latest match's continuation as a chain of `available` drafts (0: none), each
  with a one-hot q (None at temperature 0). Token and block verification stay exact: the draft
  is drawn from that q."""
  del key
  steps = drafter.steps
  tokens, available = _branches(
    view, spec, ngram=steps.ngram, min_ngram=steps.min_ngram, branches=1
  )
  drafts = tokens[:, 0]
  q = None if spec.greedy else jax.nn.one_hot(drafts, steps.vocab_size, dtype=jnp.float32)
  pending = decode_steps.row_slice(view.seq, view.n, 1)[:, 0]
  return Draft.chain(pending, drafts, q, available[:, 0]), view.cache, view.state


def graft_matches(tree: trees.Tree, view, spec) -> trees.Tree:
  """`tree` padded to the spec's `TreeSpec.num_nodes` slots with its M latest source matches
  (`TreeSpec.branches`, suffixes of `TreeSpec.ngram`..1 tokens) grafted under its root
  (`trees.graft`: equal continuations merged, siblings distinct)."""
  t = spec.tree
  tokens, available = _branches(view, spec, ngram=t.ngram, min_ngram=1, branches=t.branches)
  extra = t.num_nodes - tree.tokens.shape[1]
  pad = lambda x, value: jnp.pad(x, ((0, 0), (0, extra)), constant_values=value)
  with jax.named_scope('tree'):
    padded = trees.Tree(
      pad(tree.tokens, 0), pad(tree.parents, -1), pad(tree.depth, 0), pad(tree.valid, False)
    )
    return trees.graft(padded, tokens, available, spec.gamma)


def draft_tree(drafter, view, key, spec):
  """'lookup_tree': the M latest matches grafted under the root, N slots. Fixed before the
  target's coins: rule 1b ('along')."""
  del drafter, key
  pending = decode_steps.row_slice(view.seq, view.n, 1)
  root = trees.Tree(
    pending, jnp.full_like(pending, -1), jnp.zeros_like(pending), jnp.ones(pending.shape, bool)
  )
  return Draft.of_tree(graft_matches(root, view, spec)), view.cache, view.state
