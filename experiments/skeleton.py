"""What every experiment main does around its rows, written once: open a writer per table, print a
header, add the rows as they are measured (written at once, printed under their table's one column
spec), and draw the figures and summaries at the end, also after an interruption.

  def run(config, workdir, *, echo=print):
    plan = prepare(config)                               # fails before anything is written
    return skeleton.run(
      workdir, [skeleton.Table('alpha_table', TABLE)], header=describe(plan),
      measure=lambda results: (('alpha_table', row) for row in rows(plan)),
      finish=lambda results: draw(results.rows['alpha_table']), echo=echo)

On several processes (a multi-host slice) every process measures its share and process 0 alone
prints and writes (`sharding.is_main_process`). An experiment main is then a config, its rows and
its figures: alpha_table, exp_vs_emp, greedy_block, ops_memory, verification, translate,
block_drafting and token_trees.
"""

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from specdec_jax import sharding
from specdec_jax.measure import results_io, tables

# The columns that name a main-job row (`evaluation.Row`) in an experiment's table: its task and
# method in the files only, its drafter and temperature printed too.
ROW_KEY = (
  tables.Column('task', printed=False),
  tables.Column('drafter', width=10, align='<'),
  tables.Column('method', printed=False),
  tables.Column('temp', fmt='g', width=4),
)


@dataclasses.dataclass(frozen=True)
class Table:
  """One table of an experiment: `<file>.csv` / `.json` in the workdir.

  Attributes:
    name: how the experiment names it (`Results.add`, `Results.rows`).
    columns: its one column spec: the columns its files hold, in order, and those printed
      (`tables.Column.printed`).
    file: the files' stem (default: `name`).
    printed: print each row as it is added (its columns' header first, where `line` is None).
    line: how a row is printed, if not as `tables.format_line` under `columns`.
    fields: the files' columns where a dataclass's fields name them, not `columns` (the main
      job's: every field of `evaluation.Row`, `evaluation.COLUMNS`).
  """

  name: str
  columns: Sequence[tables.Column]
  file: str = ''
  printed: bool = True
  line: Callable[[Mapping], str] | None = None
  fields: Sequence[str] | None = None


class Results:
  """An experiment's tables while it runs: each row written as added (process 0), kept in `rows`
  (as its files hold it: `results_io.as_record`), and printed through `say`."""

  def __init__(
    self, workdir: str, tables_: Sequence[Table], say: Callable[[str], None], main: bool
  ):
    self.say = say
    self.tables = {t.name: t for t in tables_}
    self._headed: set[str] = set()  # the printed tables whose column header is out
    self.rows: dict[str, list[dict]] = {t.name: [] for t in tables_}
    self.writers = {
      t.name: results_io.ResultsWriter(
        workdir, name=t.file or t.name, columns=t.fields or t.columns
      )
      for t in tables_
      if main
    }

  def add(self, table: str, row, *, echo: bool = True) -> dict:
    """Writes `row` into `table`'s files and prints it (where the table is printed and `echo`)."""
    spec = self.tables[table]
    record = results_io.as_record(row)
    self.rows[table].append(record)
    if table in self.writers:
      self.writers[table].add(record)
    if echo and spec.printed:
      if spec.line is None and table not in self._headed:  # its header, above its first row
        self._headed.add(table)
        self.say(tables.format_header(spec.columns))
      self.say(spec.line(record) if spec.line else tables.format_line(record, spec.columns))
    return record

  def paths(self, table: str, prefix: str = '') -> dict[str, str]:
    """{prefix + 'csv' / 'json': path} of `table`'s files (none on other processes)."""
    writer = self.writers.get(table)
    return {} if writer is None else {prefix + k: v for k, v in writer.paths.items()}


def run(
  workdir: str,
  tables_: Sequence[Table],
  *,
  header: str | Sequence[str] | None,
  measure: Callable[[Results], Iterable[tuple[str, Mapping]] | None],
  finish: Callable[[Results], dict[str, str]] | None = None,
  echo: Callable[[str], None] = print,
) -> dict[str, str]:
  """Opens `tables_`' writers, prints `header` (a line or lines), adds every (table, row) that
  `measure(results)` yields (or it adds itself; a printed table's column header goes above its
  first printed row, so a table with no rows prints nothing) in a try, and in a finally
  returns what `finish(results)` returns (figures, summaries, the paths written: also after an
  interruption; process 0 alone calls it); without `finish`, every table's paths."""
  main = sharding.is_main_process()
  say = echo if main else (lambda text: None)
  results = Results(workdir, tables_, say, main)
  for line in [header] if isinstance(header, str) else header or ():
    say(line)
  paths = {}
  try:
    for table, row in measure(results) or ():
      results.add(table, row)
  finally:
    if not main:  # the figures and summaries, as the files, are process 0's
      paths = {}
    elif finish is not None:
      paths = finish(results)
    else:
      for spec in tables_:
        paths.update(results.paths(spec.name, f'{spec.name}.' if len(tables_) > 1 else ''))
  return paths
