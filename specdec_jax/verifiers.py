"""The verifiers the decode loops run, as one registry: the loops read nothing else about them.

A `Verifier` declares its name, its kernel for one drafted path per row, its kernel for K paths
(or none), the state it carries from one iteration to the next (or none), and the settings it
cannot run with, checked by `check` wherever a config is checked (`decode.LoopSpec` for the loop's
settings; `check_drafter` for a drafter, which the main job calls for every row before the first
one runs). A new way of verifying is one `register` call:

  verifiers.register(verifiers.Verifier(name='mine', verify=my_kernel, ...))
  speculative_generate(..., verifier='mine')

Kernel signatures (axis legend: B batch, K paths, G gamma, V vocab; D the state's own shape):
  verify(rng, drafts i32[B, G], q f32[B, G, V], p f32[B, G+1, V], lengths i32[B] or None,
         state) -> (tau i32[B], y i32[B], state)
  multipath(rng, drafts i32[B, K, G], q f32[B, K, G, V], p f32[B, K, G+1, V])
         -> (path i32[B], tau i32[B], y i32[B])
  init_state(batch, gamma) -> the state before the first iteration (a pytree with leading axis B)
At temperature 0 every verifier keeps the longest prefix of drafts equal to the target's argmax
(docs/method.md), so the loops run one id-comparing program whatever the name (`LoopSpec`).
"""

import dataclasses
from collections.abc import Callable

from specdec_jax import step_models, verify, verify_greedy, verify_multipath
from specdec_jax.step_models import Capabilities


@dataclasses.dataclass(frozen=True)
class Verifier:
  """A verification rule the decode loops can run (module docstring: the kernels' signatures).

  Attributes:
    name: what `speculative_generate(verifier=...)` and the configs call it.
    verify: the kernel for one drafted path per row.
    multipath: the kernel for K > 1 paths per row, or None (K = 1 only).
    init_state: the carried state's initial value, or None: the verifier carries nothing.
    draft_stop: whether it verifies drafts cut short (`lengths`, adaptive draft length).
    context_free_drafter: whether it needs a drafter whose law at a node depends on the context
      alone (one reading the target's states, or a block drafter, depends on how the loop reached
      the node).
    why: the reason for its constraints, quoted in their errors.
  """

  name: str
  verify: Callable
  multipath: Callable | None = None
  init_state: Callable | None = None
  draft_stop: bool = True
  context_free_drafter: bool = False
  why: str = ''

  def check(self, *, num_drafts: int = 1, draft_stop=None) -> None:
    """Raises one ValueError naming the setting this verifier cannot run with."""
    if num_drafts > 1 and self.multipath is None:
      raise ValueError(
        f"verifier='{self.name}' verifies one drafted path per row: it needs num_drafts=1, got "
        f'{num_drafts}. {self.why}'
      )
    if draft_stop is not None and not self.draft_stop:
      raise ValueError(
        f"verifier='{self.name}' verifies gamma drafts per row: it needs draft_stop=None, got "
        f'{draft_stop}. {self.why}'
      )

  def check_drafter(self, drafter) -> None:
    """Raises one ValueError if this verifier cannot verify what the drafter drafts (its
    `step_models.Capabilities`, or its step model)."""
    if not self.context_free_drafter:
      return
    caps = step_models.capabilities(drafter) if not isinstance(drafter, Capabilities) else drafter
    if caps.block_size:
      how = 'a block drafter: its law at a node depends on where its block started'
    elif caps.drafting == 'lookup':
      how = 'a source lookup: its drafts follow one source match and may stop short'
    elif caps.reads_target_states:
      how = "a drafter reading the target's states: its row at a node depends on how the loop reached it"
    else:
      return
    raise ValueError(
      f"verifier='{self.name}' needs a drafter whose law at a node depends on the context alone; "
      f'this one is {how}. {self.why}'
    )


def _one_iteration(kernel):
  """A kernel of `verify.VERIFIERS`' signature as a registry kernel carrying no state."""

  def run(rng, drafts, q, p, lengths, state):
    tau, y = kernel(rng, drafts, q, p, lengths)
    return tau, y, state

  return run


def _greedy_block(rng, drafts, q, p, lengths, levels):
  del lengths  # gamma drafts always (draft_stop=False)
  return verify_greedy.greedy_block_verify(rng, drafts, q, p, levels)


REGISTRY: dict[str, Verifier] = {}


def register(verifier: Verifier) -> Verifier:
  """Adds `verifier` (or replaces the one of its name) and returns it."""
  REGISTRY[verifier.name] = verifier
  return verifier


def names() -> tuple[str, ...]:
  """The registered verifiers' names, in registration order."""
  return tuple(REGISTRY)


def get(name) -> Verifier:
  """The verifier called `name`; one ValueError naming the choices for anything else."""
  if not isinstance(name, str) or name not in REGISTRY:
    raise ValueError(f'Unknown verifier {name!r}; choose one of {sorted(REGISTRY)}.')
  return REGISTRY[name]


def check_verifier(name) -> str:
  """Returns `name` if it names a registered verifier, else raises (`get`'s error)."""
  return get(name).name


register(
  Verifier(
    name='token',
    verify=_one_iteration(verify.token_verify),
    multipath=verify_multipath.multipath_token_verify,
  )
)
register(
  Verifier(
    name='block',
    verify=_one_iteration(verify.block_verify),
    multipath=verify_multipath.multipath_block_verify,
  )
)
register(
  Verifier(
    name=verify_greedy.NAME,
    verify=_greedy_block,
    init_state=verify_greedy.empty_levels,
    draft_stop=False,
    context_free_drafter=True,
    why=(
      'Greedy block verification carries a residual law along one drafted path of gamma tokens, '
      "built from the drafter's rows at the next iteration's nodes (docs/method.md section 11)."
    ),
  )
)
