"""The search tool a method's roles call, built from a `retrieval` config section."""

from __future__ import annotations

import ml_collections
from absl import logging

from scope_jax import assets
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.retrieval.corpus import load_corpus
from scope_jax.retrieval.index import DenseIndex, SearchTool
from scope_jax.retrieval.service import RetrievalClient, load_encoder
from scope_jax import world as world_lib


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


def from_config(r: ml_collections.ConfigDict, world_seed: int = 0, corpus_seeds=()):
  """(source documents, search tool): the bundled demo index, a prebuilt index directory, or a
  running Search-R1-compatible server (`retrieval.url`) with the corpus it serves; from a
  `retrieval` config section (every method that searches searches this way); `world_seed` is the
  world of `corpus='world'` (the run's `world.seed`) and `corpus_seeds` the worlds whose
  documents join it (`world.corpus_seeds`)."""
  if r.url:
    passages = demo.demo_passages() if r.corpus == "demo" else load_corpus(r.corpus)
    return passages, RetrievalClient(r.url, topk=r.topk)
  encoder = load_encoder(r.encoder)
  if r.index:
    index = DenseIndex.load(r.index, encoder.identity)
  elif r.corpus == "demo":
    index = demo.demo_index(encoder)
  elif r.corpus == "world":
    index = world_index(world_seed, encoder, corpus_seeds)
  else:
    raise ValueError(f"retrieval.corpus={r.corpus!r} needs a prebuilt index: build one with "
                     "`python -m scope_jax.retrieval.build_index --corpus=... --out=DIR` and set "
                     "--config.retrieval.index=DIR (or serve it and set retrieval.url).")
  passages = index.passages if r.corpus in ("demo", "world", "") else load_corpus(r.corpus)
  if r.max_documents:
    passages = passages[:r.max_documents]
  return passages, SearchTool(index, encoder, topk=r.topk)


def world_index(seed: int, encoder, corpus_seeds=()) -> DenseIndex:
  """The dense index over world `seed`'s documents and those of `corpus_seeds`' worlds
  (`world_lib.corpus`), built once into the asset cache."""
  passages = world_lib.corpus(seed, corpus_seeds)
  out = assets.cache_dir() / f"world_{'+'.join(str(s) for s in (seed, *corpus_seeds))}_index"
  if (out / "meta.json").exists():
    try:
      index = DenseIndex.load(out, encoder.identity)
      if index.passages == passages:
        return index
    except ValueError as e:
      logging.info("Rebuilding the world index: %s", e)
  logging.info("Building the index of world %d (%d documents) in %s", seed, len(passages), out)
  return DenseIndex.build(passages, encoder, out, chunk_size=512, progress=False)
