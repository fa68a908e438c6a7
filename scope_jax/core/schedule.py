"""Stages that take turns within each iteration, one runner step per stage step (e.g. a
challenger's stage, then a solver's), so checkpoints land inside and between stages; the
iteration's window of source documents; and the wall time spent in each stage."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Schedule:
  """`stages`: (name, steps per iteration) in the order they run."""

  stages: tuple[tuple[str, int], ...]

  @property
  def names(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.stages)

  def locate(self, step: int) -> tuple[int, str, int]:
    """Global step → (iteration, stage, step within the stage)."""
    it, r = divmod(step, sum(n for _, n in self.stages))
    for name, n in self.stages:
      if r < n:
        return it, name, r
      r -= n
    raise AssertionError("unreachable")


def corpus_window(num_passages: int, size: int, it: int, seed: Sequence[int]) -> np.ndarray:
  """Indices of iteration `it`'s documents: a window of `size` over one seeded permutation of the
  corpus, so iterations use disjoint documents while the corpus lasts."""
  perm = np.random.default_rng(list(seed)).permutation(num_passages)
  return perm[(it * size + np.arange(size)) % num_passages]


class StageClock:
  """Seconds spent in each stage over the run (host state: it is this host's wall time)."""

  def __init__(self):
    self.seconds: dict[str, float] = {}

  def add(self, stage: str, seconds: float) -> None:
    self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

  def timed(self, stage: str, fn, *args):
    """(fn(*args), seconds), the seconds added to `stage`."""
    start = time.perf_counter()
    out = fn(*args)
    dt = time.perf_counter() - start
    self.add(stage, dt)
    return out, dt

  def summary(self, what: str = "stage") -> str:
    return f"  wall time per {what}: " + ", ".join(f"{k} {v:.1f}s"
                                                 for k, v in sorted(self.seconds.items()))
