"""benchmarks/fused_projections.py: on the 13.5M pair at tiny settings, both layouts' rows, the
same tokens, finite ratios (slow: it compiles four decode programs and times them); compiled for
a TPU, both layouts' estimated cycles."""

import contextlib
import io

import pytest
from absl import flags
from absl.testing import flagsaver

from benchmarks import fused_projections, synthetic
from tests import helpers


@pytest.mark.slow
@helpers.needs_pair('ende')
def test_times_both_layouts_in_turn():
  out = io.StringIO()
  with flagsaver.flagsaver(), contextlib.redirect_stdout(out):
    flags.FLAGS(['fused_projections', '--noeigen_dots'])  # this worker's XLA flags stay as they are
    fused_projections.FLAGS.unparse_flags()
    fused_projections.FLAGS(['fused_projections', '--pretrained=ende', '--sentences=2',
                             '--rounds=1', '--max_new_tokens=8', '--drafter=bigram'])  # fmt: skip
    fused_projections.main(['fused_projections'])
  lines = out.getvalue().splitlines()
  assert lines[0].endswith('the same tokens in both layouts: True')
  rows = [line.split()[:2] for line in lines[1:5]]
  assert rows == [['t5x', 'autoregressive'], ['t5x', 'bigram'], ['fused', 'autoregressive'],
                  ['fused', 'bigram']]  # fmt: skip
  assert lines[5].startswith('seconds, fused / t5x:') and 'nan' not in lines[5]


@helpers.needs_libtpu
def test_compile_for_reads_the_compilers_estimate_of_both_layouts():
  # A tiny T5's one-position call on one TPU v4 chip, compile-only: both layouts give a positive
  # estimate, of about the same size (the same work, in fewer dots).
  config = synthetic.shape('tiny-v1.1', 'bfloat16')
  kw = dict(positions=1, batch=2, source_length=8)
  cycles = [
    fused_projections.call_cycles('tpu-v4', (1, 1), config, fused=f, **kw) for f in (False, True)
  ]
  assert all(c > 0 for c in cycles), cycles
  assert 0.5 < cycles[1] / cycles[0] < 2, cycles
