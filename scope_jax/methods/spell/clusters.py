"""Document clusters (k-means over passage embeddings, with faiss) and SPELL's history memory."""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from scope_jax.retrieval import demo_corpus as demo
from scope_jax.retrieval.corpus import Passage, load_corpus
from scope_jax.retrieval.service import load_encoder
from scope_jax.rewards.match import numbers
from scope_jax import world as world_lib


def kmeans_clusters(vectors: np.ndarray, num_clusters: int, *, seed: int = 0, min_size: int = 2,
                    iterations: int = 20) -> list[list[int]]:
  """Spherical k-means; returns clusters (lists of row indices) with at least `min_size` members."""
  import faiss
  if len(vectors) < num_clusters:
    raise ValueError(f"Cannot form {num_clusters} clusters from {len(vectors)} passages.")
  km = faiss.Kmeans(vectors.shape[1], num_clusters, niter=iterations, seed=seed, spherical=True,
                    verbose=False)
  km.train(np.ascontiguousarray(vectors, np.float32))
  _, assign = km.index.search(np.ascontiguousarray(vectors, np.float32), 1)
  groups = collections.defaultdict(list)
  for i, c in enumerate(assign[:, 0]):
    groups[int(c)].append(i)
  clusters = [sorted(g) for _, g in sorted(groups.items()) if len(g) >= min_size]
  if not clusters:
    raise ValueError(f"No cluster has at least {min_size} passages; lower min_size or num_clusters.")
  return clusters


def render_context(passages: Sequence[Passage], max_doc_chars: int = 0) -> str:
  """Documents as the roles read them: title, then text (cut to `max_doc_chars`; 0 = whole, the
  paper), blank-line separated."""
  limit = max_doc_chars or None
  return "\n\n".join(f"{p.title}\n{p.text[:limit]}" for p in passages)


def is_numeric(passage: Passage, min_numbers: int = 3) -> bool:
  return len(numbers(passage.text)) >= min_numbers


def cluster_tasks(cluster: Sequence[Passage], tasks: Sequence[str]) -> list[str]:
  """Tasks a cluster supports: financial-math QA only where most documents are numeric."""
  numeric = sum(is_numeric(p) for p in cluster) / max(len(cluster), 1)
  return [t for t in tasks if t != "doc_math" or numeric >= 0.5]


@dataclasses.dataclass
class HistoryEntry:
  doc_ids: list[str]
  question: str
  answer: str


class HistoryMemory:
  """Per-cluster FIFO of the L most recent solvable (documents, question, answer) triples."""

  def __init__(self, size: int):
    self.size = size
    self._mem: dict[str, collections.deque] = {}

  def get(self, key: str) -> list[HistoryEntry]:
    return list(self._mem.get(key, ()))

  def push(self, key: str, entry: HistoryEntry) -> None:
    self._mem.setdefault(key, collections.deque(maxlen=self.size)).append(entry)

  def context_doc_ids(self, key: str, new_ids: Sequence[str]) -> list[str]:
    """Remembered documents ∪ the new ones, in first-seen order (the context grows)."""
    out, seen = [], set()
    for e in self.get(key):
      for d in e.doc_ids:
        if d not in seen:
          seen.add(d)
          out.append(d)
    for d in new_ids:
      if d not in seen:
        seen.add(d)
        out.append(d)
    return out

  def to_json(self) -> dict:
    return {k: [dataclasses.asdict(e) for e in v] for k, v in self._mem.items()}

  @classmethod
  def from_json(cls, size: int, data: dict) -> "HistoryMemory":
    mem = cls(size)
    for k, entries in data.items():
      for e in entries:
        mem.push(k, HistoryEntry(**e))
    return mem


def from_config(data, seed: int = 0, world_seed: int = 0, corpus_seeds=(),
                heldout_entities: bool = False):
  """The corpus (bundled demo corpus by default) and its document clusters: k-means into
  `num_clusters` groups, or groups of about `cluster_size` documents when num_clusters is 0
  (from a `data` config section); `data.corpus='world'` is world `world_seed`'s documents (its
  trained half alone with `heldout_entities`) and those of `corpus_seeds`' worlds."""
  if data.corpus == "world":
    passages = world_lib.corpus(world_seed, corpus_seeds, heldout_entities)
  else:
    passages = demo.demo_passages() if data.corpus == "demo" else load_corpus(data.corpus)
  if data.max_passages:
    passages = passages[:data.max_passages]
  k = data.num_clusters or max(len(passages) // data.cluster_size, 1)
  if len(passages) < k * data.min_cluster_size:
    raise ValueError(f"The corpus has {len(passages)} passages, too few for {k} clusters of at "
                     f"least {data.min_cluster_size}.")
  vectors = None
  if data.corpus == "demo" and data.encoder == "minilm":
    vectors = demo.bundled_vectors()[:len(passages)]  # shipped with the corpus: no encoder needed
  if vectors is None:
    vectors = load_encoder(data.encoder).encode([f"{p.title}. {p.text}" for p in passages])
  groups = kmeans_clusters(vectors, k, seed=seed, min_size=data.min_cluster_size)
  cap = data.max_cluster_size or None
  return passages, [g[:cap] for g in groups]
