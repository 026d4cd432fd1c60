"""What a speculative run did, iteration by iteration, drawn as in Leviathan et al. 2023, Figure 1.

  out = decode.speculative_generate(target, drafter, ids, mask, ..., trace=True)
  print(traces.format_trace(out.trace, row=0, tokenizer=pair.tokenizer))
  traces.plot_trace(out.trace, row=0, tokenizer=pair.tokenizer)

One line per iteration (one target call): the drafts the verifier accepted (green), the first
rejected draft (red, struck through) and the target's token that replaces it (blue). An iteration
that accepted all gamma drafts has nothing struck out and ends with the extra token the same
target call yields (bold blue). Tokens an iteration proposed but did not append, because EOS or
the token limit cut its block, are shown dimmed.

Plain-text markers (`color=False`): `tok` accepted, `[tok]` rejected, `<tok>` corrected,
`<+tok>` extra, `(tok)` not appended.

Axis legend: B batch, I iterations (= max_new_tokens, the most a run can take), G gamma.
"""

from typing import Any

import numpy as np

# ANSI SGR sequences. 9 (crossed out) is widely but not universally supported; the red colour
# still marks the rejected draft where it is not.
_ANSI = {
  'accepted': '\x1b[32m',  # green
  'rejected': '\x1b[31;9m',  # red, crossed out
  'corrected': '\x1b[34m',  # blue
  'extra': '\x1b[1;34m',  # bold blue
  'cut': '\x1b[2m',  # dim
}
_RESET = '\x1b[0m'
_MARKERS = {
  'accepted': '{}',
  'rejected': '[{}]',
  'corrected': '<{}>',
  'extra': '<+{}>',
  'cut': '({})',
}
# Box colours of `plot_trace` (ColorBrewer-like, readable with black text).
_FACE = {
  'accepted': '#a6dba0',
  'rejected': '#f4a582',
  'corrected': '#92c5de',
  'extra': '#4393c3',
  'cut': '#e0e0e0',
}
_LEGEND = {
  'accepted': 'accepted draft',
  'rejected': 'rejected draft',
  'corrected': 'corrected token',
  'extra': 'extra token (all accepted)',
  'cut': 'not appended (EOS / limit)',
}
# Layout of `plot_trace`, in characters of DejaVu Sans Mono (matplotlib's monospace font, whose
# glyphs advance 0.602 em): box padding on each side, the gap between boxes, and the font size.
_CHAR_EM = 0.602
_PAD = 0.4
_GAP = 0.5
_FONT_SIZE = 10.0


def iterations(trace, row: int) -> list[dict[str, Any]]:
  """The iterations in which `row` emitted tokens, as plain Python values.

  Args:
    trace: a `decode.SpeculativeTrace` (`speculative_generate(..., trace=True).trace`), with
      drafts int32[B, I, G], num_accepted / next_token / emitted int32[B, I].
    row: the batch row, in [0, B).

  Returns:
    One dict per iteration with emitted > 0, in order:
      accepted: list[int], the accepted drafts X_1..X_tau.
      rejected: int or None, the first rejected draft X_{tau+1} (None when tau = G).
      next_token: int, Y: the corrected token (tau < G) or the extra token (tau = G).
      emitted: int, tokens appended; the row's output is the concatenation of `tokens`.
      tokens: list[int], (accepted + [next_token])[:emitted].
      cut: bool, emitted < tau + 1 (EOS or the token limit ended the row inside the block).

  Raises:
    ValueError: `trace` is None (the run was not traced) or `row` is out of range.
  """
  if trace is None:
    raise ValueError(
      'No trace: run decode.speculative_generate(..., trace=True) and pass out.trace.'
    )
  drafts = np.asarray(trace.drafts)
  batch, _, gamma = drafts.shape
  if not 0 <= row < batch:
    raise ValueError(f'row must be in [0, {batch}), got {row}.')
  drafts = drafts[row]
  tau = np.asarray(trace.num_accepted)[row]
  next_token = np.asarray(trace.next_token)[row]
  emitted = np.asarray(trace.emitted)[row]
  result = []
  for i in np.flatnonzero(emitted > 0):
    t, k = int(tau[i]), int(emitted[i])
    accepted = [int(x) for x in drafts[i, :t]]
    result.append(
      {
        'accepted': accepted,
        'rejected': int(drafts[i, t]) if t < gamma else None,
        'next_token': int(next_token[i]),
        'emitted': k,
        'tokens': (accepted + [int(next_token[i])])[:k],
        'cut': k < t + 1,
      }
    )
  return result


