"""Flax NNX ports of Llama-3, Qwen2, Qwen2.5 and Qwen3 (one config-driven decoder, `Decoder`),
applied functionally to a params pytree (`forward`).

Dimension letters used in names and einsum strings: B batch, T query length, S key length,
C cache slots, D model dim, N query heads, K kv heads, G = N / K, H head dim, F MLP dim,
V vocab, L layers.
"""

from scope_jax.models.config import PRESETS, ModelConfig, RopeScaling, get_preset, tiny_config
from scope_jax.models.hf_io import load_hf, save_hf
from scope_jax.models.kv_cache import KVCache, init_cache
from scope_jax.models.modules import Decoder
from scope_jax.models.transformer import forward, init_params, param_logical_axes, param_shapes

__all__ = ["PRESETS", "ModelConfig", "RopeScaling", "get_preset", "tiny_config", "load_hf",
           "save_hf", "KVCache", "init_cache", "Decoder", "forward", "init_params",
           "param_logical_axes", "param_shapes"]
