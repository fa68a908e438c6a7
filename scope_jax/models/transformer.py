"""One decoder for Llama-3, Qwen2, Qwen2.5 and Qwen3, applied functionally to a params pytree.

Dimension letters: B batch, T query length, S key length, C cache slots, D model dim, N query heads,
K kv heads, G = N / K, H head dim, F MLP dim, V vocab, L layers.

Params (a plain dict; layers stacked on a leading L axis and run with `lax.scan`):
  embed [V, D]; final_norm [D]; lm_head [V, D] (absent when embeddings are tied);
  layers: attn_norm [L, D], q [L, D, N, H], k/v [L, D, K, H], o [L, N, H, D],
          (q_bias [L, N, H], k_bias/v_bias [L, K, H]), (q_norm/k_norm [L, H]),
          mlp_norm [L, D], gate/up [L, D, F], down [L, F, D].
Softmax, norms and logits run in float32; masks use a large finite negative value.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models.config import ModelConfig, rope_inv_freq

Params = dict[str, Any]
K_MASK = -2.3819763e38

REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


# ------------------------------------------------------------------------ shapes, axes, init

def param_shapes(config: ModelConfig) -> dict[str, Any]:
  """Shape of every parameter, as a pytree of tuples (the single source of the layout)."""
  c = config
  l, d, f, n, k, h, v = (c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads,
                         c.num_kv_heads, c.head_dim, c.vocab_size)
  layers = {"attn_norm": (l, d), "q": (l, d, n, h), "k": (l, d, k, h), "v": (l, d, k, h),
            "o": (l, n, h, d), "mlp_norm": (l, d), "gate": (l, d, f), "up": (l, d, f),
            "down": (l, f, d)}
  if c.qkv_bias:
    layers.update(q_bias=(l, n, h), k_bias=(l, k, h), v_bias=(l, k, h))
  if c.qk_norm:
    layers.update(q_norm=(l, h), k_norm=(l, h))
  shapes = {"embed": (v, d), "final_norm": (d,), "layers": layers}
  if not c.tie_embeddings:
    shapes["lm_head"] = (v, d)
  return shapes


_LOGICAL_AXES = {
    "embed": ("vocab", "embed"), "lm_head": ("vocab", "embed"), "final_norm": ("norm",),
    "attn_norm": ("layers", "norm"), "mlp_norm": ("layers", "norm"),
    "q": ("layers", "embed", "heads", "head_dim"), "k": ("layers", "embed", "kv_heads", "head_dim"),
    "v": ("layers", "embed", "kv_heads", "head_dim"), "o": ("layers", "heads", "head_dim", "embed"),
    "q_bias": ("layers", "heads", "head_dim"), "k_bias": ("layers", "kv_heads", "head_dim"),
    "v_bias": ("layers", "kv_heads", "head_dim"), "q_norm": ("layers", "head_dim"),
    "k_norm": ("layers", "head_dim"), "gate": ("layers", "embed", "mlp"),
    "up": ("layers", "embed", "mlp"), "down": ("layers", "mlp", "embed"),
}


def param_logical_axes(config: ModelConfig) -> dict[str, Any]:
  """Logical axis names of every parameter (same tree as `param_shapes`)."""
  shapes = param_shapes(config)
  out = {name: _LOGICAL_AXES[name] for name in shapes if name != "layers"}
  out["layers"] = {name: _LOGICAL_AXES[name] for name in shapes["layers"]}
  return out


def init_params(config: ModelConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  """Random init (normal, std 0.02; norms 1; biases small) — for tests and from-scratch demos."""
  shapes = param_shapes(config)
  flat, treedef = jax.tree_util.tree_flatten_with_path(
      shapes, is_leaf=lambda x: isinstance(x, tuple))
  keys = jax.random.split(key, len(flat))
  leaves = []
  for (path, shape), k in zip(flat, keys):
    name = path[-1].key
    if name.endswith("norm"):
      leaves.append(1.0 + 0.1 * jax.random.normal(k, shape, jnp.float32))
    elif name.endswith("bias"):
      leaves.append(0.02 * jax.random.normal(k, shape, jnp.float32))
    else:
      leaves.append(0.02 * jax.random.normal(k, shape, jnp.float32))
  return jax.tree.unflatten(treedef, [x.astype(dtype) for x in leaves])


# ------------------------------------------------------------------------------- building blocks

def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
  """RMSNorm in float32, cast back to x's dtype before the scale (as Hugging Face does)."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return weight.astype(x.dtype) * y.astype(x.dtype)


def rope_tables(config: ModelConfig, positions_BT: jax.Array) -> tuple[jax.Array, jax.Array]:
  """cos, sin [B, T, H] in float32 for the rotate-half RoPE convention."""
  inv_freq = jnp.asarray(rope_inv_freq(config))
  freqs_BTh = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  emb_BTH = jnp.concatenate([freqs_BTh, freqs_BTh], axis=-1)
  return jnp.cos(emb_BTH), jnp.sin(emb_BTH)


