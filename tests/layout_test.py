"""The package's layout (docs/architecture.md): the import graph has no cycle, the engine imports
neither training/ nor measure/ (and models/, checkpoints/, data/ only through pretrained), and
specdec_jax/__init__.py lists every module. benchmarks/ has no import cycle either, and its
modules import the project's at their top. No test file imports another: what tests share is in
the helper modules (tests/helpers.py, fakes.py, chisquare.py, the *_oracle.py files) and
conftest.py."""

import ast
import pathlib

import specdec_jax
from scripts import import_graph

_ROOT = pathlib.Path(__file__).parent.parent


def _folder_imports():
  edges = import_graph.graph(_ROOT)
  return {
    (m, d): (import_graph.folder(m, _ROOT), import_graph.folder(d, _ROOT))
    for m, ds in edges.items()
    for d in ds
  }


def test_the_import_graph_has_no_cycle():
  assert import_graph.layers(import_graph.graph(_ROOT)) is not None


def test_the_benchmarks_import_graph_has_no_cycle():
  edges = import_graph.graph(_ROOT, 'benchmarks')
  assert 'benchmarks.synthetic' in edges['benchmarks.paper_scale'], 'benchmarks/ not read'
  assert import_graph.cycle(edges) is None, import_graph.summary(edges)


def test_a_cycle_is_found():
  # Negative control for the tests above.
  cyclic = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}
  assert import_graph.layers(cyclic) is None
  assert import_graph.cycle(cyclic) == ['a', 'b', 'c', 'a']
  assert import_graph.summary(cyclic).endswith('a cycle: a -> b -> c -> a')
  assert import_graph.layers({'a': {'b'}, 'b': set()}) == {'a': 2, 'b': 1}
  assert import_graph.cycle({'a': {'b'}, 'b': set()}) is None


def test_benchmarks_import_the_project_at_module_top():
  # An import inside a function is how a cycle hides from a reader (not from the graph above).
  inside = []
  for path in sorted((_ROOT / 'benchmarks').glob('*.py')):
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
      names = (
        [a.name for a in node.names]
        if isinstance(node, ast.Import)
        else [node.module or '']
        if isinstance(node, ast.ImportFrom)
        else []
      )
      own = any(n.split('.')[0] in ('benchmarks', 'specdec_jax') for n in names)
      if own and id(node) not in top:
        inside.append(f'{path.name}:{node.lineno}')
  assert not inside, inside


def _test_files_imported(path: pathlib.Path) -> set[str]:
  """The tests/*_test.py modules that `path` imports (anywhere in it)."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module == 'tests':
      found.update(f'tests.{a.name}' for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      found.add(node.module)
  return {m for m in found if m.startswith('tests.') and m.endswith('_test')}


def test_no_test_file_imports_another():
  imports = {
    path.name: _test_files_imported(path) - {f'tests.{path.stem}'}
    for path in sorted((_ROOT / 'tests').glob('*.py'))
  }
  assert not {name: found for name, found in imports.items() if found}


def test_a_test_file_import_is_found(tmp_path):
  # Negative control for the test above.
  path = tmp_path / 'x_test.py'
  path.write_text(
    'from tests import fakes, verify_test as vt\nfrom tests.decode_test import GREEDY\n'
    'import tests.t5_test\nfrom tests.helpers import GREEDY\n\ndef f():\n  import tests.a_test\n'
  )
  assert _test_files_imported(path) == {
    'tests.verify_test', 'tests.decode_test', 'tests.t5_test', 'tests.a_test'
  }  # fmt: skip


def test_training_and_measure_are_imported_only_from_inside():
  outside = {
    (m, d)
    for (m, d), (src, dst) in _folder_imports().items()
    if dst in ('training', 'measure') and src != dst
  }
  assert not outside, outside


def test_the_engine_reaches_models_checkpoints_and_data_only_through_pretrained():
  reach = {
    m
    for (m, d), (src, dst) in _folder_imports().items()
    if src == 'engine' and dst in ('models', 'checkpoints', 'data')
  }
  assert reach == {'specdec_jax.pretrained'}, reach


def test_the_package_docstring_lists_every_module():
  listed = specdec_jax.__doc__
  for path in sorted((_ROOT / 'specdec_jax').rglob('*.py')):
    if path.name != '__init__.py':
      assert f'\n  {path.stem} ' in listed or path.parent.name == 'data', path
  for folder in ('models', 'checkpoints', 'training', 'measure', 'data'):
    assert f'\n{folder}/' in listed, folder
