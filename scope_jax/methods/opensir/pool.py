"""OpenSIR's problem pool: every legal problem the teacher wrote, with its concepts and its
embedding (what the diversity reward compares new problems against), saved with checkpoints."""

from __future__ import annotations

import base64

import numpy as np


class Pool:
  """The problem pool: texts, concepts and L2-normalised embeddings [P, D], grown in place."""

  def __init__(self, dim: int):
    self.problems: list[str] = []
    self.concepts: list[list[str]] = []
    self.embeddings = np.zeros((0, dim), np.float32)

  def __len__(self) -> int:
    return len(self.problems)

  def add(self, problems, concepts, embeddings_ND) -> None:
    self.problems += list(problems)
    self.concepts += [list(c) for c in concepts]
    self.embeddings = np.concatenate([self.embeddings, np.asarray(embeddings_ND, np.float32)])

  def distinct_concepts(self) -> int:
    return len({c for cs in self.concepts for c in cs})

  def to_json(self) -> dict:
    """Texts and concepts; the embeddings go to the checkpoint as a float32 array beside it
    (`host_state`'s `pool_embeddings`), not as JSON."""
    return {"problems": self.problems, "concepts": self.concepts,
            "dim": int(self.embeddings.shape[1])}

  @classmethod
  def from_json(cls, state: dict, embeddings_PD: np.ndarray | None = None) -> "Pool":
    pool = cls(state["dim"])
    if embeddings_PD is None:  # a checkpoint that carried them as base64 float32 bytes
      raw = np.frombuffer(base64.b64decode(state["embeddings"]), "<f4")
      embeddings_PD = raw.reshape(-1, state["dim"]).copy()
    pool.add(state["problems"], state["concepts"], np.asarray(embeddings_PD, np.float32))
    if len(pool.embeddings) != len(pool.problems):
      raise ValueError(f"The checkpoint's pool has {len(pool.problems)} problems but "
                       f"{len(pool.embeddings)} embeddings; it is not from this version.")
    return pool
