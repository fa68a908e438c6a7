"""A decoder embedder (Linq-Embed-Mistral's kind) against transformers on a tiny random Mistral:
the last token's final hidden state, L2-normalised, for texts of different lengths in one batch."""

import chex
import jax
import numpy as np

from scope_jax.models import init_params, save_hf, tiny_config
from scope_jax.retrieval.decoder_encoder import DecoderEncoder, is_decoder_checkpoint
from scope_jax.retrieval.service import load_encoder

WORDS = ["what", "is", "the", "sum", "of", "two", "and", "three", "a", "train", "travels", "km",
         "in", "hours", "speed", "its", "find", "solve", "for", "x", "?", "."]


def _tokenizer(path):
  """A word-level tokenizer.json that adds BOS (id 1) in front, as Mistral's does."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  tok.save(str(path / "tokenizer.json"))


def test_last_token_embeddings_match_transformers(tmp_path):
  import torch
  import transformers
  cfg = tiny_config("mistral")
  save_hf(cfg, init_params(cfg, jax.random.key(3)), tmp_path)
  _tokenizer(tmp_path)
  assert is_decoder_checkpoint(tmp_path)
  enc = load_encoder(str(tmp_path))
  assert isinstance(enc, DecoderEncoder) and enc.dim == cfg.hidden_size
  texts = ["what is the sum of two and three ?",
           "a train travels km in hours . find its speed . solve for x in the sum of two",
           "solve"]
  ours = enc.encode(texts)
  ids = enc.tokenize(texts)
  assert all(row[0] == 1 for row in ids) and len(ids[1]) > cfg.sliding_window * 3
  ref_model = transformers.AutoModel.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
  ref = []
  with torch.no_grad():
    for row in ids:  # one text at a time: no padding on the reference side
      h = ref_model(torch.tensor([row])).last_hidden_state[0, -1].numpy()
      ref.append(h / np.linalg.norm(h))
  chex.assert_trees_all_close(ours, np.stack(ref), rtol=0, atol=2e-5)
  np.testing.assert_allclose(np.linalg.norm(ours, axis=-1), 1.0, rtol=1e-5)


def _headless_mistral(path, add_eos: bool):
  """A tiny random `transformers.MistralModel` saved as embedding models are (no `model.`
  prefix, no lm_head), with the word-level tokenizer and a tokenizer_config.json."""
  import json
  import torch
  import transformers
  torch.manual_seed(0)
  cfg = transformers.MistralConfig(vocab_size=len(WORDS) + 3, hidden_size=32,
                                   intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=64, sliding_window=None,
                                   bos_token_id=1, eos_token_id=2)
  transformers.MistralModel(cfg).save_pretrained(str(path), safe_serialization=True)
  _tokenizer(path)
  (path / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True, "add_eos_token": add_eos,
       "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
       "model_max_length": 64}))


def test_headless_embedder_with_eos_matches_transformers(tmp_path):
  """An embedder saved as `MistralModel` loads, its tokenizer_config.json's add_eos_token is
  honoured (</s> after tokenizer.json's ids, as transformers 4.x's LlamaTokenizerFast, which the
  released vLLM server used, appends it; the 5.x tokenizer here does not, so the expected ids are
  written out), and the pooled vectors match `AutoModel`'s last hidden state at that </s>."""
  import safetensors
  import torch
  import transformers
  _headless_mistral(tmp_path, add_eos=True)
  with safetensors.safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    keys = set(f.keys())
  assert "embed_tokens.weight" in keys and "lm_head.weight" not in keys
  assert not any(k.startswith("model.") for k in keys)
  enc = load_encoder(str(tmp_path))
  assert isinstance(enc, DecoderEncoder)
  texts = ["what is the sum of two and three ?", "solve", "a train travels km in hours ."]
  ids = enc.tokenize(texts)
  vocab = {w: i + 3 for i, w in enumerate(WORDS)}
  assert ids == [[1] + [vocab[w] for w in t.split()] + [2] for t in texts]
  ours = enc.encode(texts)
  ref_model = transformers.AutoModel.from_pretrained(str(tmp_path), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
  with torch.no_grad():
    ref = [ref_model(torch.tensor([row])).last_hidden_state[0, -1].numpy() for row in ids]
  ref = np.stack([h / np.linalg.norm(h) for h in ref])
  chex.assert_trees_all_close(ours, ref, rtol=0, atol=2e-5)


def test_tokenizer_config_without_eos_keeps_bos_only(tmp_path):
  _headless_mistral(tmp_path, add_eos=False)
  enc = load_encoder(str(tmp_path))
  assert enc.tokenize(["solve"]) == [[1, WORDS.index("solve") + 3]]
