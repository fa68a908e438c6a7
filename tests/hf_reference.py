"""Hugging Face (PyTorch) reference models for parity tests."""

import numpy as np


def hf_model(path):
  import torch
  import transformers
  model = transformers.AutoModelForCausalLM.from_pretrained(
      str(path), dtype=torch.float32, attn_implementation="eager")
  return model.eval()


def hf_logits(model, tokens, mask):
  """HF logits with positions counting real tokens only (what HF generate does for padding)."""
  import torch
  mask = np.asarray(mask, np.int64)
  positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
  with torch.no_grad():
    out = model(input_ids=torch.tensor(np.asarray(tokens, np.int64)),
                attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions))
  return out.logits.float().numpy()


def padded_batch(vocab, lengths, total, *, left=True, seed=0):
  """Random tokens [B, total] with a 1/0 mask, each row padded to `total` on one side."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, vocab, (len(lengths), total))
  mask = np.zeros((len(lengths), total), np.int32)
  for i, n in enumerate(lengths):
    if left:
      mask[i, total - n:] = 1
    else:
      mask[i, :n] = 1
  return tokens.astype(np.int32), mask
