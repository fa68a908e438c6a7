"""Dense retrieval: a JAX BERT encoder (E5 / MiniLM), faiss indexes, and a Search-R1 service."""

from scope_jax.retrieval.corpus import Passage, format_passages, load_corpus
from scope_jax.retrieval.index import DenseIndex, SearchTool
from scope_jax.retrieval.service import RetrievalClient, load_encoder, make_server

__all__ = ["DenseIndex", "Passage", "RetrievalClient", "SearchTool", "format_passages",
           "load_corpus", "load_encoder", "make_server"]
