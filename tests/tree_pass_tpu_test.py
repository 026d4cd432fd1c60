"""benchmarks/tree_pass_tpu.py on a tiny T5: the tree pass and the chain pass of N positions
compile for a TPU v4 chip (compile-only, nothing runs), and XLA:TPU prices them within 2x of each
other (both score N positions over the same cache; the tree adds its mask and gathers)."""

import pytest

from tests import helpers

pytest.importorskip('libtpu', reason=helpers.NO_LIBTPU)

from benchmarks import tree_pass_tpu  # noqa: E402


def test_tree_and_chain_passes_are_priced():
  kw = dict(dtype='float32', nodes=[4, 8], depth=3, source_length=8, cache_len=32)
  rows = list(tree_pass_tpu.rows('tpu-v4', 'tiny-v1.1', **kw))
  assert [r['nodes'] for r in rows] == [4, 8]
  for row in rows:
    assert row['chain'] > 0 and row['tree'] > 0 and 0.5 < row['ratio'] < 2, row
