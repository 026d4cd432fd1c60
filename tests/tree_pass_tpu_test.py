"""benchmarks/tree_pass_tpu.py on a tiny T5: the tree pass and the chain pass of N positions
compile for a TPU v4 chip (compile-only, nothing runs), and XLA:TPU prices them within 2x of each
other (both score N positions over the same cache; the tree adds its mask and gathers), and a
tree pass runs no more layout copies than the chain pass (negative control: the tree's cache written
by a scatter, the layout `cache.select_write` avoids, adds copies)."""

import jax
import pytest

from tests import helpers

pytest.importorskip('libtpu', reason=helpers.NO_LIBTPU)

from benchmarks import machines, paper_scale_tpu, synthetic, tree_pass_tpu  # noqa: E402
from specdec_jax import cache as cache_lib  # noqa: E402

KW = dict(dtype='float32', depth=3, source_length=8, cache_len=32)


@pytest.mark.slow  # by default paper_scale_test's --compile_for run prices table 5 (4 nodes) alike
def test_tree_and_chain_passes_are_priced():
  rows = list(tree_pass_tpu.rows('tpu-v4', 'tiny-v1.1', nodes=[4, 8], **KW))
  assert [r['nodes'] for r in rows] == [4, 8]
  for row in rows:
    assert row['chain'] > 0 and row['tree'] > 0 and 0.5 < row['ratio'] < 2, row
    assert 0 < row['tree_copies'] <= row['chain_copies'], row  # no copy the chain avoids


def test_negative_control_a_tree_written_by_scatter_has_more_copies(monkeypatch):
  """The check above fails for a tree pass whose cache is written by a scatter (the chain's, by
  the select, unchanged)."""
  device = machines.compile_only_devices('tpu-v4')[0]
  setup = paper_scale_tpu.Setup(device, 'tpu-v4', dtype='float32', source_length=8)
  model = synthetic.abstract_model(synthetic.shape('tiny-v1.1', 'float32'), device)
  chain = paper_scale_tpu.call_cycles(setup, model, positions=8, cache_len=32)
  monkeypatch.setattr(cache_lib, 'select_write', cache_lib.scatter_write)
  jax.clear_caches()  # the tree pass traced anew, with the scatter
  try:
    tree = tree_pass_tpu.tree_cycles(setup, model, nodes=8, depth=3, cache_len=32)
  finally:
    monkeypatch.undo()
    jax.clear_caches()  # and not kept for later tests
  assert tree.copies > chain.copies > 0
