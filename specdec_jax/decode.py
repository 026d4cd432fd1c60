"""The public API of decoding: `generate` (autoregressive, the baseline) and
`speculative_generate` (lossless speculative decoding: a chain, K paths or a token tree), and
their abstract lowerings `lower_generate` / `lower_speculative`. Each validates its arguments
once, builds the `LoopSpec` (the loop's one static argument) and calls one jitted loop of
`decode_loop` (`autoregressive_loop`, `speculative_loop`: one `lax.while_loop` body for every
draft shape).

Axis legend: B batch, S source length, G gamma, V vocab, M max_new_tokens.

At temperature 0 (`sampling.greedy`) the loops never form a probability vector: p and q are
one-hot, so sampling is an argmax and every verifier reduces to comparing ids (`rules`: the
'greedy' entries); the tokens are identical to the general path's on the same one-hot vectors
(which `top_k=1` gives at any temperature: the tests compare the two). Every verifier is then one
program (`LoopSpec` normalizes it to 'token'; 'greedy_block' reduces to it too: docs/method.md
section 11).
"""

import jax

from specdec_jax import decode_loop, step_models, validation, verifiers
from specdec_jax import sampling as sampling_lib
from specdec_jax.decode_loop import autoregressive_loop, speculative_loop  # noqa: F401 (API)
from specdec_jax.decode_stats import (  # noqa: F401 (API)
  DecodeOutput,
  DecodeStats,
  SpeculativeTrace,
  to_host,
)
from specdec_jax.loop_spec import PROPOSALS, LoopSpec, TreeSpec, buffer_length  # noqa: F401 (API)
from specdec_jax.validation import NonFiniteError  # noqa: F401  (raised by the public functions)


def _autoregressive_call(model, input_ids, input_mask, *, sampling, max_new_tokens):
  """Validates `generate`'s arguments: ((steps, params, ids, mask), LoopSpec)."""
  steps, params = step_models.as_step_model(model)
  step_models.check_target(steps)
  validation.check_sampling(sampling)
  ids, mask, max_new_tokens = validation.check_inputs(steps, input_ids, input_mask, max_new_tokens)
  return (steps, params, ids, mask), LoopSpec(sampling=sampling, max_new_tokens=max_new_tokens)


def _speculative_call(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma,
  verifier,
  sampling,
  max_new_tokens,
  trace,
  num_drafts=1,
  draft_stop=None,
  unroll_draft=False,
  proposal='sample',
  tree=None,
):
  """Validates `speculative_generate`'s arguments: (the loop's arguments before rng, LoopSpec)."""
  gamma = validation.as_int('gamma', gamma, 1)
  verifiers.check_verifier(verifier)
  validation.check_sampling(sampling)
  target_steps, target_params = step_models.as_step_model(target)
  draft_steps, draft_params = step_models.as_step_model(drafter)
  step_models.check_target(target_steps)
  if draft_steps.vocab_size != target_steps.vocab_size:
    raise ValueError(
      f'Drafter and target vocabularies differ: drafter vocab_size='
      f'{draft_steps.vocab_size}, target vocab_size={target_steps.vocab_size}.'
    )
  step_models.check_state_reader(draft_steps, target_steps)
  step_models.check_block_drafter(draft_steps, gamma)
  step_models.check_encoder_reader(draft_steps, target_steps)
  ids, mask, max_new_tokens = validation.check_inputs(
    target_steps, input_ids, input_mask, max_new_tokens, drafter=draft_steps
  )
  spec = LoopSpec(
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    gamma=gamma,
    verifier=verifier,
    num_drafts=validation.as_int('num_drafts', num_drafts, 1),
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    trace=bool(trace),
    proposal=proposal,
    tree=tree,
  )
  decode_loop.check_models(spec, target_steps, draft_steps)
  return (target_steps, target_params, draft_steps, draft_params, ids, mask), spec


# eval_shape: no backend starts at import (jax.distributed.initialize must come first).
_ABSTRACT_KEY = jax.eval_shape(lambda: jax.random.key(0))


