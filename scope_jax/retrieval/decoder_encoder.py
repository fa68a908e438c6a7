"""A decoder language model as a text embedder (Linq-Embed-Mistral, E5-Mistral, any family the
decoder loads): the final hidden state of each text's last token, L2-normalised, as vLLM's embed
task pools these models. The weights load through the decoder itself (`models.hf_io`), so a
Mistral embedder is the Llama family with a sliding window on every layer. Embedding models are
usually saved headless (transformers' `MistralModel`: `embed_tokens.weight`, `layers.*`, `norm.weight`,
no `model.` prefix and no `lm_head`); both that layout and a causal-LM one load. The tokenizer is
`tokenizer.json` with `tokenizer_config.json`'s `add_bos_token` / `add_eos_token` applied, as
transformers' Llama tokenizer applies them (E5-Mistral appends `</s>`, the token pooled).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import transformer
from scope_jax.models.config import SUPPORTED_MODEL_TYPES, ModelConfig
from scope_jax.models.hf_io import SafetensorsSource, params_from_source, read_hf_config
from scope_jax.retrieval.encoder import embed_in_buckets, file_sha256


def is_decoder_checkpoint(path) -> bool:
  """Whether `path` holds a decoder checkpoint (a config.json of a family the decoder loads)."""
  config = pathlib.Path(path) / "config.json"
  if not config.exists():
    return False
  try:
    return json.loads(config.read_text()).get("model_type") in SUPPORTED_MODEL_TYPES
  except ValueError:
    return False


@functools.partial(jax.jit, static_argnums=0)
def last_token_embedding(config: ModelConfig, params, tokens_BT, mask_BT):
  """[B, D] float32: the final hidden state at each row's last real token, L2-normalised. Rows
  are right-padded, so the last real token is at position (Σ mask − 1)."""
  hidden_BTD, _ = transformer.forward(config, params, tokens_BT, attention_mask=mask_BT,
                                      return_hidden=True, dtype=jnp.float32)
  last_B = jnp.maximum(mask_BT.sum(-1) - 1, 0)
  h_BD = jnp.take_along_axis(hidden_BTD, last_B[:, None, None], axis=1)[:, 0].astype(jnp.float32)
  return h_BD / jnp.maximum(jnp.linalg.norm(h_BD, axis=-1, keepdims=True), 1e-12)


class HeadlessSource:
  """A headless checkpoint's tensors under causal-LM names: `model.<name>` reads `<name>`."""

  def __init__(self, source):
    self.source = source

  def names(self):
    return [f"model.{n}" for n in self.source.names()]

  def shape(self, name):
    return self.source.shape(name.removeprefix("model."))

  def read(self, name, index):
    return self.source.read(name.removeprefix("model."), index)


def load_embedder(path, mesh=None, dtype=jnp.float32):
  """(config, params) of a decoder checkpoint in either layout: causal LM (`model.*`, maybe
  `lm_head`) or headless (`*Model`: no prefix, no head). Without `lm_head` the embeddings are
  read as tied, so no output matrix is loaded (pooling never uses it)."""
  config, source = read_hf_config(path), SafetensorsSource(path)
  names = set(source.names())
  if "model.embed_tokens.weight" not in names and "embed_tokens.weight" in names:
    source = HeadlessSource(source)
  if "lm_head.weight" not in names and not config.tie_embeddings:
    config = dataclasses.replace(config, tie_embeddings=True)
  return config, params_from_source(config, source, mesh, dtype=dtype)


def _token_text(value) -> str | None:
  """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
  return value.get("content") if isinstance(value, dict) else value


def apply_tokenizer_config(tokenizer, path: pathlib.Path) -> str:
  """Sets the tokenizer's post-processor from tokenizer_config.json's `add_bos_token` /
  `add_eos_token` when it names either (transformers' Llama tokenizer does the same; a bare
  tokenizer.json may add only BOS where the model was trained to pool `</s>`). Returns the
  template set ('' when the file names neither flag and tokenizer.json's own is kept)."""
  from tokenizers import processors
  file = path / "tokenizer_config.json"
  if not file.exists():
    return ""
  cfg = json.loads(file.read_text())
  if "add_bos_token" not in cfg and "add_eos_token" not in cfg:
    return ""
  specials = []
  for flag, key, default in (("add_bos_token", "bos_token", True),
                             ("add_eos_token", "eos_token", False)):
    text = _token_text(cfg.get(key))
    if cfg.get(flag, default) and text is not None:
      token_id = tokenizer.token_to_id(text)
      if token_id is None:
        raise ValueError(f"{file} asks for {key} {text!r} ({flag}), which tokenizer.json does "
                         "not know; fix the tokenizer files.")
      specials.append((key, text, token_id))
  bos = [f"{t}:0" for k, t, _ in specials if k == "bos_token"]
  eos = [f"{t}:0" for k, t, _ in specials if k == "eos_token"]
  single = " ".join(bos + ["$A:0"] + eos)
  tokenizer.post_processor = processors.TemplateProcessing(
      single=single,
      pair=" ".join(bos + ["$A:0"] + eos + bos + ["$B:1"] + eos),
      special_tokens=sorted({(t, i) for _, t, i in specials}))
  return single


class DecoderEncoder:
  """Embeds queries and passages with a decoder checkpoint directory (config.json, safetensors,
  tokenizer.json, optional tokenizer_config.json); the tokenizer's special tokens are added."""

  def __init__(self, path, *, query_prefix: str = "", passage_prefix: str = "",
               max_length: int = 512, batch_size: int = 16, mesh=None, dtype=jnp.float32,
               name: str | None = None):
    import tokenizers
    path = pathlib.Path(path)
    if not (path / "tokenizer.json").exists():
      raise FileNotFoundError(f"Embedder directory {path} has no tokenizer.json.")
    self.config, self.params = load_embedder(path, mesh=mesh, dtype=dtype)
    self.tokenizer = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    template = apply_tokenizer_config(self.tokenizer, path)
    self.tokenizer.no_padding()
    self.max_length = min(max_length, self.config.max_position_embeddings)
    self.tokenizer.enable_truncation(self.max_length)
    self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
    self.batch_size, self.mesh = batch_size, mesh
    weights = sorted(path.glob("*.safetensors"))
    self.identity = {
        "name": name or path.name,
        "weights_sha256": file_sha256(weights[0]) if weights else "",
        "query_prefix": query_prefix, "passage_prefix": passage_prefix,
        "max_length": self.max_length, "pooling": "last_token", "normalize": True,
        "dim": self.config.hidden_size}
    if template:  # texts end with what tokenizer_config.json adds (e.g. </s>): other vectors
      self.identity["specials"] = template

  @property
  def dim(self) -> int:
    return self.config.hidden_size

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids or [0] for e in self.tokenizer.encode_batch(list(texts))]

  def encode_ids(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Embeddings [n, D] float32 of token-id rows (bucketed by length, right-padded)."""
    return embed_in_buckets(ids, self.dim, self.batch_size, self.max_length, self.mesh,
                            lambda tokens, mask: last_token_embedding(self.config, self.params,
                                                                      tokens, mask))

  def encode(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
    """Embeddings [n, D] float32 (L2-normalised) of queries or passages."""
    if kind not in ("query", "passage"):
      raise ValueError(f"kind must be 'query' or 'passage', got {kind!r}.")
    prefix = self.query_prefix if kind == "query" else self.passage_prefix
    return self.encode_ids(self.tokenize([prefix + t for t in texts]))
