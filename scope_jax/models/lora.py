"""LoRA adapters (Hu et al. 2021) as their own pytree beside a shared, frozen base model.

For a target projection W [L, in..., out...] (q, k, v, o, gate, up, down) a policy holds
a [L, in..., R] (uniform ±1/√fan_in, PEFT's kaiming init) and b [L, R, out...] (zeros), and the
forward computes x·W + (α/R)·(x·a)·b at that einsum: no merged weight is ever made per policy,
so at init (b = 0) a LoRA policy's logits are the base model's exactly. The params a LoRA policy
plays are `view(base, adapters)`: the base's own dict with one more key, "lora"
(`transformer.forward` splits it off), so the sampler, the engine, evaluation and the train step
pass it unchanged while every policy, the KL reference and every frozen role share the same
base arrays. Training differentiates the adapters only; optimizer state, checkpoints and each
weight refresh hold adapters only; `merge` folds them into plain params (export, tests).

Mixture-of-experts models: the experts have no dense gate/up/down, so LoRA applies to the
attention projections only (the MLP targets are skipped; the router and experts stay frozen).
Dropout on the adapter input is not supported (`lora.dropout` must be 0).

Why not qwix (its LoRA intercepts einsum/dot_general in NNX module calls and creates the adapter
variables lazily inside the module): here the model is applied functionally from a params
pytree with layers stacked on L (scanned in training, sliced per layer in decode), and the
adapters must be a separate pytree (one shared base, adapter-only optimizer state, adapter-only
checkpoints and weight refreshes); module-owned, lazily created variables fit neither.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import math

from scope_jax import sharding as shd
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
MLP_TARGETS = ("gate", "up", "down")
_IN_DIMS = {"q": 1, "k": 1, "v": 1, "o": 2, "gate": 1, "up": 1, "down": 1}  # dims after L
KEY = "lora"  # the params-view key that holds the adapters


@dataclasses.dataclass(frozen=True)
class LoraConfig:
  rank: int = 0  # 0: off
  alpha: float = 0.0  # scale = alpha / rank; 0 means alpha = rank (scale 1)
  targets: tuple[str, ...] = TARGETS
  dropout: float = 0.0

  @property
  def scale(self) -> float:
    return (self.alpha or self.rank) / self.rank if self.rank else 0.0


@flax.struct.dataclass
class Adapters:
  """A policy's adapters: weights[target] = {"a": [L, in..., R], "b": [L, R, out...]}; the scale
  α/R is static (part of the tree's structure, never trained)."""
  weights: dict
  scale: float = flax.struct.field(pytree_node=False)


def from_config(section) -> LoraConfig:
  """A `LoraConfig` from the run's `lora` section (absent: off), checked."""
  if section is None:
    return LoraConfig()
  targets = section.get("targets", TARGETS)
  if isinstance(targets, str):
    targets = tuple(t.strip() for t in targets.split(",") if t.strip())
  out = LoraConfig(rank=int(section.get("rank", 0)), alpha=float(section.get("alpha", 0.0)),
                   targets=tuple(targets), dropout=float(section.get("dropout", 0.0)))
  check(out)
  return out


def check(lora: LoraConfig) -> None:
  """One-line errors for settings that cannot work."""
  if lora.rank < 0:
    raise ValueError(f"lora.rank must be 0 (off) or positive, got {lora.rank}.")
  if lora.alpha < 0:
    raise ValueError(f"lora.alpha must be non-negative (0: alpha = rank), got {lora.alpha}.")
  if lora.dropout != 0:
    raise ValueError(f"lora.dropout={lora.dropout} is not supported; set it to 0.")
  unknown = sorted(set(lora.targets) - set(TARGETS))
  if unknown or (lora.rank and not lora.targets):
    raise ValueError(f"lora.targets={','.join(lora.targets)!r} names unknown modules {unknown}; "
                     f"choose among {','.join(TARGETS)}.")


def active_targets(config: ModelConfig, lora: LoraConfig) -> tuple[str, ...]:
  """The targets that get adapters in this model: MoE models skip the MLP targets."""
  return tuple(t for t in TARGETS if t in lora.targets
               and not (config.num_experts and t in MLP_TARGETS))


def adapter_shapes(config: ModelConfig, lora: LoraConfig) -> dict:
  """{target: {"a": shape, "b": shape}} for the model's active targets."""
  base = transformer.param_shapes(config)["layers"]
  out = {}
  for t in active_targets(config, lora):
    shape, n = base[t], _IN_DIMS[t]
    out[t] = {"a": shape[:1 + n] + (lora.rank,), "b": (shape[0], lora.rank) + shape[1 + n:]}
  if lora.rank and not out:
    raise ValueError(f"lora.targets={','.join(lora.targets)!r} adapts nothing in this "
                     "mixture-of-experts model (its experts are not adapted); add attention "
                     "targets (q,k,v,o).")
  return out


def adapter_axes(config: ModelConfig, lora: LoraConfig) -> dict:
  """Logical axes of the adapters: the base weight's, with the rank axis replicated (None)."""
  base = transformer.param_logical_axes(config)["layers"]
  out = {}
  for t in active_targets(config, lora):
    axes, n = base[t], _IN_DIMS[t]
    out[t] = {"a": axes[:1 + n] + (None,), "b": (axes[0], None) + axes[1 + n:]}
  return out


def init_adapters(config: ModelConfig, lora: LoraConfig, key: jax.Array,
                  dtype=jnp.float32) -> Adapters:
  """a ~ U(±1/√fan_in) (PEFT's kaiming-uniform default), b = 0: the base model's function."""
  weights = {}
  for i, (t, shapes) in enumerate(adapter_shapes(config, lora).items()):
    fan_in = math.prod(shapes["a"][1:-1])
    bound = 1.0 / math.sqrt(fan_in)
    a = jax.random.uniform(jax.random.fold_in(key, i), shapes["a"], jnp.float32, -bound, bound)
    weights[t] = {"a": a.astype(dtype), "b": jnp.zeros(shapes["b"], dtype)}
  return Adapters(weights=weights, scale=lora.scale)


def adapter_shardings(config: ModelConfig, lora: LoraConfig, mesh, rules: shd.Rules) -> Adapters:
  """NamedShardings of the adapters under `rules` (as an `Adapters` tree)."""
  weights = shd.tree_shardings(adapter_axes(config, lora), adapter_shapes(config, lora), mesh,
                               rules)
  return Adapters(weights=weights, scale=lora.scale)


def init_sharded_adapters(config: ModelConfig, lora: LoraConfig, key: jax.Array, mesh,
                          rules: shd.Rules = shd.TRAIN_RULES, dtype=jnp.float32) -> Adapters:
  """`init_adapters` created directly in their shards."""
  shardings = adapter_shardings(config, lora, mesh, rules)
  return jax.jit(lambda k: init_adapters(config, lora, k, dtype), out_shardings=shardings)(key)


def place(adapters: Adapters, config: ModelConfig, mesh, rules: shd.Rules) -> Adapters:
  """The adapters laid out under `rules` (a leaf already there is the same array)."""
  lora = LoraConfig(rank=_rank(adapters), targets=tuple(adapters.weights))
  shardings = adapter_shardings(config, lora, mesh, rules)

  def put(x, s):
    here = getattr(x, "sharding", None)
    if isinstance(here, jax.sharding.NamedSharding) and here.is_equivalent_to(s, x.ndim):
      return x
    return jax.device_put(x, s)
  weights = jax.tree.map(put, adapters.weights, shardings.weights)
  return Adapters(weights=weights, scale=adapters.scale)


def _rank(adapters: Adapters) -> int:
  return next(iter(adapters.weights.values()))["a"].shape[-1]


# ------------------------------------------------------------------------- the params view

def view(base: transformer.Params, adapters: Adapters | None) -> transformer.Params:
  """What a LoRA policy plays: the base's own arrays plus its adapters under "lora"."""
  if adapters is None:
    return base
  return {**base, KEY: adapters}


def split(params: transformer.Params) -> tuple[transformer.Params, Adapters | None]:
  """(base params, adapters or None) of a params view."""
  if isinstance(params, dict) and KEY in params:
    return {k: v for k, v in params.items() if k != KEY}, params[KEY]
  return params, None


def delta(adapters: Adapters, target: str) -> jax.Array:
  """scale · a·b in the base weight's shape [L, in..., out...] (float32)."""
  w = adapters.weights[target]
  a, b = w["a"].astype(jnp.float32), w["b"].astype(jnp.float32)
  l, r = a.shape[0], a.shape[-1]
  a_LIR, b_LRO = a.reshape(l, -1, r), b.reshape(l, r, -1)
  delta_LIO = jnp.einsum("LIR,LRO->LIO", a_LIR, b_LRO)
  return adapters.scale * delta_LIO.reshape(a.shape[:-1] + b.shape[2:])


def merge(params: transformer.Params) -> transformer.Params:
  """Plain params with the adapters folded in (W + scale·a·b, in W's dtype); plain params pass
  through. For export and for tests of the adapter forward."""
  base, adapters = split(params)
  if adapters is None:
    return params
  layers = dict(base["layers"])
  for t in adapters.weights:
    w = layers[t]
    layers[t] = (w.astype(jnp.float32) + delta(adapters, t)).astype(w.dtype)
  return {**base, "layers": layers}


def count(adapters: Any) -> int:
  """Number of adapter parameters."""
  return int(sum(math.prod(x.shape) for x in jax.tree.leaves(adapters)))
