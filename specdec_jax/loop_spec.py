"""What a decode loop is asked to do, checked once: `LoopSpec` (gamma, sampling, verifier, draft
paths, draft stop, proposal, tree, trace), and the token buffer and caches it sizes
(`buffer_length`). `decode`'s loops are jitted with a LoopSpec as their static argument."""

import dataclasses

import numpy as np

from specdec_jax import sampling as sampling_lib
from specdec_jax import trees, validation, verifiers


def buffer_length(max_new_tokens: int, gamma: int) -> int:
  """Slots of the token buffer `seq` and of both decoder caches: M + G + 2.

  An iteration writes its G + 1 candidate tokens to seq[n + 1 .. n + G + 1] and the target pass
  writes cache positions n .. n + G. Rows that already finished still run (at n <= M), writing
  past their end where nothing is read, so the last slot touched is M + G + 1.
  """
  return max_new_tokens + gamma + 2


BUILDERS = ('block', 'topk', 'sampled', 'lookup', 'hybrid')


@dataclasses.dataclass(frozen=True)
class TreeSpec:
  """A token tree per iteration (hashable: part of `decode.LoopSpec`).

  Attributes:
    num_nodes: N >= gamma + 1 node slots per row, the root (the pending token) included: one
      target pass scores N positions. N = gamma + 1 can hold only a chain.
    builder: how the tree is drafted (`drafting.TREE_BUILDERS`'s entries): 'block', the best-first tree on a block
      drafter's per-position laws (`trees.best_first_tree`); 'topk', an autoregressive drafter's
      top_k children per node, depth by depth (`trees.topk_tree`; N = 1 + top_k * gamma).
    top_k: children per expanded node and frontier width of 'topk' (unread by the others).
    branching: 'sampled': children per node at depths 0..gamma-1 (gamma = its length; N the full
      tree's size, `trees.full_tree_size`); unread by the others.
    branches: 'lookup' / 'hybrid': M >= 1 source-lookup branches grafted under the root
      (`draft_lookup`): 'lookup' with a `draft_lookup.source_lookup` drafter, the M latest source
      matches; 'hybrid' with a block drafter, its best-first tree of N - M * gamma nodes and the
      M branches under one root. Unread by the others.
    ngram: the longest emitted suffix the lookup branches match (backing off to 1).
  """

  num_nodes: int
  builder: str = 'block'
  top_k: int = 2
  branching: tuple[int, ...] = ()
  branches: int = 0
  ngram: int = 3

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
    lookup = self.builder in ('lookup', 'hybrid')
    m = self.branches
    if not isinstance(m, int) or isinstance(m, bool) or m < 0 or lookup != (m > 0):
      raise ValueError(
        f"TreeSpec.branches is for builder='lookup' or 'hybrid' (an int >= 1 there, 0 otherwise), "
        f'got builder={self.builder!r}, branches={m!r}.'
      )
    validation.as_int('TreeSpec.ngram', self.ngram, 1)

  def check(self, *, gamma, verifier, num_drafts, draft_stop, proposal, unroll_draft):
    """Raises one ValueError naming the first loop setting a tree cannot run with: a tree is
    drafted by its builder (no draft stop, proposal or scan to unroll), one per row, and
    verified by the builder's exact rule. The trace records a tree's kept path."""
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
    if self.builder == 'hybrid' and self.num_nodes - self.branches * gamma < 2:
      raise ValueError(
        f"tree=TreeSpec(builder='hybrid', branches={self.branches}) keeps branches * gamma = "
        f'{self.branches * gamma} slots for the lookup branches and at least 2 for the drafter: '
        f'it needs num_nodes >= {self.branches * gamma + 2}, got {self.num_nodes}.'
      )
    if num_drafts != 1:
      raise ValueError(
        f'tree= shares prefixes in one tree per row: it needs num_drafts=1, got {num_drafts}.'
      )
    if verifier != 'token':
      raise ValueError(
        f"tree= needs verifier='token' (the default), got {verifier!r}: {why}: greedy at "
        "temperature 0, above it the builder's exact rule (`rules`)."
      )
    for name, value, default in [
      ('draft_stop', draft_stop, None),
      ('proposal', proposal, 'sample'),
      ('unroll_draft', unroll_draft, False),
    ]:
      if value != default:
        raise ValueError(f'tree= does not support {name}={value!r} (leave it at {default!r}).')


def check_tree(spec) -> None:
  """Raises one ValueError if a `decode.LoopSpec`'s tree cannot run with its other settings."""
  if not isinstance(spec.tree, TreeSpec):
    raise ValueError(f'tree must be a decode.TreeSpec or None, got {spec.tree!r}.')
  spec.tree.check(
    gamma=spec.gamma, verifier=spec.verifier, num_drafts=spec.num_drafts,
    draft_stop=spec.draft_stop, proposal=spec.proposal, unroll_draft=spec.unroll_draft,
  )  # fmt: skip


