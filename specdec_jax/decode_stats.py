"""What the decode loops return: `DecodeStats` (per-row counters: alpha, block efficiency),
`DecodeOutput` and the per-iteration `SpeculativeTrace`, and `to_host`, which reads any of them
on every process of a multi-host run. Re-exported by `decode`.

Axis legend: B batch, G gamma, I iterations, M max_new_tokens.
"""

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters of one decoding call (all shaped [B] unless stated).

  Built by `DecodeStats.zeros`, advanced by `accumulate` once per loop iteration, read through the
  properties; `summed()` pools the rows (e.g. over a whole test set) before reading them.

  Attributes:
    target_calls: int32[B] target forward passes while the row was still emitting.
    drafted: int32[B] draft tokens proposed and verified (gamma per target call, fewer for a
      drafter that stops early).
    accepted: int32[B] draft tokens accepted by the verifier.
    accepted_per_position: int32[B, G] times the draft at position i (0-based) was accepted.
    beta_sum: float32[B] sum of beta = sum_x min(p, q) over verified positions (i <= tau + 1).
    beta_count: int32[B] number of verified positions.
    nonfinite: int32[B] target calls whose logits or probabilities held a NaN or inf (never a
      silent answer: `generate` / `speculative_generate` raise when it is nonzero, unless asked
      not to).
    first_calls: int32[B] 1 once the row's first iteration ran (summed: rows).
    first_accepted: int32[B] drafts accepted in the row's first iteration, which every verifier
      starts from the target's own law (greedy block verification's per-block optimum).
  """

  target_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  accepted_per_position: jax.Array
  beta_sum: jax.Array
  beta_count: jax.Array
  nonfinite: jax.Array
  first_calls: jax.Array
  first_accepted: jax.Array

  @classmethod
  def zeros(cls, batch: int, gamma: int) -> 'DecodeStats':
    zero = jnp.zeros((batch,), jnp.int32)
    return cls(
      target_calls=zero,
      drafted=zero,
      accepted=zero,
      accepted_per_position=jnp.zeros((batch, gamma), jnp.int32),
      beta_sum=jnp.zeros((batch,), jnp.float32),
      beta_count=zero,
      nonfinite=zero,
      first_calls=zero,
      first_accepted=zero,
    )

  def accumulate(
    self,
    active: jax.Array,
    num_accepted: jax.Array,
    beta: jax.Array,
    nonfinite: jax.Array,
    num_drafted: jax.Array | None = None,
  ) -> 'DecodeStats':
    """Adds one target call for the `active` rows.

    Args:
      active: bool[B] rows still emitting before this call.
      num_accepted: int32[B] tau, drafts accepted (0 for autoregressive decoding).
      beta: float32[B, G] beta of each draft position; positions after tau + 1 were never
        verified and are not counted. [B, 0] for autoregressive decoding.
      nonfinite: bool[B] rows whose logits or probabilities held a NaN or inf in this call.
      num_drafted: int32[B] drafts verified per row when the drafter stopped early (positions
        past them are not counted); None: all G.
    """
    gamma = beta.shape[1]
    a = active.astype(jnp.int32)
    first = a * (self.target_calls == 0)
    position = jnp.arange(gamma)
    verified = (position <= num_accepted[:, None]) & active[:, None]
    drafted = gamma
    if num_drafted is not None:
      verified &= position < num_drafted[:, None]
      drafted = num_drafted
    return DecodeStats(
      target_calls=self.target_calls + a,
      drafted=self.drafted + drafted * a,
      accepted=self.accepted + num_accepted * a,
      accepted_per_position=self.accepted_per_position
      + (position < num_accepted[:, None]) * a[:, None],
      beta_sum=self.beta_sum + jnp.where(verified, beta, 0.0).sum(-1),
      beta_count=self.beta_count + verified.sum(-1),
      nonfinite=self.nonfinite + (nonfinite & active),
      first_calls=self.first_calls + first,
      first_accepted=self.first_accepted + num_accepted * first,
    )

  def summed(self) -> 'DecodeStats':
    """The counters summed over rows (scalars; [G] per position): pooled alpha and efficiency."""
    return jax.tree.map(lambda x: jnp.sum(x, axis=0), self)

  @property
  def block_efficiency(self) -> jax.Array:
    """float32[B]: mean tokens emitted per target call, (accepted + calls) / calls."""
    calls = jnp.maximum(self.target_calls, 1)
    return (self.accepted + self.target_calls) / calls

  @property
  def first_block_efficiency(self) -> jax.Array:
    """float32[B]: tokens emitted by the first iteration, (first_accepted + 1), per row that ran
    one (summed: the mean over rows)."""
    return (self.first_accepted + self.first_calls) / jnp.maximum(self.first_calls, 1)

  @property
  def alpha(self) -> jax.Array:
    """float32[B]: measured acceptance rate, the mean of beta over verified positions."""
    return self.beta_sum / jnp.maximum(self.beta_count, 1)


@flax.struct.dataclass
class DecodeOutput:
  """tokens int32[B, M] (PAD after the end), lengths int32[B] (EOS included), stats, and the
  per-iteration `SpeculativeTrace` when `speculative_generate(..., trace=True)` (else None)."""

  tokens: jax.Array
  lengths: jax.Array
  stats: DecodeStats
  trace: Any = None


@flax.struct.dataclass
class SpeculativeTrace:
  """What each iteration of a speculative run did, per row (I = max_new_tokens iterations at most;
  an iteration emits at least one token for every row still emitting).

  Attributes:
    drafts: int32[B, I, G] the drafted tokens X_1..X_G.
    num_accepted: int32[B, I] tau, the drafts kept.
    next_token: int32[B, I] Y, the corrected (tau < G) or extra (tau = G) token.
    emitted: int32[B, I] tokens the iteration appended to the row (0 once it had stopped; fewer
      than tau + 1 when EOS or the token limit cut the block).
  """

  drafts: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array
  emitted: jax.Array

  @classmethod
  def zeros(cls, batch: int, iterations: int, gamma: int) -> 'SpeculativeTrace':
    """A trace of `iterations` columns, none filled yet."""
    column = lambda *shape: jnp.zeros((batch, iterations) + shape, jnp.int32)
    return cls(drafts=column(gamma), num_accepted=column(), next_token=column(), emitted=column())

  def record(self, iteration, drafts, tau, y, emitted) -> 'SpeculativeTrace':
    """This trace with column `iteration` (int32[]) filled: drafts int32[B, G]; tau, y and
    emitted int32[B]."""
    at = lambda field, value: field.at[:, iteration].set(value)
    return SpeculativeTrace(
      drafts=at(self.drafts, drafts),
      num_accepted=at(self.num_accepted, tau),
      next_token=at(self.next_token, y),
      emitted=at(self.emitted, emitted),
    )


def spans_processes(x) -> bool:
  """True for a `jax.Array` with shards on devices of other processes (np.asarray would fail)."""
  return isinstance(x, jax.Array) and not x.is_fully_addressable


def to_host(tree):
  """`tree` (a `DecodeOutput`, `DecodeStats` or any pytree of arrays) with every array as host
  numpy, the same full value on every process.

  An array spanning devices of several processes is gathered (`process_allgather`, a collective:
  every process must call this, in the same order); any other array is read with `np.asarray`.
  """
  return jax.tree.map(
    lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
    if spans_processes(x)
    else np.asarray(x),
    tree,
  )
