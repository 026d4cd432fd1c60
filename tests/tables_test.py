"""The column-spec table formatter: missing values, number formats, widths, rows of either kind."""

import dataclasses
import math

import numpy as np
import pytest

from specdec_jax.measure import evaluation, tables

COLUMNS = (
  tables.Column('drafter', width=8, align='<'),
  tables.Column('gamma', fmt='d', width=5),
  tables.Column('alpha', fmt='.3f', width=6),
  tables.Column('speedup', 'EMP', '.2f', 6, suffix='x'),
  tables.Column('bytes', 'MB/tok', '.1f', 4, scale=1e-6),
)


def test_missing_values_show_as_a_dash():
  for missing in (None, math.nan, np.float32('nan')):
    assert tables.format_cell(missing, COLUMNS[2]) == '-'
  assert tables.format_cell(0.0, COLUMNS[2]) == '0.000'  # zero is a value, not missing
  line = tables.format_line(
    dict(drafter='-', gamma=0, alpha=None, speedup=1.0, bytes=None), COLUMNS
  )
  assert line.split() == ['-', '0', '-', '1.00x', '-']


def test_formats_suffix_and_scale():
  row = dict(drafter='bigram', gamma=3, alpha=0.41234, speedup=1.066, bytes=2.5e6)
  assert tables.format_line(row, COLUMNS).split() == ['bigram', '3', '0.412', '1.07x', '2.5']
  assert tables.format_cell(np.float32(0.5), COLUMNS[2]) == '0.500'
  assert tables.format_cell('token', COLUMNS[0]) == 'token'  # text ignores fmt and suffix
  assert tables.format_cell(True, tables.Column('x', fmt='.2f')) == 'True'


def test_every_line_has_the_headers_widths():
  rows = [
    dict(drafter='distilled-long', gamma=12, alpha=0.5, speedup=None, bytes=1e6),
    dict(drafter='b', gamma=1, alpha=math.nan, speedup=0.9, bytes=123e6),
  ]
  header, *lines = tables.format_table(rows, COLUMNS).splitlines()
  # Each column is max(width, len(header)) wide; names left-aligned, numbers right-aligned.
  assert header == 'drafter  gamma  alpha    EMP MB/tok'
  assert lines[1] == 'b            1      -  0.90x  123.0'
  # A cell wider than its column pushes the rest right; it is never cut.
  assert lines[0].startswith('distilled-long    12  0.500      -')


def test_rows_are_dicts_or_dataclasses_and_a_missing_column_is_an_error():
  @dataclasses.dataclass
  class Point:
    drafter: str
    gamma: int
    alpha: float
    speedup: float
    bytes: float

  point = Point('bigram', 3, 0.25, 1.5, 1e6)
  assert tables.format_line(point, COLUMNS) == tables.format_line(
    dataclasses.asdict(point), COLUMNS
  )
  with pytest.raises(KeyError, match='bytes'):
    tables.format_line(dict(drafter='x', gamma=1, alpha=0.1, speedup=1.0), COLUMNS)
  with pytest.raises(ValueError, match='align'):
    tables.Column('x', align='^')


def test_main_table_prints_a_row_and_its_dict_alike():
  row = evaluation.Row(
    task='EnDe', drafter='-', method='autoregressive', temp=0.0, gamma=0, block_efficiency=1.0,
    speedup=1.0, bleu=10.4, seconds=2.0, tokens_per_s=50.0,
  )  # fmt: skip
  line = tables.format_line(row, evaluation.TABLE)
  assert line == tables.format_line(dataclasses.asdict(row), evaluation.TABLE)
  cells = dict(zip([c.name for c in evaluation.TABLE], line.split()))
  assert cells['alpha'] == cells['c'] == cells['iteration_cost'] == '-'
  assert (cells['temp'], cells['speedup'], cells['bleu']) == ('0', '1.00x', '10.40')
  assert tuple(dataclasses.asdict(row)) == evaluation.COLUMNS
