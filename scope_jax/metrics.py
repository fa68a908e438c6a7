"""Run metrics: per-step JSONL, TensorBoard event files, phase timers, and a human-readable
samples log, all written whole so they survive object stores.

    <workdir>/metrics.jsonl   one JSON object per step: {"step": n, "role/name": value, ...}
    <workdir>/tb/             TensorBoard scalars
    <workdir>/samples.log     a few (prompt, output, reward) records per step
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from typing import Any, Iterable, Mapping

import numpy as np
from absl import logging
from etils import epath

from scope_jax import events


def _scalar(v: Any) -> float | None:
  try:
    f = float(np.asarray(v))
  except (TypeError, ValueError):
    return None
  return f if math.isfinite(f) else None


def _is_number(v: Any) -> bool:
  try:
    float(np.asarray(v))
    return True
  except (TypeError, ValueError):
    return False


def summarize(values: Iterable[float], prefix: str) -> dict[str, float]:
  """mean/std/min/max of a list of numbers under `prefix/…` (empty → nothing)."""
  arr = np.asarray(list(values), np.float64)
  if arr.size == 0:
    return {}
  return {f"{prefix}/mean": float(arr.mean()), f"{prefix}/std": float(arr.std()),
          f"{prefix}/min": float(arr.min()), f"{prefix}/max": float(arr.max())}


class MetricsWriter:
  """Writes metrics.jsonl, samples.log and TensorBoard events of a run, local or on gs://.

  Object stores cannot append, so both text files are kept in memory and written whole after
  every step (a temporary file renamed over the old one locally; one object write on gs://):
  nothing is lost and a crash never leaves half a line. `start(resume_step)` first drops what
  was logged after the checkpoint being resumed (those steps run again) and asks TensorBoard to
  purge the same steps, so each step is seen once. A workdir with metrics but no checkpoint is
  refused unless `overwrite` (a second run would silently be appended to the first).
  """

  def __init__(self, workdir, *, tensorboard: bool = True, enabled: bool = True):
    self.workdir = epath.Path(workdir)
    self.enabled, self.tensorboard = enabled, tensorboard
    self._tb = None
    self._lines: list[str] = []  # metrics.jsonl
    self._samples: list[tuple[int, str]] = []  # (step, text) blocks of samples.log
    self._started = False

  @property
  def metrics_path(self) -> epath.Path:
    return self.workdir / "metrics.jsonl"

  @property
  def samples_path(self) -> epath.Path:
    return self.workdir / "samples.log"

  def start(self, resume_step: int | None, *, overwrite: bool = False) -> None:
    """Loads what earlier runs wrote: kept up to `resume_step`, dropped after it."""
    self._started = True
    if not self.enabled:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    records = read_jsonl(self.metrics_path)
    check_fresh(self.workdir, resume_step is not None, overwrite, records)
    keep = -1 if resume_step is None else resume_step
    self._lines = [json.dumps(r, sort_keys=True) for r in records if r.get("step", 0) <= keep]
    self._samples = [(n, text) for n, text in _read_samples(self.samples_path) if n <= keep]
    if len(self._lines) != len(records):
      logging.info("Dropped %d metrics records after step %d (they run again).",
                   len(records) - len(self._lines), keep)
    self._flush()
    if self.tensorboard:
      self._tb = events.EventsWriter(self.workdir / "tb",  # a new events file per start
                                     purge_step=keep + 1 if resume_step is not None else None)

  def rows(self) -> list[dict]:
    """The records kept so far (this process's; none where writing is off)."""
    return [json.loads(line) for line in self._lines]

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, float]:
    clean = {k: s for k, v in metrics.items() if (s := _scalar(v)) is not None}
    bad = sorted(k for k, v in metrics.items() if k not in clean and _is_number(v))
    if bad:  # NaN or inf: JSON has no place for them, so count and name them instead
      logging.warning("Step %d: non-finite metrics %s", step, ", ".join(bad))
      clean["metrics/nonfinite"] = float(len(bad))
    if not self.enabled:
      return clean
    if not self._started:
      self.start(None, overwrite=True)
    self._lines.append(json.dumps({"step": step, **clean}, sort_keys=True))
    self._flush()
    if self._tb is not None:
      self._tb.scalars(step, clean)
      self._tb.flush()
    return clean

  def samples(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
    if not self.enabled:
      return
    for r in records:
      self._samples.append((step, "".join(f"[{k}]\n{safe_text(v)}\n" for k, v in r.items())))

  def _flush(self) -> None:
    _write_whole(self.metrics_path, "".join(line + "\n" for line in self._lines))
    _write_whole(self.samples_path, "".join(f"=== step {n} ===\n{text}\n"
                                            for n, text in self._samples))

  def close(self) -> None:
    if self.enabled and self._started:
      self._flush()
    if self._tb is not None:
      self._tb.close()


def check_fresh(workdir, has_checkpoint: bool, overwrite: bool, records=None) -> None:
  """A workdir with metrics but no checkpoint is refused unless `overwrite` (else a second run
  would be appended to the first)."""
  records = read_jsonl(epath.Path(workdir) / "metrics.jsonl") if records is None else records
  if records and not has_checkpoint and not overwrite:
    steps = len({r.get("step") for r in records if "eval/updates" not in r})
    raise ValueError(f"{workdir} holds metrics of {steps} steps but no checkpoint to "
                     "resume from; use a new --workdir, or pass --config.overwrite=true to start "
                     "over there.")


def _write_whole(path: epath.Path, text: str) -> None:
  events.write_whole(path, text.encode())


def _read_samples(path: epath.Path) -> list[tuple[int, str]]:
  if not path.exists():
    return []
  blocks, step, lines = [], None, []
  pieces = path.read_text().split("\n")  # only newlines end lines (not U+2028, \x85, …)
  for line in (p + "\n" for p in (pieces[:-1] if pieces[-1] == "" else pieces)):
    m = _SAMPLE_HEADER.match(line)
    if m:
      if step is not None:
        blocks.append((step, "".join(lines).removesuffix("\n")))
      step, lines = int(m.group(1)), []
    elif step is not None:
      lines.append(line)
  if step is not None:
    blocks.append((step, "".join(lines).removesuffix("\n")))
  return blocks


_SAMPLE_HEADER = re.compile(r"=== step (\d+) ===\n")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # but tab and newline


def safe_text(value: Any) -> str:
  """Model output as samples.log holds it: control characters (terminal escape sequences) shown
  as `\\xNN`, and a line that reads as a block header escaped, so generated text can neither
  drive the terminal of whoever reads the log nor forge a step's block across a resume."""
  text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
  return re.sub(r"(?m)^(?====)", lambda m: "\\", text)


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
