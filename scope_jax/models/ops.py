"""Pure building blocks of the decoder: RMSNorm, RoPE and causal grouped-query attention.

Dimension letters: B batch, T query length, S key length, D model dim, N query heads, K kv heads,
G = N / K, H head dim. Softmax and norms run in float32; masks use a large finite negative value.
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp

from scope_jax.models.config import ModelConfig, rope_attention_scaling, rope_inv_freq

K_MASK = -2.3819763e38

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def rms_norm(x: jax.Array, weight: jax.Array, eps: float, *, plus_one: bool = False,
             axes: int = 1) -> jax.Array:
  """RMSNorm over the last `axes` dims in float32. Llama/Qwen cast back to x's dtype before the
  scale; Gemma (`plus_one`) scales by (1 + w) in float32, then casts (as Hugging Face does)."""
  x32 = x.astype(jnp.float32)
  dims = tuple(range(-axes, 0))
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=dims, keepdims=True) + eps)
  if plus_one:
    return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)
  return weight.astype(x.dtype) * y.astype(x.dtype)


def softcap(x: jax.Array, cap: float) -> jax.Array:
  """cap · tanh(x / cap) (Gemma-2's attention and final logit capping); identity when cap is 0."""
  return x if not cap else cap * jnp.tanh(x / cap)


def rope_tables(config: ModelConfig, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, T, H] in float32 for the rotate-half RoPE convention (times YaRN's scale)."""
  inv_freq = jnp.asarray(rope_inv_freq(config))
  freqs_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)
  scale = rope_attention_scaling(config)
  return jnp.cos(emb_BTH) * scale, jnp.sin(emb_BTH) * scale


def apply_rope(x_BTNH: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array) -> jax.Array:
  half = x_BTNH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BTNH[..., half:], x_BTNH[..., :half]], axis=-1)
  cos, sin = cos_BTH[:, :, None, :].astype(x_BTNH.dtype), sin_BTH[:, :, None, :].astype(x_BTNH.dtype)
  return x_BTNH * cos + rotated * sin


def _kv_dims(keys, k_spec: str) -> tuple[int, int]:
  """(kv heads, key slots) of keys whose axes are `k_spec` (e.g. 'BKHS')."""
  return keys.shape[k_spec.index("K")], keys.shape[k_spec.index("S")]