# How a drafter proposes at temperature > 0: 'sample' draws X_i ~ q_i; 'argmax' proposes q_i's
# most likely token with q_i its one-hot vector. Both are exact (docs/method.md, "Block drafting").
PROPOSALS = ('sample', 'argmax')


@dataclasses.dataclass(frozen=True)
class LoopSpec:
  """Everything static about a decode loop: the one hashable static argument of its jit.

  Attributes:
    sampling: the transform applied identically to target and drafter logits.
    max_new_tokens: M >= 1, the most tokens per row.
    gamma: G draft tokens per iteration (>= 1 for `speculative_loop`; 0 for
      `autoregressive_loop`, which reads no other field below).
    verifier: a name of `verifiers.REGISTRY`; 'token' whenever `greedy` (every verifier is then
      the same program). Its constraints (e.g. 'greedy_block': num_drafts = 1, no draft_stop)
      are checked here (`Verifier.check`), its carried state is the loop's `verifier_state`.
    num_drafts: K >= 1 draft paths per iteration. K > 1 drafts K independent paths (each source
      row runs as K rows of both models), scores them in one target pass of K x (G + 1)
      positions, verifies them with the verifier's `multipath` kernel and moves every copy of the
      row onto the accepted path. K = 1 is the single-draft program.
    draft_stop: adaptive draft length, a threshold in (0, 1) or None (always G drafts). Drafting
      stops after the first draft X_i whose probability under the drafter's own softmax (its
      logits before the sampling transform, so greedy drafting stops too) is below it; X_i is
      kept and the row's first i drafts are verified (`verify`'s `lengths`). Lossless: the
      stop reads only the drafted prefix. Needs num_drafts = 1.
    unroll_draft: unroll the draft's `lax.scan` of gamma - 1 drafter calls (`decode_steps.draft`'s
      `unroll`; one path or K alike): the same numbers and tokens with no while loop around the
      calls, so an accelerator launches fewer kernels per draft; compiling takes longer.
    trace: record a `SpeculativeTrace` of every iteration.
    proposal: how a drafter proposes at temperature > 0 (`PROPOSALS`).
    tree: a `TreeSpec`: one token tree of depth gamma per row and iteration, one target pass
      over its nodes; None: a chain (or K paths).

  The loop's extension points are registries it reads: a way of drafting is a
  `drafting.Drafting` (chosen by the tree builder, else by the drafter's
  `step_models.Capabilities.drafting`), a verifier a `verifiers.Verifier`, and a rule for a
  draft's shape an entry of `rules.RULES`.
  """

  sampling: sampling_lib.SamplingConfig
  max_new_tokens: int
  gamma: int = 0
  verifier: str = 'token'
  num_drafts: int = 1
  draft_stop: float | None = None
  unroll_draft: bool = False
  trace: bool = False
  proposal: str = 'sample'
  tree: TreeSpec | None = None

  def __post_init__(self):
    validation.check_sampling(self.sampling)
    validation.as_int('max_new_tokens', self.max_new_tokens, 1)
    validation.as_int('gamma', self.gamma, 0)
    validation.as_int('num_drafts', self.num_drafts, 1)
    if self.draft_stop is not None:
      stop = self.draft_stop
      if isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 < stop < 1:
        raise ValueError(f'draft_stop must be a number in (0, 1) or None, got {stop!r}.')
      if self.num_drafts != 1:
        raise ValueError(f'draft_stop needs num_drafts=1, got num_drafts={self.num_drafts}.')
      object.__setattr__(self, 'draft_stop', float(stop))
    if self.proposal not in PROPOSALS:
      raise ValueError(f'proposal must be one of {PROPOSALS}, got {self.proposal!r}.')
    if not isinstance(self.unroll_draft, (bool, np.bool_)):
      raise TypeError(f'unroll_draft must be a bool, got {self.unroll_draft!r}.')
    object.__setattr__(self, 'unroll_draft', bool(self.unroll_draft))
    verifiers.get(self.verifier).check(num_drafts=self.num_drafts, draft_stop=self.draft_stop)
    if self.tree is not None:
      check_tree(self)
    if self.greedy:  # one program for both verifiers: they keep the same tokens
      object.__setattr__(self, 'verifier', 'token')

  @property
  def greedy(self) -> bool:
    """True at temperature 0, where the loops compare argmax ids (module docstring)."""
    return self.sampling.greedy

  @property
  def buffer_length(self) -> int:
    if self.tree is not None:  # a tree pass writes N cache slots from n
      return buffer_length(self.max_new_tokens, max(self.gamma, self.tree.num_nodes - 1))
    return buffer_length(self.max_new_tokens, self.gamma)
