"""specdec_jax's import graph: files, imports, layers, cycles, and which folder imports which.

  python -m scripts.import_graph [ROOT]    # ROOT: a checkout (default: this one)

A file's layer is 1 + the highest layer among the package files it imports (a file importing none
of them is layer 1); an import is any `import` / `from ... import` of a specdec_jax module,
counted once per pair of files, including those inside functions. The folder table counts the
imports between folders (the top-level files are the folder 'engine'). docs/architecture.md
prints its output before and after the subpackages were made. A last line gives the same count
for benchmarks/ (its modules' imports of each other); a cycle, in either, is named.
"""

import ast
import collections
import pathlib
import sys


def _module_files(package: pathlib.Path) -> dict[str, pathlib.Path]:
  """Dotted module name -> file, for every .py file of the package."""
  files = {}
  for path in sorted(package.rglob('*.py')):
    parts = path.relative_to(package.parent).with_suffix('').parts
    files['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
  return files


def _imports(path: pathlib.Path, modules: dict[str, pathlib.Path], package: str) -> set[str]:
  """The package's modules that `path` imports."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names if a.name in modules)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for alias in node.names:
        child = f'{node.module}.{alias.name}'
        found.add(child if child in modules else node.module)
  return {m for m in found if m in modules and m != package}


def graph(root: pathlib.Path, package: str = 'specdec_jax') -> dict[str, set[str]]:
  """Module -> the modules of `package` (a folder of `root`: specdec_jax, benchmarks) it imports
  (the package's own `__init__` left out)."""
  modules = _module_files(root / package)
  return {m: _imports(p, modules, package) - {m} for m, p in modules.items() if m != package}


def layers(edges: dict[str, set[str]]) -> dict[str, int] | None:
  """Each module's layer, or None when the graph has a cycle."""
  layer, visiting = {}, set()

  def visit(m):
    if m in layer:
      return layer[m]
    if m in visiting:
      raise RecursionError(m)
    visiting.add(m)
    layer[m] = 1 + max((visit(d) for d in edges[m]), default=0)
    return layer[m]

  try:
    for m in edges:
      visit(m)
  except RecursionError:
    return None
  return layer


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """A cycle of imports, [a, b, ..., a] (each imports the next), or None where there is none."""
  path, done = [], set()

  def visit(m):
    if m in path:
      return path[path.index(m) :] + [m]
    if m in done:
      return None
    path.append(m)
    for d in sorted(edges[m]):
      found = visit(d)
      if found:
        return found
    path.pop()
    done.add(m)
    return None

  for m in sorted(edges):
    found = visit(m)
    if found:
      return found
  return None


def summary(edges: dict[str, set[str]]) -> str:
  """'N files, M imports, L layers, no cycle', or the cycle named."""
  layer = layers(edges)
  head = f'{len(edges)} files, {sum(map(len, edges.values()))} imports, '
  if layer is None:
    return head + 'a cycle: ' + ' -> '.join(cycle(edges))
  return head + f'{max(layer.values(), default=0)} layers, no cycle'


def folder(module: str, root: pathlib.Path) -> str:
  """The folder a module lives in: 'engine' for specdec_jax's top-level files."""
  parts = module.split('.')
  is_package = (root.joinpath(*parts) / '__init__.py').exists()
  return parts[1] if len(parts) > 2 or is_package else 'engine'


def main(argv):
  root = pathlib.Path(argv[1] if len(argv) > 1 else '.')
  edges = graph(root)
  print(summary(edges))
  between = collections.Counter(
    (folder(m, root), folder(d, root)) for m, ds in edges.items() for d in ds
  )
  names = sorted({f for pair in between for f in pair}, key=lambda f: (f != 'engine', f))
  print('imports from (row) to (column):')
  print(f'{"":>12}' + ''.join(f'{n:>12}' for n in names))
  for a in names:
    print(f'{a:>12}' + ''.join(f'{between[a, b] or ".":>12}' for b in names))
  if (root / 'benchmarks').is_dir():
    print(f'benchmarks: {summary(graph(root, "benchmarks"))}')


if __name__ == '__main__':
  main(sys.argv)