def _attend_block(q_BTNH, keys, values, q_slot_BT, k_valid_BS, q_pos_BT, k_pos_BS, *,
                  scale, cap, window, kv_specs=("BKHS", "BKSH")):
  """Grouped-query attention for one query block; the causal mask comes from slot indices, the
  sliding window (when `window` > 0) from RoPE positions, so padding never shifts it."""
  b, t, n, h = q_BTNH.shape
  k_spec, v_spec = kv_specs
  kv, s = _kv_dims(keys, k_spec)
  q_BKGTH = jnp.einsum("BTKGH->BKGTH", q_BTNH.reshape(b, t, kv, n // kv, h))
  scores_BKGTS = jnp.einsum(f"BKGTH,{k_spec}->BKGTS", q_BKGTH, keys,
                            preferred_element_type=jnp.float32) * (h ** -0.5 if scale is None
                                                                   else scale)
  scores_BKGTS = softcap(scores_BKGTS, cap)
  k_slot_S = jnp.arange(s, dtype=jnp.int32)
  mask_BTS = (k_slot_S[None, None, :] <= q_slot_BT[:, :, None]) & k_valid_BS[:, None, :]
  if window is not None:
    near_BTS = (q_pos_BT[:, :, None] - k_pos_BS[:, None, :]) < window
    mask_BTS &= (window <= 0) | near_BTS
  scores_BKGTS = jnp.where(mask_BTS[:, None, None, :, :], scores_BKGTS, K_MASK)
  probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(values.dtype)
  out_BKGTH = jnp.einsum(f"BKGTS,{v_spec}->BKGTH", probs_BKGTS, values)
  return jnp.einsum("BKGTH->BTKGH", out_BKGTH).reshape(b, t, n, h)


_TARGET: list[tuple[str, int]] = []  # (platform, device count) programs are traced for


@contextlib.contextmanager
def compiling_for(platform: str, devices: int):
  """Traces programs as they are traced on `platform` with `devices` devices (the choices below
  follow the target, not this host): `scope_jax.plan` compiles TPU programs on a CPU host."""
  _TARGET.append((platform, devices))
  try:
    yield
  finally:
    _TARGET.pop()


def _target() -> tuple[str, int]:
  return _TARGET[-1] if _TARGET else (jax.default_backend(), jax.device_count())


def target_platform() -> str:
  """The platform programs are traced for: this host's backend, or `compiling_for`'s."""
  return _target()[0]


def slice_layers_outside_loops() -> bool:
  """Whether a decode loop takes each layer's weights out of the stacked arrays once, before it
  starts: on CPU, where XLA would copy every layer's slice on every step. Elsewhere the slices
  stay inside the loop, where the compiler reads them in place (taken outside, they are a second
  copy of every weight held for the whole loop)."""
  return _target()[0] == "cpu"


def default_q_chunk() -> int:
  """Query rows per attention block: 64 on CPU, where a block's [T, S] scores should stay in
  cache (at 512 to 3k keys the forward is 1.7-2.8x faster than with 512 rows, forward and
  backward at 1k keys 1.3x); 512 on accelerators, whose matrix units want large tiles."""
  return 64 if _target()[0] == "cpu" else 512


CACHE_ATTENTION_ENV = "SCOPE_JAX_CACHE_ATTENTION"


def blockwise_cache_attention() -> bool:
  """Whether a prefill into a KV cache uses `attend_cached` (read when a program is traced).
  By default on a single CPU device: its loop over rows indexes the batch, which on a batch
  sharded over devices gathers every shard to every device (18x slower on 8 CPU devices), and
  accelerators want `attend_kv`'s large tiles. `SCOPE_JAX_CACHE_ATTENTION=blockwise|dense`
  overrides the choice (`auto`, the default, decides as above)."""
  choice = os.environ.get(CACHE_ATTENTION_ENV, "auto")
  if choice not in ("auto", "blockwise", "dense"):
    raise ValueError(f"{CACHE_ATTENTION_ENV}={choice!r} is not a choice: use 'auto' (blockwise on "
                     "a single CPU device), 'blockwise' or 'dense'.")
  if choice != "auto":
    return choice == "blockwise"
  platform, devices = _target()
  return platform == "cpu" and devices == 1


def attend(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, q_slot_BT: jax.Array,
           k_valid_BS: jax.Array, **kw) -> jax.Array:
  """`attend_kv` with keys and values laid out like the queries, [B, S, K, H]."""
  return attend_kv(q_BTNH, jnp.einsum("BSKH->BKHS", k_BSKH), jnp.einsum("BSKH->BKSH", v_BSKH),
                   q_slot_BT, k_valid_BS, **kw)


def attend_kv(q_BTNH: jax.Array, keys: jax.Array, values: jax.Array, q_slot_BT: jax.Array,
              k_valid_BS: jax.Array, *, q_pos_BT: jax.Array | None = None,
              k_pos_BS: jax.Array | None = None, window: jax.Array | int | None = None,
              scale: float | None = None, cap: float = 0.0,
              q_chunk: int | None = None,
              kv_specs: tuple[str, str] = ("BKHS", "BKSH")) -> jax.Array:
  """Causal grouped-query attention over keys and values whose axes are `kv_specs` (a KV cache
  layout's: `kv_cache.attention_specs`; by default keys [B, K, H, S], values [B, K, S, H]);
  scores and softmax in float32.

  Query t (at key slot q_slot[t]) attends to valid key slots s <= q_slot[t]; with a positive
  `window` (traced, per layer) also only to keys whose position is within `window` of its own.
  `scale` defaults to head_dim^-½; `cap` soft-caps the scores (Gemma-2). Long query blocks
  are processed `q_chunk` rows at a time under rematerialisation, so memory is O(q_chunk · S),
  not O(T · S), in the forward and the backward pass (default: `default_q_chunk()`).
  """
  b, t, n, h = q_BTNH.shape
  q_chunk = q_chunk or default_q_chunk()
  if window is not None and (q_pos_BT is None or k_pos_BS is None):
    raise ValueError("A sliding window needs query and key positions.")
  if q_pos_BT is None:
    q_pos_BT = jnp.zeros((b, t), jnp.int32)
    k_pos_BS = jnp.zeros(k_valid_BS.shape, jnp.int32)
  kw = dict(scale=scale, cap=cap, window=window, kv_specs=kv_specs)
  if t <= q_chunk:
    return _attend_block(q_BTNH, keys, values, q_slot_BT, k_valid_BS, q_pos_BT, k_pos_BS, **kw)
  n_chunks = -(-t // q_chunk)
  size = -(-t // n_chunks)  # equal chunks: at most n_chunks - 1 padded queries
  pad = n_chunks * size - t
  q = jnp.pad(q_BTNH, ((0, 0), (0, pad), (0, 0), (0, 0)))
  slots = jnp.pad(q_slot_BT, ((0, 0), (0, pad)))
  q_pos = jnp.pad(q_pos_BT, ((0, 0), (0, pad)))
  q_cBcNH = jnp.moveaxis(q.reshape(b, n_chunks, size, n, h), 1, 0)
  slots_cBc = jnp.moveaxis(slots.reshape(b, n_chunks, size), 1, 0)
  pos_cBc = jnp.moveaxis(q_pos.reshape(b, n_chunks, size), 1, 0)
  block = jax.checkpoint(lambda xs: _attend_block(xs[0], keys, values, xs[1], k_valid_BS,
                                                  xs[2], k_pos_BS, **kw))
  out = jax.lax.map(block, (q_cBcNH, slots_cBc, pos_cBc))
  return jnp.moveaxis(out, 0, 1).reshape(b, t + pad, n, h)[:, :t]


def attend_cached(q_BTNH: jax.Array, keys: jax.Array, values: jax.Array, q_slot_BT: jax.Array,
                  k_valid_BS: jax.Array, *, q_pos_BT: jax.Array | None = None,
                  k_pos_BS: jax.Array | None = None, window: jax.Array | int | None = None,
                  scale: float | None = None, cap: float = 0.0, q_chunk: int = 64,
                  k_block: int = 512,
                  kv_specs: tuple[str, str] = ("BKHS", "BKSH")) -> jax.Array:
  """`attend_kv` for a block of queries over a KV cache, computed one row and `q_chunk` queries
  at a time against `k_block`-key blocks with an online softmax (float32). A chunk reads only
  the key blocks that hold a valid key at or before its last query, and a chunk with no real
  query (its own slot not valid: padding) is skipped and returns zeros. What this saves:
  attention over keys past a row's length (rows of different lengths share a window), over
  the causal upper triangle of a prefill, and over left padding; one row's keys stay in the
  CPU's cache while its chunks run (4 rows × 576 queries at 3,072 keys: 0.72-0.86x the time of
  `attend_kv`). For inference on one CPU device (`blockwise_cache_attention`): the loop over rows is
  serial, and the skips are `lax.cond`s.
  """
  b, t, n, h = q_BTNH.shape
  k_spec, v_spec = (x[1:] for x in kv_specs)  # one row's
  kv, s = _kv_dims(keys, kv_specs[0])
  k_axis, v_axis = k_spec.index("S"), v_spec.index("S")
  g = n // kv
  if window is not None and (q_pos_BT is None or k_pos_BS is None):
    raise ValueError("A sliding window needs query and key positions.")
  q_chunk, k_block = min(q_chunk, t), min(k_block, s)
  nq, nk = -(-t // q_chunk), -(-s // k_block)
  pad = nq * q_chunk - t
  pad_t = lambda x, value=0: jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2),
                                     constant_values=value)
  scale = h ** -0.5 if scale is None else scale
  q_BcKGqH = jnp.einsum("BcqKGH->BcKGqH",
                        pad_t(q_BTNH).reshape(b, nq, q_chunk, kv, g, h)) * scale
  slot_Bcq = pad_t(q_slot_BT, -1).reshape(b, nq, q_chunk)
  qpos_Bcq = pad_t(q_pos_BT if q_pos_BT is not None else q_slot_BT).reshape(b, nq, q_chunk)
  k_pos_BS = k_pos_BS if k_pos_BS is not None else jnp.zeros((b, s), jnp.int32)
  # A query is real when its own slot holds a valid key (the block's write marked it so).
  own_BTq = jnp.take_along_axis(k_valid_BS, jnp.clip(slot_Bcq.reshape(b, -1), 0, s - 1), axis=1)
  real_Bc = (own_BTq.reshape(b, nq, q_chunk) & (slot_Bcq >= 0)).any(-1)
  valid_Bk = jnp.pad(k_valid_BS, ((0, 0), (0, nk * k_block - s))).reshape(b, nk, k_block).any(-1)

  def chunk(i):
    r, c = i // nq, i % nq
    q_KGqH, slot_q, qpos_q = q_BcKGqH[r, c], slot_Bcq[r, c], qpos_Bcq[r, c]
    need_k = valid_Bk[r] & (jnp.arange(nk) * k_block <= slot_q.max())

    def block(j, carry):
      def update(carry):
        m_KGq, l_KGq, acc_KGqH = carry
        start = jnp.minimum(j * k_block, s - k_block)  # the last block may overlap the one before
        k_blk = jax.lax.dynamic_slice_in_dim(keys[r], start, k_block, axis=k_axis)
        v_blk = jax.lax.dynamic_slice_in_dim(values[r], start, k_block, axis=v_axis)
        valid_S = jax.lax.dynamic_slice_in_dim(k_valid_BS[r], start, k_block)
        slot_S = start + jnp.arange(k_block, dtype=jnp.int32)
        scores = jnp.einsum(f"KGqH,{k_spec}->KGqS", q_KGqH, k_blk.astype(q_KGqH.dtype),
                            preferred_element_type=jnp.float32)
        scores = softcap(scores, cap)
        mask_qS = ((slot_S[None, :] <= slot_q[:, None]) & valid_S[None, :]
                   & (slot_S[None, :] >= j * k_block))
        if window is not None:
          pos_S = jax.lax.dynamic_slice_in_dim(k_pos_BS[r], start, k_block)
          mask_qS &= (window <= 0) | ((qpos_q[:, None] - pos_S[None, :]) < window)
        scores = jnp.where(mask_qS, scores, K_MASK)
        m_new = jnp.maximum(m_KGq, scores.max(-1))
        p_KGqS = jnp.exp(scores - m_new[..., None])
        rescale = jnp.exp(m_KGq - m_new)
        pv_KGqH = jnp.einsum(f"KGqS,{v_spec}->KGqH", p_KGqS.astype(v_blk.dtype), v_blk,
                             preferred_element_type=jnp.float32)
        return m_new, l_KGq * rescale + p_KGqS.sum(-1), acc_KGqH * rescale[..., None] + pv_KGqH
      return jax.lax.cond(need_k[j], update, lambda carry: carry, carry)

    def attend(_):
      init = (jnp.full((kv, g, q_chunk), K_MASK, jnp.float32),
              jnp.zeros((kv, g, q_chunk), jnp.float32),
              jnp.zeros((kv, g, q_chunk, h), jnp.float32))
      _, l_KGq, acc_KGqH = jax.lax.fori_loop(0, nk, block, init)
      return acc_KGqH / jnp.where(l_KGq > 0, l_KGq, 1.0)[..., None]

    skip = lambda _: jnp.zeros((kv, g, q_chunk, h), jnp.float32)
    out_KGqH = jax.lax.cond(real_Bc[r, c], attend, skip, None)
    return jnp.einsum("KGqH->qKGH", out_KGqH).reshape(q_chunk, n, h).astype(q_BTNH.dtype)

  out = jax.lax.map(chunk, jnp.arange(b * nq))
  return out.reshape(b, nq * q_chunk, n, h)[:, :t]
