"""Timing loops: one compiled program per model shape, whatever the loop lengths; the per-call
seconds and cost ratios they report, on a fake clock."""

import collections
import dataclasses
import functools
import re
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from specdec_jax import step_models
from specdec_jax.measure import timed_loops, timing
from specdec_jax.models import t5
from tests import helpers

# Fake seconds of a timing loop run: fixed setup (dispatch), plus per call of the loop _STEP per
# position a model call scores (`repeated_steps`), or per iteration (`repeated_iterations`)
# _PASS_IN_LOOP, _DRAFT per drafter call of its draft, and _FIRST_DRAFT once when it drafts (the
# draft's first call feeds two positions, and reloads what the pass evicted).
# _PASS_IN_LOOP is not (gamma+1) * _STEP, so a c taken as (iteration - separately timed pass) /
# gamma reads another value than one from the iteration with and without its drafter calls.
_SETUP, _STEP, _PASS_IN_LOOP, _DRAFT, _FIRST_DRAFT = 2e-3, 1e-3, 5e-3, 4e-4, 7e-4
_TREE_NODE = 1.4e-3  # per node of a tree pass (`repeated_tree_passes`): not a chain's _STEP
_ITERATION_2 = _PASS_IN_LOOP + 2 * _DRAFT + _FIRST_DRAFT  # a fake iteration at gamma 2


def _run(per_call, loop_length):
  """Fake seconds of one run of a loop of `loop_length` iterations."""
  return _SETUP + per_call * loop_length


def _iteration_seconds(kw):
  """Fake seconds of one iteration of `repeated_iterations(**kw)`: its draft of `draft_length`
  drafter calls (none at 0) and the pass."""
  calls = kw['draft_length']
  return _PASS_IN_LOOP + (calls > 0) * _FIRST_DRAFT + calls * _DRAFT


@pytest.fixture
def fake_clock(monkeypatch):
  """timing's clock made exact: the jitted loops still compile and run (compiles are counted),
  and each run advances the clock by the fake seconds above for the loop length it was given."""
  now = [0.0]

  def spy(real, per_call):
    def run(*args, **kwargs):
      out = real(*args, **kwargs)
      now[0] += _SETUP + per_call(kwargs) * int(kwargs['loop_length'])
      return out

    return run

  monkeypatch.setattr(timing, 'time', types.SimpleNamespace(perf_counter=lambda: now[0]))
  steps, iterations = timed_loops.repeated_steps, timed_loops.repeated_iterations
  monkeypatch.setattr(
    timed_loops, 'repeated_steps', spy(steps, lambda kw: _STEP * kw['num_tokens'])
  )
  monkeypatch.setattr(timed_loops, 'repeated_iterations', spy(iterations, _iteration_seconds))
  tree_seconds = lambda kw: _TREE_NODE * kw['tree'].tokens.shape[1]  # the tree: [B, N]
  monkeypatch.setattr(
    timed_loops, 'repeated_tree_passes', spy(timed_loops.repeated_tree_passes, tree_seconds)
  )
  return steps, iterations  # the real jitted loops


@pytest.mark.usefixtures('fake_clock')  # the loops still compile and run, on the fake clock
def test_step_and_iteration_timers_compile_once_per_shape(tiny_pair):
  target, drafter = tiny_pair
  kw = dict(batch_size=1, source_length=8, cache_len=32, repeats=1)
  with timing.compiles() as compiled:
    for loop_lengths in [(2, 6), (3, 9)]:
      # Per call: the slope between the two loop lengths (setup cancels). Fails if a loop ignores
      # its length (0), if the difference is not divided by the extra calls (4-6x), or if the
      # lengths are swapped (clamped to 0).
      assert timing.step_seconds(target, loop_lengths=loop_lengths, **kw) == pytest.approx(_STEP)
      assert timing.iteration_seconds(
        target, drafter, gamma=2, loop_lengths=loop_lengths, **kw
      ) == pytest.approx(_ITERATION_2)
      # The drafter's calls in the loop: the iteration without its draft, with it, and with a
      # draft 16 calls longer (`test_step_costs_c_is_the_drafters_calls_in_the_loop` checks c).
      timing.step_costs(target, drafter, gamma=2, loop_lengths=loop_lengths, rounds=1, **kw)
  # Two loop lengths, one program: a step loop each for the target's step (as `step_seconds`'),
  # its 3-position pass and the drafter's step; iterations without the draft, with it, and with a
  # longer one (static draft lengths, no traced branch): three programs.
  loops = collections.Counter(n for n in compiled if n.startswith('jit(repeated_'))
  assert loops == {'jit(repeated_steps)': 3, 'jit(repeated_iterations)': 3}, compiled


