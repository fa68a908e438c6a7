"""Run metrics: per-step JSONL, TensorBoard event files (tensorboardX, no TensorFlow), phase
timers, and a human-readable samples log.

    <workdir>/metrics.jsonl   one JSON object per step: {"step": n, "role/name": value, ...}
    <workdir>/tb/             TensorBoard scalars
    <workdir>/samples.log     a few (prompt, output, reward) records per step
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Any, Iterable, Mapping

import numpy as np
from absl import logging
from etils import epath


def _scalar(v: Any) -> float | None:
  try:
    f = float(np.asarray(v))
  except (TypeError, ValueError):
    return None
  return f if math.isfinite(f) else None


def summarize(values: Iterable[float], prefix: str) -> dict[str, float]:
  """mean/std/min/max of a list of numbers under `prefix/…` (empty → nothing)."""
  arr = np.asarray(list(values), np.float64)
  if arr.size == 0:
    return {}
  return {f"{prefix}/mean": float(arr.mean()), f"{prefix}/std": float(arr.std()),
          f"{prefix}/min": float(arr.min()), f"{prefix}/max": float(arr.max())}


class MetricsWriter:
  def __init__(self, workdir, *, tensorboard: bool = True, enabled: bool = True):
    self.workdir = epath.Path(workdir)
    self.enabled = enabled
    self._tb = None
    if enabled:
      self.workdir.mkdir(parents=True, exist_ok=True)
      if tensorboard:
        try:
          from tensorboardX import SummaryWriter
          self._tb = SummaryWriter(str(self.workdir / "tb"))
        except ImportError:
          logging.warning("tensorboardX is not installed; writing JSONL metrics only.")

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
    clean = {k: s for k, v in metrics.items() if (s := _scalar(v)) is not None}
    if not self.enabled:
      return clean
    with (self.workdir / "metrics.jsonl").open("a") as f:
      f.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
    if self._tb is not None:
      for k, v in clean.items():
        self._tb.add_scalar(k, v, step)
      self._tb.flush()
    return clean

  def samples(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
    if not self.enabled:
      return
    with (self.workdir / "samples.log").open("a") as f:
      for r in records:
        f.write(f"=== step {step} ===\n")
        for k, v in r.items():
          f.write(f"[{k}]\n{v}\n")
        f.write("\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


class PhaseTimer:
  """Wall time per named phase: `with timer('rollout'): ...`; `timer.metrics()` → time/<phase>."""

  def __init__(self):
    self.totals: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    start = time.perf_counter()
    try:
      yield
    finally:
      self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - start

  def metrics(self) -> dict[str, float]:
    return {f"time/{k}": v for k, v in self.totals.items()}

  def reset(self) -> None:
    self.totals = {}


def read_jsonl(path) -> list[dict]:
  path = epath.Path(path)
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
