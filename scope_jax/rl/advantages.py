"""Advantage estimators over host rewards (numpy): group, batch and keyed z-scores.

All are one function, `zscore_by_key`: rewards are normalised within each key — the GRPO group
(G rollouts of one prompt), the whole batch (REINFORCE++ baseline), a task type (a
questioner's) or a hop count (an examiner's).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import numpy as np

STD_KINDS = ("population", "unbiased", "none")


def zscore_by_key(rewards: Sequence[float], keys: Sequence[Hashable] | None = None, *,
                  std: str = "population", eps: float = 1e-6) -> np.ndarray:
  """A_i = (r_i − mean_k) / (std_k + eps) over the rewards sharing key k (one key if None).

  std='population' divides by n (so that Σ A² = G); 'unbiased' by n − 1 (verl,
  TRL); 'none' only centres, A_i = r_i − mean_k (Dr. GRPO), so a group whose rewards differ
  by a little keeps small advantages. A key with a single reward gets advantage 0.
  """
  r = np.asarray(rewards, np.float64)
  if std not in STD_KINDS:
    raise ValueError(f"Unknown std kind {std!r}; valid: {', '.join(STD_KINDS)}.")
  keys = [0] * len(r) if keys is None else list(keys)
  if len(keys) != len(r):
    raise ValueError(f"{len(r)} rewards but {len(keys)} keys.")
  out = np.zeros_like(r)
  groups: dict[Hashable, list[int]] = {}
  for i, k in enumerate(keys):
    groups.setdefault(k, []).append(i)
  for idx in groups.values():
    vals = r[idx]
    if len(vals) < 2:
      continue
    centred = vals - vals.mean()
    out[idx] = centred if std == "none" else centred / (vals.std(ddof=int(std == "unbiased")) + eps)
  return out.astype(np.float32)


def group_zscore(rewards_NG, *, std: str = "population", eps: float = 1e-6) -> np.ndarray:
  """GRPO advantages for rewards shaped [num_prompts, G]: z-score within each row."""
  r = np.asarray(rewards_NG, np.float64)
  keys = np.repeat(np.arange(r.shape[0]), r.shape[1])
  return zscore_by_key(r.reshape(-1), keys, std=std, eps=eps).reshape(r.shape)


def batch_zscore(rewards, keys=None, *, std: str = "population", eps: float = 1e-6) -> np.ndarray:
  """REINFORCE++-style baseline: z-score across the batch, optionally within each key."""
  return zscore_by_key(rewards, keys, std=std, eps=eps)


def keyed_zscore(rewards, keys, *, delta: float = 1e-6, std: str = "population") -> np.ndarray:
  """Dr.Zero's: A = (r − mean_h) / (std_h + δ) within each key h (a hop count)."""
  return zscore_by_key(rewards, keys, std=std, eps=delta)
