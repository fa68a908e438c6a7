"""Real-weights import from llama.cpp GGUF files (qwen2, llama, gemma2, olmo2/olmo3 and
qwen3moe architectures).

Tensors are dequantised to float32 with the `gguf` package and renamed to Hugging Face names, so
the same loader (`hf_io.params_from_source`) that reads safetensors builds the params. llama.cpp's
llama converter permutes the Q/K rows for its interleaved RoPE; that permutation is undone here
(qwen2, qwen3moe, gemma2 and olmo2/3 are stored unpermuted, with NEOX-style RoPE, which is Hugging Face's
rotate-half). llama.cpp's Gemma converter stores every norm weight as 1 + w; that is undone too.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from scope_jax import sharding as shd
from scope_jax.models import hf_io
from scope_jax.models.config import ModelConfig, RopeScaling, rope_inv_freq

SUPPORTED_ARCHS = ("qwen2", "llama", "gemma2", "olmo2", "olmo3", "qwen3moe")
_MODEL_TYPES = {"qwen2": "qwen2", "llama": "llama", "gemma2": "gemma2", "olmo2": "olmo2",
                "olmo3": "olmo3", "qwen3moe": "qwen3_moe"}
_EXPERTS = {"ffn_gate_exps.weight": "gate_proj", "ffn_up_exps.weight": "up_proj",
            "ffn_down_exps.weight": "down_proj"}  # [E, ...] in GGUF, one HF tensor per expert

_NORM_NAMES = {  # per architecture: GGUF norm → HF norm
    "pre": {"attn_norm.weight": "input_layernorm.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight"},
    "gemma2": {"attn_norm.weight": "input_layernorm.weight",
               "post_attention_norm.weight": "post_attention_layernorm.weight",
               "ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
    "qwen3moe": {"attn_norm.weight": "input_layernorm.weight",
                 "ffn_norm.weight": "post_attention_layernorm.weight",
                 "attn_q_norm.weight": "self_attn.q_norm.weight",
                 "attn_k_norm.weight": "self_attn.k_norm.weight",
                 "ffn_gate_inp.weight": "mlp.gate.weight"},
    "olmo2": {"post_attention_norm.weight": "post_attention_layernorm.weight",
              "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
              "attn_q_norm.weight": "self_attn.q_norm.weight",
              "attn_k_norm.weight": "self_attn.k_norm.weight"},
}
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight":
              "model.norm.weight", "output.weight": "lm_head.weight"}


def _field(reader, key, default=None):
  field = reader.get_field(key)
  if field is None:
    return default
  value = field.contents()
  # Floats are stored as float32: 1e-06 reads back as 9.99999997e-07; keep the decimal value.
  return float(f"{value:.7g}") if isinstance(value, float) else value


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Inverse of llama.cpp's `permute` (interleaved → half-split rotary rows)."""
  rows = w.shape[0]
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def layer_names(arch: str) -> dict[str, str]:
  """GGUF per-layer tensor name → HF name for one architecture (`arch` as GGUF or ours)."""
  arch = {"qwen3_moe": "qwen3moe", "olmo3": "olmo2"}.get(arch, arch)  # OLMo-3: OLMo-2's names
  return {**_LAYER_NAMES, **_NORM_NAMES.get(arch, _NORM_NAMES["pre"])}


