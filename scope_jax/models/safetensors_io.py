"""Minimal safetensors reader/writer that reads row ranges, not whole tensors.

The reader parses the header and reads only the bytes a slice needs (contiguous rows of the first
dimension), so a loader can fill one device shard at a time without ever holding a full copy of
the model. bfloat16 goes through `ml_dtypes`, so neither torch nor a framework is needed. Paths may
be local or anything `etils.epath` opens (e.g. gs://).
"""

from __future__ import annotations

import json
import struct
from typing import Any, Mapping, Sequence

import ml_dtypes
import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
          "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 2**20


def _open(path, mode="rb"):
  from etils import epath
  return epath.Path(path).open(mode)


class SafetensorsFile:
  """Lazily reads tensors (or row slices of them) from one .safetensors file."""

  def __init__(self, path):
    self.path = str(path)
    with _open(self.path) as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise ValueError(f"{self.path} is not a safetensors file (shorter than 8 bytes).")
      (n,) = struct.unpack("<Q", raw)
      if n > _MAX_HEADER:
        raise ValueError(f"{self.path}: safetensors header of {n} bytes is implausible; "
                         "the file is corrupt or not safetensors.")
      try:
        header = json.loads(f.read(n))
      except (ValueError, RecursionError) as e:
        raise ValueError(f"{self.path}: the safetensors header is not valid JSON ({e}); the file "
                         "is corrupt or truncated.") from None
    if not isinstance(header, dict):
      raise ValueError(f"{self.path}: the safetensors header is not a JSON object.")
    self.metadata = header.pop("__metadata__", {}) or {}
    self.entries: dict[str, dict[str, Any]] = header
    self._data_start = 8 + n

  def names(self) -> list[str]:
    return list(self.entries)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.entries[name]["shape"])

  def dtype(self, name: str) -> np.dtype:
    code = self.entries[name]["dtype"]
    if code not in DTYPES:
      raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {code}.")
    return np.dtype(DTYPES[code])

  def read(self, name: str, index: Sequence[slice] | None = None) -> np.ndarray:
    """Reads `name[index]`; only the rows of the first dimension in `index` are read from disk."""
    shape, dtype = self.shape(name), self.dtype(name)
    begin, _ = self.entries[name]["data_offsets"]
    index = tuple(index or ())
    row_slice = index[0] if index else slice(None)
    if not shape:
      rows, row_bytes, start = (0, 1), dtype.itemsize, 0
    else:
      rows = row_slice.indices(shape[0])[:2]
      row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
      start = rows[0] * row_bytes
    count = max(rows[1] - rows[0], 0)
    with _open(self.path) as f:
      f.seek(self._data_start + begin + start)
      want = count * row_bytes if shape else dtype.itemsize
      buf = f.read(want)
    if len(buf) != want:
      raise ValueError(f"{self.path}: tensor {name!r} {list(shape)} is cut short ({len(buf)} of "
                       f"{want} bytes at offset {self._data_start + begin + start}); the file is "
                       "truncated or corrupt.")
    arr = np.frombuffer(buf, dtype=dtype)
    if not shape:
      return arr.reshape(())
    arr = arr.reshape((count,) + shape[1:])
    return arr[(slice(None),) + index[1:]] if len(index) > 1 else arr


def save_file(tensors: Mapping[str, np.ndarray], path, metadata: Mapping[str, str] | None = None):
  """Writes numpy arrays (float32, bfloat16, ...) as one safetensors file."""
  header: dict[str, Any] = {}
  if metadata:
    header["__metadata__"] = dict(metadata)
  offset = 0
  arrays = []
  for name, arr in tensors.items():
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in _NAMES:
      raise ValueError(f"Cannot write tensor {name!r} of dtype {arr.dtype} to safetensors.")
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays.append(arr)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with _open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays:
      f.write(arr.tobytes())