def _cells(step: dict[str, Any]) -> list[tuple[str, int]]:
  """(kind, token id) of one iteration in display order: accepted, rejected, then Y.

  Kinds are the keys of `_ANSI`; a token past the `emitted` cut is 'cut' whatever it was.
  """
  k = step['emitted']
  cells = [('accepted' if j < k else 'cut', x) for j, x in enumerate(step['accepted'])]
  if step['rejected'] is not None:
    cells.append(('rejected', step['rejected']))
  kind = 'corrected' if step['rejected'] is not None else 'extra'
  cells.append((kind if len(step['accepted']) < k else 'cut', step['next_token']))
  return cells


def _label(token: int, tokenizer) -> str:
  """A token as its SentencePiece piece (with its '▁' word marker), or its id."""
  if tokenizer is None:
    return str(token)
  piece = tokenizer.id_to_piece(token)
  # A control character (e.g. a newline piece) would break the one-line-per-iteration layout.
  return piece if piece.isprintable() else piece.encode('unicode_escape').decode('ascii')


def format_trace(trace, row: int, tokenizer=None, *, color: bool = True) -> str:
  """A row's trace as terminal text, one line per iteration, as in Leviathan et al. Figure 1.

  Each line is the iteration number, then its tokens separated by spaces: accepted drafts green,
  the rejected draft red and crossed out, the corrected token blue, the extra token of an
  all-accepted iteration bold blue, tokens cut by EOS or the limit dim (ANSI colours). With
  `color=False` the kinds are marked instead: `tok`, `[tok]`, `<tok>`, `<+tok>`, `(tok)`.

  Args:
    trace: a `decode.SpeculativeTrace`.
    row: the batch row.
    tokenizer: shows tokens as pieces (`tokenizer.id_to_piece(id) -> str`, as
      `data.tokenizer.Tokenizer` has); None shows ids.
    color: ANSI colours (for a terminal or a notebook's text output) or plain-text markers.

  Returns:
    The lines joined by newlines (no trailing newline); '' when the row emitted nothing.
  """
  steps = iterations(trace, row)
  width = len(str(len(steps)))
  lines = []
  for i, step in enumerate(steps, start=1):
    words = []
    for kind, token in _cells(step):
      label = _label(token, tokenizer)
      words.append(f'{_ANSI[kind]}{label}{_RESET}' if color else _MARKERS[kind].format(label))
    lines.append(f'{i:>{width}d}  ' + ' '.join(words))
  return '\n'.join(lines)


