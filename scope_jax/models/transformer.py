"""The decoder applied functionally: a pure function of a params pytree (what the sampler, the
train step, checkpoints and the HF/GGUF I/O pass around), backed by the Flax modules.

Params (a plain dict; layers stacked on a leading L axis):
  embed [V, D]; final_norm [D]; lm_head [V, D] (absent when embeddings are tied);
  layers: attn_norm [L, D], q [L, D, N, H], k/v [L, D, K, H], o [L, N, H, D],
          (q_bias [L, N, H], k_bias/v_bias [L, K, H]), (q_norm/k_norm [L, H]),
          mlp_norm [L, D], gate/up [L, D, F], down [L, F, D].

The modules (`modules.Decoder`) nest these as embedder/{embed,lm_head}, final_norm and
layers/{attn_norm, attn/{q,k,v,o,...}, mlp_norm, mlp/{gate,up,down}}; the params pytree is that
state with each layer's sub-modules and the embedder flattened (`_params_path`), so names,
shapes and logical axes all come from the modules. `forward` merges params into the module
inside the caller's jit: the merge is traced away and nothing is re-created per step.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import modules, ops
from scope_jax.models.config import ModelConfig
from scope_jax.models.ops import K_MASK, REMAT_POLICIES, apply_rope, attend, rms_norm, rope_tables

__all__ = ["Params", "K_MASK", "REMAT_POLICIES", "apply_rope", "attend", "rms_norm",
           "rope_tables", "param_shapes", "param_logical_axes", "init_params", "as_module",
           "params_of", "forward", "forward_jit", "unembedding", "logits_from_hidden",
           "count_params", "param_shardings", "init_sharded_params", "shard_params"]

Params = dict[str, Any]


# ------------------------------------------------------------------------ layout, from the modules

@functools.lru_cache(maxsize=None)
def _abstract(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
  """The module's graph and its parameters as shapes (no memory, no FLOPs)."""
  return nnx.split(nnx.eval_shape(lambda: modules.Decoder(config, rngs=nnx.Rngs(0))))


def _params_path(module_path: tuple[str, ...]) -> tuple[str, ...]:
  """Where a module parameter sits in the params pytree: inside `layers` the sub-modules are
  flattened (layers/attn/q -> layers/q); elsewhere only the parameter name stays."""
  return (module_path[0], module_path[-1]) if module_path[0] == "layers" else module_path[-1:]


@functools.lru_cache(maxsize=None)
def _layout(config: ModelConfig) -> tuple[tuple[tuple[str, ...], tuple[str, ...], Any], ...]:
  """(module path, params path, abstract Param) of every parameter."""
  _, state = _abstract(config)
  out = tuple((tuple(str(k) for k in path), _params_path(tuple(str(k) for k in path)), var)
              for path, var in nnx.to_flat_state(state))
  names = [p for _, p, _ in out]
  assert len(set(names)) == len(names), f"parameter names collide: {names}"
  return out


def _nest(items) -> dict:
  tree: dict = {}
  for path, value in items:
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def param_shapes(config: ModelConfig) -> dict[str, Any]:
  """Shape of every parameter, as a params pytree of tuples."""
  return _nest((p, tuple(var.value.shape)) for _, p, var in _layout(config))


def param_logical_axes(config: ModelConfig) -> dict[str, Any]:
  """Logical axis names of every parameter: the modules' `out_sharding` metadata."""
  return _nest((p, tuple(var.out_sharding)) for _, p, var in _layout(config))


def as_module(config: ModelConfig, params: Params) -> modules.Decoder:
  """A `Decoder` module holding `params` (arrays or tracers); inside jit this costs nothing."""
  graphdef, _ = _abstract(config)
  missing, extra = _check_keys(config, params)
  if missing or extra:
    raise ValueError(f"Params do not match the model layout: missing "
                     f"{missing or 'nothing'}, unexpected {extra or 'nothing'}. Expected the "
                     "tree of transformer.param_shapes(config).")
  items = []
  for module_path, params_path, _ in _layout(config):
    node = params
    for key in params_path:
      node = node[key]
    items.append((module_path, node))
  return nnx.merge(graphdef, nnx.State(_nest(items)))


