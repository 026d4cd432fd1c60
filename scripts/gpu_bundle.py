"""What a run on a lent GPU carries (the device tool: at most 64 MiB): the code, the pairs it asks
for with the pairs their int8 deltas are deltas on, the pinned wheels the GPU machine's image
lacks, and a `run.sh` that installs them and runs scripts/gpu_quarter_hour.py there
(`make_bundle`; `python -m scripts.gpu_quarter_hour --bundle=DIR`). Sizes are checked before
anything is copied and after."""

import datetime
import json
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
MIB = 2**20
BUNDLE_LIMIT = 64 * MIB  # what one run of the device tool carries
# Wheels a run carries: setup.py's pins that the GPU machine's image lacks or has at other
# versions (flax, optax, orbax-checkpoint), and ml_collections (absent there). Pure Python.
PINNED_WHEELS = (
  'flax==0.12.8',
  'optax==0.2.8',
  'orbax-checkpoint==0.12.8',
  'ml_collections==1.1.0',
)
BUNDLED = ('specdec_jax', 'benchmarks', 'experiments', 'scripts', 'setup.py', 'pyproject.toml')


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')


def _files(root: pathlib.Path, entry: str) -> list[pathlib.Path]:
  """The files of `entry` (a file or a folder of `root`), caches left out."""
  path = root / entry
  if path.is_file():
    return [path]
  skip = lambda p: '__pycache__' in p.parts or p.suffix == '.pyc' or '.egg-info' in str(p)
  return sorted(p for p in path.rglob('*') if p.is_file() and not skip(p.relative_to(root)))


def pairs_needed(root: pathlib.Path, pairs: Sequence[str]) -> list[str]:
  """`pairs` and the pairs their int8-delta checkpoints are deltas on (`delta.json`'s base)."""
  todo, out = list(pairs), []
  while todo:
    name = todo.pop(0)
    if name in out:
      continue
    directory = root / 'pretrained' / name
    if not (directory / 'pair.json').exists():
      raise ValueError(f'No pair pretrained/{name} in {root} (a folder with pair.json).')
    out.append(name)
    for delta in directory.rglob('delta.json'):
      base = (delta.parent / json.loads(delta.read_text())['base']).resolve()
      todo.append(base.relative_to((root / 'pretrained').resolve()).parts[0])
  return out


def bundle_parts(root: pathlib.Path, pairs: Sequence[str]) -> dict[str, list[pathlib.Path]]:
  """{part: its files}: the code (`BUNDLED`) and each pair needed."""
  parts = {entry: _files(root, entry) for entry in BUNDLED if (root / entry).exists()}
  for name in pairs_needed(root, pairs):
    parts[f'pretrained/{name}'] = _files(root, f'pretrained/{name}')
  return parts


def part_sizes(parts: dict[str, list[pathlib.Path]]) -> dict[str, int]:
  return {part: sum(p.stat().st_size for p in files) for part, files in parts.items()}


def check_size(sizes: dict[str, int], limit: int = BUNDLE_LIMIT) -> int:
  """The total of `sizes` ({part: bytes}); ValueError naming the parts when it exceeds `limit`."""
  total = sum(sizes.values())
  if total > limit:
    listed = ', '.join(
      f'{k} {v / MIB:.1f}' for k, v in sorted(sizes.items(), key=lambda kv: -kv[1])
    )
    raise ValueError(
      f'The bundle is {total / MIB:.1f} MiB, over the {limit / MIB:.0f} MiB a GPU run carries '
      f'(MiB: {listed}). Leave out a pair (--with_pairs), or move it apart.'
    )
  return total


RUN_SH = """#!/usr/bin/env bash
# The GPU quarter-hour on a lent GPU (scripts/gpu_quarter_hour.py): the pinned wheels into
# /tmp/site, then every stage; the table and the logs go to $OUT (or /tmp/gpu_quarter_hour).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
  --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
exec python3 -m scripts.gpu_quarter_hour --out="${OUT:-/tmp/gpu_quarter_hour}" "$@"
"""


def _wheel_name(requirement: str) -> str:
  """'orbax-checkpoint==0.12.8' -> 'orbax_checkpoint-0.12.8-' (a wheel file's start)."""
  name, _, version = requirement.partition('==')
  return f'{name.replace("-", "_").lower()}-{version}-'


def _wheels(dest: pathlib.Path, wheels_from: str | None) -> list[pathlib.Path]:
  """The pinned wheels in `dest`: copied from `wheels_from`, else downloaded by pip (py3 wheels
  for the GPU machine's Python 3.12)."""
  dest.mkdir(parents=True, exist_ok=True)
  if wheels_from:
    found = {p.name.lower(): p for p in pathlib.Path(wheels_from).glob('*.whl')}
    for requirement in PINNED_WHEELS:
      match = [p for n, p in found.items() if n.startswith(_wheel_name(requirement))]
      if not match:
        raise ValueError(f'No wheel of {requirement} in {wheels_from}.')
      shutil.copy2(match[0], dest / match[0].name)
  else:
    subprocess.run(
      [sys.executable, '-m', 'pip', 'download', '-q', '--no-deps', '--only-binary=:all:',
       '--python-version', '3.12', '--implementation', 'cp', '--platform',
       'manylinux_2_28_x86_64', '-d', str(dest), *PINNED_WHEELS],
      check=True,
    )  # fmt: skip
  return sorted(dest.glob('*.whl'))


def make_bundle(
  dest: str,
  *,
  pairs: Sequence[str] = ('ende',),
  wheels_from: str | None = None,
  root: pathlib.Path = REPO,
  limit: int = BUNDLE_LIMIT,
) -> dict:
  """Copies what a GPU run needs into `dest` (a new or empty folder, or an earlier bundle): the
  code, `pairs` (and their delta bases), the pinned wheels (.whl/) and run.sh; checks the size
  against `limit` before copying and after. Returns the manifest (also dest/BUNDLE.json)."""
  dest_ = pathlib.Path(dest)
  if dest_.exists() and any(dest_.iterdir()):
    if not (dest_ / 'BUNDLE.json').exists():
      raise ValueError(f'{dest} is not empty and holds no earlier bundle: give a new folder.')
    shutil.rmtree(dest_)
  parts = bundle_parts(root, pairs)
  check_size(part_sizes(parts), limit)  # before copying anything
  for files in parts.values():
    for path in files:
      target = dest_ / path.relative_to(root)
      target.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy2(path, target)
  wheels = _wheels(dest_ / '.whl', wheels_from)
  (dest_ / 'run.sh').write_text(RUN_SH)
  (dest_ / 'run.sh').chmod(0o755)
  sizes = part_sizes(parts)
  sizes['.whl'] = sum(p.stat().st_size for p in wheels)
  sizes['run.sh'] = (dest_ / 'run.sh').stat().st_size
  manifest = dict(
    bytes=sum(sizes.values()), limit=limit, sizes=sizes, pairs=pairs_needed(root, pairs),
    wheels=[p.name for p in wheels], made=_now(),
  )  # fmt: skip
  (dest_ / 'BUNDLE.json').write_text(json.dumps(manifest, indent=1) + '\n')
  measured = sum(p.stat().st_size for p in dest_.rglob('*') if p.is_file())
  check_size({'everything': measured}, limit)
  return dict(manifest, bytes=measured)
