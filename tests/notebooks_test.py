"""Executes every notebook in notebooks/ in a fresh python3 kernel; any cell error fails the test.

Notebooks are stored without outputs, so this is the only place they run. Each is sized to run in
about a minute on 2 CPU cores.
"""

import pathlib

import nbclient
import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))
CELL_TIMEOUT_S = 300


def test_notebooks_exist():
  assert {p.name for p in NOTEBOOKS} >= {
    'quickstart.ipynb',
    'analysis.ipynb',
    'bring_your_own_t5.ipynb',
  }


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path):
  notebook = nbformat.read(path, as_version=4)
  for cell in notebook.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, f'{path.name}: clear outputs'


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_code_compiles_and_imports_what_exists(path):
  """The default suite's check (running them is `-m slow`): every code cell is valid Python and
  every `from specdec_jax... import name` names something that exists."""
  import ast
  import importlib.util

  notebook = nbformat.read(path, as_version=4)
  for cell in notebook.cells:
    if cell.cell_type != 'code':
      continue
    lines = cell.source.splitlines()
    source = '\n'.join(x for x in lines if not x.lstrip().startswith(('%', '!')))
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('specdec_jax'):
        module = importlib.import_module(node.module)
        for alias in node.names:
          assert hasattr(module, alias.name) or importlib.util.find_spec(
            f'{node.module}.{alias.name}'
          ), f'{path.name}: {node.module} has no {alias.name}'


# Running them: the quickstart ~55 CPU-seconds, the others ~90 and ~115 on 2 cores (-m slow).
_DEFAULT_RUN = ()  # every notebook runs with -m slow


@pytest.mark.parametrize(
  'path',
  [p if p.stem in _DEFAULT_RUN else pytest.param(p, marks=pytest.mark.slow) for p in NOTEBOOKS],
  ids=lambda p: p.stem,
)
def test_notebook_runs(path):
  notebook = nbformat.read(path, as_version=4)
  # The kernel starts in the repository root; the notebooks find it from any cwd anyway.
  client = nbclient.NotebookClient(
    notebook,
    timeout=CELL_TIMEOUT_S,
    kernel_name='python3',
    resources={'metadata': {'path': str(ROOT)}},
  )
  client.execute()  # raises CellExecutionError, with the cell and its traceback, on any error
