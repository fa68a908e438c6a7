"""Programs compiled for TPU slices (compile-only devices) cannot be read back from JAX's
persistent cache, so these tests compile without it."""

import jax
import pytest


@pytest.fixture(autouse=True)
def _no_persistent_cache():
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", before)