def test_step_costs_c_is_the_drafters_calls_in_the_loop(fake_clock, tiny_pair):
  target, drafter = tiny_pair
  costs = timing.step_costs(
    target, drafter, batch_size=1, source_length=8, gamma=2, cache_len=32, rounds=2, repeats=2,
    loop_lengths=(2, 6),
  )  # fmt: skip
  # Seconds: slopes between the two loop lengths, setup cancelled.
  assert costs['target_step'] == pytest.approx(_STEP)
  assert costs['target_pass'] == pytest.approx(3 * _STEP)
  assert costs['iteration'] == pytest.approx(_ITERATION_2)
  assert costs['c_alone'] == pytest.approx(1.0)  # a ratio of slopes
  # c: what a drafter call adds to a 6-iteration run (16 calls more per iteration) over a
  # 6-step run: 0.4 steps but for the step run's setup (0.379); c_fixed: what the first draft adds
  # beyond its calls (0.7 steps, 0.663). Fails if c is taken from the separately timed pass
  # ((6.5 - 3) / 2 = 1.75), from the iteration with and without its draft (0.71: the first
  # draft's extra spread over gamma), is not per drafter call (x2), is c_alone (1.0), clamps a
  # positive difference to 0, or divides by the step's slope (0.4).
  long_step = _run(_STEP, 6)
  assert costs['c'] == pytest.approx(6 * _DRAFT / long_step)
  assert costs['c_fixed'] == pytest.approx(6 * _FIRST_DRAFT / long_step)
  assert costs['pass_cost'] == pytest.approx(_run(3 * _STEP, 6) / long_step)


def test_step_costs_of_a_tree_time_the_trees_pass(fake_clock, tiny_pair):
  # A token tree's row: the pass is one over a tree of N = 5 nodes (`repeated_tree_passes`, 7 ms
  # here, unlike a chain of any width), the drafter's costs the chain's at gamma = its depth.
  # Fails if the pass stays the gamma + 1 positions' (3 ms), has other nodes, or the drafter's
  # costs move.
  target, drafter = tiny_pair
  kw = dict(batch_size=1, source_length=8, gamma=2, cache_len=32, rounds=1, repeats=1)
  costs = timing.step_costs(target, drafter, loop_lengths=(2, 6), tree_nodes=5, **kw)
  long_step = _run(_STEP, 6)
  assert costs['target_pass'] == pytest.approx(5 * _TREE_NODE)
  assert costs['pass_cost'] == pytest.approx(_run(5 * _TREE_NODE, 6) / long_step)
  assert costs['c'] == pytest.approx(6 * _DRAFT / long_step)
  assert costs['c_fixed'] == pytest.approx(6 * _FIRST_DRAFT / long_step)
  with pytest.raises(ValueError, match='nodes >= 2'):
    timing.step_costs(target, drafter, tree_nodes=1, **kw)
  with pytest.raises(ValueError, match='num_drafts must be 1'):
    timing.step_costs(target, drafter, tree_nodes=5, num_drafts=2, **kw)
  with pytest.raises(ValueError, match='no room for a pass of 30 nodes'):
    timing.step_costs(target, drafter, tree_nodes=30, **kw)


def test_c_fixed_is_reported_as_measured_below_zero(fake_clock, tiny_pair, monkeypatch):
  # An unrolled draft can cost less than gamma of the calls that measure c (its purpose): c_fixed
  # is then negative, and reported so (a clamp at 0 read 0.0 here and biased noise upward).
  monkeypatch.setitem(globals(), '_FIRST_DRAFT', -3e-4)
  target, drafter = tiny_pair
  costs = timing.step_costs(
    target, drafter, batch_size=1, source_length=8, gamma=2, cache_len=32, rounds=1, repeats=1,
    loop_lengths=(2, 6),
  )  # fmt: skip
  long_step = _run(_STEP, 6)
  assert costs['c'] == pytest.approx(6 * _DRAFT / long_step)
  assert costs['c_fixed'] == pytest.approx(6 * -3e-4 / long_step)
  assert costs['iteration'] == pytest.approx(_PASS_IN_LOOP + 2 * _DRAFT - 3e-4)


