"""Functional KV cache: a key and a value buffer per layer, per-row write offsets and positions.

Rows of a batch advance independently: a block of T tokens is written at each row's own `end`
slot, and `end` then moves to just past the row's last real token (so left-padded prompts keep
their leading holes and right-padded blocks are overwritten by the next write). Causality is by
slot order; RoPE positions are explicit, so holes never shift a position.

Shapes: L layers, B rows, C slots, K kv heads, H head dim. Each layer's keys are stored
transposed, [B, K, H, C], and its values as [B, K, C, H]: a query's scores and its weighted sum
of values are then plain matmuls over contiguous memory, with no transposed copy of the cache per
step. One buffer per layer (not one [L, ...] array) lets the unrolled layers of a forward with a
cache read and update their own buffers in place; slicing a layer out of a stacked buffer inside
a layer scan copies it, every layer and every decode step.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # L × [B, K, H, C] keys, RoPE applied
  v: tuple[jax.Array, ...]  # L × [B, K, C, H] values
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



def init_cache(config, batch_size: int, capacity: int, dtype=jnp.float32) -> KVCache:
  """An empty cache for `batch_size` rows of at most `capacity` slots each."""
  bk, layers = (batch_size, config.num_kv_heads), range(config.num_layers)
  return KVCache(
      k=tuple(jnp.zeros(bk + (config.head_dim, capacity), dtype) for _ in layers),
      v=tuple(jnp.zeros(bk + (capacity, config.head_dim), dtype) for _ in layers),
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


def write_keys(k_BKHC: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array) -> jax.Array:
  """Scatters one layer's new keys into its [B, K, H, C] buffer at `slots`."""
  put = lambda k_KHC, s_T, n_TKH: k_KHC.at[:, :, s_T].set(jnp.einsum("TKH->KHT", n_TKH),
                                                           mode="drop")
  return _per_row(put)(k_BKHC, slots_BT, new_BTKH.astype(k_BKHC.dtype))


def write_values(v_BKCH: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array) -> jax.Array:
  """Scatters one layer's new values into its [B, K, C, H] buffer at `slots`."""
  put = lambda v_KCH, s_T, n_TKH: v_KCH.at[:, s_T].set(jnp.einsum("TKH->KTH", n_TKH),
                                                        mode="drop")
  return _per_row(put)(v_BKCH, slots_BT, new_BTKH.astype(v_BKCH.dtype))


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