def config_from_gguf(reader) -> ModelConfig:
  arch = _field(reader, "general.architecture")
  if arch not in SUPPORTED_ARCHS:
    raise ValueError(f"Unsupported GGUF architecture {arch!r}; supported: {SUPPORTED_ARCHS}.")
  get = lambda k, d=None: _field(reader, f"{arch}.{k}", d)
  n = int(get("attention.head_count"))
  d = int(get("embedding_length"))
  names = {t.name for t in reader.tensors}
  tokens = _field(reader, "tokenizer.ggml.tokens")
  embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
  vocab = int(embd.shape[-1]) if len(embd.shape) > 1 else len(tokens)
  scaling = None
  if "rope_freqs.weight" in names:
    scaling = RopeScaling(
        "llama3", float(get("rope.scaling.factor", 8.0)), 1.0, 4.0,
        int(get("rope.scaling.original_context_length", 8192)))
  family = {}
  head_dim = int(get("attention.key_length", d // n))
  layers = int(get("block_count"))
  if arch == "gemma2":
    # llama.cpp scales queries by head_dim^-½, except Gemma-2 27B (46 layers): (D / N)^-½.
    family = dict(norm_layout="sandwich", norm_plus_one=True, embed_scale=True,
                  hidden_act="gelu_tanh",
                  query_pre_attn_scalar=float(d // n if layers == 46 else head_dim),
                  attn_softcap=float(get("attn_logit_softcapping", 0.0) or 0.0),
                  final_softcap=float(get("final_logit_softcapping", 0.0) or 0.0),
                  sliding_window=int(get("attention.sliding_window", 4096)),
                  layer_types=tuple("sliding_attention" if i % 2 == 0 else "full_attention"
                                    for i in range(layers)))
  elif arch in ("olmo2", "olmo3"):
    family = dict(norm_layout="post", qk_norm=True, qk_norm_full=True)
    if arch == "olmo3":  # 3 sliding-window layers, then 1 global, repeated
      family.update(sliding_window=int(get("attention.sliding_window", 4096)),
                    layer_types=tuple("sliding_attention" if (i + 1) % 4 else "full_attention"
                                      for i in range(layers)))
  elif arch == "qwen3moe":
    family = dict(qk_norm=True, num_experts=int(get("expert_count")),
                  num_experts_per_tok=int(get("expert_used_count")),
                  moe_intermediate_size=int(get("expert_feed_forward_length")),
                  norm_topk_prob=True)
  return ModelConfig(
      model_type=_MODEL_TYPES[arch],
      vocab_size=vocab, hidden_size=d, intermediate_size=int(get("feed_forward_length", 0) or
                                                           get("expert_feed_forward_length", 0)),
      num_layers=layers, num_heads=n,
      num_kv_heads=int(get("attention.head_count_kv", n)),
      head_dim=head_dim,
      rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
      rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=scaling,
      qkv_bias=arch == "qwen2", tie_embeddings="output.weight" not in names,
      max_position_embeddings=int(get("context_length", 32768)),
      bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
      eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"),
      pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"), **family)


class GGUFSource:
  """A GGUF file's tensors under their Hugging Face names, each dequantised when it is read, so
  loading never holds the whole model in float32 beside its params (`hf_io.TensorSource`).

  With `tie`, one matrix serves as input embedding and output projection: where the file stores
  both (llama.cpp writes a tied model's matrix twice, at two precisions), the more precise one.
  """

  def __init__(self, reader, config: ModelConfig, tie: bool = False):
    import gguf  # optional dependency (the `test` extra), used only here
    self._gguf, self._config = gguf, config
    self._entries: dict[str, tuple[Any, int | None]] = {}  # HF name → (GGUF tensor, expert)
    self._shapes: dict[str, tuple[int, ...]] = {}
    self._cached: tuple[str, np.ndarray] | None = None  # the last dequantised GGUF tensor
    names = layer_names(config.model_type)
    bits = {}
    for t in reader.tensors:
      shape = tuple(int(x) for x in reversed(list(t.shape)))
      if t.name in ("token_embd.weight", "output.weight"):
        block, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        bits[t.name] = 8 * size / block
      if t.name == "rope_freqs.weight":
        _check_rope_freqs(config, self._dequantize(t))
        continue
      if t.name in _TOP_NAMES:
        self._add(_TOP_NAMES[t.name], t, shape)
        continue
      parts = t.name.split(".", 2)
      if parts[0] == "blk" and parts[2] in _EXPERTS:
        for e in range(shape[0]):
          self._add(f"model.layers.{parts[1]}.mlp.experts.{e}.{_EXPERTS[parts[2]]}.weight", t,
                    shape[1:], e)
        continue
      if parts[0] != "blk" or parts[2] not in names:
        raise ValueError(f"Unexpected GGUF tensor {t.name!r} for architecture {config.model_type}.")
      self._add(f"model.layers.{parts[1]}.{names[parts[2]]}", t, shape)
    if tie and "lm_head.weight" in self._entries:
      output = self._entries.pop("lm_head.weight"), self._shapes.pop("lm_head.weight")
      if bits["output.weight"] > bits["token_embd.weight"]:
        self._entries["model.embed_tokens.weight"], _ = output

  def _add(self, name, tensor, shape, expert=None):
    self._entries[name], self._shapes[name] = (tensor, expert), tuple(shape)

  def _dequantize(self, t) -> np.ndarray:
    shape = tuple(int(x) for x in reversed(list(t.shape)))
    return self._gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)

  def names(self):
    return list(self._entries)

  def shape(self, name):
    return self._shapes[name]

  def read(self, name, index=None) -> np.ndarray:
    t, expert = self._entries[name]
    if self._cached is None or self._cached[0] != t.name:
      self._cached = (t.name, self._convert(t, self._dequantize(t)))
    arr = self._cached[1] if expert is None else self._cached[1][expert]
    return np.asarray(arr if index is None else arr[tuple(index)])

  def _convert(self, t, arr: np.ndarray) -> np.ndarray:
    """llama.cpp's storage conventions undone: Gemma norms as 1 + w, Llama's Q/K rows permuted."""
    c = self._config
    if c.norm_plus_one and t.name.endswith("norm.weight"):
      return arr - 1.0
    if c.model_type == "llama" and t.name.endswith("attn_q.weight"):
      return _unpermute(arr, c.num_heads)
    if c.model_type == "llama" and t.name.endswith("attn_k.weight"):
      return _unpermute(arr, c.num_kv_heads)
    return arr


def open_gguf(path, tie: bool = False) -> tuple[ModelConfig, GGUFSource]:
  """(config, lazily dequantising tensor source) of a GGUF file."""
  import gguf
  reader = gguf.GGUFReader(str(path))
  config = config_from_gguf(reader)
  if tie:
    config = config.replace(tie_embeddings=True)
  return config, GGUFSource(reader, config, tie)


def read_gguf(path, tie: bool = False) -> tuple[ModelConfig, dict[str, np.ndarray]]:
  """Returns (config, HF-named float32 tensors) dequantised from a GGUF file (`GGUFSource`)."""
  config, source = open_gguf(path, tie)
  return config, {name: source.read(name) for name in source.names()}


def _check_rope_freqs(config: ModelConfig, factors: np.ndarray) -> None:
  """llama.cpp stores Llama-3 scaling as per-frequency divisors; they must match our config."""
  base = rope_inv_freq(config.replace(rope_scaling=None))
  ours = base / rope_inv_freq(config)
  if not np.allclose(ours, factors, rtol=1e-4):
    raise ValueError("GGUF rope_freqs do not match Llama-3 scaling with factor "
                     f"{config.rope_scaling.factor}; cannot import this rope variant.")


def load_gguf(path, mesh=None, dtype=None, rules=None, tie: bool = False):
  """Loads a GGUF file into (config, params) through the Hugging Face tensor mapping, one
  tensor dequantised at a time."""
  config, source = open_gguf(path, tie)
  params = hf_io.params_from_source(config, source, mesh, rules or shd.TRAIN_RULES,
                                    dtype or jnp.float32)
  return config, params
