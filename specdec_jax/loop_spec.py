"""What a decode loop is asked to do, checked once: `LoopSpec` (gamma, sampling, verifier, draft
paths, draft stop, proposal, tree, trace), and the token buffer and caches it sizes
(`buffer_length`). `decode`'s loops are jitted with a LoopSpec as their static argument."""

import dataclasses

import numpy as np

from specdec_jax import decode_tree, validation, verifiers
from specdec_jax import sampling as sampling_lib


def buffer_length(max_new_tokens: int, gamma: int) -> int:
  """Slots of the token buffer `seq` and of both decoder caches: M + G + 2.

  An iteration writes its G + 1 candidate tokens to seq[n + 1 .. n + G + 1] and the target pass
  writes cache positions n .. n + G. Rows that already finished still run (at n <= M), writing
  past their end where nothing is read, so the last slot touched is M + G + 1.
  """
  return max_new_tokens + gamma + 2


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
    tree: a `decode_tree.TreeSpec`: one token tree of depth gamma per row and iteration, one
      target pass over its nodes (`decode_tree`'s loop); None: a chain (or K paths).

  The loop's two extension points are registries it reads: a verifier is a
  `verifiers.Verifier`, a way of drafting a `decode_steps.Drafting` (chosen by the drafter:
  `decode_steps.drafting_of`).
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
  tree: decode_tree.TreeSpec | None = None

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
      decode_tree.check_loop(self)
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
