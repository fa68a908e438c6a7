"""Functional KV cache: a key and a value buffer per layer, per-row write offsets and positions.

Rows of a batch advance independently: a block of T tokens is written at each row's own `end`
slot, and `end` then moves to just past the row's last real token (so left-padded prompts keep
their leading holes and right-padded blocks are overwritten by the next write). Causality is by
slot order; RoPE positions are explicit, so holes never shift a position.

Shapes: L layers, B rows, C slots, K kv heads, H head dim. Two layouts of a layer's buffers,
chosen per target (`default_layout`) and read back from the buffers' shapes (`layout_of`):
  * `HEADS` (CPU, GPU): keys [B, K, H, C], values [B, K, C, H]. A query's scores and its
    weighted sum of values are plain matmuls over contiguous memory, which XLA:CPU's dots need
    (with `SLOTS` it transposes the window on every step: 2-3x slower attention);
  * `SLOTS` (TPU): keys and values [B, C, K, H]. The TPU decode loop wants both physically
    slot-major: stored head-major, XLA adds whole-cache layout copies in and out of the loop
    (v5p-8, 64 slots × 4,096, chunk 16: see `tests/sampling/test_decode_inplace.py`).
One buffer per layer (not one [L, ...] array) lets the unrolled layers of a forward with a
cache read and update their own buffers in place; slicing a layer out of a stacked buffer inside
a layer scan copies it, every layer and every decode step.

A forward may read only the first W slots of every buffer: it then gets `valid` and `pos` for
those W slots ([B, W]) and attends to `read_window(..., W)`, while writes still land in the
whole buffers (a decode loop carries the whole cache and reads its window by slicing).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from scope_jax.models import ops

HEADS = "heads"  # keys [B, K, H, C], values [B, K, C, H]
SLOTS = "slots"  # keys and values [B, C, K, H]
LAYOUTS = (HEADS, SLOTS)


@flax.struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # L × keys, RoPE applied: [B, K, H, C] (HEADS) or [B, C, K, H]
  v: tuple[jax.Array, ...]  # L × values: [B, K, C, H] (HEADS) or [B, C, K, H] (SLOTS)
  valid: jax.Array  # [B, C] bool: slot holds a real token
  end: jax.Array  # [B] int32: next slot to write
  next_pos: jax.Array  # [B] int32: RoPE position of the row's next real token
  pos: jax.Array  # [B, C] int32: RoPE position of each slot (sliding windows count positions)

  @property
  def capacity(self) -> int:
    return self.valid.shape[1]

  @property
  def batch_size(self) -> int:
    return self.valid.shape[0]



def default_layout() -> str:
  """The buffers' layout for the target programs are traced for (`ops.compiling_for`): `SLOTS`
  on TPU, `HEADS` elsewhere (see the module docstring)."""
  return SLOTS if ops.target_platform() == "tpu" else HEADS


def _check(layout: str) -> str:
  if layout not in LAYOUTS:
    raise ValueError(f"KV cache layout {layout!r} is not one of {LAYOUTS}.")
  return layout


def buffer_shapes(config, batch_size: int, capacity: int, layout: str):
  """(keys, values) shapes of one layer's buffers."""
  b, c, k, h = batch_size, capacity, config.num_kv_heads, config.head_dim
  if _check(layout) == SLOTS:
    return (b, c, k, h), (b, c, k, h)
  return (b, k, h, c), (b, k, c, h)


def buffer_axes(layout: str):
  """(keys, values) logical axis names of one layer's buffers (`sharding.py`'s rules)."""
  if _check(layout) == SLOTS:
    return ("batch", "cache", "kv_heads", "head_dim"), ("batch", "cache", "kv_heads", "head_dim")
  return ("batch", "kv_heads", "head_dim", "cache"), ("batch", "kv_heads", "cache", "head_dim")


