"""The splash attention path (TPU training) equals `ops.attend_kv` on every real query, in value
and gradient: grouped-query heads, soft-capped scores, a sliding window chosen by a traced
per-layer value, left and right padding. Run in Pallas's interpreter on the CPU."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import ops, splash

pytest.importorskip("jax.experimental.pallas.ops.tpu.splash_attention")


def _case(seed, b=3, t=256, n=4, k=2, h=64):
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), jnp.float32)
  kk = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  v = jnp.asarray(rng.normal(size=(b, t, k, h)), jnp.float32)
  cols = np.arange(t)[None]
  valid = np.stack([cols[0] >= 40,  # left padding
                    cols[0] < 200,  # right padding
                    cols[0] >= 0])  # none
  pos = np.maximum(np.cumsum(valid, axis=1) - 1, 0)  # real tokens count from 0
  return q, kk, v, jnp.asarray(valid), jnp.asarray(pos, jnp.int32)


def _xla(q, kk, v, valid, pos, *, window, cap, scale):
  b, t = valid.shape
  slots = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
  kw = dict(q_pos_BT=pos, k_pos_BS=pos, window=window) if window is not None else {}
  return ops.attend_kv(q, jnp.einsum("BSKH->BKHS", kk), jnp.einsum("BSKH->BKSH", v), slots,
                       valid, scale=scale, cap=cap, **kw)


@pytest.mark.parametrize("window,cap", [(None, 0.0), (0, 50.0), (48, 0.0), (48, 5.0)])
def test_splash_equals_attend_kv_on_real_queries(window, cap):
  q, kk, v, valid, pos = _case(0)
  scale = 0.11
  sliding = 48 if window is not None else 0
  real = np.asarray(valid)[:, :, None, None]
  w = None if window is None else jnp.int32(window)

  def ours(q_, k_, v_):
    return splash.attend(q_, k_, v_, valid, window=w, sliding=sliding, scale=scale, cap=cap,
                         interpret=True)

  def theirs(q_, k_, v_):
    return _xla(q_, k_, v_, valid, pos, window=w, cap=cap, scale=scale)

  chex.assert_trees_all_close(np.where(real, ours(q, kk, v), 0),
                              np.where(real, theirs(q, kk, v), 0), atol=2e-5, rtol=2e-5)
  # Gradients of a loss that reads real positions only.
  loss = lambda f: lambda *a: (jnp.where(real, f(*a), 0.0) ** 2).sum()
  g_ours = jax.grad(loss(ours), argnums=(0, 1, 2))(q, kk, v)
  g_theirs = jax.grad(loss(theirs), argnums=(0, 1, 2))(q, kk, v)
  chex.assert_trees_all_close(g_ours, g_theirs, atol=1e-4, rtol=1e-4)


def test_splash_applies_only_when_the_target_is_a_tpu():
  assert not splash.applies(1024, 64)  # this host's CPU
  with ops.compiling_for("tpu", 4):
    assert splash.applies(1024, 64) and splash.applies(384, 128)
    assert not splash.applies(1000, 64) and not splash.applies(1024, 40)
