"""Tests of the trace renderer: the trace reproduces the output, the colours and markers are where
the verifier put them, the figure has one text row per iteration, and trace=False records nothing.
"""

import io
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from matplotlib import colors
from matplotlib import figure as figure_lib

from specdec_jax import decode
from specdec_jax import sampling as sampling_lib
from specdec_jax.data import tokenizer as tokenizer_lib
from specdec_jax.measure import traces
from tests import fakes

TARGET = fakes.random_markov(seed=41, vocab_size=8, positions=40, eos_id=1)
DRAFTER = fakes.random_markov(seed=42, vocab_size=8, positions=40, eos_id=1, scale=0.8)
ROWS, MAX_NEW, GAMMA = 64, 20, 3
SPM = pathlib.Path(__file__).resolve().parents[1] / 'pretrained' / 'ende' / 'spm.model'


def _traced_run(verifier, temperature, *, drafter=DRAFTER, gamma=GAMMA):
  ids, mask = jnp.zeros((ROWS, 1), jnp.int32), jnp.ones((ROWS, 1), jnp.int32)
  return decode.speculative_generate(
    TARGET,
    drafter,
    ids,
    mask,
    gamma=gamma,
    verifier=verifier,
    sampling=sampling_lib.SamplingConfig(temperature=temperature),
    max_new_tokens=MAX_NEW,
    rng=jax.random.key(3),
    trace=True,
  )


@pytest.mark.parametrize('temperature', [0.0, 1.0])
@pytest.mark.parametrize('verifier', ['token', 'block'])
def test_trace_reproduces_the_output(verifier, temperature):
  """Accepted drafts + Y, cut by `emitted`, concatenated over iterations, are the row's tokens."""
  out = _traced_run(verifier, temperature)
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  kinds = set()
  for row in range(ROWS):
    steps = traces.iterations(out.trace, row)
    rebuilt = []
    for step in steps:
      rebuilt += (step['accepted'] + [step['next_token']])[: step['emitted']]
      kinds.add('cut' if step['cut'] else 'extra' if step['rejected'] is None else 'rejected')
    assert rebuilt == tokens[row, : lengths[row]].tolist(), f'row {row}'
    assert len(steps) == int(out.stats.target_calls[row])
    assert sum(len(s['accepted']) for s in steps) == int(out.stats.accepted[row])
    # Emitting iterations come first; the row then stays stopped.
    assert np.count_nonzero(np.asarray(out.trace.emitted[row])) == len(steps)
    assert np.asarray(out.trace.emitted[row, len(steps) :]).sum() == 0
  if temperature > 0:  # greedy rows are all alike: the fakes ignore the source
    # Not vacuous: rejections, all-accepted iterations and blocks cut by EOS all occurred.
    assert kinds == {'cut', 'extra', 'rejected'}


def test_target_as_drafter_trace_is_all_extra_tokens():
  out = _traced_run('token', 1.0, drafter=TARGET)
  for row in range(4):
    for step in traces.iterations(out.trace, row)[:-1]:  # only the last may be cut
      assert step['rejected'] is None and len(step['accepted']) == GAMMA and not step['cut']


def test_trace_off_returns_none():
  ids, mask = jnp.zeros((2, 1), jnp.int32), jnp.ones((2, 1), jnp.int32)
  out = decode.speculative_generate(
    TARGET,
    DRAFTER,
    ids,
    mask,
    gamma=GAMMA,
    sampling=sampling_lib.SamplingConfig(temperature=1.0),
    max_new_tokens=8,
    rng=jax.random.key(0),
  )
  assert out.trace is None
  with pytest.raises(ValueError, match='trace=True'):
    traces.iterations(out.trace, 0)


def _while_carry_shapes(trace: bool) -> list[tuple[int, ...]]:
  """Shapes carried by the decode loop's `while`, traced (not run) with `trace` static."""
  batch, max_new = 2, 8

  spec = decode.LoopSpec(
    sampling=sampling_lib.SamplingConfig(temperature=1.0),
    max_new_tokens=max_new,
    gamma=GAMMA,
    trace=trace,
  )

  def loop(target_params, draft_params, ids, mask, rng):
    return decode.speculative_loop(
      TARGET.steps, target_params, DRAFTER.steps, draft_params, ids, mask, rng, spec=spec
    )

  ids = jnp.zeros((batch, 1), jnp.int32)
  jaxpr = jax.make_jaxpr(loop)(TARGET.params, DRAFTER.params, ids, ids, jax.random.key(0))
  (jit_eqn,) = jaxpr.eqns  # the jitted loop
  (loop_eqn,) = [e for e in jit_eqn.params['jaxpr'].eqns if e.primitive.name == 'while']
  return sorted(v.aval.shape for v in loop_eqn.outvars)


