"""The search tool a method's roles call, built from a `retrieval` config section."""

from __future__ import annotations

from typing import Callable

import ml_collections

from scope_jax.retrieval import demo_corpus as demo
from scope_jax.retrieval.corpus import load_corpus
from scope_jax.retrieval.index import DenseIndex, SearchTool
from scope_jax.retrieval.service import RetrievalClient, load_encoder


def validate(r: ml_collections.ConfigDict) -> None:
  """Checks a `retrieval` section before anything is loaded."""
  if not r.url and not r.encoder:
    raise ValueError("retrieval.encoder is empty: set it to the query encoder's checkpoint "
                     "directory (E5-base-v2 in the paper) or an asset name such as 'minilm'.")
  if not r.url and not r.index and r.corpus not in ("demo", "world"):
    raise ValueError("Searching needs an index: set --config.retrieval.index to a directory "
                     "built with `python -m scope_jax.retrieval.build_index` (or retrieval.url to "
                     "a running retrieval server, with retrieval.corpus), or use the demo or "
                     "world corpus.")


def from_config(r: ml_collections.ConfigDict, world_index: Callable | None = None):
  """(source documents, search tool): the bundled demo index, a prebuilt index directory, or a
  running Search-R1-compatible server (`retrieval.url`) with the corpus it serves; from a
  `retrieval` config section (every method that searches searches this way). `world_index(encoder)`
  builds the index of `corpus='world'` (`scope_jax.world.search.from_config` passes the run's world)."""
  if r.url:
    passages = demo.demo_passages() if r.corpus == "demo" else load_corpus(r.corpus)
    return passages, RetrievalClient(r.url, topk=r.topk)
  if r.corpus == "world" and not r.index and world_index is None:
    raise ValueError("retrieval.corpus='world' needs the world's documents: build the tool with "
                     "scope_jax.world.search.from_config(section, world_seed).")
  encoder = load_encoder(r.encoder)
  if r.index:
    index = DenseIndex.load(r.index, encoder.identity)
  elif r.corpus == "demo":
    index = demo.demo_index(encoder)
  elif r.corpus == "world":
    index = world_index(encoder)
  else:
    raise ValueError(f"retrieval.corpus={r.corpus!r} needs a prebuilt index: build one with "
                     "`python -m scope_jax.retrieval.build_index --corpus=... --out=DIR` and set "
                     "--config.retrieval.index=DIR (or serve it and set retrieval.url).")
  passages = index.passages if r.corpus in ("demo", "world", "") else load_corpus(r.corpus)
  if r.max_documents:
    passages = passages[:r.max_documents]
  return passages, SearchTool(index, encoder, topk=r.topk)
