"""Loud signs of a run that learns nothing: updates skipped as non-finite, updates whose
advantages are all zero (every group's rewards tied: no signal), and responses with no generated
token. Each step that shows one is warned about, and the run's summary counts them, so a run that
"finished" without learning says so.
"""

from __future__ import annotations

import dataclasses

# Per-update metrics that Runtime.train reports (behind its train/ prefix).
APPLIED, SIGNAL_ROWS, EMPTY_ROWS, ROWS = "applied", "signal_rows", "empty_rows", "rows"


def update_stats(trajectories, advantages) -> dict[str, float]:
  """An update's rows, rows with a non-zero advantage, and rows with no generated token."""
  import numpy as np
  signal = sum(bool(np.any(np.asarray(a) != 0)) for a in advantages)
  empty = sum(int(np.asarray(t.loss_mask).sum() == 0) for t in trajectories)
  return {ROWS: float(len(trajectories)), SIGNAL_ROWS: float(signal), EMPTY_ROWS: float(empty)}


@dataclasses.dataclass
class Health:
  steps: int = 0
  updates: int = 0
  skipped: int = 0  # non-finite: the params did not change
  no_signal: int = 0  # every advantage zero: the policy-gradient term was zero
  rows: int = 0
  empty_rows: int = 0

  def observe(self, metrics: dict[str, float]) -> list[str]:
    """Counts this step's updates (every `…train/applied` key) and returns its warnings."""
    warnings = []
    self.steps += 1
    for key in sorted(k for k in metrics if k.endswith("train/" + APPLIED)):
      prefix = key[:-len(APPLIED)]
      self.updates += 1
      if not metrics[key]:
        self.skipped += 1
        warnings.append(f"{prefix[:-1]}: the update was skipped (non-finite loss or gradient)")
      rows = int(metrics.get(prefix + ROWS, 0))
      if rows and not metrics.get(prefix + SIGNAL_ROWS, 1):
        self.no_signal += 1
        warnings.append(f"{prefix[:-1]}: every advantage is zero (each group's rewards are tied)")
      empty = int(metrics.get(prefix + EMPTY_ROWS, 0))
      self.rows += rows
      self.empty_rows += empty
      if rows and empty == rows:
        warnings.append(f"{prefix[:-1]}: every response is empty (no generated token)")
    return warnings

  def summary(self) -> str | None:
    """A warning line for the end of the run, or None when every update could teach (or no
    step ran)."""
    if not self.updates:
      return (f"NOTHING WAS LEARNED: 0 updates in {self.steps} steps (no step had a group with "
              "reward variance, or every rollout failed).") if self.steps else None
    bad = []
    if self.skipped:
      bad.append(f"{self.skipped} of {self.updates} updates skipped as non-finite")
    if self.no_signal:
      bad.append(f"{self.no_signal} of {self.updates} updates with every advantage zero")
    if self.empty_rows:
      bad.append(f"{self.empty_rows} of {self.rows} trained responses empty")
    if not bad:
      return None
    verdict = ("NOTHING WAS LEARNED: " if self.skipped + self.no_signal >= self.updates
               else "Warning: ")
    return verdict + "; ".join(bad) + "."
