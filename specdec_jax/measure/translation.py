"""Decoding a test set, timed: sentences in, a `Run` per method out (hypotheses, tokens, stats,
each batch's seconds and iterations), every batch decoded by each method in turn so that the
methods share one machine load (`translate_in_turn`). Tokenizing, building a mesh's global batch
and gathering outputs stay outside the timed calls (`timing.timed`). `evaluation` builds the main
job's rows on it; experiments call it directly.

Axis legend: B batch, S source length, M max_new_tokens.
"""

import contextlib
import dataclasses
import math
from collections.abc import Sequence

import jax
import numpy as np

from specdec_jax import decode, sharding, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.measure import timing

AUTOREGRESSIVE = 'autoregressive'


@dataclasses.dataclass
class Run:
  """One decoding method over the whole test set."""

  hypotheses: list[str]
  tokens: int  # tokens emitted
  stats: decode.DecodeStats  # pooled over all rows (`DecodeStats.summed`)
  # Per batch: decoding wall time (compilation excluded) and loop iterations (target calls of
  # its longest row). `loop_costs` fits them.
  batch_seconds: np.ndarray
  batch_iterations: np.ndarray
  # With `trace=True`: tau (drafts accepted) of every iteration in which a row was still
  # emitting, over all rows (int32[iterations]); else None.
  accepted_lengths: np.ndarray | None = None
  # Each source's emitted token ids (int32[its length]), in order: what losslessness compares.
  outputs: list[np.ndarray] = dataclasses.field(default_factory=list)

  @property
  def seconds(self) -> float:
    """Decoding wall time over all batches."""
    return float(np.sum(self.batch_seconds))


def loop_costs(seconds, iterations) -> tuple[float, float]:
  """(seconds per call before the first iteration, seconds per iteration) of a decode loop, by
  least squares of `seconds ~ fixed + per_iteration * iterations` over its calls (e.g. the
  sentences of a test set). This is what the loop really costs, the work around the model calls
  included; NaN when the calls do not differ in iterations."""
  seconds, iterations = np.asarray(seconds, np.float64), np.asarray(iterations, np.float64)
  if len(iterations) < 2 or np.ptp(iterations) == 0:
    return math.nan, math.nan
  design = np.stack([np.ones_like(iterations), iterations], axis=1)
  (fixed, per_iteration), *_ = np.linalg.lstsq(design, seconds, rcond=None)
  return float(fixed), float(per_iteration)


def translate(target, drafter, tokenizer, sources, *, method: str, **kw) -> Run:
  """`translate_in_turn` with one method ('autoregressive' or a verifier name): its Run."""
  return translate_in_turn(target, drafter, tokenizer, sources, methods=(method,), **kw)[method]


