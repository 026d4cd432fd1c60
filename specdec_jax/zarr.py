"""A minimal reader of zarr v2 arrays, as tensorstore's zarr driver writes them (T5X checkpoints).

numpy and the standard library's decompressors only: no tensorstore or zarr dependency.
"""

import bz2
import gzip
import itertools
import json
import math
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

PathLike = str | Path

# zarr v2 (what tensorstore's zarr driver writes): a directory with `.zarray` JSON metadata and
# one file per chunk named by its grid index ('1.0'), each chunk stored full size, compressed.

_ZARR_DECOMPRESSORS = {'gzip': gzip.decompress, 'zlib': zlib.decompress, 'bz2': bz2.decompress}


def read_zarr(path: PathLike) -> np.ndarray:
  """Reads a zarr v2 array directory into numpy, e.g. one parameter of a T5X checkpoint.

  Handles any chunking (edge chunks are stored padded to full size), C or F chunk order, '.' or '/'
  dimension separators, no compressor or gzip / zlib / bz2, unwritten chunks (`fill_value`), and
  numpy dtypes plus tensorstore's 'bfloat16'. The result has native byte order.
  """
  directory = Path(path)
  metadata_file = directory / '.zarray'
  if not metadata_file.is_file():
    raise FileNotFoundError(f'No zarr array at {directory} (no .zarray file).')
  metadata = json.loads(metadata_file.read_text())
  if metadata.get('zarr_format') != 2:
    raise ValueError(f'{directory}: unsupported zarr_format {metadata.get("zarr_format")}.')
  if metadata.get('filters'):
    raise ValueError(f'{directory}: unsupported zarr filters {metadata["filters"]}.')
  dtype = _zarr_dtype(metadata['dtype'], directory)
  shape, chunks = tuple(metadata['shape']), tuple(metadata['chunks'])
  decompress = _zarr_decompressor(metadata.get('compressor'), directory)
  separator = metadata.get('dimension_separator') or '.'
  out = np.full(shape, _zarr_fill_value(metadata.get('fill_value')), dtype=dtype)
  grid = [range(math.ceil(size / chunk)) for size, chunk in zip(shape, chunks)]
  for index in itertools.product(*grid):
    chunk_file = directory / (separator.join(map(str, index)) or '0')
    if not chunk_file.is_file():
      continue  # zarr need not write chunks that are all fill_value
    chunk = np.frombuffer(decompress(chunk_file.read_bytes()), dtype=dtype)
    if chunk.size != math.prod(chunks):
      raise ValueError(f'{chunk_file}: {chunk.size} elements, expected {math.prod(chunks)}.')
    chunk = chunk.reshape(chunks, order=metadata.get('order', 'C'))
    region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(index, chunks, shape))
    out[region] = chunk[tuple(slice(0, r.stop - r.start) for r in region)]
  return out.astype(dtype.newbyteorder('='))


def _zarr_dtype(name: Any, directory: Path) -> np.dtype:
  if name == 'bfloat16':
    return np.dtype(ml_dtypes.bfloat16)
  try:
    return np.dtype(name)
  except TypeError as e:
    raise ValueError(f'{directory}: unsupported zarr dtype {name!r}.') from e


def _zarr_decompressor(compressor: Mapping | None, directory: Path) -> Callable[[bytes], bytes]:
  if compressor is None:
    return lambda raw: raw
  if compressor.get('id') not in _ZARR_DECOMPRESSORS:
    raise ValueError(
      f'{directory}: unsupported zarr compressor {compressor.get("id")!r} '
      f'(supported: none, {", ".join(_ZARR_DECOMPRESSORS)}).'
    )
  return _ZARR_DECOMPRESSORS[compressor['id']]


def _zarr_fill_value(value: Any) -> float:
  if value is None:
    return 0
  return {'NaN': np.nan, 'Infinity': np.inf, '-Infinity': -np.inf}.get(value, value)