def apply_rope(x_BTNH: jax.Array, cos_BTH: jax.Array, sin_BTH: jax.Array) -> jax.Array:
  half = x_BTNH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BTNH[..., half:], x_BTNH[..., :half]], axis=-1)
  cos, sin = cos_BTH[:, :, None, :].astype(x_BTNH.dtype), sin_BTH[:, :, None, :].astype(x_BTNH.dtype)
  return x_BTNH * cos + rotated * sin


def _attend_block(q_BTNH, k_BSKH, v_BSKH, q_slot_BT, k_valid_BS):
  """Grouped-query attention for one query block; the causal mask comes from slot indices."""
  b, t, n, h = q_BTNH.shape
  s, kv = k_BSKH.shape[1], k_BSKH.shape[2]
  q_BTKGH = q_BTNH.reshape(b, t, kv, n // kv, h)
  scores_BKGTS = jnp.einsum("BTKGH,BSKH->BKGTS", q_BTKGH, k_BSKH,
                            preferred_element_type=jnp.float32) * (h ** -0.5)
  k_slot_S = jnp.arange(s, dtype=jnp.int32)
  mask_BTS = (k_slot_S[None, None, :] <= q_slot_BT[:, :, None]) & k_valid_BS[:, None, :]
  scores_BKGTS = jnp.where(mask_BTS[:, None, None, :, :], scores_BKGTS, K_MASK)
  probs_BKGTS = jax.nn.softmax(scores_BKGTS, axis=-1).astype(v_BSKH.dtype)
  out_BTKGH = jnp.einsum("BKGTS,BSKH->BTKGH", probs_BKGTS, v_BSKH)
  return out_BTKGH.reshape(b, t, n, h)


def attend(q_BTNH: jax.Array, k_BSKH: jax.Array, v_BSKH: jax.Array, q_slot_BT: jax.Array,
           k_valid_BS: jax.Array, *, q_chunk: int = 512) -> jax.Array:
  """Causal grouped-query attention; scores and softmax in float32.

  Query t (at key slot q_slot[t]) attends to valid key slots s <= q_slot[t]. Long query blocks
  are processed `q_chunk` rows at a time under rematerialisation, so memory is O(q_chunk · S),
  not O(T · S), in the forward and the backward pass.
  """
  b, t, n, h = q_BTNH.shape
  if t <= q_chunk:
    return _attend_block(q_BTNH, k_BSKH, v_BSKH, q_slot_BT, k_valid_BS)
  pad = -t % q_chunk
  q = jnp.pad(q_BTNH, ((0, 0), (0, pad), (0, 0), (0, 0)))
  slots = jnp.pad(q_slot_BT, ((0, 0), (0, pad)))
  n_chunks = (t + pad) // q_chunk
  q_cBcNH = jnp.moveaxis(q.reshape(b, n_chunks, q_chunk, n, h), 1, 0)
  slots_cBc = jnp.moveaxis(slots.reshape(b, n_chunks, q_chunk), 1, 0)
  block = jax.checkpoint(lambda xs: _attend_block(xs[0], k_BSKH, v_BSKH, xs[1], k_valid_BS))
  out = jax.lax.map(block, (q_cBcNH, slots_cBc))
  return jnp.moveaxis(out, 0, 1).reshape(b, t + pad, n, h)[:, :t]


def _project_qkv(config: ModelConfig, lp: Params, h_BTD: jax.Array, cos, sin):
  dt = h_BTD.dtype
  q = jnp.einsum("BTD,DNH->BTNH", h_BTD, lp["q"].astype(dt))
  k = jnp.einsum("BTD,DKH->BTKH", h_BTD, lp["k"].astype(dt))
  v = jnp.einsum("BTD,DKH->BTKH", h_BTD, lp["v"].astype(dt))
  if config.qkv_bias:
    q, k, v = q + lp["q_bias"].astype(dt), k + lp["k_bias"].astype(dt), v + lp["v_bias"].astype(dt)
  if config.qk_norm:
    q = rms_norm(q, lp["q_norm"], config.rms_norm_eps)
    k = rms_norm(k, lp["k_norm"], config.rms_norm_eps)
  return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def _mlp(config: ModelConfig, lp: Params, x_BTD: jax.Array) -> jax.Array:
  dt = x_BTD.dtype
  h_BTD = rms_norm(x_BTD, lp["mlp_norm"], config.rms_norm_eps)
  gate_BTF = jnp.einsum("BTD,DF->BTF", h_BTD, lp["gate"].astype(dt))
  up_BTF = jnp.einsum("BTD,DF->BTF", h_BTD, lp["up"].astype(dt))
  return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate_BTF) * up_BTF, lp["down"].astype(dt))


def _attention_out(lp: Params, attn_BTNH: jax.Array) -> jax.Array:
  return jnp.einsum("BTNH,NHD->BTD", attn_BTNH, lp["o"].astype(attn_BTNH.dtype))


# ----------------------------------------------------------------------------------- forward

def unembedding(config: ModelConfig, params: Params) -> jax.Array:
  """The output projection [V, D] (the input embedding when tied)."""
  return params["embed"] if config.tie_embeddings else params["lm_head"]


