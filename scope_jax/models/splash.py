"""Causal-skipping attention for the cache-free forward (training, scoring) on TPU: the Pallas
splash attention kernel, which visits only the key blocks a query block can see (about half of
[T, T] for causal attention, a band for a sliding window) in the forward and the backward pass.

It takes over from `ops.attend_kv` when the program's target is a TPU (the platform of the
active mesh's devices, else `ops.compiling_for`'s target or the backend: `scope_jax.plan`
compiles TPU programs on a CPU host) and the block is long enough to tile; CPU and GPU keep the
XLA path. Under an `activation_sharding` context the kernel runs in `shard_map`, rows split over
the batch axes and heads over the tensor axis (a Pallas kernel is not partitioned by GSPMD).

What it covers, as `ops.attend_kv` does: grouped-query heads (K kv heads serve N = G·K query
heads natively), Gemma-2's soft-capped scores (`attn_logits_soft_cap`), the scale (folded into
q), sliding windows (a `LocalMask` band; a layer's traced window chooses between the causal and
the local kernel with `lax.cond`, as windows are 0 or the model's one `sliding_window`), and
padding (segment ids: a real query sees only real keys; padding queries see only padding, so
their outputs, never read by a real position nor by the loss, differ from `attend_kv`'s).

Dimension letters: B batch, T query length (= key length), N query heads, K kv heads, H head dim.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from scope_jax import sharding as shd
from scope_jax.models import ops

BLOCK = 512  # query and key tile; MaxText's default for training
MIN_BLOCK = 128


def target_platform() -> str:
  """The platform the traced program runs on: the active mesh's devices, else the target."""
  act = shd.active()
  if act is not None:
    return act.mesh.devices.flat[0].platform
  return ops._target()[0]  # pylint: disable=protected-access


def block_size(t: int) -> int:
  """The largest tile in BLOCK … MIN_BLOCK (powers of two) that divides `t`, or 0 if none."""
  b = BLOCK
  while b >= MIN_BLOCK:
    if t % b == 0:
      return b
    b //= 2
  return 0


ENV = "SCOPE_JAX_SPLASH"


def applies(t: int, h: int) -> bool:
  """Whether the cache-free attention of a [T]-token block runs in the splash kernel: on TPU,
  when T tiles into 128-multiples and the head dim is a multiple of 64 (read when a program is
  traced). `SCOPE_JAX_SPLASH=off` keeps `ops.attend_kv` everywhere (`auto`, the default)."""
  choice = os.environ.get(ENV, "auto")
  if choice not in ("auto", "off"):
    raise ValueError(f"{ENV}={choice!r} is not a choice: use 'auto' (splash attention on TPU) "
                     "or 'off' (XLA attention everywhere).")
  return (choice == "auto" and target_platform() == "tpu" and block_size(t) > 0
          and h % 64 == 0)


@functools.lru_cache(maxsize=32)
def _kernel(heads: int, t: int, window: int, cap: float, interpret: bool = False):
  """A splash kernel for `heads` query heads over [T, T]: causal, or a band of `window` keys."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  if window > 0:  # key s is visible to query q when q − window < s ≤ q
    mask = sa.LocalMask((t, t), window_size=(window - 1, 0), offset=0)
  else:
    mask = sa.CausalMask((t, t))
  b = block_size(t)
  # One fused backward kernel (dq, dk, dv together): it forms each visible score block once,
  # where separate dq and dkv kernels would form it twice.
  sizes = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                        block_kv_dkv_compute=b, use_fused_bwd_kernel=True)
  with jax.ensure_compile_time_eval():  # concrete mask tables, so the cached kernel outlives a trace
    return sa.make_splash_mha(sa.MultiHeadMask([mask] * heads), block_sizes=sizes,
                              head_shards=1, q_seq_shards=1, attn_logits_soft_cap=cap or None,
                              interpret=interpret)


def _local(q_BNTH, k_BKTH, v_BKTH, seg_BT, window, *, sliding: int, cap: float,
           interpret: bool):
  """The kernel on this device's rows and heads (vmapped over rows)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa
  n, t = q_BNTH.shape[1], q_BNTH.shape[2]

  def run(width):
    kernel = _kernel(n, t, width, cap, interpret)
    return jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=sa.SegmentIds(s, s)))(
        q_BNTH, k_BKTH, v_BKTH, seg_BT)

  if not sliding:
    return run(0)
  return jax.lax.cond(window > 0, lambda: run(sliding), lambda: run(0))


