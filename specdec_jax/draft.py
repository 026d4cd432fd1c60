"""What one iteration's steps hand each other: the drafter's view of the loop (`DraftView`), a
draft as data (`Draft`), and a verifier's result (`Outcome`).

A draft is a token tree rooted at the pending token. A chain is the tree with one child per node
(no parent table is built for it: the pass and the rules know its shape); K paths are K chains
under one root, one per model row; a tree carries its parent table (`trees.Tree`). The loop
(`decode_loop`) reads a draft's shape from the spec, statically, and picks the pass and the rule
that fit it (`scoring.SHAPES`, `verifiers.RULES`).

Axes: B batch, R = B * K model rows, N nodes (a chain: G + 1), G gamma (the depth), V vocab,
L buffer length, S source length, F state width.
"""

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp

from specdec_jax import trees
from specdec_jax.decode_steps import TargetStates
from specdec_jax.step_models import Cache


class DraftView(NamedTuple):
  """What a drafting entry reads of the loop (never the loop's state itself); rows repeated K
  times for K paths.

  Attributes:
    seq: i32[R, L] the token buffer; seq[r, n[r]] is the pending token.
    n: i32[R] tokens emitted.
    done: bool[R] rows finished.
    cache: the drafter's cache (None: the entry calls no model).
    state: the entry's carried state (`drafting.Drafting.init_state`), or None.
    target_states: the last target pass's states at the kept positions, for a drafter that reads
      them, else None.
    source_ids, source_mask: i32[R, S], bool[R, S] the rows' sources.
  """

  seq: jax.Array
  n: jax.Array
  done: jax.Array
  cache: Cache | None
  state: jax.Array | None
  target_states: TargetStates | None
  source_ids: jax.Array
  source_mask: jax.Array


@flax.struct.dataclass(kw_only=True)
class Draft:
  """One iteration's draft per row: node 0 is the pending token, then the drafted tokens.

  Attributes:
    tokens: i32[R, N] a chain's [pending, X_1..X_G] (the chain pass's input) or a tree's nodes.
    q: the drafter's laws the verifier reads, or None (temperature 0, a rule that reads none):
      a chain's f32[R, G, V] q_1..q_G; a sampled tree's f32[R, N, V] law of each node's children.
    lengths: i32[R] drafts each row verifies (a chain cut short: draft stop, a lookup with a
      short or no match), or None: all G.
    parents, depth, valid: a tree's structure (`trees.Tree`), i32/i32/bool[R, N]; None for a
      chain.
  """

  tokens: jax.Array
  q: jax.Array | None = None
  lengths: jax.Array | None = None
  parents: jax.Array | None = None
  depth: jax.Array | None = None
  valid: jax.Array | None = None

  @classmethod
  def chain(cls, pending, drafts, q=None, lengths=None) -> 'Draft':
    """The chain [pending, X_1..X_G]: pending i32[R], drafts i32[R, G]."""
    return cls(tokens=jnp.concatenate([pending[:, None], drafts], axis=1), q=q, lengths=lengths)

  @classmethod
  def of_tree(cls, tree: trees.Tree, q=None) -> 'Draft':
    return cls(tokens=tree.tokens, q=q, parents=tree.parents, depth=tree.depth, valid=tree.valid)

  @property
  def drafts(self) -> jax.Array:
    """A chain's drafts X_1..X_G, i32[R, G]."""
    return self.tokens[:, 1:]

  @property
  def tree(self) -> trees.Tree:
    """The draft as a `trees.Tree` (a chain's parent table built on the spot)."""
    if self.parents is None:
      return trees.chain(self.tokens[:, 0], self.drafts)
    return trees.Tree(self.tokens, self.parents, self.depth, self.valid)


class Outcome(NamedTuple):
  """What every verifier returns, per source row.

  Attributes:
    tau: i32[B] drafts accepted (the accepted path's depth).
    y: i32[B] the token emitted after them (corrected or bonus).
    beta: f32[B, G] per depth, sum_x min(p, q) (a chain; 1 at a tree's accepted depths, else 0).
    nonfinite: bool[B] rows whose logits or laws held a NaN or inf.
    path: None for a chain; K paths: i32[B] the path kept; a tree: i32[B, G] the accepted nodes'
      slots, -1 past tau.
  """

  tau: jax.Array
  y: jax.Array
  beta: jax.Array
  nonfinite: jax.Array
  path: jax.Array | None = None