@pytest.mark.slow  # ~30 CPU-s: 8 timed programs, 15 runs each
def test_a_deeper_drafter_reads_a_larger_c():
  """Real clock: c of a drafter with 8 decoder layers against the same drafter with 1 (same
  target, gamma, shapes). Its calls cost several times more; a c that did not measure the
  drafter's calls (noise around a difference of separately timed programs, a fixed cost per
  iteration) fails. The target is big enough (d_model 256) that its step times well above zero."""
  target = helpers.tiny_t5(
    'tiny-v1.1', vocab_size=2000, d_model=256, d_kv=64, d_ff=1024, num_encoder_layers=1,
    num_decoder_layers=2,
  )  # fmt: skip
  kw = dict(batch_size=1, source_length=8, gamma=3, cache_len=32, rounds=1, repeats=15)
  costs = {
    layers: timing.step_costs(
      target, helpers.tiny_t5('tiny-v1.0', seed=1, vocab_size=2000, num_decoder_layers=layers), **kw
    )
    for layers in (1, 8)
  }
  # A drafter call's seconds in the loop (c x the target step, each measured beside the other):
  # 4.5-9x deeper in three runs on a loaded 2-core machine. Then c itself, over steps that move.
  seconds = {layers: cost['c'] * cost['target_step'] for layers, cost in costs.items()}
  assert seconds[8] > 3 * seconds[1] > 0, costs
  assert costs[8]['c'] > costs[1]['c'], costs


def test_the_guard_fails_a_timed_call_that_slices_a_device_array_per_length():
  # Negative control: `x[0, :n]` of a device array compiles small programs for each new n (what
  # hf_peer's autoregressive row paid inside its timer: a dynamic_slice, and an index program that
  # another test in the same worker may have compiled already); gathered to the host first, the
  # same outputs compile nothing.
  x = jnp.arange(64, dtype=jnp.int32).reshape(2, 32)
  lengths = iter(range(3, 9))
  with pytest.raises(timing.CompiledWhileTimed, match=r'compiled [12] program\(s\).*dynamic_slice'):
    timing.timed(lambda: x[0, : next(lengths)], 'slicing')
  on_host = lambda: np.asarray(x)[0, : next(lengths)]
  np.testing.assert_array_equal(timing.timed(on_host)[0], np.arange(4))
  out, seconds = timing.timed(on_host)
  assert out.shape == (5,) and seconds >= 0
  # `compiles` names what compiled; a jitted function compiles on its first call only.
  double = jax.jit(lambda v: v * 2)
  with timing.compiles() as first:
    double(x)
  with timing.compiles() as again:
    double(x)
  assert len(first) == 1 and 'jit(<lambda>)' in first[0] and again == []
  # `time_call`'s first call may compile; its timed repeats may not.
  plus = jax.jit(lambda v: v + 3)
  assert timing.time_call(lambda: plus(x), 2)[0] > 0
  with pytest.raises(timing.CompiledWhileTimed):
    timing.time_call(lambda: jax.jit(lambda v: v + 3)(x), 1)  # a new jit object each call


def _one_row_output_layers(compiled_text: str, vocab: int) -> int:
  """Dots of a compiled program that produce one row of `vocab` logits: drafter output layers at
  batch 1 (the target's pass produces gamma + 1 rows)."""
  return len(re.findall(rf'= f32\[(?:1,)*{vocab}\]\{{[\d,]*\}} dot\(', compiled_text))


def test_iteration_timer_keeps_every_drafter_output_layer(xla_cpu_defaults):
  # The timing loop discarded the first drafter call's logits once; XLA then dropped that call's
  # output layer and in-loop c read 2-4x low. Each draft is now the argmax of its call's logits.
  vocab = 1000  # a size no other axis has
  target_config = dataclasses.replace(  # one layer a side: the target's depth does not matter here
    t5.CONFIGS['tiny-v1.1'], vocab_size=vocab, num_encoder_layers=1, num_decoder_layers=1
  )
  configs = target_config, dataclasses.replace(
    target_config, d_model=8, d_kv=4, num_heads=2, d_ff=16, num_encoder_layers=0,
    num_decoder_layers=1, encoder_dim=target_config.d_model,
  )  # fmt: skip
  target, drafter = (helpers.tiny_t5(config, seed) for seed, config in enumerate(configs))
  ids = jnp.full((1, 8), 3, jnp.int32)
  pair = step_models.as_step_model(target), step_models.as_step_model(drafter)
  args = [*pair[0], *pair[1]]
  args += [
    timed_loops.model_cache(pair[0], None, ids, 16),
    timed_loops.model_cache(pair[1], pair[0], ids, 16),
  ]
  args += [jnp.full((1,), 4, jnp.int32)]
  # The draft's first call (one position's logits: `step_at`) and its scan's call: one output
  # layer each; unrolled, one per call. The program has the decode loop's structure: its while
  # loop, the draft's scan (none unrolled or without a draft) and no branch.
  for draft_length, unroll, layers, loops in ((3, False, 2, 2), (3, True, 3, 1), (0, False, 0, 1)):
    text = timed_loops.repeated_iterations.lower(
      *args, gamma=3, draft_length=draft_length, cache_len=16, unroll_draft=unroll,
      loop_length=jnp.int32(2),
    ).compile().as_text()  # fmt: skip
    assert _one_row_output_layers(text, vocab) == layers, (draft_length, unroll)
    assert len(re.findall(r' while\(', text)) == loops and ' conditional(' not in text
  # Negative control: a program that discards its first call's logits has one output layer less.
  steps, params = step_models.as_step_model(drafter)
  encoded = target.steps.encode(target.params, jnp.full((1, 8), 3, jnp.int32), jnp.ones((1, 8)))

  def two_calls(params, encoded, discard):
    cache = steps.init_cache(params, encoded, jnp.ones((1, 8), jnp.int32), 16)
    tokens = jnp.full((1, 2), 3, jnp.int32)
    first, _, cache = steps.step_at(params, tokens, None, cache, jnp.ones((1,), jnp.int32))
    second = steps.step(params, jnp.full((1, 1), 3, jnp.int32), cache)[0]
    return second if discard else second + first

  for discard, layers in ((True, 1), (False, 2)):
    control = jax.jit(functools.partial(two_calls, discard=discard)).lower(params, encoded)
    assert _one_row_output_layers(control.compile().as_text(), vocab) == layers


