"""A model from a `model` config section: (ModelConfig, params), placed on a mesh.

`model.source` is 'tiny' (the section's own small architecture, random init), 'preset:<name>'
(a named architecture, random init), 'hf:<dir or gs://>' (a Hugging Face checkpoint) or
'gguf:<file or asset>'. Training and evaluation both load through here.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp

from scope_jax import assets
from scope_jax import sharding as shd
from scope_jax.models import gguf_io, hf_io, transformer
from scope_jax.models.config import ModelConfig, get_preset

SOURCES = "'tiny', 'preset:<name>', 'hf:<path>' or 'gguf:<path or asset>'"


def model_config(cfg) -> ModelConfig | None:
  """The architecture of `cfg.source` when it needs no file ('tiny', 'preset:'), else None."""
  if cfg.source == "tiny":
    return ModelConfig(**cfg.tiny.to_dict())
  if cfg.source.startswith("preset:"):
    return get_preset(cfg.source[len("preset:"):])
  return None


TIE_CHOICES = ("auto", "yes")


def check_source(source: str, tie: str = "auto") -> None:
  """Fails at once, in one line, on a `model.source` no loader takes."""
  if source != "tiny" and not source.startswith(("preset:", "hf:", "gguf:")):
    raise ValueError(f"Unknown model.source {source!r}; use {SOURCES}.")
  if tie not in TIE_CHOICES:
    raise ValueError(f"model.tie_embeddings={tie!r}; use 'auto' (as the source stores them) or "
                     "'yes' (one matrix for input and output).")


def run_options(config: ModelConfig, cfg) -> ModelConfig:
  """`config` with the run's model settings that no checkpoint stores: the experts' capacity
  (`cfg.moe_capacity_factor`, 0 or None: dropless)."""
  factor = float(cfg.get("moe_capacity_factor", 0.0) or 0.0)
  if not factor:
    return config
  if factor < 0 or not config.num_experts:
    raise ValueError(f"model.moe_capacity_factor={factor}: use 0 (dropless) or a positive "
                     "multiple of the balanced load (e.g. 1.25), and only with a mixture of "
                     f"experts ({cfg.source} has none).")
  return config.replace(moe_capacity_factor=factor)


def load_model(cfg, mesh, seed: int, rules: shd.Rules = shd.TRAIN_RULES):
  """(ModelConfig, params) from `cfg.source` (with `run_options`), placed on `mesh` under
  `rules`."""
  config, params = _load(cfg, mesh, seed, rules)
  return run_options(config, cfg), params


def _load(cfg, mesh, seed: int, rules: shd.Rules):
  """(ModelConfig, params) from `cfg.source`, placed on `mesh` under `rules`.

  `cfg.tie_embeddings='yes'` ties the input and output embeddings of a source that stores them
  apart: a GGUF of a tied model (llama.cpp writes the matrix twice) or a random architecture.
  """
  tie = cfg.get("tie_embeddings", "auto")
  check_source(cfg.source, tie)
  dtype = jnp.dtype(cfg.param_dtype)
  source = cfg.source
  if source.startswith("hf:"):
    config, params = hf_io.load_hf(source[len("hf:"):], mesh=mesh, dtype=dtype, rules=rules)
    if tie == "yes" and not config.tie_embeddings:
      raise ValueError(f"model.tie_embeddings='yes' but {source} has its own lm_head (config.json "
                       "tie_word_embeddings=false); leave it 'auto' for Hugging Face checkpoints.")
    return config, params
  if source.startswith("gguf:"):
    target = source[len("gguf:"):]
    path = pathlib.Path(target) if pathlib.Path(target).exists() else assets.fetch(target)
    return gguf_io.load_gguf(path, mesh=mesh, dtype=dtype, rules=rules, tie=tie == "yes")
  config = model_config(cfg)
  if tie == "yes":
    config = config.replace(tie_embeddings=True)
  params = transformer.init_sharded_params(config, jax.random.key(seed), mesh, rules, dtype)
  return config, params