def slot_axes(layout: str) -> tuple[int, int]:
  """The slot axis of (keys, values)."""
  return (1, 1) if _check(layout) == SLOTS else (3, 2)


def layout_of(k: jax.Array, num_kv_heads: int, head_dim: int) -> str:
  """The layout of a key buffer, from its shape: [B, C, K, H] is `SLOTS`, [B, K, H, C] `HEADS`
  (when both read alike, C = K = H, the target's `default_layout`)."""
  slots, heads = k.shape[2:] == (num_kv_heads, head_dim), k.shape[1:3] == (num_kv_heads, head_dim)
  if slots and heads:
    return default_layout()
  if not (slots or heads):
    raise ValueError(f"A key buffer of shape {k.shape} holds neither [B, K, H, C] nor [B, C, K, H] "
                     f"with K={num_kv_heads} kv heads of {head_dim} dims; build it with init_cache.")
  return SLOTS if slots else HEADS


def _value_layout(v: jax.Array, num_kv_heads: int, head_dim: int) -> str:
  """`layout_of` for a value buffer ([B, C, K, H] or [B, K, C, H])."""
  slots = v.shape[2:] == (num_kv_heads, head_dim)
  heads = v.shape[1] == num_kv_heads and v.shape[3] == head_dim
  if slots and heads:
    return default_layout()
  if not (slots or heads):
    raise ValueError(f"A value buffer of shape {v.shape} holds neither [B, K, C, H] nor "
                     f"[B, C, K, H] with K={num_kv_heads} kv heads of {head_dim} dims.")
  return SLOTS if slots else HEADS


def cache_layout(cache: KVCache) -> str:
  """The layout of a whole cache's buffers (keys and values alike in `SLOTS`; in `HEADS` they
  differ unless H = C, and then keys [B, K, C, C] read as `SLOTS` only when K = C too)."""
  k, v = cache.k[0], cache.v[0]
  if k.shape != v.shape:
    return HEADS
  if k.shape[1] != cache.valid.shape[1]:
    return HEADS
  if k.shape[1] == k.shape[2] == k.shape[3]:
    return default_layout()
  return SLOTS


def init_cache(config, batch_size: int, capacity: int, dtype=jnp.float32,
               layout: str | None = None) -> KVCache:
  """An empty cache for `batch_size` rows of at most `capacity` slots each, in `layout`
  (default: `default_layout()`)."""
  k_shape, v_shape = buffer_shapes(config, batch_size, capacity, layout or default_layout())
  layers = range(config.num_layers)
  return KVCache(
      k=tuple(jnp.zeros(k_shape, dtype) for _ in layers),
      v=tuple(jnp.zeros(v_shape, dtype) for _ in layers),
      valid=jnp.zeros((batch_size, capacity), bool),
      end=jnp.zeros((batch_size,), jnp.int32),
      next_pos=jnp.zeros((batch_size,), jnp.int32),
      pos=jnp.zeros((batch_size, capacity), jnp.int32))


def block_slots(cache: KVCache, num_tokens: int) -> jax.Array:
  """Slots [B, T] that a block of T tokens occupies, starting at each row's `end`."""
  return cache.end[:, None] + jnp.arange(num_tokens, dtype=jnp.int32)[None, :]


def positions_for_block(cache: KVCache | None, mask_BT: jax.Array) -> jax.Array:
  """RoPE positions [B, T]: real tokens count up from the row's next position; pads repeat it."""
  start = 0 if cache is None else cache.next_pos[:, None]
  return start + jnp.maximum(jnp.cumsum(mask_BT.astype(jnp.int32), axis=-1) - 1, 0)


def _per_row(write):
  """`write(buffer_row, slots_T, new_row)` applied to every row: a scatter whose batch axis
  stays a batch axis, so a cache sharded over rows is written where it lives (indexing rows by
  an index array made the partitioner gather every step's new keys to every device)."""
  return jax.vmap(write)


