"""The decoder of Llama-3, Qwen2/2.5, Qwen3, Gemma-2 and OLMo-2/3 as Flax NNX modules.

Every parameter is an `nnx.Param` whose `out_sharding` metadata holds its logical axis names
(`vocab`, `embed`, `heads`, ...): the one source of the layout, which `sharding.py`'s rules map
to mesh axes. The layers are one `DecoderLayer` whose parameters are stacked on a leading
`layers` axis (built under `nnx.vmap`), run with `lax.scan` without a KV cache (training,
scoring: one compiled layer) and unrolled with one (prefill and decode: each layer updates its own
cache buffers in place; see `kv_cache`).

Activations are pinned at the embedding output and at every layer's output (rows on the batch
axes: `sharding.constrain`, a no-op outside `sharding.activation_sharding`), so a sharded
training step is FSDP. Without a cache on TPU, attention is the splash kernel (`splash.py`);
a one-token step over a cache in the `SLOTS` layout runs in the decode kernel
(`decode_attention.py`).

Build and call a module directly, or use it functionally through `transformer.forward`, which
merges a params pytree into the module inside the caller's jit (traced away):

    model = Decoder(config, rngs=nnx.Rngs(0))
    logits_BTV, _ = model(tokens_BT)

Dimension letters: B batch, T query length, S key length, D model dim, N query heads, K kv heads,
H head dim, F MLP dim, V vocab, L layers.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import decode_attention, moe, ops, splash
from scope_jax.models.config import ModelConfig

Init = Callable[[jax.Array, tuple[int, ...], Any], jax.Array]
BTD = ("activation_batch", "activation_length", "activation_embed")  # a layer's input and output


def _normal(std: float) -> Init:
  return lambda key, shape, dtype: (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def _stack(x_BTD, axis: str, size: int) -> bool:
  """Whether a block's projections run stacked (`_stacked`): where the tensor axis splits
  their outputs (`axis` of `size`), so each separate matmul would all-reduce its own input
  gradient. Not for a decode step (each weight read once, no stacked copy), nor under FSDP
  alone, where the stacked weights' gradient is all-reduced instead of reduce-scattered."""
  return x_BTD.shape[1] > 1 and shd.splits(axis, size)


def _stacked(spec: str, x, *weights):
  """`x` times each of `weights` (same shape) as one matmul over them stacked on axis 1 (the S
  of `spec`), split again: the backward's input gradient is then one sum, reduced once over a
  tensor axis the weights' outputs split over, where separate matmuls reduce one each (an
  all-reduce of [B, T, D] per weight)."""
  out = jnp.einsum(spec, x, jnp.stack(weights, axis=1))
  return tuple(out[:, :, i] for i in range(len(weights)))


def _adapt(y, x, lora, name: str, down: str, up: str):
  """y + scale·(x·a)·b for the LoRA target `name` (`lora` = (this layer's adapter weights
  {name: {"a", "b"}}, scale); see `lora.py`); y itself where the layer has no adapter there."""
  if lora is None or name not in lora[0]:
    return y
  weights, scale = lora
  xa = jnp.einsum(down, x, weights[name]["a"].astype(x.dtype))
  return y + scale * jnp.einsum(up, xa, weights[name]["b"].astype(x.dtype))