def generate(
  model,
  input_ids,
  input_mask,
  *,
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  rng: jax.Array,
  check_finite: bool = True,
) -> DecodeOutput:
  """Plain autoregressive decoding: one target call per token, the baseline.

  Args:
    model: a `T5Model` (or any step model, see `step_models.as_step_model`).
    input_ids: int[B, S] source tokens in [0, vocab_size), padded.
    input_mask: bool or 0/1 int[B, S], 1 for real tokens. A row with none (all 0, e.g. filling a
      batch) is decoded from an all-padding source: T5's attention then spreads evenly over the
      padding, so the row's output is finite but means nothing.
    sampling: the standardized sampling transform (temperature 0 is greedy).
    max_new_tokens: M >= 1, the most tokens per row.
    rng: a PRNG key, `jax.random.key(seed)`; may be None at temperature 0, where nothing is drawn
      (any other temperature raises ValueError).
    check_finite: raise `NonFiniteError` if the model produced NaN or inf logits (this waits for
      the result); False returns the output with `stats.nonfinite` counts instead.

  Returns:
    DecodeOutput with tokens int32[B, M], lengths int32[B], stats.target_calls.
  """
  args, spec = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  out = autoregressive_loop(*args, validation.check_rng(rng, sampling), spec=spec)
  return validation.raise_if_nonfinite(out, 'The model') if check_finite else out


def speculative_generate(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma: int,
  verifier: str = 'token',
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  rng: jax.Array,
  num_drafts: int = 1,
  draft_stop: float | None = None,
  unroll_draft: bool = False,
  trace: bool = False,
  check_finite: bool = True,
  proposal: str = 'sample',
  tree: TreeSpec | None = None,
) -> DecodeOutput:
  """Speculative decoding: output distributed exactly as `generate(target, ...)`.

  Each iteration the drafter proposes gamma tokens (a `lax.scan`), the target scores all gamma + 1
  prefixes in one call, and `verifier` keeps a prefix of the drafts plus one token. The whole loop
  is one `lax.while_loop` inside one jit; rows accept different numbers of drafts and stop
  independently at EOS or `max_new_tokens`. At temperature 0 both verifiers keep the longest
  prefix of drafts equal to the target's argmax, so in float32 the output is greedy `generate`'s,
  token for token. In bfloat16 it is greedy decoding of the target as its (gamma+1)-position
  pass computes it, which rounds differently from `generate`'s 1-position step: near-ties of the
  two most likely tokens can flip (7 of 256 shipped test sentences; tests/bfloat16_test.py).

  Args:
    target: the target `T5Model` (or step model).
    drafter: a `T5Model` sharing the target's vocabulary (one with `num_encoder_layers=0` reads
      the target's encoder output), an n-gram drafter from `drafters`, or the target itself.
    input_ids: int[B, S] source tokens in [0, vocab_size), padded.
    input_mask: bool or 0/1 int[B, S], 1 for real tokens. An all-0 row is decoded as `generate`
      decodes it (from an all-padding source), and speculative decoding is lossless on it as on
      any row (greedy: the same tokens).
    gamma: G >= 1 draft tokens per iteration.
    verifier: a name of `verifiers.REGISTRY`: 'token' (Leviathan et al.), 'block' (Sun et al.)
      or 'greedy_block' (Sun et al. App. C: more drafts kept per iteration, a residual law
      carried into the next; K = 1, no draft_stop, a drafter whose law depends on the context
      alone: not one reading the target's states, nor a block drafter).
    sampling: the transform applied identically to target and drafter logits.
    max_new_tokens: M >= 1, the most tokens per row.
    rng: a PRNG key, `jax.random.key(seed)`; may be None at temperature 0 (as `generate`'s).
    num_drafts: K >= 1 draft paths per iteration. K > 1: the drafter samples K independent
      paths of gamma tokens per row, one target pass scores all K x (gamma + 1) positions, and
      the verifier's `multipath` kernel keeps a prefix of one path ('block': greedy
      multi-path block verification; 'token': recursive rejection over the paths). Each row
      runs as K rows of both models (K times their caches). At temperature 0 the K paths are the
      drafter's one argmax path, so K > 1 adds work and no tokens.
    draft_stop: adaptive draft length: stop drafting after the first draft whose probability
      under the drafter's own softmax is below this threshold in (0, 1), and verify that shorter
      path (`LoopSpec.draft_stop`); None drafts gamma tokens every iteration. The target pass
      keeps its gamma + 1 positions (its cost does not shrink; the verifier ignores the rest).
    unroll_draft: unroll the draft's `lax.scan` (`LoopSpec.unroll_draft`): the same tokens, the
      drafter's gamma - 1 later calls inlined instead of a while loop, so an accelerator launches
      fewer kernels per iteration; compiling takes longer (the more so the larger gamma).
    trace: also return a `SpeculativeTrace` (drafts, accepted counts, corrected tokens of every
      iteration) in `out.trace`; off, the loop records nothing.
    check_finite: raise `NonFiniteError` if the target's logits or either model's probabilities
      held NaN or inf; False returns the output with `stats.nonfinite` counts instead.
    proposal: at temperature > 0, 'sample' draws each draft from the drafter's law q_i,
      'argmax' proposes q_i's most likely token with a one-hot q_i (both exact; 'sample' accepted
      more on the shipped pairs, block drafters included: docs/results.md section 10).
    tree: a `TreeSpec`, e.g. `TreeSpec(num_nodes=16)`: each iteration drafts a token tree of
      depth gamma (a block drafter's best-first or sampled tree, an autoregressive drafter's top-k),
      scores its nodes in one target pass and keeps one root path (`drafting`, `rules`; docs/method.md
      section 13). Other settings at their defaults; each misfit is one ValueError.

  A block drafter (a step model with `block_size`, e.g. a T5 with `T5Config.block_size`) proposes
  all gamma <= block_size drafts in one call (`decode_steps.draft_block`).

  Returns:
    DecodeOutput: tokens int32[B, M], lengths int32[B], per-row `DecodeStats`, and the trace.
  """
  args, spec = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=trace,
    num_drafts=num_drafts,
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    proposal=proposal,
    tree=tree,
  )
  out = speculative_loop(*args, validation.check_rng(rng, sampling), spec=spec)
  return validation.raise_if_nonfinite(out, 'The target or the drafter') if check_finite else out