def translate_in_turn(
  target,
  drafter,
  tokenizer: tokenizer_lib.Tokenizer,
  sources: Sequence[str],
  *,
  methods: Sequence[str],
  gamma: int | None = None,
  sampling: sampling_lib.SamplingConfig,
  batch_size: int,
  max_source_length: int,
  max_new_tokens: int,
  seed: int = 0,
  on_batch=None,
  trace: bool = False,
  mesh=None,
  num_drafts: int = 1,
  draft_stop: float | None = None,
  proposal: str = 'sample',
  tree=None,
) -> dict[str, Run]:
  """Decodes `sources` batch by batch, each batch with every one of `methods` in turn (same rng),
  timing each call: {method: Run}.

  `methods` are 'autoregressive' and verifier names (`verifiers.REGISTRY`; `gamma` is needed
  with any of them). Timed in turn, batch
  by batch, `runs['autoregressive'].seconds / runs[verifier].seconds` compares the two under the
  same machine load, so slow drift on a shared machine cancels out, and one autoregressive
  baseline serves every verifier. Every batch is padded to [batch_size, max_source_length], so
  each method compiles once; a warm-up call of each on the first batch is made before timing.
  `on_batch(n)` is called after each method's batch of n sources (progress). `trace=True`
  (verifiers only) decodes with `speculative_generate(..., trace=True)` and fills
  `Run.accepted_lengths`; the trace's bookkeeping is then part of the timed work. `num_drafts`,
  `draft_stop`, `proposal` and `tree` are `speculative_generate`'s (K draft paths per iteration;
  adaptive length; how drafts are proposed at T > 0; a token tree per iteration).

  With a `mesh` (the models placed on it, see `pretrained.load`), each batch is split over its
  'data' axis and every process tokenizes only the rows its devices hold; outputs are gathered to
  every process, and each timed call starts after a barrier of all processes.

  Each batch is tokenized (and, on a mesh, built) once before its timed calls, and outputs reach
  the host after them: a timed call is the decode alone (`timing.timed`, which raises if it
  compiles anything).
  """
  check_methods(methods)
  if gamma is None and set(methods) != {AUTOREGRESSIVE}:
    raise ValueError(f'translate_in_turn needs gamma for the verifiers among {tuple(methods)}.')
  if trace and AUTOREGRESSIVE in methods:
    raise ValueError('trace=True needs speculative methods only (verifier names).')
  chunks = [sources[i : i + batch_size] for i in range(0, len(sources), batch_size)]

  def encode(texts):  # host work, before any timer: each batch once, for every method
    texts = list(texts) + [''] * (batch_size - len(texts))
    rows = lambda rows: tokenizer.encode_batch(
      [texts[i] for i in rows], max_source_length, truncate=True
    )
    return (
      rows(range(batch_size)) if mesh is None else sharding.global_batch(rows, batch_size, mesh)
    )

  def run_batch(batch, rng, method):
    kw = dict(sampling=sampling, max_new_tokens=max_new_tokens, rng=rng)
    with on_mesh(mesh):
      if method == AUTOREGRESSIVE:
        return decode.generate(target, *batch, **kw)
      return decode.speculative_generate(
        target, drafter, *batch, gamma=gamma, verifier=method, trace=trace,
        num_drafts=num_drafts, draft_stop=draft_stop, proposal=proposal, tree=tree, **kw,
      )  # fmt: skip

  if mesh is not None:
    sharding.check_batch(batch_size, mesh)
  first = encode(chunks[0])
  for method in methods:
    jax.block_until_ready(run_batch(first, jax.random.key(seed), method))
  outputs = {method: [] for method in methods}  # per batch: (host output, seconds, rows)
  for i, chunk in enumerate(chunks):
    batch, rng = encode(chunk), jax.random.key(seed + 1 + i)
    for method in methods:
      sharding.barrier('translate.timed')
      out, seconds = timing.timed(lambda: run_batch(batch, rng, method), f'{method} on batch {i}')
      outputs[method].append((decode.to_host(out), seconds, len(chunk)))
      if on_batch:
        on_batch(len(chunk))
  return {method: _gather(batches, tokenizer, trace) for method, batches in outputs.items()}


def _gather(batches, tokenizer, trace: bool) -> Run:
  """One method's Run from its batches: (host output, seconds, real rows) each."""
  hyps, lengths, stats, accepted, outputs = [], [], [], [], []
  for out, _, n in batches:
    hyps += [tokenizer.decode(row) for row in out.tokens[:n]]
    outputs += [row[:length] for row, length in zip(out.tokens[:n], out.lengths[:n])]
    lengths.append(out.lengths[:n])
    stats.append(jax.tree.map(lambda x: x[:n], out.stats))
    if trace:  # live iterations: a row still emitting appends at least one token
      live = out.trace.emitted[:n] > 0
      accepted.append(out.trace.num_accepted[:n][live])
  return Run(
    hyps,
    int(np.concatenate(lengths).sum()),
    jax.tree.map(lambda *x: np.concatenate(x), *stats).summed(),
    np.asarray([seconds for _, seconds, _ in batches]),
    np.asarray([int(np.max(out.stats.target_calls)) for out, _, _ in batches]),
    np.concatenate(accepted) if trace else None,
    outputs,
  )


def on_mesh(mesh):
  """`jax.set_mesh(mesh)` (turns on the models' activation constraints), or nothing for None."""
  return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def check_methods(methods: Sequence[str], what: str = 'methods') -> None:
  """Raises ValueError unless `methods` are distinct, each 'autoregressive' or a verifier name
  (`verifiers.check_verifier`)."""
  if not methods or len(set(methods)) != len(methods):
    raise ValueError(f'{what} must be distinct names, at least one; got {tuple(methods)}.')
  for method in methods:
    if method != AUTOREGRESSIVE:
      verifiers.check_verifier(method)