def plot_trace(trace, row: int, tokenizer=None, *, ax=None):
  """A row's trace as a figure: one row of coloured token boxes per iteration, and a legend.

  Needs no pyplot and sets no backend: without `ax` it draws on a new `matplotlib.figure.Figure`,
  which a notebook shows as a cell's value (with the inline backend) and `fig.savefig` writes.

  Args:
    trace: a `decode.SpeculativeTrace`.
    row: the batch row.
    tokenizer: shows tokens as pieces (`id_to_piece`); None shows ids.
    ax: a matplotlib Axes to draw on (its figure is returned); None makes a new figure sized to
      the trace (up to 16 inches wide; longer lines get a smaller font).

  Returns:
    The `matplotlib.figure.Figure`. Iteration i (1-based) is the text row at y = i; the token
    boxes are `ax.texts`, and a line (`ax.lines`) strikes through each rejected draft.
  """
  steps = iterations(trace, row)
  rows = [[(kind, _label(token, tokenizer)) for kind, token in _cells(s)] for s in steps]
  # x is measured in characters of the monospace font: a box is its label plus _PAD on each
  # side, and boxes are _GAP apart. The font size is then chosen so that the longest line fits.
  lengths = [_GAP + sum(len(label) + 2 * _PAD + _GAP for _, label in cells) for cells in rows]
  chars = max(lengths, default=10.0)
  if ax is None:
    ax = _new_axes(chars, len(rows))
  fig = ax.figure
  position = ax.get_position()
  width_pt = position.width * fig.get_figwidth() * 72
  row_pt = position.height * fig.get_figheight() * 72 / max(len(rows), 1)
  size = min(_FONT_SIZE, width_pt / (chars * _CHAR_EM), row_pt / 1.8)
  for y, cells in enumerate(rows, start=1):
    _draw_row(ax, y, cells, size)
  ax.set_xlim(0, max(chars, width_pt / (_CHAR_EM * size)))
  ax.set_ylim(len(rows) + 0.6, 0.4)  # iteration 1 at the top, as text reads
  ax.set_yticks(range(1, len(rows) + 1))
  ax.tick_params(axis='y', labelsize=min(_FONT_SIZE, max(size, 6)))
  ax.set_ylabel('iteration')
  ax.set_xticks([])
  for side in ('top', 'right', 'bottom'):
    ax.spines[side].set_visible(False)
  _legend(ax, {kind for cells in rows for kind, _ in cells})
  return fig


def _new_axes(chars: float, num_rows: int):
  """Axes on a new `Figure` sized to `num_rows` lines of up to `chars` characters (up to 16
  inches wide), with room above for the legend."""
  from matplotlib import figure as figure_lib  # ~0.5 s of imports that only plotting needs

  inches = min(chars * _CHAR_EM * _FONT_SIZE / 72, 16.0)
  fig = figure_lib.Figure(figsize=(max(inches + 0.8, 6.0), 0.3 * num_rows + 1.0))
  top = 1.0 - 0.6 / fig.get_figheight()  # room for the legend
  return fig.add_axes(
    (
      0.6 / fig.get_figwidth(),
      0.1 / fig.get_figheight(),
      1.0 - 0.8 / fig.get_figwidth(),
      top - 0.1 / fig.get_figheight(),
    )
  )


def _draw_row(ax, y: float, cells, size: float) -> None:
  """One iteration's (kind, label) boxes at height y, left to right; x counts characters."""
  x = _GAP  # clear of the axis line
  for kind, label in cells:
    center = x + _PAD + len(label) / 2
    ax.text(
      center,
      y,
      label,
      ha='center',
      va='center',
      family='monospace',
      fontsize=size,
      fontweight='bold' if kind == 'extra' else 'normal',
      parse_math=False,
      color='#606060' if kind == 'cut' else 'black',
      bbox=dict(
        boxstyle=f'round,pad={_PAD * _CHAR_EM:.3f}', facecolor=_FACE[kind], edgecolor='none'
      ),
    )
    if kind == 'rejected':
      ax.plot(
        [center - len(label) / 2, center + len(label) / 2],
        [y, y],
        color='#b2182b',
        linewidth=1.2,
        zorder=4,
      )  # over the box (texts are drawn at zorder 3)
    x += len(label) + 2 * _PAD + _GAP


def _legend(ax, shown: set) -> None:
  """The legend of the kinds of box `shown`, above the axes."""
  from matplotlib import patches

  handles = [
    patches.Patch(facecolor=_FACE[k], label=text) for k, text in _LEGEND.items() if k in shown
  ]
  ax.legend(
    handles=handles,
    loc='lower left',
    bbox_to_anchor=(0.0, 1.0),
    ncols=3,
    fontsize='small',
    frameon=False,
    borderaxespad=0.2,
  )