def lower_generate(
  model, input_ids, input_mask, *, sampling: sampling_lib.SamplingConfig, max_new_tokens: int
) -> jax.stages.Lowered:
  """`generate`'s program lowered for these shapes, without running (or allocating) anything.

  `input_ids` / `input_mask` and the leaves of `model.params` may be `jax.ShapeDtypeStruct`s (with
  or without `sharding=`), e.g. `jax.eval_shape` of `t5.init_params` with shardings attached, so
  `.compile()` then `memory_analysis()` / `cost_analysis()` plan a model too large to build here.
  Arguments are validated as `generate` validates them, except the values of abstract inputs.
  """
  args, spec = _autoregressive_call(
    model, input_ids, input_mask, sampling=sampling, max_new_tokens=max_new_tokens
  )
  return autoregressive_loop.lower(*args, _ABSTRACT_KEY, spec=spec)


def lower_speculative(
  target,
  drafter,
  input_ids,
  input_mask,
  *,
  gamma: int,
  verifier: str = 'token',
  sampling: sampling_lib.SamplingConfig,
  max_new_tokens: int,
  num_drafts: int = 1,
  draft_stop: float | None = None,
  unroll_draft: bool = False,
  proposal: str = 'sample',
  tree: TreeSpec | None = None,
) -> jax.stages.Lowered:
  """`speculative_generate`'s program lowered for these shapes (trace off), without running it.

  Takes abstract inputs and params as `lower_generate` does; validates as `speculative_generate`.
  `unroll_draft` lowers the loop with its draft scan unrolled (`speculative_generate`'s): one
  while loop fewer, more kernels in the loop body's HLO and fewer launched per iteration.
  """
  args, spec = _speculative_call(
    target,
    drafter,
    input_ids,
    input_mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling,
    max_new_tokens=max_new_tokens,
    trace=False,
    num_drafts=num_drafts,
    draft_stop=draft_stop,
    unroll_draft=unroll_draft,
    proposal=proposal,
    tree=tree,
  )
  return speculative_loop.lower(*args, _ABSTRACT_KEY, spec=spec)
