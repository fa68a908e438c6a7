"""Our decoder vs transformers (PyTorch, float32) on tiny random configs of every family."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import forward, hf_io, init_params, load_hf, save_hf, tiny_config
from tests.hf_reference import hf_logits, hf_model, padded_batch

# family × attention layout: 4 query heads with 4 (MHA), 2 (GQA) or 1 (MQA) kv heads.
CASES = [
    ("llama", 4), ("llama", 2), ("llama", 1),  # Llama-3 with llama3 rope scaling
    ("mistral", 2),  # Llama's layout, a sliding window on every layer (rows of 13 cross it)
    ("qwen2", 4), ("qwen2", 2), ("qwen2", 1),  # Qwen2 / Qwen2.5: qkv bias
    ("qwen3", 4), ("qwen3", 2), ("qwen3", 1),  # Qwen3: q/k norm, head_dim 24 != 64 / 4
    # Gemma-2: √D embeddings, (1 + w) sandwich norms, GeGLU, soft-capping, query scalar, tied,
    # alternating windows of 4 positions (rows of 13 cross them). OLMo-2/3: post-norms, q/k norm
    # over the whole projection; OLMo-3's 3 sliding : 1 full layers.
    ("gemma2", 2), ("gemma2", 1), ("olmo2", 4), ("olmo2", 2), ("olmo3", 4), ("olmo3", 2),
    ("qwen3_moe", 2),  # 8 experts, top-2, renormalised; dropless ragged_dot experts
]


def _batch(cfg, left):
  return padded_batch(cfg.vocab_size, [13, 7, 1], 13, left=left)


@pytest.mark.parametrize("model_type,kv_heads", CASES)
def test_logits_match_transformers(model_type, kv_heads, tmp_path):
  cfg = tiny_config(model_type, num_kv_heads=kv_heads)
  params = init_params(cfg, jax.random.key(1))
  save_hf(cfg, params, tmp_path)
  ref_model = hf_model(tmp_path)
  for left in (True, False):
    tokens, mask = _batch(cfg, left)
    ours, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
    ref = hf_logits(ref_model, tokens, mask)
    m = mask.astype(bool)
    chex.assert_trees_all_close(np.asarray(ours)[m], ref[m], rtol=0, atol=1e-4)  # max |Δlogit|


def test_qwen25_tied_embeddings(tmp_path):
  cfg = tiny_config("qwen2", tie_embeddings=True)
  params = init_params(cfg, jax.random.key(2))
  assert "lm_head" not in params
  save_hf(cfg, params, tmp_path)
  tokens, mask = _batch(cfg, True)
  ours, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  ref = hf_logits(hf_model(tmp_path), tokens, mask)
  m = mask.astype(bool)
  chex.assert_trees_all_close(np.asarray(ours)[m], ref[m], rtol=0, atol=1e-4)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "gemma2", "olmo2",
                                        "olmo3", "qwen3_moe"])
def test_load_hf_of_transformers_checkpoint(model_type, tmp_path):
  """transformers initialises and saves (its own config format); load_hf must agree with it."""
  import torch
  import transformers
  cfg = tiny_config(model_type)
  hf_cfg = transformers.AutoConfig.for_model(**cfg.to_hf_config())
  torch.manual_seed(0)
  model = transformers.AutoModelForCausalLM.from_config(hf_cfg, attn_implementation="eager")
  with torch.no_grad():  # HF zero-inits biases and ones norms: randomise so they are tested
    for name, p in model.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.save_pretrained(tmp_path)
  loaded_cfg, params = load_hf(tmp_path)
  assert loaded_cfg == cfg.replace(bos_token_id=loaded_cfg.bos_token_id,
                                   eos_token_id=loaded_cfg.eos_token_id,
                                   pad_token_id=loaded_cfg.pad_token_id)
  tokens, mask = _batch(cfg, True)
  ours, _ = forward(loaded_cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  ref = hf_logits(model.eval(), tokens, mask)
  m = mask.astype(bool)
  chex.assert_trees_all_close(np.asarray(ours)[m], ref[m], rtol=0, atol=1e-4)


def test_save_load_roundtrip_sharded_checkpoint(tmp_path):
  cfg = tiny_config("qwen3")
  params = init_params(cfg, jax.random.key(3))
  save_hf(cfg, params, tmp_path, max_shard_bytes=40_000)
  assert (tmp_path / "model.safetensors.index.json").exists()
  assert len(list(tmp_path.glob("model-*.safetensors"))) > 2
  loaded_cfg, loaded = load_hf(tmp_path)
  assert loaded_cfg == cfg
  chex.assert_trees_all_equal(params, loaded)
  tokens, mask = _batch(cfg, False)
  ref = hf_logits(hf_model(tmp_path), tokens, mask)
  ours, _ = forward(cfg, loaded, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  m = mask.astype(bool)
  chex.assert_trees_all_close(np.asarray(ours)[m], ref[m], rtol=0, atol=1e-4)


def test_bfloat16_checkpoint_and_compute(tmp_path):
  cfg = tiny_config("qwen2")
  params = init_params(cfg, jax.random.key(4))
  save_hf(cfg, params, tmp_path, dtype=jnp.bfloat16)
  _, p16 = load_hf(tmp_path, dtype=jnp.bfloat16)
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(p16))
  tokens, mask = _batch(cfg, True)
  f32, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  b16, _ = forward(cfg, p16, jnp.asarray(tokens), attention_mask=jnp.asarray(mask),
                   dtype=jnp.bfloat16)
  assert b16.dtype == jnp.float32
  m = mask.astype(bool)
  scale = np.abs(np.asarray(f32))[m].max()
  # bf16 has an 8-bit mantissa: relative error of a few 2^-8 through 2 layers.
  chex.assert_trees_all_close(np.asarray(b16)[m], np.asarray(f32)[m], rtol=0, atol=0.05 * scale)
  agree = (np.asarray(b16).argmax(-1) == np.asarray(f32).argmax(-1))[m].mean()
  assert agree >= 0.9


# ------------------------------------------------------------------------------- bad input

def test_unsupported_model_type():
  with pytest.raises(ValueError, match="Unsupported model_type .gpt2.*llama, mistral, qwen2, qwen3, qwen3_moe, gemma2"):
    from scope_jax.models import ModelConfig
    ModelConfig.from_hf_config({"model_type": "gpt2", "vocab_size": 10})


def test_wrong_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="No config.json"):
    load_hf(tmp_path / "nowhere")


def test_missing_safetensors(tmp_path):
  cfg = tiny_config("qwen2")
  import json
  (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_config()))
  with pytest.raises(FileNotFoundError, match="No model.safetensors"):
    load_hf(tmp_path)


def test_missing_tensor_is_named(tmp_path):
  cfg = tiny_config("qwen2")
  tensors = hf_io.to_hf_tensors(cfg, init_params(cfg, jax.random.key(0)))
  del tensors["model.layers.1.self_attn.k_proj.bias"]
  with pytest.raises(ValueError, match=r"missing tensor 'model.layers.1.self_attn.k_proj.bias' "
                                       r"\(expected shape \(32,\)\)"):
    hf_io.params_from_source(cfg, hf_io.DictSource(tensors))


def test_shape_mismatch_is_named(tmp_path):
  cfg = tiny_config("llama")
  params = init_params(cfg, jax.random.key(0))
  save_hf(cfg, params, tmp_path)
  wrong = cfg.replace(intermediate_size=96)
  with pytest.raises(ValueError, match=r"'model.layers.0.mlp.gate_proj.weight' has shape "
                                       r"\(128, 64\), but the config expects \(96, 64\)"):
    hf_io.params_from_source(wrong, hf_io.SafetensorsSource(tmp_path))
