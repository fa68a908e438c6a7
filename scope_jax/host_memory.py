"""Host allocator settings: keep freed memory for reuse instead of handing it back to the kernel.

XLA:CPU allocates every program's buffers (a KV cache window, activations, a layer's weights
sliced out of the stacked arrays) with malloc, per call. glibc serves large blocks from fresh
`mmap`ed pages, or from per-thread arenas that it trims, and gives them back on free, so every
call pays a page fault for each 4 KiB it touches again: on `bench/rollout.py`'s ~100M model,
4.5M faults and 13 s of kernel time in a 50 s engine run. With one arena, no `mmap` for large
blocks and no trimming, freed blocks are reused (0.3M faults, 4 s). The process keeps its peak
heap, as it would with tcmalloc or jemalloc, which big JAX deployments preload for the same reason.

`reuse_freed_memory` has to run before JAX starts its thread pools (the entrypoints call it
first); `SCOPE_JAX_MALLOC=system` keeps the C library's defaults.
"""

from __future__ import annotations

import ctypes
import os
import sys

ENV = "SCOPE_JAX_MALLOC"
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8  # glibc's mallopt parameters


def reuse_freed_memory(environ=os.environ) -> bool:
  """Sets glibc's malloc to one arena, no `mmap` and no trimming; False where it does not apply
  (not Linux glibc, or `SCOPE_JAX_MALLOC=system`)."""
  setting = environ.get(ENV, "reuse").strip().lower()
  if setting not in ("reuse", "system"):
    raise ValueError(f"{ENV}={environ[ENV]!r}: use 'reuse' (the default: freed host memory is "
                     "kept for reuse) or 'system' (the C library's defaults).")
  if setting == "system" or not sys.platform.startswith("linux"):
    return False
  try:
    libc = ctypes.CDLL("libc.so.6")
    libc.gnu_get_libc_version  # glibc only: musl's mallopt takes none of these
  except (OSError, AttributeError):
    return False
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
  return all(libc.mallopt(param, value) == 1 for param, value in settings)
