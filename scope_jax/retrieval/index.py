"""A faiss inner-product index over encoder embeddings, saved with its corpus and encoder identity.

Embedding runs in chunks written to `<out>/embeddings/*.npy`, so an interrupted build resumes
where it stopped. Index kinds: 'flat' (exact, default), 'ivf' (IVF-Flat, for millions of passages)
and 'hnsw'. Loading checks the encoder identity and refuses a mismatch.
"""

from __future__ import annotations

import json
import pathlib
from typing import Sequence

import numpy as np
from absl import logging
from etils import epath

from scope_jax.retrieval.corpus import Passage, format_passages, load_corpus, write_corpus

INDEX_KINDS = ("flat", "ivf", "hnsw")


def _faiss():
  import faiss
  return faiss


def make_faiss_index(dim: int, kind: str = "flat", *, nlist: int = 1024, hnsw_m: int = 32):
  faiss = _faiss()
  if kind == "flat":
    return faiss.IndexFlatIP(dim)
  if kind == "ivf":
    return faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, nlist, faiss.METRIC_INNER_PRODUCT)
  if kind == "hnsw":
    return faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
  raise ValueError(f"Unknown index kind {kind!r}; valid: {', '.join(INDEX_KINDS)}.")


def write_faiss(index, path: epath.Path) -> None:
  """faiss writes local files itself; elsewhere (gs://) its bytes go through epath."""
  if "://" in str(path):
    path.write_bytes(_faiss().serialize_index(index).tobytes())
  else:
    _faiss().write_index(index, str(path))


def read_faiss(path: epath.Path):
  if "://" in str(path):
    return _faiss().deserialize_index(np.frombuffer(path.read_bytes(), np.uint8))
  return _faiss().read_index(str(path))


def embed_corpus(passages: Sequence[Passage], encoder, out_dir, *, chunk_size: int = 4096,
                 progress: bool = True) -> np.ndarray:
  """Embeds passages chunk by chunk into out_dir/embeddings, skipping chunks already written."""
  from tqdm import tqdm
  emb_dir = pathlib.Path(out_dir) / "embeddings"
  emb_dir.mkdir(parents=True, exist_ok=True)
  chunks = []
  starts = range(0, len(passages), chunk_size)
  for start in tqdm(starts, desc="embedding", unit="chunk", disable=not progress):
    part = passages[start:start + chunk_size]
    file = emb_dir / f"{start // chunk_size:06d}.npy"
    if file.exists():
      arr = np.load(file, allow_pickle=False)
      if arr.shape == (len(part), encoder.dim):
        chunks.append(arr)
        continue
      logging.warning("Re-embedding %s: it holds %s, expected %s.", file, arr.shape,
                      (len(part), encoder.dim))
    arr = encoder.encode([f"{p.title}. {p.text}" if p.title else p.text for p in part], "passage")
    tmp = file.with_suffix(".tmp.npy")
    np.save(tmp, arr.astype(np.float32))
    tmp.rename(file)
    chunks.append(arr)
  return np.concatenate(chunks).astype(np.float32)


