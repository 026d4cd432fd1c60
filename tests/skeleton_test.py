"""experiments/skeleton.py: one column spec per table (written whole, printed in part), the header,
rows written as they come, the finish also after an interruption, and process 0 alone writing."""

import csv
import json

import pytest

from experiments import skeleton
from specdec_jax import sharding
from specdec_jax.measure import tables

_SPEC = (
  tables.Column('drafter', width=8, align='<'),
  tables.Column('seed', printed=False),
  tables.Column('alpha', fmt='.2f', width=6),
)
_TABLES = [skeleton.Table('main', _SPEC), skeleton.Table('extra', _SPEC, printed=False)]


def _rows(results):
  yield 'main', dict(drafter='bigram', seed=3, alpha=0.25)
  results.add('extra', dict(drafter='x', seed=1, alpha=float('nan')))
  yield 'main', dict(drafter='trigram', seed=4, alpha=0.5)


def test_rows_are_written_whole_and_printed_by_their_spec(tmp_path):
  lines, finished = [], []

  def finish(results):
    finished.append({name: list(rows) for name, rows in results.rows.items()})
    return results.paths('main')

  paths = skeleton.run(
    str(tmp_path), _TABLES, header='a header', measure=_rows, finish=finish, echo=lines.append
  )
  assert lines[0] == 'a header' and lines[1].split() == ['drafter', 'alpha']  # seed not printed
  assert [line.split() for line in lines[2:]] == [['bigram', '0.25'], ['trigram', '0.50']]
  with open(paths['csv']) as f:
    assert list(csv.DictReader(f)) == [
      dict(drafter='bigram', seed='3', alpha='0.25'),
      dict(drafter='trigram', seed='4', alpha='0.5'),
    ]
  assert json.loads((tmp_path / 'extra.json').read_text()) == [
    dict(drafter='x', seed=1, alpha=None)  # strict JSON: NaN written as null
  ]
  assert [r['drafter'] for r in finished[0]['main']] == ['bigram', 'trigram']


def test_finish_runs_after_an_interruption(tmp_path):
  def interrupted(results):
    yield 'main', dict(drafter='bigram', seed=3, alpha=0.25)
    raise KeyboardInterrupt

  finished = []
  with pytest.raises(KeyboardInterrupt):
    skeleton.run(
      str(tmp_path), _TABLES, header=None, measure=interrupted,
      finish=lambda results: finished.append(len(results.rows['main'])) or {},
      echo=lambda line: None,
    )  # fmt: skip
  assert finished == [1]
  assert len(json.loads((tmp_path / 'main.json').read_text())) == 1


def test_other_processes_neither_print_nor_write(tmp_path, monkeypatch):
  monkeypatch.setattr(sharding, 'is_main_process', lambda: False)
  lines, finished = [], []
  paths = skeleton.run(
    str(tmp_path / 'out'), _TABLES, header='a header', measure=_rows,
    finish=lambda results: finished.append(1) or {'x': 'y'}, echo=lines.append,
  )  # fmt: skip
  assert (lines, finished, paths) == ([], [], {})
  assert not (tmp_path / 'out').exists()


def test_a_table_without_rows_prints_no_header(tmp_path):
  """Each printed table's column header goes above its first row: a section that is off (no rows)
  prints nothing, and a table first added to after another's rows gets its header there."""
  lines = []
  spec = (tables.Column('gamma', width=5), tables.Column('tokens', fmt='.2f', width=6))
  three = [*_TABLES, skeleton.Table('late', spec), skeleton.Table('empty', spec)]

  def rows(results):
    yield from _rows(results)
    yield 'late', dict(gamma=4, tokens=1.5)

  skeleton.run(str(tmp_path), three, header='h', measure=rows, echo=lines.append)
  assert [line.split() for line in lines] == [
    ['h'], ['drafter', 'alpha'], ['bigram', '0.25'], ['trigram', '0.50'],
    ['gamma', 'tokens'], ['4', '1.50'],
  ]  # fmt: skip
