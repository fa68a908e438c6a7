"""Query-chunked attention equals one-block attention, in value and gradient."""

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

  np.testing.assert_allclose(f(8)(q, kk, v), f(64)(q, kk, v), atol=1e-6)
  g8 = jax.grad(lambda *a: (f(8)(*a) ** 2).sum(), argnums=(0, 1, 2))(q, kk, v)
  g64 = jax.grad(lambda *a: (f(64)(*a) ** 2).sum(), argnums=(0, 1, 2))(q, kk, v)
  for a, b_ in zip(g8, g64):
    np.testing.assert_allclose(a, b_, atol=1e-5)