def logits_from_hidden(hidden_BTD: jax.Array, unembed_VD: jax.Array) -> jax.Array:
  return jnp.einsum("BTD,VD->BTV", hidden_BTD, unembed_VD.astype(hidden_BTD.dtype),
                    preferred_element_type=jnp.float32)


def forward(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
            attention_mask: jax.Array | None = None, cache: kvc.KVCache | None = None, *,
            return_hidden: bool = False, dtype=jnp.float32, remat: str = "none"):
  """Runs the decoder on tokens [B, T].

  Args:
    attention_mask: [B, T], 1 on real tokens, 0 on padding (left or right). Defaults to all ones.
    positions: [B, T] RoPE positions; by default real tokens count up from 0 (or from the
      cache's per-row next position), so padded rows match an unpadded run.
    cache: a `KVCache`; the block is written at each row's own offset and attends to everything
      the row wrote before. Without a cache the block attends causally to itself.
    return_hidden: return the final-norm hidden states [B, T, D] instead of logits [B, T, V].
    dtype: compute dtype (float32 or bfloat16); logits are float32 either way.
    remat: rematerialisation policy name for the layer scan (see REMAT_POLICIES).

  Returns:
    (logits [B, T, V] float32 or hidden [B, T, D], updated cache or None).
  """
  b, t = tokens.shape
  mask_BT = jnp.ones((b, t), bool) if attention_mask is None else attention_mask.astype(bool)
  if positions is None:
    positions = kvc.positions_for_block(cache, mask_BT)
  cos, sin = rope_tables(config, positions)
  x_BTD = jnp.take(params["embed"], tokens, axis=0).astype(dtype)

  if cache is None:
    slots_BT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
    valid_BC = mask_BT  # keys are the block itself
  else:
    slots_BT = kvc.block_slots(cache, t)
    valid_BC = kvc.written_valid(cache, slots_BT, mask_BT)

  def layer(carry, xs):
    x, k_all, v_all = carry
    lp, i = xs
    h = rms_norm(x, lp["attn_norm"], config.rms_norm_eps)
    q, k, v = _project_qkv(config, lp, h, cos, sin)
    if cache is not None:
      k_all = kvc.write_layer(k_all, i, slots_BT, k)
      v_all = kvc.write_layer(v_all, i, slots_BT, v)
      k, v = k_all[i].astype(dtype), v_all[i].astype(dtype)
    x = x + _attention_out(lp, attend(q, k, v, slots_BT, valid_BC))
    x = x + _mlp(config, lp, x)
    return (x, k_all, v_all), None

  policy = REMAT_POLICIES[remat]
  if remat != "none":
    layer = jax.checkpoint(layer, policy=policy)
  k0 = v0 = jnp.zeros((), dtype)
  if cache is not None:
    k0, v0 = cache.k, cache.v
  layer_ids = jnp.arange(config.num_layers, dtype=jnp.int32)
  (x_BTD, k_all, v_all), _ = jax.lax.scan(layer, (x_BTD, k0, v0), (params["layers"], layer_ids))
  hidden_BTD = rms_norm(x_BTD, params["final_norm"], config.rms_norm_eps)

  new_cache = None
  if cache is not None:
    new_cache = kvc.advance(cache, k_all, v_all, valid_BC, mask_BT)
  if return_hidden:
    return hidden_BTD, new_cache
  return logits_from_hidden(hidden_BTD, unembedding(config, params)), new_cache


@functools.partial(jax.jit, static_argnames=("config", "dtype", "return_hidden"))
def forward_jit(config, params, tokens, attention_mask=None, positions=None, *, dtype=jnp.float32,
                return_hidden=False):
  """Jitted cache-free forward (convenience for tests and evaluation)."""
  out, _ = forward(config, params, tokens, positions, attention_mask, dtype=dtype,
                   return_hidden=return_hidden)
  return out


def count_params(params: Params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))


# ------------------------------------------------------------------------------ placement

def param_shardings(config, mesh: jax.sharding.Mesh, rules: shd.Rules = shd.TRAIN_RULES) -> Any:
  """Shardings of a model's params under `rules`."""
  shapes = param_shapes(config)
  return shd.tree_shardings(param_logical_axes(config), shapes, mesh, rules)


def init_sharded_params(config, key: jax.Array, mesh: jax.sharding.Mesh,
                        rules: shd.Rules = shd.TRAIN_RULES, dtype=jnp.float32) -> Any:
  """Random params created directly in their shards: eval_shape → shardings → jitted init."""
  shardings = param_shardings(config, mesh, rules)
  init = jax.jit(lambda k: init_params(config, k, dtype), out_shardings=shardings)
  return init(key)


def shard_params(params: Any, config, mesh: jax.sharding.Mesh,
                 rules: shd.Rules = shd.TRAIN_RULES) -> Any:
  """Moves (or reshards) an existing params pytree onto the mesh under `rules`."""
  return jax.device_put(params, param_shardings(config, mesh, rules))