def _default_precision(fn):
  """`fn` traced under the default matmul precision, forward and backward: Mosaic rejects a
  'highest' precision bfloat16 matmul, and a caller's `jax.default_matmul_precision` (the tests
  ask for 'highest') would otherwise reach the kernel's dots, in its backward pass too."""

  @jax.custom_vjp
  def call(*args):
    with jax.default_matmul_precision("default"):
      return fn(*args)

  def fwd(*args):
    with jax.default_matmul_precision("default"):
      return jax.vjp(fn, *args)  # (output, the pullback: a pytree of residuals)

  def bwd(pullback, ct):
    with jax.default_matmul_precision("default"):
      return pullback(ct)

  call.defvjp(fwd, bwd)
  return call


def attend(q_BTNH: jax.Array, k_BTKH: jax.Array, v_BTKH: jax.Array, valid_BT: jax.Array, *,
           window: jax.Array | int | None = None, sliding: int = 0, scale: float | None = None,
           cap: float = 0.0, interpret: bool = False) -> jax.Array:
  """Causal grouped-query self-attention of a block, [B, T, N, H], as `ops.attend_kv` computes
  it for the cache-free forward (real query positions agree; see the module docstring).

  `window` is the layer's window (traced; 0 = global) and `sliding` the model's one window size
  (static; 0 when no layer slides). Positions are the slots: rows are contiguous runs of real
  tokens (left or right padded), so a slot distance is a position distance. `interpret` runs
  the kernel in Pallas's interpreter (any backend: tests on CPU).
  """
  b, t, n, h = q_BTNH.shape
  kv = k_BTKH.shape[2]
  scale = h ** -0.5 if scale is None else scale
  q_BNTH = jnp.einsum("BTNH->BNTH", q_BTNH * jnp.asarray(scale, q_BTNH.dtype))
  k_BKTH = jnp.einsum("BTKH->BKTH", k_BTKH)
  v_BKTH = jnp.einsum("BTKH->BKTH", v_BTKH)
  seg_BT = valid_BT.astype(jnp.int32)
  window = jnp.asarray(0 if window is None else window, jnp.int32)
  fn = functools.partial(_local, sliding=int(sliding), cap=float(cap or 0.0),
                         interpret=interpret)
  fn = _default_precision(fn)
  act = shd.active()
  if act is None:
    out_BNTH = fn(q_BNTH, k_BKTH, v_BKTH, seg_BT, window)
  else:
    rules = act.rules_dict
    spec = lambda heads, shape: shd.logical_to_spec(
        ("activation_batch", heads, None, None), shape, act.mesh, rules)
    q_spec = spec("activation_heads", q_BNTH.shape)
    k_spec = spec("activation_kv_heads", k_BKTH.shape)
    if q_spec[1] != k_spec[1]:  # kv heads the tensor axis cannot split: keep all heads whole
      q_spec, k_spec = P(q_spec[0], None, None, None), P(k_spec[0], None, None, None)
    row_spec = P(q_spec[0], None)
    out_BNTH = jax.shard_map(fn, mesh=act.mesh, in_specs=(q_spec, k_spec, k_spec, row_spec, P()),
                             out_specs=q_spec, check_vma=False)(
                                 q_BNTH, k_BKTH, v_BKTH, seg_BT, window)
  del kv
  return jnp.einsum("BNTH->BTNH", out_BNTH)
