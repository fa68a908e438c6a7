"""Searching a world: the dense index over a world's documents (built once into the asset cache)
and the search tool of a `retrieval` config section whose corpus may be that world
(`retrieval.corpus='world'`)."""

from __future__ import annotations

import functools

import ml_collections
from absl import logging

from scope_jax import assets
from scope_jax.retrieval import search as retrieval_search
from scope_jax.retrieval.index import DenseIndex
from scope_jax.world import corpus


def index(seed: int, encoder, corpus_seeds=(), heldout_entities: bool = False) -> DenseIndex:
  """The dense index over world `seed`'s documents (its trained half alone with
  `heldout_entities`) and those of `corpus_seeds`' worlds (`world.corpus`), built once into the
  asset cache."""
  passages = corpus(seed, corpus_seeds, heldout_entities)
  name = "+".join(str(s) for s in (seed, *corpus_seeds)) + ("_trained" if heldout_entities else "")
  out = assets.cache_dir() / f"world_{name}_index"
  if (out / "meta.json").exists():
    try:
      built = DenseIndex.load(out, encoder.identity)
      if built.passages == passages:
        return built
    except ValueError as e:
      logging.info("Rebuilding the world index: %s", e)
  logging.info("Building the index of world %d (%d documents) in %s", seed, len(passages), out)
  return DenseIndex.build(passages, encoder, out, chunk_size=512, progress=False)


def from_config(r: ml_collections.ConfigDict, world_seed: int = 0, corpus_seeds=(),
                heldout_entities: bool = False):
  """(source documents, search tool) of a `retrieval` section (`retrieval.search.from_config`),
  where `corpus='world'` is world `world_seed` (the run's `world.seed`) joined by the documents of
  `corpus_seeds`' worlds (`world.corpus_seeds`); with `heldout_entities` (the run's
  `world.heldout_entities`) the world lends its trained half alone, to search and to draw from."""
  return retrieval_search.from_config(
      r, world_index=functools.partial(index, world_seed, corpus_seeds=corpus_seeds,
                                       heldout_entities=heldout_entities))
