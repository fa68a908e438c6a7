"""Architecture description of the decoder families: Llama-3, Qwen2/2.5, Qwen3, Gemma-2, OLMo-2
and OLMo-3.

One frozen, hashable dataclass describes every supported checkpoint; the variants differ by flags
(qkv bias, q/k norm over heads or the whole projection, rope scaling, tied embeddings, norm
placement, GeGLU, soft-capping, sliding-window layers), never by copies of the code. Being
hashable, a `ModelConfig` can be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "olmo2",
                         "olmo3")
NORM_LAYOUTS = ("pre", "sandwich", "post")  # Llama/Qwen, Gemma-2 (pre + post), OLMo-2/3 (post)
ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency rescaling: 'linear', 'llama3' (Llama-3.1/3.2) or 'yarn' (OLMo-3's long
  context: interpolated frequencies blended by a ramp, cos/sin scaled by `attention_factor`)."""

  rope_type: str
  factor: float = 1.0
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192
  attention_factor: float = 0.0  # yarn: cos/sin scale (0: 0.1·ln(factor) + 1, HF's default)
  beta_fast: float = 32.0  # yarn: ramp bounds in rotations
  beta_slow: float = 1.0
  truncate: bool = True  # yarn: round the ramp bounds to whole dimensions


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and variant flags of one decoder. Letters in comments follow the project alphabet."""

  model_type: str  # 'llama' | 'qwen2' | 'qwen3'
  vocab_size: int  # V
  hidden_size: int  # D
  intermediate_size: int  # F
  num_layers: int  # L
  num_heads: int  # N
  num_kv_heads: int  # K (N % K == 0; K == N is MHA, K == 1 is MQA)
  head_dim: int  # H (Qwen3 sets it explicitly, != D / N)
  rms_norm_eps: float = 1e-6
  rope_theta: float = 10000.0
  rope_scaling: RopeScaling | None = None
  qkv_bias: bool = False  # Qwen2 / Qwen2.5
  qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
  tie_embeddings: bool = False
  rope_full_only: bool = False  # OLMo-3: rope_scaling on full-attention layers; sliding ones plain
  max_position_embeddings: int = 32768
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  pad_token_id: int | None = None
  # Gemma-2 / OLMo families (defaults are the Llama/Qwen behaviour):
  norm_layout: str = "pre"  # 'pre' | 'sandwich' (pre and post norms) | 'post' (post norms only)
  norm_plus_one: bool = False  # Gemma: RMSNorm scales by (1 + w), in float32
  qk_norm_full: bool = False  # OLMo: q/k RMSNorm over the whole projection (N·H), not per head
  hidden_act: str = "silu"  # 'silu' (SwiGLU) | 'gelu_tanh' (GeGLU, Gemma)
  embed_scale: bool = False  # Gemma: embeddings times √D
  query_pre_attn_scalar: float = 0.0  # Gemma: scores scaled by scalar^-½ (0: head_dim^-½)
  attn_softcap: float = 0.0  # Gemma-2: cap·tanh(scores / cap) (0: off)
  final_softcap: float = 0.0  # Gemma-2: cap·tanh(logits / cap) (0: off)
  sliding_window: int = 0  # keys within this many positions on 'sliding_attention' layers
  layer_types: tuple[str, ...] = ()  # per layer: 'full_attention' | 'sliding_attention' ('' = all full)
  # Mixture of experts (Qwen3-MoE): every layer's MLP is E experts, top-k routed per token.
  num_experts: int = 0  # E (0: a dense MLP)
  num_experts_per_tok: int = 0  # k
  moe_intermediate_size: int = 0  # F of each expert
  norm_topk_prob: bool = True  # renormalise the k routing weights to sum to 1
  # Expert-parallel receive buffer per shard, as a multiple of the balanced load; the pairs past
  # it are dropped (0: worst-case buffers, dropless). A run's setting (model.moe_capacity_factor),
  # not the checkpoint's; applied without a KV cache (training, scoring): see models/moe.py.
  moe_capacity_factor: float = 0.0

  def __post_init__(self):
    if self.model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(
          f"Unsupported model_type {self.model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}.")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}.")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings.")
    if self.rope_scaling is not None and self.rope_scaling.rope_type not in SUPPORTED_ROPE_TYPES:
      raise ValueError(f"Unsupported rope_type {self.rope_scaling.rope_type!r}; supported: "
                       f"{', '.join(SUPPORTED_ROPE_TYPES)}.")
    if self.norm_layout not in NORM_LAYOUTS:
      raise ValueError(f"norm_layout={self.norm_layout!r}; supported: {', '.join(NORM_LAYOUTS)}.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"hidden_act={self.hidden_act!r}; supported: {', '.join(ACTIVATIONS)}.")
    if self.layer_types:
      if len(self.layer_types) != self.num_layers:
        raise ValueError(f"layer_types has {len(self.layer_types)} entries for "
                         f"{self.num_layers} layers.")
      bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
      if bad:
        raise ValueError(f"Unknown layer types {bad}; supported: {', '.join(LAYER_TYPES)}.")
      if "sliding_attention" in self.layer_types and self.sliding_window < 1:
        raise ValueError("Sliding-attention layers need sliding_window >= 1.")
    if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
      raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in "
                       f"1..num_experts={self.num_experts}.")
    if self.num_experts and self.moe_intermediate_size < 1:
      raise ValueError("A mixture of experts needs moe_intermediate_size >= 1.")
    if self.moe_capacity_factor and (self.moe_capacity_factor < 0 or not self.num_experts):
      raise ValueError(f"moe_capacity_factor={self.moe_capacity_factor}: use 0 (dropless) or a "
                       "positive multiple of the balanced load (e.g. 1.25), on a mixture of "
                       "experts only.")

  @property
  def windows(self) -> tuple[int, ...]:
    """Per layer: the attention window in positions (0 = global attention)."""
    types = self.layer_types or ("full_attention",) * self.num_layers
    return tuple(self.sliding_window if t == "sliding_attention" else 0 for t in types)

  @property
  def attn_scale(self) -> float:
    return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

  @property
  def num_groups(self) -> int:
    """G = N / K query heads per kv head."""
    return self.num_heads // self.num_kv_heads

  @property
  def eos_ids(self) -> tuple[int, ...]:
    if self.eos_token_id is None:
      return ()
    if isinstance(self.eos_token_id, int):
      return (self.eos_token_id,)
    return tuple(self.eos_token_id)

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    d, f, n, k, h = (self.hidden_size, self.intermediate_size, self.num_heads, self.num_kv_heads,
                     self.head_dim)
    attn = d * n * h + 2 * d * k * h + n * h * d
    if self.qkv_bias:
      attn += n * h + 2 * k * h
    if self.qk_norm:
      attn += (n * h + k * h) if self.qk_norm_full else 2 * h
    norms = {"pre": 2, "sandwich": 4, "post": 2}[self.norm_layout]
    mlp = (self.num_experts * 3 * d * self.moe_intermediate_size + d * self.num_experts
           if self.num_experts else 3 * d * f)
    layer = attn + mlp + norms * d
    emb = self.vocab_size * d * (1 if self.tie_embeddings else 2)
    return self.num_layers * layer + emb + d

  # ---------------------------------------------------------------- HF config.json ⇄ ModelConfig

  @classmethod
  def from_hf_config(cls, hf: Mapping[str, Any]) -> "ModelConfig":
    """Reads a Hugging Face `config.json` dict (classic or transformers-5 `rope_parameters` form)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(f"Unsupported model_type {model_type!r} in config.json; supported: "
                       f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
      if key not in hf:
        raise ValueError(f"config.json for model_type {model_type!r} is missing {key!r}.")
    n = int(hf["num_attention_heads"])
    layers = int(hf["num_hidden_layers"])
    head_dim = hf.get("head_dim") or hf["hidden_size"] // n
    rope_theta, rope_scaling = _read_rope(hf)
    if model_type == "qwen2":
      qkv_bias = True
    else:
      qkv_bias = bool(hf.get("attention_bias", False))
    if hf.get("use_sliding_window") and model_type in ("qwen2", "qwen3", "qwen3_moe"):
      raise ValueError("use_sliding_window=true is not supported for Qwen; full attention only.")
    family = _family_fields(model_type, hf, layers)
    if model_type == "olmo3" and rope_scaling is not None:
      family["rope_full_only"] = True  # HF applies OLMo-3's scaling to full-attention layers
    if model_type == "qwen3_moe":
      family.update(_moe_fields(hf, layers))
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    family["hidden_act"] = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_tanh"}.get(act, act)
    return cls(
        model_type=model_type,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=layers,
        num_heads=n,
        num_kv_heads=int(hf.get("num_key_value_heads") or n),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
        qkv_bias=qkv_bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "olmo2", "olmo3"),
        tie_embeddings=bool(hf.get("tie_word_embeddings", model_type == "gemma2")),
        max_position_embeddings=int(hf.get("max_position_embeddings", 32768)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=_as_id(hf.get("eos_token_id")),
        pad_token_id=hf.get("pad_token_id"),
        **family,
    )

  def to_hf_config(self, torch_dtype: str = "float32") -> dict[str, Any]:
    """A `config.json` dict that `transformers.AutoConfig` reads back into the same model."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "gemma2": "Gemma2ForCausalLM",
            "olmo2": "Olmo2ForCausalLM", "olmo3": "Olmo3ForCausalLM"}[self.model_type]
    out: dict[str, Any] = {
        "architectures": [arch],
        "model_type": self.model_type,
        "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads,
        "head_dim": self.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": self.rms_norm_eps,
        "rope_theta": self.rope_theta,
        "rope_scaling": None,
        "tie_word_embeddings": self.tie_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": torch_dtype,
    }
    if self.rope_scaling is not None:
      out["rope_scaling"] = {"rope_type": self.rope_scaling.rope_type,
                             "factor": self.rope_scaling.factor}
      if self.rope_scaling.rope_type == "yarn":
        y = self.rope_scaling
        out["rope_scaling"].update(
            beta_fast=y.beta_fast, beta_slow=y.beta_slow, truncate=y.truncate,
            original_max_position_embeddings=y.original_max_position_embeddings)
        if y.attention_factor:
          out["rope_scaling"]["attention_factor"] = y.attention_factor
      if self.rope_scaling.rope_type == "llama3":
        out["rope_scaling"].update(
            low_freq_factor=self.rope_scaling.low_freq_factor,
            high_freq_factor=self.rope_scaling.high_freq_factor,
            original_max_position_embeddings=self.rope_scaling.original_max_position_embeddings)
    if self.model_type == "llama":
      out.update(attention_bias=self.qkv_bias, mlp_bias=False)
    if self.model_type == "mistral":  # every layer windowed when sliding_window is set
      out.update(sliding_window=self.sliding_window or None)
    elif self.model_type in ("qwen3", "qwen3_moe", "gemma2", "olmo2", "olmo3"):
      out.update(attention_bias=self.qkv_bias)
    if self.num_experts:
      out.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                 moe_intermediate_size=self.moe_intermediate_size,
                 norm_topk_prob=self.norm_topk_prob, decoder_sparse_step=1, mlp_only_layers=[],
                 router_aux_loss_coef=0.001, output_router_logits=False)
    if self.model_type == "gemma2":
      out.update(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                 query_pre_attn_scalar=int(self.query_pre_attn_scalar or self.head_dim),
                 attn_logit_softcapping=self.attn_softcap or None,
                 final_logit_softcapping=self.final_softcap or None)
    if self.model_type in ("gemma2", "olmo3"):
      out.update(sliding_window=self.sliding_window or None, layer_types=list(
          self.layer_types or ("full_attention",) * self.num_layers))
    if self.model_type == "olmo3":  # per layer type, as HF reads it
      full = dict(out["rope_scaling"] or {"rope_type": "default"}, rope_theta=self.rope_theta)
      plain = {"rope_type": "default", "rope_theta": self.rope_theta}
      out["rope_parameters"] = {"full_attention": full,
                                "sliding_attention": plain if self.rope_full_only else dict(full)}
      out["rope_scaling"] = None
    if self.model_type in ("qwen2", "qwen3", "qwen3_moe"):
      out.update(use_sliding_window=False, sliding_window=None, max_window_layers=self.num_layers)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
      value = getattr(self, key)
      if value is not None:
        out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _family_fields(model_type: str, hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
  """The Gemma-2 / OLMo / Mistral fields of a HF config (HF's defaults where a key is absent)."""
  if model_type == "mistral":  # Llama's layout; a sliding window on every layer when set
    window = int(hf.get("sliding_window") or 0)
    return dict(sliding_window=window,
                layer_types=("sliding_attention",) * layers) if window else {}
  if model_type == "gemma2":
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)]
    return dict(norm_layout="sandwich", norm_plus_one=True, embed_scale=True,
                query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar") or 256),
                attn_softcap=float(hf.get("attn_logit_softcapping") or 0.0),
                final_softcap=float(hf.get("final_logit_softcapping") or 0.0),
                sliding_window=int(hf.get("sliding_window") or 4096), layer_types=tuple(types))
  if model_type in ("olmo2", "olmo3"):
    out: dict[str, Any] = dict(norm_layout="post", qk_norm_full=True)
    if model_type == "olmo3":
      types = hf.get("layer_types") or [
          "sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(layers)]
      out.update(sliding_window=int(hf.get("sliding_window") or 4096), layer_types=tuple(types))
    return out
  return {}


def _moe_fields(hf: Mapping[str, Any], layers: int) -> dict[str, Any]:
  """Qwen3-MoE's expert settings; every layer must be sparse (layers are one stacked block)."""
  step = int(hf.get("decoder_sparse_step", 1) or 1)
  dense = [i for i in range(layers) if i in (hf.get("mlp_only_layers") or []) or (i + 1) % step]
  if dense:
    raise ValueError(f"Layers {dense} of this Qwen3-MoE checkpoint are dense (mlp_only_layers / "
                     "decoder_sparse_step); only all-sparse stacks are supported.")
  experts = hf.get("num_experts") or hf.get("num_local_experts")  # transformers 5 writes the latter
  if not experts:
    raise ValueError("config.json of a qwen3_moe model has no num_experts (or num_local_experts).")
  return dict(num_experts=int(experts), num_experts_per_tok=int(hf["num_experts_per_tok"]),
              moe_intermediate_size=int(hf["moe_intermediate_size"]),
              norm_topk_prob=bool(hf.get("norm_topk_prob", False)))  # HF's default


def _as_id(value):
  if isinstance(value, list):
    return tuple(int(v) for v in value)
  return value


def _read_rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
  """Returns (theta, scaling) from either `rope_theta`/`rope_scaling` or `rope_parameters`."""
  params = hf.get("rope_parameters")
  scaling = hf.get("rope_scaling")
  theta = hf.get("rope_theta")
  if isinstance(params, Mapping):
    # transformers 5 folds theta and the scaling into one dict (possibly per attention type).
    if "rope_type" not in params and "rope_theta" not in params:
      per_type = {k: dict(v or {}) for k, v in params.items()}
      full, sliding = per_type.get("full_attention"), per_type.get("sliding_attention")
      plain = lambda p: p.get("rope_type", "default") == "default"
      if (full is not None and sliding is not None and plain(sliding)
          and sliding.get("rope_theta") == full.get("rope_theta")):
        params = full  # OLMo-3: scaling (if any) on full-attention layers only
      elif any(p != next(iter(per_type.values())) for p in per_type.values()):
        raise ValueError(f"rope_parameters differ between layer types ({dict(params)}) in a way "
                         "this model layer does not support.")
      else:
        params = next(iter(per_type.values()))
    theta = params.get("rope_theta", theta)
    scaling = params
  theta = float(theta if theta is not None else 10000.0)
  if not scaling:
    return theta, None
  rope_type = scaling.get("rope_type", scaling.get("type", "default"))
  if rope_type == "default":
    return theta, None
  if rope_type not in SUPPORTED_ROPE_TYPES:
    raise ValueError(f"Unsupported rope scaling type {rope_type!r}; supported: "
                     f"{', '.join(SUPPORTED_ROPE_TYPES)}.")
  if rope_type == "yarn" and (scaling.get("mscale") or scaling.get("mscale_all_dim")):
    raise ValueError("yarn rope scaling with mscale / mscale_all_dim is not supported.")
  return theta, RopeScaling(
      rope_type=rope_type,
      factor=float(scaling.get("factor", 1.0)),
      low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
      high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
      original_max_position_embeddings=int(scaling.get("original_max_position_embeddings", 8192)),
      attention_factor=float(scaling.get("attention_factor") or 0.0),
      beta_fast=float(scaling.get("beta_fast") or 32.0),
      beta_slow=float(scaling.get("beta_slow") or 1.0),
      truncate=bool(scaling.get("truncate", True)))


# -------------------------------------------------------------------------------------- presets

def _qwen25(d, f, layers, n, k, tie, vocab=151936, eps=1e-6, max_pos=32768):
  return ModelConfig("qwen2", vocab, d, f, layers, n, k, d // n, rms_norm_eps=eps,
                     rope_theta=1e6, qkv_bias=True, tie_embeddings=tie, max_position_embeddings=max_pos,
                     bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)


def _qwen3(d, f, layers, n, tie):
  return ModelConfig("qwen3", 151936, d, f, layers, n, 8, 128, rms_norm_eps=1e-6, rope_theta=1e6,
                     qk_norm=True, tie_embeddings=tie, max_position_embeddings=40960,
                     bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)


def _llama3(d, f, layers, n, head_dim, tie, factor):
  return ModelConfig("llama", 128256, d, f, layers, n, 8, head_dim, rms_norm_eps=1e-5,
                     rope_theta=500000.0, rope_scaling=RopeScaling("llama3", factor, 1.0, 4.0, 8192),
                     tie_embeddings=tie, max_position_embeddings=131072, bos_token_id=128000,
                     eos_token_id=(128001, 128008, 128009))


def _gemma2(d, f, layers, n, k, scalar):
  return ModelConfig("gemma2", 256000, d, f, layers, n, k, 256, rms_norm_eps=1e-6,
                     rope_theta=10000.0, tie_embeddings=True, max_position_embeddings=8192,
                     norm_layout="sandwich", norm_plus_one=True, hidden_act="gelu_tanh",
                     embed_scale=True, query_pre_attn_scalar=scalar, attn_softcap=50.0,
                     final_softcap=30.0, sliding_window=4096,
                     layer_types=("sliding_attention", "full_attention") * (layers // 2),
                     bos_token_id=2, eos_token_id=(1, 107), pad_token_id=0)


def _olmo(model_type, vocab, max_pos, eos, pad, window=0):
  types = (("sliding_attention",) * 3 + ("full_attention",)) * 8 if window else ()
  return ModelConfig(model_type, vocab, 4096, 11008, 32, 32, 32, 128, rms_norm_eps=1e-6,
                     rope_theta=500000.0, max_position_embeddings=max_pos, norm_layout="post",
                     qk_norm=True, qk_norm_full=True, sliding_window=window, layer_types=types,
                     eos_token_id=eos, pad_token_id=pad)


PRESETS: dict[str, ModelConfig] = {
    "qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, tie=True),
    "qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, tie=True, max_pos=131072),
    "qwen2.5-3b": _qwen25(2048, 11008, 36, 16, 2, tie=True),
    "qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, tie=False, vocab=152064, max_pos=131072),
    "qwen2.5-14b": _qwen25(5120, 13824, 48, 40, 8, tie=False, vocab=152064, eps=1e-5,
                           max_pos=131072),
    "qwen2.5-32b": _qwen25(5120, 27648, 64, 40, 8, tie=False, vocab=152064, eps=1e-5,
                           max_pos=131072),
    "qwen3-0.6b": _qwen3(1024, 3072, 28, 16, tie=True),
    "qwen3-1.7b": _qwen3(2048, 6144, 28, 16, tie=True),
    "qwen3-4b": _qwen3(2560, 9728, 36, 32, tie=True),
    "qwen3-8b": _qwen3(4096, 12288, 36, 32, tie=False),
    "qwen3-14b": _qwen3(5120, 17408, 40, 40, tie=False),
    "qwen3-32b": _qwen3(5120, 25600, 64, 64, tie=False),
    "llama3.1-8b": _llama3(4096, 14336, 32, 32, 128, tie=False, factor=8.0),
    "llama3.1-70b": _llama3(8192, 28672, 80, 64, 128, tie=False, factor=8.0),
    "llama3.2-1b": _llama3(2048, 8192, 16, 32, 64, tie=True, factor=32.0),
    "llama3.2-3b": _llama3(3072, 8192, 28, 24, 128, tie=True, factor=32.0),
    "qwen3-30b-a3b": ModelConfig(
        "qwen3_moe", 151936, 2048, 6144, 48, 32, 4, 128, rms_norm_eps=1e-6, rope_theta=1e6,
        qk_norm=True, max_position_embeddings=40960, bos_token_id=151643, eos_token_id=151645,
        pad_token_id=151643, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768),
    "gemma2-2b": _gemma2(2304, 9216, 26, 8, 4, 256.0),
    "gemma2-9b": _gemma2(3584, 14336, 42, 16, 8, 256.0),
    "olmo2-7b": _olmo("olmo2", 100352, 4096, 100257, 100277),
    "olmo3-7b": _olmo("olmo3", 100278, 65536, 100257, 100277, window=4096),
}


def get_preset(name: str) -> ModelConfig:
  """A named preset, e.g. 'qwen2.5-7b'; unknown names list the valid ones."""
  try:
    return PRESETS[name.lower()]
  except KeyError:
    raise ValueError(f"Unknown model preset {name!r}; valid: {', '.join(sorted(PRESETS))}.") from None


def tiny_config(model_type: str = "qwen2", **overrides) -> ModelConfig:
  """A small random-init config of one family for tests and CPU demos."""
  base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
              num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, rope_theta=10000.0,
              max_position_embeddings=512)
  if model_type == "qwen2":
    base.update(qkv_bias=True)
  elif model_type == "qwen3":
    base.update(qk_norm=True, head_dim=24)
  elif model_type == "llama":
    base.update(rope_scaling=RopeScaling("llama3", 8.0, 1.0, 4.0, 64))
  elif model_type == "mistral":  # Llama's layout with a window of 4 positions on every layer
    base.update(sliding_window=4, layer_types=("sliding_attention",) * 2)
  elif model_type == "gemma2":  # caps small enough that tanh bends; a window of 4 positions
    base.update(num_layers=4, norm_layout="sandwich", norm_plus_one=True, embed_scale=True,
                hidden_act="gelu_tanh", query_pre_attn_scalar=24.0, attn_softcap=0.5,
                final_softcap=1.5, sliding_window=4, tie_embeddings=True,
                layer_types=("sliding_attention", "full_attention") * 2)
  elif model_type == "olmo2":
    base.update(norm_layout="post", qk_norm=True, qk_norm_full=True)
  elif model_type == "qwen3_moe":  # 8 experts, top-2 of them per token
    base.update(qk_norm=True, head_dim=24, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32)
  elif model_type == "olmo3":
    base.update(num_layers=4, norm_layout="post", qk_norm=True, qk_norm_full=True,
                sliding_window=4, layer_types=("sliding_attention",) * 3 + ("full_attention",))
  base.update(overrides)
  return ModelConfig(model_type=model_type, **base)


def rope_inv_freq(config: ModelConfig):
  """Per-pair inverse frequencies [H/2] (numpy float64 → float32), with Llama-3 scaling applied."""
  import numpy as np
  h = config.head_dim
  inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
  scaling = config.rope_scaling
  if scaling is None:
    return inv_freq.astype(np.float32)
  if scaling.rope_type == "linear":
    return (inv_freq / scaling.factor).astype(np.float32)
  if scaling.rope_type == "yarn":
    return _yarn_inv_freq(config.rope_theta, h, scaling)
  # llama3: long wavelengths are divided by `factor`, short ones kept, the band between blended.
  low_wavelen = scaling.original_max_position_embeddings / scaling.low_freq_factor
  high_wavelen = scaling.original_max_position_embeddings / scaling.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
  smooth = ((scaling.original_max_position_embeddings / wavelen - scaling.low_freq_factor)
            / (scaling.high_freq_factor - scaling.low_freq_factor))
  blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
  medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
  return np.where(medium, blended, scaled).astype(np.float32)


def _yarn_inv_freq(base: float, dim: int, y: RopeScaling):
  """YaRN (HF's `_compute_yarn_parameters`): low frequencies interpolated by `factor`, high ones
  kept, blended by a linear ramp between the dimensions where beta_fast and beta_slow rotations
  fit into the original context; float32 as HF computes it."""
  import numpy as np
  correction = lambda rot: (dim * math.log(y.original_max_position_embeddings / (rot * 2 * math.pi))
                            / (2 * math.log(base)))
  low, high = correction(y.beta_fast), correction(y.beta_slow)
  if y.truncate:
    low, high = math.floor(low), math.ceil(high)
  low, high = max(low, 0), min(high, dim - 1)
  if low == high:
    high += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
  pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
  extrapolation = (1 - ramp).astype(np.float32)
  inv = (1.0 / (y.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
  return inv.astype(np.float32)


def rope_attention_scaling(config: ModelConfig) -> float:
  """The cos/sin scale of the rope (YaRN's attention factor; 1 otherwise)."""
  y = config.rope_scaling
  if y is None or y.rope_type != "yarn":
    return 1.0
  if y.attention_factor:
    return y.attention_factor
  return 1.0 if y.factor <= 1 else 0.1 * math.log(y.factor) + 1.0
