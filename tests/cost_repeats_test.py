"""benchmarks/cost_repeats.py on the 13.5M pair at tiny settings: one line per measurement and a
summary per setting, each cost finite (slow: it times the cost loops)."""

import contextlib
import io

import pytest
from absl import flags
from absl.testing import flagsaver

from benchmarks import cost_repeats
from tests import helpers


@pytest.mark.slow
@helpers.needs_pair('ende')
def test_measures_each_setting_in_turn():
  out = io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out):
    flags.FLAGS(['cost_repeats', '--noeigen_dots'])  # this worker's XLA flags stay as they are
    cost_repeats.FLAGS.unparse_flags()
    cost_repeats.FLAGS(['cost_repeats', '--pretrained=ende', '--trials=2', '--repeats=1,2',
                        '--gamma=2', '--max_new_tokens=8'])  # fmt: skip
    cost_repeats.main(['cost_repeats'])
  lines = out.getvalue().splitlines()
  trials = [line for line in lines if ', trial ' in line]
  assert [line.split(',')[0] for line in trials] == ['repeats   1', 'repeats   2'] * 2
  summary = [line for line in lines if 'mean +- sd over 2 trials' in line]
  assert len(summary) == 2 and all('nan' not in line for line in summary)
