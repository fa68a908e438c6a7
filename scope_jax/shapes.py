"""Bounded array shapes: lengths rounded up to a few buckets so that sampling, training batches
and encoders compile a handful of programs instead of one per length."""

from __future__ import annotations


def length_bucket(n: int, minimum: int = 16) -> int:
  """Power-of-two buckets up to 2048, then multiples of 1024: bounded recompilation."""
  n = max(n, minimum)
  if n <= 2048:
    return 1 << (n - 1).bit_length()
  return -(-n // 1024) * 1024
