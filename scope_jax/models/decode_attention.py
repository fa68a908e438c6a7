"""Decode attention on TPU: one query token per row over the first W slots of a KV cache in the
`kv_cache.SLOTS` layout (keys and values [B, C, K, H]), as a Pallas kernel that reads the window
once and keeps its float32 scores in VMEM (XLA's attention writes [B, K, G, 1, W] scores to HBM
and reads them back for the softmax, about 0.3x the window's bytes, and above ~8K slots
relayouts the keys once per layer).

How a block is computed: a row's key block [bk, K, H] is contiguous in the slot-major buffer and
is read as one matrix [bk·R, 128] of lane-wide rows, R = K·H/128 rows per slot, in the order the
chip's tiles hold them (`slot_view`: at H = 128 row s·K + j is slot s of kv head j; at H = 256
with K = 4 a slot's tiles are (heads 0-3, dims 0-127), (heads 0-3, dims 128-255), so the view is
a bitcast, where [bk·K, 256] would relayout the whole cache). Every query head meets every row in
one [N, 128] x [128, bk·R] matmul per 128-dim piece p of H; piece p's products are rolled back
onto the piece-0 column of their slot and head and summed, so each such column holds a full
score; the other columns, and other kv heads', are dropped by a -inf bias (R times the MXU work of
a per-head dot, which decode's memory bound leaves idle, and no relayout or strided load). The
probabilities are rolled forward onto each piece's columns for its share of the values. The
softmax is online over key blocks in float32, its row maximum and sum and the [N, H] accumulator
in VMEM scratch.

It takes over from `ops.attend_kv` for a one-token query block on a TPU target (`applies`);
CPU and GPU keep the XLA path, and `SCOPE_JAX_DECODE_KERNEL=off` keeps it everywhere. Under an
`activation_sharding` context it runs in `shard_map`, rows over the batch axes and heads over
the tensor axis, as `splash.attend` does.

Dimension letters: B rows, C cache slots, W window slots read, K kv heads, G = N / K query heads
per kv head, N query heads, H head dim (P = H / 128 pieces), bk slots per key block, R = K·P rows
of 128 per slot, r a block's bk·R rows.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.sharding import PartitionSpec as P

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import ops

BLOCKS = (512, 256, 128)  # key-block sizes tried, largest first (slots per grid step)
ENV = "SCOPE_JAX_DECODE_KERNEL"


def target_platform() -> str:
  """The platform the traced program runs on: the active mesh's devices, else the target."""
  act = shd.active()
  if act is not None:
    return act.mesh.devices.flat[0].platform
  return ops._target()[0]  # pylint: disable=protected-access


BLOCK_ROWS = 8192  # rows of 128 lanes a key block holds at most (2 MiB in bf16; VMEM bound)


