"""Plain-text tables from a column spec: the one row printer of the main job and the experiments.

  COLUMNS = (Column('drafter', align='<'), Column('alpha', fmt='.3f', width=6),
             Column('speedup', fmt='.2f', suffix='x', width=7))
  print(format_header(COLUMNS))
  for row in rows:                       # dicts, or dataclasses such as evaluation.Row
    print(format_line(row, COLUMNS))

A missing value (None or NaN) shows as '-'. A column is as wide as the wider of `width` and its
header, so header and lines stay aligned whatever the header. A table's one spec also names the
columns its files hold and the lines do not show (`printed=False`): `results_io.ResultsWriter`
takes the spec itself.
"""

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of a printed table."""

  name: str  # the row's key (a dict) or attribute (a dataclass)
  header: str = ''  # the printed header; '' prints `name`
  fmt: str = ''  # format spec of a number, e.g. '.3f', 'd', 'g'; '' prints str(value)
  width: int = 10  # minimum width in characters
  align: str = '>'  # '>' right (numbers), '<' left (names)
  suffix: str = ''  # appended to a number, e.g. 'x' for a speedup
  scale: float = 1.0  # a number is multiplied by this before formatting, e.g. 1e-6 for MB
  printed: bool = True  # False: a column of the table's files (CSV, JSON) that is not printed

  def __post_init__(self):
    if self.align not in ('<', '>'):
      raise ValueError(f"Column {self.name!r}: align must be '<' or '>', got {self.align!r}.")

  @property
  def title(self) -> str:
    return self.header or self.name

  @property
  def span(self) -> int:
    """Characters the column takes: its width, or its header's length if longer."""
    return max(self.width, len(self.title))


def format_cell(value, column: Column) -> str:
  """`value` as `column` prints it (not padded): '-' for None or NaN."""
  if value is None or (isinstance(value, numbers.Real) and math.isnan(value)):
    return '-'
  if isinstance(value, numbers.Real) and not isinstance(value, bool):
    if column.scale != 1.0:
      value = value * column.scale
    return f'{value:{column.fmt}}{column.suffix}'
  return str(value)


def _value(row, name: str):
  return row[name] if isinstance(row, Mapping) else getattr(row, name)


def format_header(columns: Sequence[Column]) -> str:
  """The header line of `columns` (those printed)."""
  return ' '.join(f'{c.title:{c.align}{c.span}}' for c in columns if c.printed)


def format_line(row, columns: Sequence[Column]) -> str:
  """One row (a mapping or an object with the columns' names as attributes) under
  `format_header(columns)`. Raises KeyError / AttributeError naming a column the row lacks."""
  return ' '.join(
    f'{format_cell(_value(row, c.name), c):{c.align}{c.span}}' for c in columns if c.printed
  )


def format_table(rows, columns: Sequence[Column]) -> str:
  """The header and one line per row."""
  return '\n'.join([format_header(columns)] + [format_line(row, columns) for row in rows])


def print_table(title: str, rows, columns: Sequence[Column]) -> None:
  """A blank line, `title` and the table, its first (name) column as wide as its widest value:
  the benchmarks' titled tables."""
  first = columns[0]
  width = max([first.width] + [len(str(_value(row, first.name))) for row in rows])
  columns = (dataclasses.replace(first, width=width),) + tuple(columns[1:])
  print(f'\n{title}\n{format_table(rows, columns)}', flush=True)


def gib(nbytes: float) -> str:
  """Bytes as GiB with two decimals: '1.50' for 1.5 * 2**30."""
  return f'{nbytes / 2**30:.2f}'
