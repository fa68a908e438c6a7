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
