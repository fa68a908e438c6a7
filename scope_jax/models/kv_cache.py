"""Functional KV cache: one buffer for all layers, per-row write offsets and positions.

Rows of a batch advance independently: a block of T tokens is written at each row's own `end`
slot, and `end` then moves to just past the row's last real token (so left-padded prompts keep
their leading holes and right-padded blocks are overwritten by the next write). Causality is by
slot order; RoPE positions are explicit, so holes never shift a position.

Shapes: L layers, B rows, C slots, K kv heads, H head dim.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class KVCache:
  k: jax.Array  # [L, B, C, K, H] keys, RoPE applied
  v: jax.Array  # [L, B, C, K, H]
  valid: jax.Array  # [B, C] bool: slot holds a real token
  end: jax.Array  # [B] int32: next slot to write
  next_pos: jax.Array  # [B] int32: RoPE position of the row's next real token
  pos: jax.Array  # [B, C] int32: RoPE position of each slot (sliding windows count positions)

  @property
  def capacity(self) -> int:
    return self.k.shape[2]

  @property
  def batch_size(self) -> int:
    return self.k.shape[1]


def init_cache(config, batch_size: int, capacity: int, dtype=jnp.float32) -> KVCache:
  """An empty cache for `batch_size` rows of at most `capacity` slots each."""
  shape = (config.num_layers, batch_size, capacity, config.num_kv_heads, config.head_dim)
  return KVCache(
      k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
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


def write_layer(k_all: jax.Array, layer: jax.Array, slots_BT: jax.Array,
                new_BTKH: jax.Array) -> jax.Array:
  """Scatters one layer's new keys (or values) into the [L, B, C, K, H] buffer at `slots`."""
  rows_BT = jnp.broadcast_to(jnp.arange(slots_BT.shape[0])[:, None], slots_BT.shape)
  return k_all.at[layer, rows_BT, slots_BT].set(new_BTKH.astype(k_all.dtype), mode="drop")


def written_valid(cache: KVCache, slots_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """Slot validity [B, C] after writing a block whose real tokens are `mask_BT`."""
  rows_BT = jnp.broadcast_to(jnp.arange(slots_BT.shape[0])[:, None], slots_BT.shape)
  return cache.valid.at[rows_BT, slots_BT].set(mask_BT.astype(bool), mode="drop")


def written_pos(cache: KVCache, slots_BT: jax.Array, positions_BT: jax.Array) -> jax.Array:
  """Slot positions [B, C] after writing a block at `slots` with RoPE `positions`."""
  rows_BT = jnp.broadcast_to(jnp.arange(slots_BT.shape[0])[:, None], slots_BT.shape)
  return cache.pos.at[rows_BT, slots_BT].set(positions_BT.astype(jnp.int32), mode="drop")


def advance(cache: KVCache, k: jax.Array, v: jax.Array, valid_BC: jax.Array,
            mask_BT: jax.Array, pos_BC: jax.Array | None = None) -> KVCache:
  """The cache after a block: `end` just past the last real token, positions past the real ones."""
  t = mask_BT.shape[1]
  has_real_BT = mask_BT.astype(bool)
  last_real_B = jnp.max(jnp.where(has_real_BT, jnp.arange(1, t + 1)[None, :], 0), axis=-1)
  return KVCache(k=k, v=v, valid=valid_BC, end=cache.end + last_real_B.astype(jnp.int32),
                 next_pos=cache.next_pos + has_real_BT.sum(-1).astype(jnp.int32),
                 pos=cache.pos if pos_BC is None else pos_BC)


def fork(cache: KVCache, copies: int) -> KVCache:
  """Repeats every row `copies` times (row-major: r0, r0, ..., r1, r1, ...): G samples per prompt."""
  rep = lambda x, axis: jnp.repeat(x, copies, axis=axis)
  return KVCache(k=rep(cache.k, 1), v=rep(cache.v, 1), valid=rep(cache.valid, 0),
                 end=rep(cache.end, 0), next_pos=rep(cache.next_pos, 0), pos=rep(cache.pos, 0))