def _check_keys(config: ModelConfig, params: Params) -> tuple[list[str], list[str]]:
  want = {"/".join(p) for _, p, _ in _layout(config)}
  have = {"/".join(str(getattr(k, "key", k)) for k in path)
          for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  return sorted(want - have), sorted(have - want)


def params_of(model: modules.Decoder) -> Params:
  """The params pytree of a `Decoder` module (the inverse of `as_module`)."""
  _, state = nnx.split(model)
  return _nest((_params_path(tuple(str(k) for k in path)), var.value)
               for path, var in nnx.to_flat_state(state))


def init_params(config: ModelConfig, key: jax.Array, dtype=jnp.float32) -> Params:
  """Random init (normal, std 0.02; norm scales near 1) — for tests and from-scratch demos."""
  return params_of(modules.Decoder(config, rngs=nnx.Rngs(params=key), param_dtype=dtype))


# ----------------------------------------------------------------------------------- forward

def forward(config: ModelConfig, params: Params, tokens: jax.Array, positions: jax.Array | None = None,
            attention_mask: jax.Array | None = None, cache: kvc.KVCache | None = None, *,
            return_hidden: bool = False, dtype=jnp.float32, remat: str = "none",
            return_router: bool = False, layers: Sequence[Any] | None = None):
  """Runs the decoder on tokens [B, T]. `params` may be a LoRA view (`lora.view`: the base's
  params plus adapters under "lora"), applied as x·W + scale·(x·a)·b at each adapted projection.

  Args:
    attention_mask: [B, T], 1 on real tokens, 0 on padding (left or right). Defaults to all ones.
    positions: [B, T] RoPE positions; by default real tokens count up from 0 (or from the
      cache's per-row next position), so padded rows match an unpadded run.
    cache: a `KVCache`; the block is written at each row's own offset and attends to everything
      the row wrote before. Without a cache the block attends causally to itself.
    return_hidden: return the final-norm hidden states [B, T, D] instead of logits [B, T, V].
    dtype: compute dtype (float32 or bfloat16); logits are float32 either way.
    remat: rematerialisation policy name for the layer scan (see REMAT_POLICIES).

    return_router: also return the per-layer router statistics of a mixture of experts
      ({'load', 'prob': [L, E], 'tokens', 'computed': [L]}; None for dense models).
    layers: `layer_params(config, params)`, taken once outside a decode loop: each layer's
      weights as their own arrays (with a cache, the layers are unrolled, and XLA:CPU would
      otherwise copy every layer's slice of the stacked weights on every step).

  Returns:
    (logits [B, T, V] float32 or hidden [B, T, D], updated cache or None[, router statistics]).
  """
  base, adapters = _split_lora(params)
  lora = None if adapters is None else (adapters.weights, adapters.scale)
  return as_module(config, base)(tokens, positions, attention_mask, cache,
                                 return_hidden=return_hidden, dtype=dtype, remat=remat,
                                 return_router=return_router, layers=layers, lora=lora)


def _split_lora(params: Params):
  """(base params, LoRA adapters or None): a LoRA policy's params are the base's dict plus its
  adapters under "lora" (`lora.view`), applied at each target projection."""
  if isinstance(params, dict) and "lora" in params:
    return {k: v for k, v in params.items() if k != "lora"}, params["lora"]
  return params, None


def layer_params(config: ModelConfig, params: Params) -> tuple[nnx.State, ...]:
  """Each decoder layer's weights sliced out of the stacked `layers` arrays, for `forward`'s
  `layers`: a decode loop slices them once, not once per step."""
  _, state = nnx.split(as_module(config, _split_lora(params)[0]).layers)
  return tuple(jax.tree.map(lambda a, i=i: a[i], state) for i in range(config.num_layers))


@functools.partial(jax.jit, static_argnames=("config", "dtype", "return_hidden"))
def forward_jit(config, params, tokens, attention_mask=None, positions=None, *, dtype=jnp.float32,
                return_hidden=False):
  """Jitted cache-free forward (convenience for tests and evaluation)."""
  out, _ = forward(config, params, tokens, positions, attention_mask, dtype=dtype,
                   return_hidden=return_hidden)
  return out


def router_aux_loss(config: ModelConfig, router) -> jax.Array:
  """HF's load-balancing loss over all layers' real tokens: E · Σ_e f_e · p_e, with f_e the
  share of tokens routed to e (summed over the k choices) and p_e its mean router probability."""
  tokens = jnp.maximum(router["tokens"].sum(), 1.0)
  f_E = router["load"].sum(0) / tokens
  p_E = router["prob"].sum(0) / tokens
  return config.num_experts * jnp.sum(f_E * p_E)


def unembedding(config: ModelConfig, params: Params) -> jax.Array:
  """The output projection [V, D] (the input embedding when tied)."""
  return params["embed"] if config.tie_embeddings else params["lm_head"]


def logits_from_hidden(hidden_BTD: jax.Array, unembed_VD: jax.Array,
                       softcap: float = 0.0) -> jax.Array:
  """Float32 logits of final-norm hidden states; `softcap` is the model's `final_softcap`."""
  return ops.softcap(jnp.einsum("BTD,VD->BTV", hidden_BTD, unembed_VD.astype(hidden_BTD.dtype),
                                preferred_element_type=jnp.float32), softcap)


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


def _cast_before_use(config, name: str) -> bool:
  """Whether the forward casts this weight to the compute dtype before any use (matmul weights,
  biases), so a copy already in that dtype computes the same numbers. Not the norm scales (Gemma
  takes 1 + w in float32) nor Gemma's embedding (scaled in the weights' dtype)."""
  return "norm" not in name and not (name == "embed" and config.norm_plus_one)


def sampling_layout(config, params: Any, mesh: jax.sharding.Mesh, rules: shd.Rules,
                    dtype) -> tuple[Any, Any]:
  """(shardings, dtypes) of the params in the sampling layout. A leaf that layout moves is a
  copy either way: it is made in the compute `dtype` where that is narrower and the forward
  casts the weight to it anyway (a float32 master copy sampled in bfloat16: half the bytes
  held, half read per decode step, the same samples). A leaf it does not move is shared."""
  target = param_shardings(config, mesh, rules)
  narrow = jnp.dtype(dtype)

  def leaf_dtype(path, x, s):
    here = getattr(x, "sharding", None)
    moved = not (isinstance(here, jax.sharding.NamedSharding)
                 and here.is_equivalent_to(s, len(x.shape)))
    name = str(getattr(path[-1], "key", path[-1]))
    cast = moved and narrow.itemsize < jnp.dtype(x.dtype).itemsize and _cast_before_use(config, name)
    return narrow if cast else jnp.dtype(x.dtype)
  return target, jax.tree_util.tree_map_with_path(leaf_dtype, params, target)


@functools.lru_cache(maxsize=None)
def _recast(dtype, sharding):
  """Casts on the input's shards, then lays the result out as `sharding` (exactly that one)."""
  return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding)


def sampling_params(params: Any, config, mesh: jax.sharding.Mesh, rules: shd.Rules, dtype) -> Any:
  """The params a sampler plays, in the sampling layout (`sampling_layout`): moved leaves
  copied (cast on their shards, then laid out), the others the same arrays."""
  shardings, dtypes = sampling_layout(config, params, mesh, rules, dtype)

  def place(x, s, dt):
    if isinstance(x.sharding, jax.sharding.NamedSharding) and x.sharding.is_equivalent_to(
        s, x.ndim):
      return x
    return _recast(dt, s)(x)
  return jax.tree.map(place, params, shardings, dtypes)