def _near_one(key, shape, dtype):
  """Norm scales around 1 (not exactly 1), so a test catches a norm applied in the wrong place."""
  return (1.0 + 0.1 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def _param(rngs: nnx.Rngs, init: Init, shape: tuple[int, ...], axes: tuple[str, ...],
           dtype) -> nnx.Param:
  """A parameter tagged with its logical axes; placement is left to the caller's rules."""
  return nnx.Param(init(rngs.params(), shape, dtype), out_sharding=axes, eager_sharding=False)


class Embedder(nnx.Module):
  """Token embedding [V, D] and the output projection (the embedding itself when tied)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    shape = (config.vocab_size, config.hidden_size)
    self.scale = config.hidden_size ** 0.5 if config.embed_scale else None
    self.final_softcap = config.final_softcap
    self.embed = _param(rngs, _normal(0.02), shape, ("vocab", "embed"), param_dtype)
    self.lm_head = (None if config.tie_embeddings else
                    _param(rngs, _normal(0.02), shape, ("vocab", "embed"), param_dtype))

  def encode(self, tokens_BT: jax.Array, dtype) -> jax.Array:
    x_BTD = jnp.take(self.embed[...], tokens_BT, axis=0)
    if self.scale is not None:  # Gemma: √D rounded to the weights' dtype, as HF does
      x_BTD = x_BTD * jnp.asarray(self.scale, x_BTD.dtype)
    return x_BTD.astype(dtype)

  @property
  def unembed_VD(self) -> jax.Array:
    return (self.embed if self.lm_head is None else self.lm_head)[...]

  def decode(self, hidden_BTD: jax.Array) -> jax.Array:
    """Logits [B, T, V] in float32 (soft-capped for Gemma-2)."""
    return ops.softcap(jnp.einsum("BTD,VD->BTV", hidden_BTD,
                                  self.unembed_VD.astype(hidden_BTD.dtype),
                                  preferred_element_type=jnp.float32), self.final_softcap)


class Attention(nnx.Module):
  """Grouped-query self-attention with RoPE, optional q/k/v biases (Qwen2), q/k norms per head
  (Qwen3) or over the whole projection (OLMo), soft-capped scores and a per-layer sliding window
  (Gemma-2, OLMo-3).

  With a KV cache the block's keys and values are written into the layer's buffers, and the
  block attends to every slot the row wrote before.
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    c, w = config, _normal(0.02)
    d, n, k, h = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
    self.eps, self.qkv_bias, self.qk_norm = c.rms_norm_eps, c.qkv_bias, c.qk_norm
    self.qk_norm_full, self.scale, self.cap = c.qk_norm_full, c.attn_scale, c.attn_softcap
    self.sliding = c.sliding_window if any(c.windows) else 0  # the one window size, or 0
    self.q = _param(rngs, w, (d, n, h), ("embed", "heads", "head_dim"), param_dtype)
    self.k = _param(rngs, w, (d, k, h), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.v = _param(rngs, w, (d, k, h), ("embed", "kv_heads", "head_dim"), param_dtype)
    self.o = _param(rngs, w, (n, h, d), ("heads", "head_dim", "embed"), param_dtype)
    if c.qkv_bias:
      self.q_bias = _param(rngs, w, (n, h), ("heads", "head_dim"), param_dtype)
      self.k_bias = _param(rngs, w, (k, h), ("kv_heads", "head_dim"), param_dtype)
      self.v_bias = _param(rngs, w, (k, h), ("kv_heads", "head_dim"), param_dtype)
    if c.qk_norm and c.qk_norm_full:  # one RMSNorm over all heads of the projection
      self.q_norm = _param(rngs, _near_one, (n, h), ("heads", "head_dim"), param_dtype)
      self.k_norm = _param(rngs, _near_one, (k, h), ("kv_heads", "head_dim"), param_dtype)
    elif c.qk_norm:
      self.q_norm = _param(rngs, _near_one, (h,), ("head_dim",), param_dtype)
      self.k_norm = _param(rngs, _near_one, (h,), ("head_dim",), param_dtype)

  def project_qkv(self, h_BTD: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array, lora=None):
    dt = h_BTD.dtype
    w = lambda p: p[...].astype(dt)
    if not _stack(h_BTD, "activation_heads", self.q.shape[1]):
      q = jnp.einsum("BTD,DNH->BTNH", h_BTD, w(self.q))
      k = jnp.einsum("BTD,DKH->BTKH", h_BTD, w(self.k))
      v = jnp.einsum("BTD,DKH->BTKH", h_BTD, w(self.v))
    elif self.q.shape == self.k.shape:  # no grouping: one matmul for all three
      q, k, v = _stacked("BTD,DSNH->BTSNH", h_BTD, w(self.q), w(self.k), w(self.v))
    else:
      q = jnp.einsum("BTD,DNH->BTNH", h_BTD, w(self.q))
      k, v = _stacked("BTD,DSKH->BTSKH", h_BTD, w(self.k), w(self.v))
    q = _adapt(q, h_BTD, lora, "q", "BTD,DR->BTR", "BTR,RNH->BTNH")
    k = _adapt(k, h_BTD, lora, "k", "BTD,DR->BTR", "BTR,RKH->BTKH")
    v = _adapt(v, h_BTD, lora, "v", "BTD,DR->BTR", "BTR,RKH->BTKH")
    if self.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if self.qk_norm:
      axes = 2 if self.qk_norm_full else 1
      q = ops.rms_norm(q, self.q_norm[...], self.eps, axes=axes)
      k = ops.rms_norm(k, self.k_norm[...], self.eps, axes=axes)
    return ops.apply_rope(q, cos_BTH, sin_BTH), ops.apply_rope(k, cos_BTH, sin_BTH), v

  def __call__(self, h_BTD, cos_BTH, sin_BTH, slots_BT, valid_BS, kv=None, positions=None,
               window=None, lora=None):
    """Returns (output [B, T, D], kv): `kv` is this layer's cache buffers (in a `kv_cache`
    layout) with the block written at `slots`, or None (the block attends to itself); the block
    attends to the first S slots, S = `valid_BS`'s length (the buffers may hold more).
    `positions` = (query positions [B, T], key positions [B, S]) for a sliding `window`;
    `lora` = (this layer's adapters, scale) or None."""
    q, k, v = self.project_qkv(h_BTD, cos_BTH, sin_BTH, lora)
    if kv is None and splash.applies(q.shape[1], q.shape[3]):  # TPU: skip the masked blocks
      out_BTNH = splash.attend(q, k, v, valid_BS, window=window, sliding=self.sliding,
                               scale=self.scale, cap=self.cap)
      return self._out(out_BTNH, lora), kv
    if kv is None:
      specs, keys, values = None, jnp.einsum("BTKH->BKHT", k), jnp.einsum("BTKH->BKTH", v)
    else:
      layout = kvc.layout_of(kv[0], *k.shape[2:])
      kv = (kvc.write_keys(kv[0], slots_BT, k, layout),
            kvc.write_values(kv[1], slots_BT, v, layout))
      if decode_attention.applies(q.shape[1], layout, valid_BS.shape[1],
                                  kv[0].shape[kvc.slot_axes(layout)[0]], q.shape[3], k.shape[2]):
        return self._decode(q, kv, slots_BT, valid_BS, positions, window, lora), kv
      keys, values = kvc.read_window(*kv, valid_BS.shape[1], layout)
      keys, values = keys.astype(h_BTD.dtype), values.astype(h_BTD.dtype)
      specs = kvc.attention_specs(layout)
    q_pos, k_pos = positions if positions is not None else (None, None)
    attend = ops.attend_kv
    if kv is not None and q.shape[1] > 1 and ops.blockwise_cache_attention():
      attend = ops.attend_cached  # a prefill into the cache: skip the keys no query needs
    out_BTNH = attend(q, keys, values, slots_BT, valid_BS, q_pos_BT=q_pos, k_pos_BS=k_pos,
                      window=window, scale=self.scale, cap=self.cap,
                      kv_specs=specs or ("BKHS", "BKSH"))
    return self._out(out_BTNH, lora), kv

  def _out(self, out_BTNH, lora):
    """The output projection (with its adapter): [B, T, N, H] → [B, T, D]."""
    y_BTD = jnp.einsum("BTNH,NHD->BTD", out_BTNH, self.o[...].astype(out_BTNH.dtype))
    return _adapt(y_BTD, out_BTNH, lora, "o", "BTNH,NHR->BTR", "BTR,RD->BTD")

  def _decode(self, q_B1NH, kv, slots_B1, valid_BW, positions, window, lora=None):
    """A one-token block's attention over the first W slots of the cache buffers `kv` (read in
    place) in the TPU decode kernel, projected out: [B, 1, D]."""
    q_pos, k_pos = positions if positions is not None else (None, None)
    mask_BW = decode_attention.decode_mask(
        slots_B1[:, 0], valid_BW, None if q_pos is None else q_pos[:, 0], k_pos, window)
    out_BNH = decode_attention.attend(q_B1NH[:, 0], kv[0], kv[1], mask_BW, scale=self.scale,
                                      cap=self.cap)
    y_BD = jnp.einsum("BNH,NHD->BD", out_BNH, self.o[...].astype(out_BNH.dtype))
    return _adapt(y_BD, out_BNH, lora, "o", "BNH,NHR->BR", "BR,RD->BD")[:, None]


class MLP(nnx.Module):
  """Gated feed-forward: down(act(gate(x)) * up(x)), SwiGLU (silu) or GeGLU (tanh GELU)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    d, f, w = config.hidden_size, config.intermediate_size, _normal(0.02)
    self.hidden_act = config.hidden_act
    self.gate = _param(rngs, w, (d, f), ("embed", "mlp"), param_dtype)
    self.up = _param(rngs, w, (d, f), ("embed", "mlp"), param_dtype)
    self.down = _param(rngs, w, (f, d), ("mlp", "embed"), param_dtype)

  def __call__(self, h_BTD: jax.Array, lora=None) -> jax.Array:
    dt = h_BTD.dtype
    gate_DF, up_DF = self.gate[...].astype(dt), self.up[...].astype(dt)
    if not _stack(h_BTD, "activation_mlp", gate_DF.shape[1]):
      gate_BTF = jnp.einsum("BTD,DF->BTF", h_BTD, gate_DF)
      up_BTF = jnp.einsum("BTD,DF->BTF", h_BTD, up_DF)
    else:
      gate_BTF, up_BTF = _stacked("BTD,DSF->BTSF", h_BTD, gate_DF, up_DF)
    gate_BTF = _adapt(gate_BTF, h_BTD, lora, "gate", "BTD,DR->BTR", "BTR,RF->BTF")
    up_BTF = _adapt(up_BTF, h_BTD, lora, "up", "BTD,DR->BTR", "BTR,RF->BTF")
    act_BTF = (jax.nn.silu(gate_BTF) if self.hidden_act == "silu" else
               jax.nn.gelu(gate_BTF, approximate=True))
    h_BTF = act_BTF * up_BTF
    down_BTD = jnp.einsum("BTF,FD->BTD", h_BTF, self.down[...].astype(dt))
    return _adapt(down_BTD, h_BTF, lora, "down", "BTF,FR->BTR", "BTR,RD->BTD")


class MoE(nnx.Module):
  """Qwen3-MoE's sparse MLP: a softmax router over E experts keeps each token's top k (their
  weights renormalised to sum to 1 when `norm_topk_prob`, in HF's order: softmax in float32,
  top-k, renormalise, cast), and each expert is a SwiGLU MLP. Never a dense [M, E, F] tensor:
  `moe.experts` runs the (token, expert) pairs grouped by expert, expert-parallel on a TPU mesh,
  through `ragged_dot` otherwise. Dropless, except where a call passes a capacity
  (`config.moe_capacity_factor`, which the forward applies without a KV cache: training and
  scoring); then the pairs past a shard's capacity are dropped (`moe.capacity_counts`).
  """

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    d, e, f, w = config.hidden_size, config.num_experts, config.moe_intermediate_size, _normal(0.02)
    self.k, self.norm_topk = config.num_experts_per_tok, config.norm_topk_prob
    self.capacity_factor = config.moe_capacity_factor
    self.router = _param(rngs, _normal(0.5), (d, e), ("embed", "router"), param_dtype)
    self.expert_gate = _param(rngs, w, (e, d, f), ("expert", "embed", "mlp"), param_dtype)
    self.expert_up = _param(rngs, w, (e, d, f), ("expert", "embed", "mlp"), param_dtype)
    self.expert_down = _param(rngs, w, (e, f, d), ("expert", "mlp", "embed"), param_dtype)

  def route(self, x_MD: jax.Array):
    """(top-k weights [M, k] in x's dtype, expert ids [M, k], router probs [M, E] float32)."""
    return moe.route(x_MD, self.router[...], self.k, self.norm_topk)

  def __call__(self, h_BTD: jax.Array, mask_BT: jax.Array | None = None,
               capacity: bool = False):
    """Returns (output [B, T, D], router statistics: expert load [E], probability mass [E] and
    the pairs computed over the real tokens of `mask_BT`, and their count). `capacity`: apply
    `moe_capacity_factor` (else dropless)."""
    b, t, d = h_BTD.shape
    x_MD = h_BTD.reshape(b * t, d)
    weights_MK, ids_MK, probs_ME = self.route(x_MD)
    y_MD, kept_MK = moe.experts(x_MD, weights_MK, ids_MK, self.expert_gate[...],
                                self.expert_up[...], self.expert_down[...],
                                self.capacity_factor if capacity else 0.0)
    stats = moe.router_stats(ids_MK, probs_ME, None if mask_BT is None else mask_BT.reshape(-1),
                             kept_MK)
    return y_MD.reshape(b, t, d), stats


class DecoderLayer(nnx.Module):
  """Residual block: x + post(attn(pre(x))), then x + post(mlp(pre(x))). Llama/Qwen have only
  the pre-norms, OLMo-2/3 only the post-norms, Gemma-2 both (`config.norm_layout`)."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    d, layout = config.hidden_size, config.norm_layout
    self.eps, self.plus_one = config.rms_norm_eps, config.norm_plus_one
    norm = lambda: _param(rngs, _near_one, (d,), ("norm",), param_dtype)
    self.attn_norm = norm() if layout in ("pre", "sandwich") else None
    self.attn = Attention(config, rngs=rngs, param_dtype=param_dtype)
    self.attn_post_norm = norm() if layout in ("sandwich", "post") else None
    self.mlp_norm = norm() if layout in ("pre", "sandwich") else None
    self.mlp = (MoE if config.num_experts else MLP)(config, rngs=rngs, param_dtype=param_dtype)
    self.mlp_post_norm = norm() if layout in ("sandwich", "post") else None

  def _norm(self, x_BTD, weight):
    if weight is None:
      return x_BTD
    return ops.rms_norm(x_BTD, weight[...], self.eps, plus_one=self.plus_one)

  def __call__(self, x_BTD, cos_BTH, sin_BTH, slots_BT, valid_BS, kv=None, positions=None,
               window=None, mask_BT=None, lora=None):
    """Returns (x, kv, router statistics or None); `lora` = (this layer's adapters, scale)."""
    h_BTD = self._norm(x_BTD, self.attn_norm)
    attn_BTD, kv = self.attn(h_BTD, cos_BTH, sin_BTH, slots_BT, valid_BS, kv, positions, window,
                             lora)
    x_BTD = x_BTD + self._norm(attn_BTD, self.attn_post_norm)
    stats = None
    if isinstance(self.mlp, MoE):
      # cache-free forwards (training, scoring) apply the capacity; sampling stays dropless
      mlp_BTD, stats = self.mlp(self._norm(x_BTD, self.mlp_norm), mask_BT, capacity=kv is None)
    else:
      mlp_BTD = self.mlp(self._norm(x_BTD, self.mlp_norm), lora)
    return x_BTD + self._norm(mlp_BTD, self.mlp_post_norm), kv, stats


def stacked_layers(config: ModelConfig, rngs: nnx.Rngs, param_dtype=jnp.float32) -> DecoderLayer:
  """One DecoderLayer whose parameters carry a leading `layers` axis of size L."""

  @nnx.split_rngs(splits=config.num_layers)
  @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(layer_rngs: nnx.Rngs) -> DecoderLayer:
    return DecoderLayer(config, rngs=layer_rngs, param_dtype=param_dtype)

  return make(rngs)


class Decoder(nnx.Module):
  """The whole model: embedding, L decoder layers, final norm and output projection."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    self.config = config
    self.embedder = Embedder(config, rngs=rngs, param_dtype=param_dtype)
    self.layers = stacked_layers(config, rngs, param_dtype)
    self.final_norm = _param(rngs, _near_one, (config.hidden_size,), ("norm",), param_dtype)

  def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None, cache: kvc.KVCache | None = None, *,
               return_hidden: bool = False, dtype=jnp.float32, remat: str = "none",
               return_router: bool = False, layers: Sequence[nnx.State] | None = None,
               lora: tuple[dict, float] | None = None):
    """Runs the decoder on tokens [B, T]; see `transformer.forward` for the arguments. `lora` =
    (LoRA adapter weights {target: {"a", "b"}} stacked on L, scale) or None (`lora.py`).

    Returns (logits [B, T, V] float32 or hidden [B, T, D], updated cache or None), and the
    router statistics per layer when `return_router` (mixture-of-experts models).
    """
    c = self.config
    b, t = tokens.shape
    if layers is not None and cache is None:
      raise ValueError("`layers` (pre-sliced layer weights) applies to the unrolled forward with a "
                       "cache; without a cache the stacked layers are scanned: drop `layers`.")
    mask_BT = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
    if positions is None:
      positions = kvc.positions_for_block(cache, mask_BT)
    cos, sin = ops.rope_tables(c, positions)
    local_rope = None  # OLMo-3: sliding-window layers use the unscaled rope
    if c.rope_full_only and c.rope_scaling is not None:
      local_rope = ops.rope_tables(c.replace(rope_scaling=None), positions)
    # Rows on the batch axes: the lookup's output is laid out like the table (D over fsdp),
    # which GSPMD would otherwise carry through every layer as tensor parallelism.
    x_BTD = shd.constrain(self.embedder.encode(tokens, dtype), BTD)
    if cache is None:
      slots_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
      valid_BC = mask_BT  # keys are the block itself
      pos_BC = positions
    else:
      slots_BT = kvc.block_slots(cache, t)
      valid_BC = kvc.written_valid(cache, slots_BT, mask_BT)
      pos_BC = kvc.written_pos(cache, slots_BT, positions)
    windows = jnp.asarray(c.windows, jnp.int32)  # [L]; 0 = global attention
    sliding = bool(c.sliding_window) and any(c.windows)

    layer_def, layer_state = nnx.split(self.layers)

    adapters = {} if lora is None else lora[0]

    def run_layer(x, kv, state, window, adapters_l):
      cos_l, sin_l = cos, sin
      if local_rope is not None:
        cos_l, sin_l = (jnp.where(window > 0, lo, hi) for lo, hi in zip(local_rope, (cos, sin)))
      x, kv, stats = nnx.merge(layer_def, state)(
          x, cos_l, sin_l, slots_BT, valid_BC, kv, (positions, pos_BC) if sliding else None,
          window if sliding else None, mask_BT, None if lora is None else (adapters_l, lora[1]))
      return shd.constrain(x, BTD), kv, stats

    if remat not in ops.REMAT_POLICIES:
      raise ValueError(f"Unknown remat policy {remat!r}; use one of "
                       f"{', '.join(ops.REMAT_POLICIES)} (model.remat).")
    if remat != "none":
      run_layer = jax.checkpoint(run_layer, policy=ops.REMAT_POLICIES[remat])
    if cache is not None:  # unrolled: each layer updates its own cache buffers in place
      ks, vs, stats = list(cache.k), list(cache.v), []
      for i in range(c.num_layers):
        state_i = layers[i] if layers is not None else jax.tree.map(lambda a: a[i], layer_state)
        adapters_i = jax.tree.map(lambda a: a[i], adapters)  # small: sliced in the loop
        x_BTD, (ks[i], vs[i]), stats_i = run_layer(x_BTD, (ks[i], vs[i]), state_i, windows[i],
                                                   adapters_i)
        stats.append(stats_i)
      router = None if stats[0] is None else jax.tree.map(lambda *a: jnp.stack(a), *stats)
    else:  # scanned
      def layer(x, xs):
        x, _, stats = run_layer(x, None, *xs)
        return x, stats

      x_BTD, router = jax.lax.scan(layer, x_BTD, (layer_state, windows, adapters))
    hidden_BTD = ops.rms_norm(x_BTD, self.final_norm[...], c.rms_norm_eps,
                              plus_one=c.norm_plus_one)

    new_cache = None
    if cache is not None:
      new_cache = kvc.advance(cache, tuple(ks), tuple(vs), valid_BC, mask_BT, pos_BC)
    out = hidden_BTD if return_hidden else self.embedder.decode(hidden_BTD)
    if return_router:  # per-layer expert loads and router mass [L, E] (None without experts)
      return out, new_cache, router
    return out, new_cache