def test_trace_off_is_not_in_the_program():
  """`trace` is static: off, the while loop carries no trace arrays at all (nothing to pay)."""
  off, on = _while_carry_shapes(False), _while_carry_shapes(True)
  extra = list(on)
  for shape in off:
    extra.remove(shape)
  assert sorted(extra) == sorted([(2, 8, GAMMA), (2, 8), (2, 8), (2, 8)])


# ---------------------------------------------------------------------------------------------
# Rendering a hand-made trace whose every kind of token is known.


def _hand_trace():
  """One row, gamma 3, three iterations (and an unused fourth slot).

  1: drafts 5 6 7, tau 1, Y 9, emitted 2           -> 5 [6] <9>
  2: drafts 4 4 3, tau 3, Y 2, emitted 4           -> 4 4 3 <+2>
  3: drafts 1 6 6, tau 2, Y 7, emitted 1 (EOS 1)   -> 1 (6) [6] (7)
  """
  return decode.SpeculativeTrace(
    drafts=np.array([[[5, 6, 7], [4, 4, 3], [1, 6, 6], [0, 0, 0]]], np.int32),
    num_accepted=np.array([[1, 3, 2, 0]], np.int32),
    next_token=np.array([[9, 2, 7, 0]], np.int32),
    emitted=np.array([[2, 4, 1, 0]], np.int32),
  )


def test_iterations_of_hand_trace():
  steps = traces.iterations(_hand_trace(), 0)
  assert [s['accepted'] for s in steps] == [[5], [4, 4, 3], [1, 6]]
  assert [s['rejected'] for s in steps] == [6, None, 6]
  assert [s['next_token'] for s in steps] == [9, 2, 7]
  assert [s['tokens'] for s in steps] == [[5, 9], [4, 4, 3, 2], [1]]
  assert [s['cut'] for s in steps] == [False, False, True]
  with pytest.raises(ValueError, match='row must be in'):
    traces.iterations(_hand_trace(), 1)


def test_format_plain_markers():
  text = traces.format_trace(_hand_trace(), 0, color=False)
  assert text.splitlines() == ['1  5 [6] <9>', '2  4 4 3 <+2>', '3  1 (6) [6] (7)']


def test_format_ansi_colours():
  green, red_struck, blue, bold_blue, dim, reset = (
    '\x1b[32m',
    '\x1b[31;9m',
    '\x1b[34m',
    '\x1b[1;34m',
    '\x1b[2m',
    '\x1b[0m',
  )
  lines = traces.format_trace(_hand_trace(), 0).splitlines()
  assert lines[0] == f'1  {green}5{reset} {red_struck}6{reset} {blue}9{reset}'
  assert lines[1] == (f'2  {green}4{reset} {green}4{reset} {green}3{reset} {bold_blue}2{reset}')
  assert lines[2] == f'3  {green}1{reset} {dim}6{reset} {red_struck}6{reset} {dim}7{reset}'


def test_format_with_sentencepiece_pieces():
  tokenizer = tokenizer_lib.Tokenizer.load(str(SPM))
  ids = tokenizer.encode('Das Haus ist klein.', add_eos=False)
  trace = decode.SpeculativeTrace(
    drafts=np.array([[ids[:3]]], np.int32),
    num_accepted=np.array([[2]], np.int32),
    next_token=np.array([[tokenizer.eos_id]], np.int32),
    emitted=np.array([[3]], np.int32),
  )
  pieces = [tokenizer.id_to_piece(i) for i in ids[:3]]
  assert pieces[0].startswith('\u2581')  # the word marker is kept
  line = traces.format_trace(trace, 0, tokenizer, color=False)
  assert line == f'1  {pieces[0]} {pieces[1]} [{pieces[2]}] <</s>>'


def test_plot_has_one_text_row_per_iteration():
  fig = traces.plot_trace(_hand_trace(), 0)
  assert isinstance(fig, figure_lib.Figure)
  (ax,) = fig.axes
  boxes = {}
  for text in ax.texts:
    boxes.setdefault(text.get_position()[1], []).append(
      (text.get_text(), text.get_bbox_patch().get_facecolor())
    )
  assert sorted(boxes) == [1, 2, 3]
  face = {k: colors.to_rgba(c) for k, c in traces._FACE.items()}
  assert boxes[1] == [('5', face['accepted']), ('6', face['rejected']), ('9', face['corrected'])]
  assert boxes[2][-1] == ('2', face['extra'])
  assert [c for _, c in boxes[3]] == [face['accepted'], face['cut'], face['rejected'], face['cut']]
  assert len(ax.lines) == 2  # the two rejected drafts are struck through
  assert len(ax.get_legend().get_texts()) == 5
  fig.savefig(io.BytesIO(), format='png')  # renders without pyplot or a backend


def test_plot_on_given_axes_of_a_real_run():
  out = _traced_run('block', 1.0)
  fig = figure_lib.Figure()
  ax = fig.subplots()
  assert traces.plot_trace(out.trace, 5, ax=ax) is fig
  rows = {text.get_position()[1] for text in ax.texts}
  assert rows == set(range(1, len(traces.iterations(out.trace, 5)) + 1))