class DenseIndex:
  """Passages + their faiss index + the identity of the encoder that embedded them."""

  def __init__(self, passages: list[Passage], index, encoder_identity: dict, kind: str = "flat"):
    self.passages, self.index, self.encoder_identity, self.kind = passages, index, encoder_identity, kind

  @classmethod
  def build(cls, passages: list[Passage], encoder, out_dir=None, *, kind: str = "flat",
            nlist: int | None = None, chunk_size: int = 4096, progress: bool = True):
    if not passages:
      raise ValueError("Cannot build an index over an empty corpus.")
    if out_dir is not None:
      vecs = embed_corpus(passages, encoder, out_dir, chunk_size=chunk_size, progress=progress)
    else:
      vecs = encoder.encode([f"{p.title}. {p.text}" if p.title else p.text for p in passages])
    out = cls.from_vectors(passages, vecs, encoder.identity, kind=kind, nlist=nlist)
    if out_dir is not None:
      out.save(out_dir)
    return out

  @classmethod
  def from_vectors(cls, passages: list[Passage], vecs_ND: np.ndarray, encoder_identity: dict, *,
                   kind: str = "flat", nlist: int | None = None) -> "DenseIndex":
    """The index over embeddings already computed, row i being passage i's."""
    if len(passages) != len(vecs_ND):
      raise ValueError(f"{len(passages)} passages but {len(vecs_ND)} embedding rows.")
    vecs_ND = np.ascontiguousarray(vecs_ND, np.float32)
    nlist = nlist or max(1, min(4096, int(4 * np.sqrt(len(passages)))))
    index = make_faiss_index(vecs_ND.shape[1], kind, nlist=nlist)
    if kind == "ivf":
      index.train(vecs_ND)
    index.add(vecs_ND)
    return cls(passages, index, dict(encoder_identity), kind)

  def save(self, out_dir) -> None:
    """Writes the index, its passages and meta.json (last) to a local or gs:// directory."""
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_faiss(self.index, out / "index.faiss")
    write_corpus(self.passages, out / "corpus.jsonl")
    meta = {"encoder": self.encoder_identity, "kind": self.kind, "count": len(self.passages),
            "dim": self.index.d}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))

  @classmethod
  def load(cls, path, encoder_identity: dict | None = None) -> "DenseIndex":
    path = epath.Path(path)
    if not (path / "meta.json").exists():
      raise FileNotFoundError(f"No index at {path} (meta.json missing); build one with "
                              "`python -m scope_jax.retrieval.build_index`.")
    meta = json.loads((path / "meta.json").read_text())
    if encoder_identity is not None:
      check_identity(meta["encoder"], encoder_identity, path)
    index = read_faiss(path / "index.faiss")
    passages = load_corpus(path / "corpus.jsonl")
    if len(passages) != index.ntotal:
      raise ValueError(f"Index {path} holds {index.ntotal} vectors but {len(passages)} passages.")
    return cls(passages, index, meta["encoder"], meta.get("kind", "flat"))

  def search(self, query_vecs: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    if hasattr(self.index, "nprobe"):
      self.index.nprobe = max(self.index.nprobe, 16)
    return self.index.search(np.ascontiguousarray(query_vecs, np.float32), k)


def check_identity(built_with: dict, current: dict, where) -> None:
  keys = ("weights_sha256", "query_prefix", "passage_prefix", "pooling", "normalize", "dim")
  diff = [k for k in keys if built_with.get(k) != current.get(k)]
  if diff:
    details = ", ".join(f"{k}: index {built_with.get(k)!r} vs encoder {current.get(k)!r}"
                        for k in diff)
    raise ValueError(f"Index {where} was built with a different encoder "
                     f"({built_with.get('name')!r} vs {current.get('name')!r}; {details}). "
                     "Rebuild the index with this encoder, or load the encoder it was built with.")


class SearchTool:
  """In-process batched retrieval implementing the rollout tool interface."""

  def __init__(self, index: DenseIndex, encoder, topk: int = 3):
    check_identity(index.encoder_identity, encoder.identity, "in memory")
    self.index, self.encoder, self.topk = index, encoder, topk

  def retrieve(self, queries: Sequence[str], topk: int | None = None
               ) -> list[list[tuple[Passage, float]]]:
    if not queries:
      return []
    k = min(topk or self.topk, len(self.index.passages))
    scores, ids = self.index.search(self.encoder.encode(list(queries), "query"), k)
    return [[(self.index.passages[i], float(s)) for i, s in zip(row_ids, row_s) if i >= 0]
            for row_ids, row_s in zip(ids, scores)]

  def __call__(self, queries: Sequence[str]) -> list[str]:
    return [format_passages(p for p, _ in hits) for hits in self.retrieve(queries)]
