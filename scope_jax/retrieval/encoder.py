"""A JAX BERT sentence encoder for E5 (`intfloat/e5-*`) and sentence-transformers MiniLM weights.

Post-LN BERT, GELU (erf), mean pooling over the attention mask, L2 normalisation. E5 prefixes
("query: ", "passage: ") are configuration. Encoding is batched, jitted per length bucket, and
data-parallel over a mesh (rows split, weights replicated).

Params: word/pos/type embeddings, emb_ln_{scale,bias}; layers stacked on L:
q/k/v [L, D, N, H] (+ biases [L, N, H]), o [L, N, H, D] (+ bias [L, D]), attn_ln_*, ffn_in [L, D, F]
(+ [L, F]), ffn_out [L, F, D] (+ [L, D]), ffn_ln_*.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import sharding as shd
from scope_jax.models import safetensors_io
from scope_jax.shapes import length_bucket

NEG = -1e9


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  vocab_size: int
  hidden_size: int  # D
  intermediate_size: int  # F
  num_layers: int  # L
  num_heads: int  # N
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @classmethod
  def from_hf_config(cls, hf: dict) -> "EncoderConfig":
    if hf.get("model_type") not in ("bert", None):
      raise ValueError(f"Encoder must be a BERT model (E5 / MiniLM), got model_type "
                       f"{hf.get('model_type')!r}.")
    if hf.get("hidden_act", "gelu") != "gelu":
      raise ValueError(f"Unsupported hidden_act {hf['hidden_act']!r}; only 'gelu' (erf).")
    return cls(vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
               intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"],
               num_heads=hf["num_attention_heads"],
               max_position_embeddings=hf.get("max_position_embeddings", 512),
               type_vocab_size=hf.get("type_vocab_size", 2),
               layer_norm_eps=hf.get("layer_norm_eps", 1e-12))


def layer_norm(x, scale, bias, eps):
  x32 = x.astype(jnp.float32)
  mean = x32.mean(-1, keepdims=True)
  var = jnp.square(x32 - mean).mean(-1, keepdims=True)
  return ((x32 - mean) * jax.lax.rsqrt(var + eps) * scale + bias).astype(x.dtype)


def encode_tokens(config: EncoderConfig, params, tokens_BT, mask_BT, type_ids_BT=None):
  """Last hidden states [B, T, D] of BERT."""
  b, t = tokens_BT.shape
  eps = config.layer_norm_eps
  types = jnp.zeros_like(tokens_BT) if type_ids_BT is None else type_ids_BT
  x = (params["word_emb"][tokens_BT] + params["pos_emb"][None, :t] + params["type_emb"][types])
  x = layer_norm(x, params["emb_ln_scale"], params["emb_ln_bias"], eps)
  bias_B11S = jnp.where(mask_BT[:, None, None, :] > 0, 0.0, NEG)

  def layer(x_BTD, lp):
    q = jnp.einsum("BTD,DNH->BTNH", x_BTD, lp["q"]) + lp["q_bias"]
    k = jnp.einsum("BSD,DNH->BSNH", x_BTD, lp["k"]) + lp["k_bias"]
    v = jnp.einsum("BSD,DNH->BSNH", x_BTD, lp["v"]) + lp["v_bias"]
    scores = jnp.einsum("BTNH,BSNH->BNTS", q, k, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores * config.head_dim ** -0.5 + bias_B11S, axis=-1)
    ctx = jnp.einsum("BNTS,BSNH->BTNH", probs.astype(v.dtype), v)
    attn = jnp.einsum("BTNH,NHD->BTD", ctx, lp["o"]) + lp["o_bias"]
    x_BTD = layer_norm(x_BTD + attn, lp["attn_ln_scale"], lp["attn_ln_bias"], eps)
    h = jax.nn.gelu(jnp.einsum("BTD,DF->BTF", x_BTD, lp["ffn_in"]) + lp["ffn_in_bias"],
                    approximate=False)
    out = jnp.einsum("BTF,FD->BTD", h, lp["ffn_out"]) + lp["ffn_out_bias"]
    return layer_norm(x_BTD + out, lp["ffn_ln_scale"], lp["ffn_ln_bias"], eps), None

  x, _ = jax.lax.scan(layer, x, params["layers"])
  return x


def mean_pool(hidden_BTD, mask_BT, normalize: bool = True):
  m = mask_BT.astype(jnp.float32)[..., None]
  pooled = (hidden_BTD.astype(jnp.float32) * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
  if normalize:
    pooled = pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)
  return pooled


@functools.partial(jax.jit, static_argnames=("config", "normalize"))
def embed(config: EncoderConfig, params, tokens_BT, mask_BT, normalize: bool = True):
  """Sentence embeddings [B, D] (mean-pooled, L2-normalised)."""
  return mean_pool(encode_tokens(config, params, tokens_BT, mask_BT), mask_BT, normalize)


# -------------------------------------------------------------------------- HF weights

_LAYER_MAP = {  # ours: (HF suffix, transform)
    "q": ("attention.self.query.weight", "heads_in"), "q_bias": ("attention.self.query.bias", "heads"),
    "k": ("attention.self.key.weight", "heads_in"), "k_bias": ("attention.self.key.bias", "heads"),
    "v": ("attention.self.value.weight", "heads_in"), "v_bias": ("attention.self.value.bias", "heads"),
    "o": ("attention.output.dense.weight", "heads_out"), "o_bias": ("attention.output.dense.bias", None),
    "attn_ln_scale": ("attention.output.LayerNorm.weight", None),
    "attn_ln_bias": ("attention.output.LayerNorm.bias", None),
    "ffn_in": ("intermediate.dense.weight", "t"), "ffn_in_bias": ("intermediate.dense.bias", None),
    "ffn_out": ("output.dense.weight", "t"), "ffn_out_bias": ("output.dense.bias", None),
    "ffn_ln_scale": ("output.LayerNorm.weight", None), "ffn_ln_bias": ("output.LayerNorm.bias", None),
}
_TOP_MAP = {"word_emb": "embeddings.word_embeddings.weight",
            "pos_emb": "embeddings.position_embeddings.weight",
            "type_emb": "embeddings.token_type_embeddings.weight",
            "emb_ln_scale": "embeddings.LayerNorm.weight", "emb_ln_bias": "embeddings.LayerNorm.bias"}


def param_shapes(config: EncoderConfig) -> dict:
  """The shape of every encoder parameter, in `params_from_hf`'s layout (for compiling without
  weights)."""
  d, f, n, h, l = (config.hidden_size, config.intermediate_size, config.num_heads,
                   config.head_dim, config.num_layers)
  top = {"word_emb": (config.vocab_size, d), "pos_emb": (config.max_position_embeddings, d),
         "type_emb": (config.type_vocab_size, d), "emb_ln_scale": (d,), "emb_ln_bias": (d,)}
  per_layer = {"q": (d, n, h), "q_bias": (n, h), "k": (d, n, h), "k_bias": (n, h),
               "v": (d, n, h), "v_bias": (n, h), "o": (n, h, d), "o_bias": (d,),
               "attn_ln_scale": (d,), "attn_ln_bias": (d,), "ffn_in": (d, f), "ffn_in_bias": (f,),
               "ffn_out": (f, d), "ffn_out_bias": (d,), "ffn_ln_scale": (d,), "ffn_ln_bias": (d,)}
  return top | {"layers": {k: (l,) + v for k, v in per_layer.items()}}


def params_from_hf(config: EncoderConfig, tensors: dict[str, np.ndarray], dtype=jnp.float32):
  """HF BertModel tensors (optionally prefixed 'bert.') → encoder params."""
  tensors = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in tensors.items()}
  n, h, d = config.num_heads, config.head_dim, config.hidden_size

  def get(name):
    if name not in tensors:
      raise ValueError(f"Encoder checkpoint is missing tensor {name!r}.")
    return np.asarray(tensors[name], np.float32)

  def transform(w, kind):
    if kind == "heads_in":  # [N*H, D] → [D, N, H]
      return w.T.reshape(d, n, h)
    if kind == "heads":
      return w.reshape(n, h)
    if kind == "heads_out":  # [D, N*H] → [N, H, D]
      return w.T.reshape(n, h, d)
    if kind == "t":
      return w.T
    return w

  params = {k: jnp.asarray(get(v), dtype) for k, v in _TOP_MAP.items()}
  layers = {}
  for ours, (suffix, kind) in _LAYER_MAP.items():
    stack = [transform(get(f"encoder.layer.{i}.{suffix}"), kind) for i in range(config.num_layers)]
    layers[ours] = jnp.asarray(np.stack(stack), dtype)
  params["layers"] = layers
  return params


def file_sha256(path, limit: int | None = None) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    h.update(f.read(limit) if limit else f.read())
  return h.hexdigest()


def embed_in_buckets(ids: Sequence[Sequence[int]], dim: int, batch_size: int, max_length: int,
                     mesh, embed_fn) -> np.ndarray:
  """[n, dim] float32 from `embed_fn(tokens, mask)` over right-padded batches of similar
  lengths (few compiled widths); on a mesh the rows are a multiple of its batch shards."""
  out = np.zeros((len(ids), dim), np.float32)
  order = np.argsort([len(x) for x in ids])  # similar lengths share a bucket
  rows = batch_size
  if mesh is not None:
    mult = shd.batch_shards(mesh)
    rows = -(-rows // mult) * mult
  for start in range(0, len(ids), rows):
    idx = order[start:start + rows]
    width = min(length_bucket(max(len(ids[i]) for i in idx), 16), max_length)
    tokens = np.zeros((rows, width), np.int32)
    mask = np.zeros((rows, width), np.int32)
    for r, i in enumerate(idx):
      row = list(ids[i])[:width]
      tokens[r, :len(row)], mask[r, :len(row)] = row, 1
    mask[len(idx):, 0] = 1  # padding rows hold one token, so no row is empty
    if mesh is not None:
      tokens, mask = shd.shard_batch((tokens, mask), mesh)
    out[idx] = shd.to_host(embed_fn(tokens, mask))[:len(idx)]
  return out


class TextEncoder:
  """Loads an E5/MiniLM checkpoint directory and embeds queries and passages."""

  def __init__(self, path, *, query_prefix: str = "", passage_prefix: str = "",
               max_length: int = 256, batch_size: int = 64, mesh=None, dtype=jnp.float32,
               name: str | None = None):
    import tokenizers
    path = pathlib.Path(path)
    for needed in ("config.json", "tokenizer.json", "model.safetensors"):
      if not (path / needed).exists():
        raise FileNotFoundError(f"Encoder directory {path} has no {needed}; expected a Hugging "
                                "Face BERT checkpoint (config.json, tokenizer.json, model.safetensors).")
    self.config = EncoderConfig.from_hf_config(json.loads((path / "config.json").read_text()))
    st = safetensors_io.SafetensorsFile(path / "model.safetensors")
    tensors = {n: st.read(n) for n in st.names()}
    self.params = params_from_hf(self.config, tensors, dtype)
    self.path = path
    self.tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    normalizer = json.loads((path / "tokenizer.json").read_text()).get("normalizer") or {}
    self.lower_case = bool(normalizer.get("lowercase", True))  # BERT-uncased unless it says not
    self.tokenizer.no_padding()
    self.max_length = min(max_length, self.config.max_position_embeddings)
    self.tokenizer.enable_truncation(self.max_length)
    self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
    self.batch_size = batch_size
    self.mesh = mesh
    if mesh is not None:
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      self.params = jax.tree.map(lambda x: shd.global_array(x, replicated), self.params)
    self.identity = {
        "name": name or path.name, "weights_sha256": file_sha256(path / "model.safetensors"),
        "query_prefix": query_prefix, "passage_prefix": passage_prefix,
        "max_length": self.max_length, "pooling": "mean", "normalize": True,
        "dim": self.config.hidden_size}

  @property
  def dim(self) -> int:
    return self.config.hidden_size

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

  def encode(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
    """Embeddings [n, D] float32 (L2-normalised) of queries or passages."""
    if kind not in ("query", "passage"):
      raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}.")
    prefix = self.query_prefix if kind == "query" else self.passage_prefix
    ids = self.tokenize([prefix + t for t in texts])
    return embed_in_buckets(ids, self.dim, self.batch_size, self.max_length, self.mesh,
                            lambda tokens, mask: embed(self.config, self.params, tokens, mask))
