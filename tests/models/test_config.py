"""ModelConfig: HF config.json in both rope forms, presets, and validation."""

import chex
import numpy as np
import pytest

from scope_jax.models import PRESETS, ModelConfig, RopeScaling, get_preset, tiny_config
from scope_jax.models.config import rope_inv_freq


def test_classic_and_rope_parameters_forms_agree():
  classic = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096,
             "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "rope_theta": 500000.0,
             "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
  v5 = {k: v for k, v in classic.items() if k not in ("rope_theta", "rope_scaling")}
  v5["rope_parameters"] = {**classic["rope_scaling"], "rope_theta": 500000.0}
  a, b = ModelConfig.from_hf_config(classic), ModelConfig.from_hf_config(v5)
  assert a == b
  assert a.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
  assert a.head_dim == 128 and a.num_groups == 4 and not a.qkv_bias


def test_qwen_variants_from_config():
  q2 = ModelConfig.from_hf_config({"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
                                   "intermediate_size": 4864, "num_hidden_layers": 24,
                                   "num_attention_heads": 14, "num_key_value_heads": 2,
                                   "rope_theta": 1e6, "tie_word_embeddings": True})
  assert q2.qkv_bias and not q2.qk_norm and q2.tie_embeddings and q2.head_dim == 64
  assert q2 == get_preset("qwen2.5-0.5b").replace(eos_token_id=None, bos_token_id=None,
                                                  pad_token_id=None, max_position_embeddings=32768)
  q3 = ModelConfig.from_hf_config({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
                                   "intermediate_size": 3072, "num_hidden_layers": 28,
                                   "num_attention_heads": 16, "num_key_value_heads": 8,
                                   "head_dim": 128, "rope_parameters": {"rope_type": "default",
                                                                       "rope_theta": 1e6}})
  assert q3.qk_norm and not q3.qkv_bias and q3.head_dim == 128 and q3.rope_scaling is None


@pytest.mark.parametrize("name,billions", [
    ("qwen2.5-0.5b", 0.494), ("qwen2.5-7b", 7.616), ("qwen2.5-14b", 14.77),
    ("qwen3-0.6b", 0.596), ("qwen3-8b", 8.191), ("llama3.1-8b", 8.030), ("llama3.2-1b", 1.236),
    ("llama3.1-70b", 70.55), ("gemma2-2b", 2.614), ("gemma2-9b", 9.242), ("olmo2-7b", 7.299),
    ("olmo3-7b", 7.298)])
def test_preset_parameter_counts(name, billions):
  assert abs(get_preset(name).num_params() / 1e9 - billions) / billions < 0.005


def test_every_preset_is_valid_and_roundtrips():
  assert len(PRESETS) == 21
  for name, cfg in PRESETS.items():
    assert ModelConfig.from_hf_config(cfg.to_hf_config()) == cfg, name


def test_unknown_preset_lists_choices():
  with pytest.raises(ValueError, match="valid: .*qwen3-8b"):
    get_preset("qwen9")


@pytest.mark.parametrize("bad,match", [
    (dict(num_heads=6, num_kv_heads=4), "multiple of num_kv_heads"),
    (dict(rope_scaling=RopeScaling("longrope")), "Unsupported rope_type 'longrope'"),
    (dict(model_type="phi3"), "Unsupported model_type 'phi3'")])
def test_invalid_configs(bad, match):
  base = dict(model_type="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1,
              num_heads=4, num_kv_heads=2, head_dim=2)
  with pytest.raises(ValueError, match=match):
    ModelConfig(**{**base, **bad})


def test_llama3_rope_matches_transformers():
  import torch  # noqa: F401  (transformers' rope init runs in torch)
  import transformers
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  cfg = get_preset("llama3.2-1b")
  hf = transformers.LlamaConfig(**cfg.to_hf_config())
  inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, "cpu")
  chex.assert_trees_all_close(rope_inv_freq(cfg), inv_freq.numpy(), rtol=1e-6, atol=0)


def test_corrupt_checkpoint_files_name_the_file_and_tensor(tmp_path):
  import jax
  from scope_jax.models import hf_io, init_params
  cfg = tiny_config()
  hf_io.save_hf(cfg, init_params(cfg, jax.random.key(0)), tmp_path / "ok")
  (tmp_path / "ok" / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match=r"config.json is not valid JSON"):
    hf_io.load_hf(tmp_path / "ok")
  hf_io.save_hf(cfg, init_params(cfg, jax.random.key(0)), tmp_path / "cut")
  st = tmp_path / "cut" / "model.safetensors"
  st.write_bytes(st.read_bytes()[:len(st.read_bytes()) // 2])
  with pytest.raises(ValueError, match=r"model.safetensors: tensor '.*' .* is cut short"):
    hf_io.load_hf(tmp_path / "cut")
