"""Attention: query-chunked equals one block (value and gradient); the blockwise cached path
equals the dense one on every real query."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import ops, transformer


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


def _cache_case(rng, starts, lengths, s, t, *, left=False, n=4, k=2, h=8, dtype=jnp.float32):
  """Queries written at `starts` (right-padded to t, or left-padded when `left`) into a cache
  of s slots; the keys before each start hold `starts` earlier tokens."""
  b = len(starts)
  q = jnp.asarray(rng.normal(size=(b, t, n, h)), dtype)
  kT = jnp.asarray(rng.normal(size=(b, k, h, s)), dtype)
  v = jnp.asarray(rng.normal(size=(b, k, s, h)), dtype)
  starts, lengths = np.asarray(starts), np.asarray(lengths)
  slots = starts[:, None] + np.arange(t)[None]
  cols = np.arange(s)[None]
  if left:  # the block's real tokens are its last `lengths`
    valid = (cols >= (starts + t - lengths)[:, None]) & (cols < (starts + t)[:, None])
  else:
    valid = cols < (starts + lengths)[:, None]
  real = np.take_along_axis(valid, np.minimum(slots, s - 1), axis=1) & (slots < s)
  return q, kT, v, jnp.asarray(slots, jnp.int32), jnp.asarray(valid), real


def _dense(q, kT, v, slots, valid, **kw):
  return ops.attend_kv(q, kT, v, slots, valid, **kw)


@pytest.mark.parametrize("q_chunk,k_block", [(16, 32), (8, 48), (64, 512)])
def test_cached_attention_equals_dense_on_real_queries(q_chunk, k_block):
  rng = np.random.default_rng(1)
  # rows of different lengths in one window; 37 queries (not a multiple of the chunk); 160
  # slots (not a multiple of 48: the last key block overlaps the one before, and the last row's
  # queries there see valid keys in the overlap, which must count once)
  q, kT, v, slots, valid, real = _cache_case(rng, [0, 30, 90, 110, 118], [37, 20, 5, 1, 37],
                                             160, 37)
  want = _dense(q, kT, v, slots, valid)
  got = ops.attend_cached(q, kT, v, slots, valid, q_chunk=q_chunk, k_block=k_block)
  chex.assert_shape(got, q.shape)
  chex.assert_trees_all_close(jnp.where(real[..., None, None], got, 0.0),
                              jnp.where(real[..., None, None], want, 0.0), atol=1e-6, rtol=1e-6)


def test_cached_attention_left_padding_skips_padded_chunks():
  rng = np.random.default_rng(2)
  q, kT, v, slots, valid, real = _cache_case(rng, [0, 0, 0], [64, 40, 3], 72, 64, left=True)
  want = _dense(q, kT, v, slots, valid)
  got = ops.attend_cached(q, kT, v, slots, valid, q_chunk=16, k_block=16)
  chex.assert_trees_all_close(jnp.where(real[..., None, None], got, 0.0),
                              jnp.where(real[..., None, None], want, 0.0), atol=1e-6, rtol=1e-6)
  # a chunk holding no real query is not computed: its output is zeros, not the dense path's
  # average over masked keys
  assert not real[2, :48].any()
  chex.assert_trees_all_equal(got[2, :48], jnp.zeros_like(got[2, :48]))


def test_cached_attention_never_reads_key_blocks_past_a_chunk():
  """NaN in the key blocks that no query may attend (past each chunk's last slot, or with no
  valid key) would reach the output through 0 × NaN if they were read."""
  rng = np.random.default_rng(3)
  q, kT, v, slots, valid, real = _cache_case(rng, [16, 32], [16, 16], 128, 16)
  poison = np.zeros((2, 128), bool)
  poison[0, 32:], poison[1, 48:] = True, True  # past each row's block: whole 16-key blocks
  kT = jnp.where(jnp.asarray(poison)[:, None, None, :], jnp.nan, kT)
  v = jnp.where(jnp.asarray(poison)[:, None, :, None], jnp.nan, v)
  got = ops.attend_cached(q, kT, v, slots, valid, q_chunk=8, k_block=16)
  assert bool(jnp.isfinite(got).all())
  want = _dense(q, jnp.nan_to_num(kT), jnp.nan_to_num(v), slots, valid)
  chex.assert_trees_all_close(got, want, atol=1e-6, rtol=1e-6)


def test_cached_attention_sliding_window_softcap_and_scale():
  rng = np.random.default_rng(4)
  q, kT, v, slots, valid, real = _cache_case(rng, [5, 50], [30, 12], 96, 30)
  # RoPE positions differ from slots (a hole in row 1) so the window follows positions
  pos = np.broadcast_to(np.arange(96)[None], (2, 96)).copy()
  pos[1, 40:] -= 3
  q_pos = jnp.asarray(np.take_along_axis(pos, np.asarray(slots), axis=1), jnp.int32)
  kw = dict(q_pos_BT=q_pos, k_pos_BS=jnp.asarray(pos, jnp.int32), scale=0.3, cap=5.0)
  for window in (jnp.int32(7), jnp.int32(0)):  # a sliding layer, a global one
    want = _dense(q, kT, v, slots, valid, window=window, **kw)
    got = ops.attend_cached(q, kT, v, slots, valid, window=window, q_chunk=8,
                                        k_block=16, **kw)
    chex.assert_trees_all_close(jnp.where(real[..., None, None], got, 0.0),
                                jnp.where(real[..., None, None], want, 0.0), atol=1e-6,
                                rtol=1e-6)


def test_cached_attention_bfloat16():
  rng = np.random.default_rng(5)
  q, kT, v, slots, valid, real = _cache_case(rng, [0, 20], [24, 9], 64, 24, dtype=jnp.bfloat16)
  want = _dense(q.astype(jnp.float32), kT.astype(jnp.float32), v.astype(jnp.float32), slots,
                valid)
  got = ops.attend_cached(q, kT, v, slots, valid, q_chunk=8, k_block=16)
  assert got.dtype == jnp.bfloat16
  chex.assert_trees_all_close(jnp.where(real[..., None, None], got.astype(jnp.float32), 0.0),
                              jnp.where(real[..., None, None], want, 0.0), atol=2e-2, rtol=2e-2)