def block_size(window: int, capacity: int, rows: int = 1) -> int:
  """Slots per key block: the largest of `BLOCKS` no longer than the window (rounded up to 128)
  whose blocks covering `window` stay inside the buffer's `capacity` (the slots past the window
  that the last block reads are masked) and hold at most `BLOCK_ROWS` rows of the slot view
  (`rows` per slot, K·H/128: 16 kv heads of 256 dims leave 256 slots), or 0."""
  cover = -(-window // BLOCKS[-1]) * BLOCKS[-1]
  for bk in BLOCKS:
    if bk <= cover and -(-window // bk) * bk <= capacity and bk * rows <= BLOCK_ROWS:
      return bk
  return 0


LANES = 128  # lanes of a vector register: a row of the slot view; also slots per mask piece
TILE_ROWS = 8  # rows of the chip's (8, 128) tiles; fewer kv heads get a tile of their own height


def tile_rows(kv: int, head_dim: int) -> int:
  """Kv heads per tile of a [B, C, K, H] buffer's (K, H) dims (the compiler's tiles are
  (min(K, 8), 128) for K a power of two below 8, else (8, 128)), or 0 where the slot view
  (`slot_view`) would not be a bitcast: H not a multiple of 128, or H > 128 with K neither a
  power of two below 8 nor a multiple of 8."""
  if head_dim % LANES or kv < 1:
    return 0
  if head_dim == LANES:
    return kv  # one piece: the view is a plain reshape whatever the tiles
  if kv < TILE_ROWS:
    return kv if kv & (kv - 1) == 0 else 0
  return TILE_ROWS if kv % TILE_ROWS == 0 else 0


def slot_view(x_BCKH: jax.Array) -> jax.Array:
  """[B, C, K, H] → [B, C·R, 128], R = K·H/128: a slot's rows ordered (tile of kv heads, piece of
  H, head within the tile), as the chip's (T, 128) tiles lay them out, T = `tile_rows`: the same
  bytes (a bitcast in the compiled program, no copy). Row (s, t, p, i) holds dims
  p·128 … p·128 + 127 of kv head t·T + i."""
  b, c, kv, h = x_BCKH.shape
  t, pieces = tile_rows(kv, h), h // LANES
  x = x_BCKH.reshape(b, c, kv // t, t, pieces, LANES).transpose(0, 1, 2, 4, 3, 5)
  return x.reshape(b, c * kv * pieces, LANES)


def applies(t: int, layout: str, window: int, capacity: int, head_dim: int,
            kv_heads: int = 1) -> bool:
  """Whether a [T]-token query block's attention over a KV cache runs in the kernel: on a TPU
  target, for one token (T = 1) over the `SLOTS` layout, when a key block fits the buffer and
  the cache's slot view is a bitcast (`tile_rows`: a head dim of 128, or a multiple of it with
  kv heads a power of two below 8 or a multiple of 8; `kv_heads` as the layer holds them
  before any tensor split, which halves them); under an activation context when the mesh has
  several devices (a Pallas call outside `shard_map` would gather every shard). Read when a
  program is traced;
  `SCOPE_JAX_DECODE_KERNEL=off` keeps `ops.attend_kv` everywhere (`auto`, the default)."""
  choice = os.environ.get(ENV, "auto")
  if choice not in ("auto", "off"):
    raise ValueError(f"{ENV}={choice!r} is not a choice: use 'auto' (the decode kernel on TPU) "
                     "or 'off' (XLA attention everywhere).")
  if choice == "off" or t != 1 or layout != kvc.SLOTS or target_platform() != "tpu":
    return False
  sharded_alone = shd.active() is None and ops._target()[1] > 1  # pylint: disable=protected-access
  return (not sharded_alone and tile_rows(kv_heads, head_dim) > 0
          and block_size(window, capacity, kv_heads * head_dim // LANES) > 0)


def decode_mask(slot_B: jax.Array, valid_BW: jax.Array, q_pos_B: jax.Array | None = None,
                k_pos_BW: jax.Array | None = None,
                window: jax.Array | int | None = None) -> jax.Array:
  """[B, W] bool: the keys a row's one query sees, as `ops._attend_block` builds it for T = 1:
  valid slots at or before the query's slot and, with a positive `window`, within `window`
  positions of it."""
  w = valid_BW.shape[1]
  mask_BW = (jnp.arange(w, dtype=jnp.int32)[None, :] <= slot_B[:, None]) & valid_BW
  if window is not None:
    if q_pos_B is None or k_pos_BW is None:
      raise ValueError("A sliding window needs query and key positions.")
    mask_BW &= (window <= 0) | ((q_pos_B[:, None] - k_pos_BW) < window)
  return mask_BW


def _head_bias(n: int, kv: int, pieces: int, tile: int, bk: int) -> np.ndarray:
  """[N, bk·R] float32: 0 where column (s, t, p, i) of the slot view (`slot_view`) is piece 0
  of query head n's kv head (t·T + i = n // G), else -inf."""
  g = n // kv
  r = np.arange(bk * kv * pieces) % (kv * pieces)  # row within its slot
  head = r // (pieces * tile) * tile + r % tile
  first = (r // tile) % pieces == 0
  same = first[None, :] & (head[None, :] == np.arange(n)[:, None] // g)
  return np.where(same, 0.0, -np.inf).astype(np.float32)


def _spread(rows: int) -> np.ndarray:
  """[128, 128·R] 0/1: row s has ones at columns s·R … s·R + R − 1 (a slot's mask, once per row
  of the slot view); a [1, 128] mask times it is the mask of the block's [128·R] rows, exactly."""
  cols = np.arange(LANES * rows)[None, :]
  first = np.arange(LANES)[:, None] * rows
  return ((cols >= first) & (cols < first + rows)).astype(np.float32)


def _kernel(q_ref, k_ref, v_ref, mask_ref, spread_ref, heads_ref, o_ref, m_ref, l_ref, acc_ref,
            *, scale: float, cap: float, rows_valid: int | None, pieces: int, tile: int):
  """One (row, key block) step of the online softmax; `rows_valid` (static) is how many of the
  last block's bk·R rows lie inside the window when the window does not fill it, else None;
  `pieces` = H / 128 and `tile` kv heads per tile order the rows (`slot_view`)."""
  j = pl.program_id(1)
  last = j == pl.num_programs(1) - 1

  @pl.when(j == 0)
  def _init():
    m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
    l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
    acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

  q_NH = q_ref[0]
  k_cL = k_ref[0].astype(q_NH.dtype)  # c = (s, t, p, i): `slot_view`'s rows of 128 lanes
  v_cL = v_ref[0].astype(q_NH.dtype)
  width = k_cL.shape[0]
  s_Nc = None
  for p in range(pieces):  # piece p's products rolled back onto piece 0's column
    part = jax.lax.dot_general(q_NH[:, p * LANES:(p + 1) * LANES], k_cL,
                               (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    part = _roll(part, width - p * tile) if p else part
    s_Nc = part if s_Nc is None else s_Nc + part
  s_Nc = s_Nc * scale
  if cap:
    s_Nc = cap * jnp.tanh(s_Nc / cap)
  # The slots' mask [1, bk] spread over their kv heads [1, bk·K] (0/1 products: exact).
  mask_1b = mask_ref[0].astype(jnp.bfloat16)
  spread = spread_ref[...].astype(jnp.bfloat16)
  seen_1c = jnp.concatenate(
      [jax.lax.dot_general(mask_1b[:, i:i + LANES], spread, (((1,), (0,)), ((), ())),
                           preferred_element_type=jnp.float32)
       for i in range(0, mask_1b.shape[1], LANES)], axis=1)
  s_Nc = jnp.where(seen_1c > 0.5, s_Nc, ops.K_MASK) + heads_ref[...]  # other heads: -inf
  if rows_valid is not None:  # the last block's rows past the window: -inf, and zero values
    col = jax.lax.broadcasted_iota(jnp.int32, s_Nc.shape, 1)
    s_Nc = jnp.where(jnp.logical_and(last, col >= rows_valid), -jnp.inf, s_Nc)
    rows = jax.lax.broadcasted_iota(jnp.int32, v_cL.shape, 0)
    v_cL = jnp.where(jnp.logical_and(last, rows >= rows_valid), jnp.zeros_like(v_cL), v_cL)
  m_prev = m_ref[...]
  m_new = jnp.maximum(m_prev, s_Nc.max(axis=-1, keepdims=True))
  p_Nc = jnp.exp(s_Nc - m_new)
  rescale = jnp.exp(m_prev - m_new)
  l_ref[...] = l_ref[...] * rescale + p_Nc.sum(axis=-1, keepdims=True)
  for p in range(pieces):  # the probabilities rolled forward onto piece p's columns
    p_part = _roll(p_Nc, p * tile) if p else p_Nc
    pv_NL = jax.lax.dot_general(p_part.astype(v_cL.dtype), v_cL, (((1,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
    piece = slice(p * LANES, (p + 1) * LANES)
    acc_ref[:, piece] = acc_ref[:, piece] * rescale + pv_NL
  m_ref[...] = m_new

  @pl.when(last)
  def _finish():
    o_ref[0] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def _roll(x, shift: int):
  """Columns of x moved `shift` places to the right, cyclically (as `jnp.roll` on axis 1)."""
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.roll(x, shift, 1)


def _local(q_BNH, k_BCKH, v_BCKH, mask_B1w, *, window: int, bk: int, scale: float, cap: float,
           interpret: bool):
  """The pallas call on this device's rows and heads; `mask_B1w` is [B, 1, nb·bk] (1: seen),
  `bk` chosen for all kv heads (a device's share of them fits the same block)."""
  b, n, h = q_BNH.shape
  _, c, kv, _ = k_BCKH.shape
  pieces, tile = h // LANES, tile_rows(kv, h)
  nb = -(-window // bk)
  if not tile:
    raise ValueError(f"decode attention: {kv} kv heads per device (after the tensor split) at "
                     f"head dim {h} have no bitcast slot view; use a tensor axis that leaves a "
                     f"power of two below {TILE_ROWS} or a multiple of it.")
  rows = kv * pieces  # of the slot view, per slot
  k_BcL, v_BcL = slot_view(k_BCKH), slot_view(v_BCKH)  # the same bytes as the buffers
  heads_Nc = jnp.asarray(_head_bias(n, kv, pieces, tile, bk))
  spread = jnp.asarray(_spread(rows))
  tail = window - (nb - 1) * bk
  rows_valid = None if tail == bk else tail * rows
  kernel = functools.partial(_kernel, scale=scale, cap=cap, rows_valid=rows_valid,
                             pieces=pieces, tile=tile)
  item = jnp.dtype(k_BCKH.dtype).itemsize
  cost = pl.CostEstimate(
      flops=4 * b * n * window * h, transcendentals=b * n * window,
      bytes_accessed=(2 * b * window * kv * h * item + 2 * q_BNH.size * q_BNH.dtype.itemsize
                      + mask_B1w.size * mask_B1w.dtype.itemsize))
  kv_spec = pl.BlockSpec((1, bk * rows, LANES), lambda i, j: (i, j, 0))
  whole = lambda x: pl.BlockSpec(x.shape, lambda i, j: (0, 0))  # fetched once
  return pl.pallas_call(
      kernel,
      grid=(b, nb),
      in_specs=[pl.BlockSpec((1, n, h), lambda i, j: (i, 0, 0)), kv_spec, kv_spec,
                pl.BlockSpec((1, 1, bk), lambda i, j: (i, 0, j)), whole(spread),
                whole(heads_Nc)],
      out_specs=pl.BlockSpec((1, n, h), lambda i, j: (i, 0, 0)),
      out_shape=jax.ShapeDtypeStruct((b, n, h), q_BNH.dtype),
      scratch_shapes=[_vmem((n, 1)), _vmem((n, 1)), _vmem((n, h))],
      compiler_params=_params(),
      cost_estimate=cost,
      interpret=interpret,
  )(q_BNH, k_BcL, v_BcL, mask_B1w, spread, heads_Nc)


def _vmem(shape):
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.VMEM(shape, jnp.float32)


def _params():
  from jax.experimental.pallas import tpu as pltpu
  return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))


def attend(q: jax.Array, k_BCKH: jax.Array, v_BCKH: jax.Array, mask_BW: jax.Array, *,
           scale: float | None = None, cap: float = 0.0, interpret: bool = False) -> jax.Array:
  """Attention of one query token per row, q [B, N, H] or [B, K, G, H], over the first W slots
  of keys and values [B, C, K, H] (W = `mask_BW`'s length; the buffers are read in place, never
  sliced): out [B, N, H] in q's dtype. `mask_BW` is bool (True: attend; `decode_mask`); a row
  that sees no key averages its W values, as `ops.attend_kv` does. `scale` defaults to H^-½; `cap` soft-caps the scores. `interpret` runs the kernel in
  Pallas's interpreter (any backend: tests on CPU)."""
  if q.ndim == 4:
    q = q.reshape(q.shape[0], -1, q.shape[-1])
  b, n, h = q.shape
  _, c, kv, _ = k_BCKH.shape
  w = mask_BW.shape[1]
  if v_BCKH.shape != k_BCKH.shape or k_BCKH.shape[0] != b or k_BCKH.shape[3] != h or n % kv:
    raise ValueError(f"decode attention wants q [B, N, H] {q.shape} and keys and values "
                     f"[B, C, K, H] {k_BCKH.shape} / {v_BCKH.shape} with K dividing N.")
  if not tile_rows(kv, h):
    raise ValueError(f"decode attention wants a head dim that is a multiple of {LANES}, and above "
                     f"it kv heads a power of two below {TILE_ROWS} or a multiple of it, not "
                     f"H={h}, K={kv}; use ops.attend_kv (SCOPE_JAX_DECODE_KERNEL=off).")
  bk = block_size(w, c, kv * h // LANES)
  if not bk:
    raise ValueError(f"A window of {w} slots in a {c}-slot buffer leaves no key block of "
                     f"{BLOCKS} inside it of at most {BLOCK_ROWS} rows of {kv * h // LANES} a "
                     f"slot; use a capacity that is a multiple of {BLOCKS[-1]}, or fewer kv "
                     "heads per device.")
  if mask_BW.dtype != jnp.bool_:
    raise ValueError(f"decode attention wants a boolean mask [B, W] (True: attend), not "
                     f"{mask_BW.dtype}; build it with decode_mask.")
  pad = -(-w // bk) * bk - w  # slots past the window: masked in the kernel
  mask_B1w = jnp.pad(mask_BW.astype(jnp.float32), ((0, 0), (0, pad)))[:, None, :]
  fn = functools.partial(_local, window=w, bk=bk, scale=float(h ** -0.5 if scale is None else scale),
                         cap=float(cap or 0.0), interpret=interpret)
  act = shd.active()
  with jax.default_matmul_precision("default"):  # Mosaic rejects a 'highest' bf16 matmul
    if act is None:
      return fn(q, k_BCKH, v_BCKH, mask_B1w)
    rules = act.rules_dict
    spec = lambda axes, shape: shd.logical_to_spec(axes, shape, act.mesh, rules)
    q_spec = spec(("activation_batch", "activation_heads", None), q.shape)
    k_spec = spec(("activation_batch", None, "activation_kv_heads", None), k_BCKH.shape)
    if q_spec[1] != k_spec[2]:  # kv heads the tensor axis cannot split: keep all heads whole
      q_spec = P(q_spec[0], None, None)
      k_spec = P(k_spec[0], None, None, None)
    mask_spec = P(q_spec[0], None, None)
    return jax.shard_map(fn, mesh=act.mesh, in_specs=(q_spec, k_spec, k_spec, mask_spec),
                         out_specs=q_spec, check_vma=False)(q, k_BCKH, v_BCKH, mask_B1w)