def write_keys(k: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array,
               layout: str | None = None) -> jax.Array:
  """Scatters one layer's new keys into its buffer at `slots` (layout read from the shapes)."""
  layout = layout or layout_of(k, *new_BTKH.shape[2:])
  if layout == SLOTS:
    put = lambda k_CKH, s_T, n_TKH: k_CKH.at[s_T].set(n_TKH, mode="drop")
  else:
    put = lambda k_KHC, s_T, n_TKH: k_KHC.at[:, :, s_T].set(jnp.einsum("TKH->KHT", n_TKH),
                                                             mode="drop")
  return _per_row(put)(k, slots_BT, new_BTKH.astype(k.dtype))


def write_values(v: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array,
                 layout: str | None = None) -> jax.Array:
  """Scatters one layer's new values into its buffer at `slots` (layout read from the shapes)."""
  layout = layout or _value_layout(v, *new_BTKH.shape[2:])
  if _check(layout) == SLOTS:
    put = lambda v_CKH, s_T, n_TKH: v_CKH.at[s_T].set(n_TKH, mode="drop")
  else:
    put = lambda v_KCH, s_T, n_TKH: v_KCH.at[:, s_T].set(jnp.einsum("TKH->KTH", n_TKH),
                                                          mode="drop")
  return _per_row(put)(v, slots_BT, new_BTKH.astype(v.dtype))


def read_window(k: jax.Array, v: jax.Array, window: int, layout: str):
  """The first `window` slots of one layer's (keys, values): a slice, which the attention that
  reads it fuses on TPU (on CPU a slice inside a loop is a copy: see `slot_ops.decode`)."""
  ka, va = slot_axes(layout)
  if k.shape[ka] == window:
    return k, v
  return jax.lax.slice_in_dim(k, 0, window, axis=ka), jax.lax.slice_in_dim(v, 0, window, axis=va)


def written_valid(cache: KVCache, slots_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """Slot validity [B, C] after writing a block whose real tokens are `mask_BT`."""
  put = lambda valid_C, s_T, m_T: valid_C.at[s_T].set(m_T, mode="drop")
  return _per_row(put)(cache.valid, slots_BT, mask_BT.astype(bool))


def written_pos(cache: KVCache, slots_BT: jax.Array, positions_BT: jax.Array) -> jax.Array:
  """Slot positions [B, C] after writing a block at `slots` with RoPE `positions`."""
  put = lambda pos_C, s_T, p_T: pos_C.at[s_T].set(p_T, mode="drop")
  return _per_row(put)(cache.pos, slots_BT, positions_BT.astype(jnp.int32))


def advance(cache: KVCache, k: tuple[jax.Array, ...], v: tuple[jax.Array, ...],
            valid_BC: jax.Array, mask_BT: jax.Array, pos_BC: jax.Array | None = None) -> KVCache:
  """The cache after a block: `end` just past the last real token, positions past the real ones."""
  t = mask_BT.shape[1]
  has_real_BT = mask_BT.astype(bool)
  last_real_B = jnp.max(jnp.where(has_real_BT, jnp.arange(1, t + 1)[None, :], 0), axis=-1)
  return KVCache(k=k, v=v, valid=valid_BC, end=cache.end + last_real_B.astype(jnp.int32),
                 next_pos=cache.next_pos + has_real_BT.sum(-1).astype(jnp.int32),
                 pos=cache.pos if pos_BC is None else pos_BC)


def fork(cache: KVCache, copies: int) -> KVCache:
  """Repeats every row `copies` times (row-major: r0, r0, ..., r1, r1, ...): G samples per prompt."""
  rep = lambda x: jnp.repeat(x, copies, axis=0)
  return KVCache(k=tuple(map(rep, cache.k)), v=tuple(map(rep, cache.v)), valid=rep(cache.valid),
                 end=rep(cache.end), next_pos=rep(cache.next_pos), pos=rep(cache.pos))