@pytest.mark.slow  # ~25 CPU-s
def test_timers_run_a_drafter_that_reads_the_target_states(fake_clock, tiny_pair):
  """An EAGLE-style drafter is timed as the loop runs it (`decode_steps.draft` with the last pass's
  states; its bare step reads zero states), and such a drafter cannot be timed by `step` alone."""
  target, _ = tiny_pair
  drafter = helpers.tiny_t5(
    'tiny-v1.0', seed=1, num_encoder_layers=0, encoder_dim=32, feature_dim=32,
    num_decoder_layers=1,
  )  # fmt: skip
  kw = dict(batch_size=1, source_length=8, cache_len=32, repeats=1, loop_lengths=(1, 3))
  assert timing.step_seconds(drafter, target=target, **kw) == pytest.approx(_STEP)
  assert timing.iteration_seconds(target, drafter, gamma=2, **kw) == pytest.approx(_ITERATION_2)
  costs = timing.step_costs(target, drafter, gamma=2, rounds=1, **kw)
  assert costs['c'] == pytest.approx(3 * _DRAFT / _run(_STEP, 3))
  assert costs['c_fixed'] == pytest.approx(3 * _FIRST_DRAFT / _run(_STEP, 3))
  assert costs['c_alone'] == pytest.approx(1.0)


def _has_source_self_attention(compiled_text: str, source_length: int) -> bool:
  """Whether a compiled program holds [.., S, S] attention scores: the encoder's self-attention
  over the source (the decoder's cross-attention scores are [.., T, S] with T < S here)."""
  return re.search(rf'f32\[[0-9,]*{source_length},{source_length}\]', compiled_text) is not None


def test_timed_loops_do_not_run_the_encoder(tiny_pair):
  # The encoder once ran inside both loop lengths; at source 256 its noise swamped the difference
  # of cheap drafter calls (c_alone read 0). It now runs once in `_init_cache`, before timing.
  target, drafter = tiny_pair
  source = 24  # a size no other axis has
  ids = jnp.full((1, source), 3, jnp.int32)
  target, drafter = step_models.as_step_model(target), step_models.as_step_model(drafter)
  steps, params = target
  cache = timed_loops.model_cache(target, None, ids, 16)
  position = jnp.full((1,), 4, jnp.int32)
  lowered = timed_loops.repeated_steps.lower(
    steps, params, cache, position, num_tokens=1, loop_length=jnp.int32(2)
  )
  assert not _has_source_self_attention(lowered.compile().as_text(), source)
  args = [*target, *drafter, cache, timed_loops.model_cache(drafter, target, ids, 16), position]
  lowered = timed_loops.repeated_iterations.lower(
    *args, gamma=2, draft_length=2, cache_len=16, unroll_draft=False, loop_length=jnp.int32(2)
  )
  assert not _has_source_self_attention(lowered.compile().as_text(), source)
  # Negative control: the set-up program, which encodes the source, has them.
  encoder = step_models.encoder_of(target)  # (steps, params)
  setup = timed_loops.init_cache.lower(steps, params, *encoder, ids, cache_len=16).compile()
  assert _has_source_self_attention(setup.as_text(), source)
