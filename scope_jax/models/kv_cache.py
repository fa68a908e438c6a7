"""Functional KV cache: a key and a value buffer per layer, per-row write offsets and positions.

Rows of a batch advance independently: a block of T tokens is written at each row's own `end`
slot, and `end` then moves to just past the row's last real token (so left-padded prompts keep
their leading holes and right-padded blocks are overwritten by the next write). Causality is by
slot order; RoPE positions are explicit, so holes never shift a position.

Shapes: L layers, B rows, C slots, K kv heads, H head dim. Two layouts of a layer's buffers,
chosen per target (`default_layout`) and read back from the buffers' shapes (`layout_of`):
  * `HEADS` (CPU, GPU): keys [B, K, H, C], values [B, K, C, H]. A query's scores and its
    weighted sum of values are plain matmuls over contiguous memory, which XLA:CPU's dots need
    (with `SLOTS` it transposes the window on every step: 2-3x slower attention; keys stored
    [B, K, C, H] were 1.5x slower);
  * `SLOTS` (TPU): keys and values [B, C, K, H], the layout the TPU's in-place scatter of a
    step's keys wants. Compiled for v5p-8 (Qwen2.5-7B shapes, 2 layers, 64 slots × 4,096, chunk
    16; `python -m bench.decode_hlo --model 7b`), in-place decode on `HEADS` keeps 8 whole-buffer
    layout copies and 274 MiB of temporaries per chip for a 256 MiB cache; on `SLOTS` none and
    35 MiB, and one call reads 1.19x a step's minimum bytes (1.64x on `HEADS`) with XLA's
    attention, 1.15x with the decode kernel (`decode_attention`, which at 16,384 slots also
    spares XLA's two whole-buffer relayouts of the keys: 1.12x against 1.27x).
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

# Layouts: the axis order of one layer's (keys, values) buffers.
HEADS = "heads"  # keys [B, K, H, C], values [B, K, C, H]
SLOTS = "slots"  # keys and values [B, C, K, H]
SPECS = {HEADS: ("BKHC", "BKCH"), SLOTS: ("BCKH", "BCKH")}
LAYOUTS = tuple(SPECS)
_AXES = dict(B="batch", C="cache", K="kv_heads", H="head_dim")


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


def specs(layout: str) -> tuple[str, str]:
  """(keys, values) axis letters of `layout`: B rows, C slots, K kv heads, H head dim."""
  if layout not in SPECS:
    raise ValueError(f"KV cache layout {layout!r} is not one of {LAYOUTS}.")
  return SPECS[layout]


def attention_specs(layout: str) -> tuple[str, str]:
  """`specs` with the slots named S (key slots), as `ops.attend_kv` reads them."""
  return tuple(x.replace("C", "S") for x in specs(layout))


def buffer_shapes(config, batch_size: int, capacity: int, layout: str):
  """(keys, values) shapes of one layer's buffers."""
  size = dict(B=batch_size, C=capacity, K=config.num_kv_heads, H=config.head_dim)
  return tuple(tuple(size[a] for a in spec) for spec in specs(layout))


def buffer_axes(layout: str):
  """(keys, values) logical axis names of one layer's buffers (`sharding.py`'s rules)."""
  return tuple(tuple(_AXES[a] for a in spec) for spec in specs(layout))


def slot_axes(layout: str) -> tuple[int, int]:
  """The slot axis of (keys, values)."""
  return tuple(spec.index("C") for spec in specs(layout))


def _pick(candidates: list[str]) -> str:
  if len(candidates) > 1 and default_layout() in candidates:
    return default_layout()
  return candidates[0]


def layout_of(k: jax.Array, num_kv_heads: int, head_dim: int) -> str:
  """The layout of a key buffer, from its shape (where two layouts read alike, e.g. C = H,
  the target's `default_layout`)."""
  fits = lambda spec: all(k.shape[spec.index(a)] == n
                          for a, n in (("K", num_kv_heads), ("H", head_dim)))
  candidates = [name for name, (spec, _) in SPECS.items() if fits(spec)]
  if not candidates:
    raise ValueError(f"A key buffer of shape {k.shape} is in no KV cache layout with "
                     f"K={num_kv_heads} kv heads of {head_dim} dims; build it with init_cache.")
  return _pick(candidates)


def cache_layout(cache: "KVCache") -> str:
  """The layout of a whole cache's buffers, from their shapes and its capacity."""
  k, v = cache.k[0], cache.v[0]

  def fits(k_spec, v_spec):
    size = dict(zip(k_spec, k.shape))
    return size["C"] == cache.valid.shape[1] and v.shape == tuple(size[a] for a in v_spec)
  candidates = [name for name, pair in SPECS.items() if fits(*pair)]
  if not candidates:
    raise ValueError(f"KV cache buffers {k.shape} / {v.shape} with {cache.valid.shape[1]} slots "
                     "are in no layout; build the cache with init_cache.")
  return _pick(candidates)


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


def _write(buffer: jax.Array, spec: str, slots_BT: jax.Array, new_BTKH: jax.Array) -> jax.Array:
  """Scatters a block [B, T, K, H] into a buffer with axes `spec` at `slots` (per row)."""
  new_BTKH = new_BTKH.astype(buffer.dtype)
  row = spec[1:]
  at = (slice(None),) * row.index("C")
  put = lambda x, s_T, n_TKH: x.at[at + (s_T,)].set(
      jnp.einsum(f"TKH->{row.replace('C', 'T')}", n_TKH), mode="drop")
  return _per_row(put)(buffer, slots_BT, new_BTKH)


def write_keys(k: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array,
               layout: str | None = None) -> jax.Array:
  """Scatters one layer's new keys into its buffer at `slots` (layout read from the shapes)."""
  layout = layout or layout_of(k, *new_BTKH.shape[2:])
  return _write(k, specs(layout)[0], slots_BT, new_BTKH)


def write_values(v: jax.Array, slots_BT: jax.Array, new_BTKH: jax.Array,
                 layout: str | None = None) -> jax.Array:
  """Scatters one layer's new values into its buffer at `slots` (layout read from the shapes:
  only `SLOTS` stores values otherwise than [B, K, C, H])."""
  if layout is None:
    layout = SLOTS if v.shape[2:] == new_BTKH.shape[2:] and v.shape[1] != new_BTKH.shape[2] \
        else HEADS
  return _write(v, specs(layout)[1], slots_BT, new_BTKH)


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
