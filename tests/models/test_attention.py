"""Query-chunked attention equals one-block attention, in value and gradient."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import transformer


def test_chunked_attention_equals_single_block():
  rng = np.random.default_rng(0)
  b, t, n, k, h = 2, 37, 4, 2, 8
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
  valid = jnp.asarray(rng.random((b, t)) > 0.2)

  def f(chunk):
    return lambda q_, k_, v_: transformer.attend(q_, k_, v_, slots, valid, q_chunk=chunk)

  chex.assert_trees_all_close(f(8)(q, kk, v), f(64)(q, kk, v), atol=1e-6, rtol=1e-7)
  chex.assert_trees_all_close(f(16)(q, kk, v), f(64)(q, kk, v), atol=1e-6, rtol=1e-7)  # 3 × 13
  g8 = jax.grad(lambda *a: (f(8)(*a) ** 2).sum(), argnums=(0, 1, 2))(q, kk, v)
  g64 = jax.grad(lambda *a: (f(64)(*a) ** 2).sum(), argnums=(0, 1, 2))(q, kk, v)
  chex.assert_trees_all_close(g8, g64, atol=1e-5, rtol=1e-7)
