"""Proposer difficulty rewards: map a solver success rate p̄ ∈ [0, 1] to a reward."""

from __future__ import annotations

import math

SPELL_SIGMA = 0.5 / 3
MAPPINGS = ("gaussian", "reverse", "rzero")


def spell_gaussian(p: float, sigma: float = SPELL_SIGMA) -> float:
  """SPELL Eq. 5: 0 if p̄ ∈ {0, 1}, else exp(−(p̄ − ½)² / (2σ²)) with σ = 1/6."""
  if p <= 0.0 or p >= 1.0:
    return 0.0
  return math.exp(-((p - 0.5) ** 2) / (2 * sigma * sigma))


def azr_reverse(p: float) -> float:
  """Absolute Zero: 1 − p̄, and 0 when p̄ ∈ {0, 1} (unsolvable or trivial)."""
  if p <= 0.0 or p >= 1.0:
    return 0.0
  return 1.0 - p


def rzero_uncertainty(p: float) -> float:
  """R-Zero: 1 − 2|p̄ − ½| (peak 1 at ½, 0 at 0 and 1)."""
  return 1.0 - 2.0 * abs(p - 0.5)


def questioner_difficulty(p: float, mapping: str = "gaussian") -> float:
  if mapping == "gaussian":
    return spell_gaussian(p)
  if mapping == "reverse":
    return azr_reverse(p)
  if mapping == "rzero":
    return rzero_uncertainty(p)
  raise ValueError(f"Unknown difficulty mapping {mapping!r}; valid: {', '.join(MAPPINGS)}.")
