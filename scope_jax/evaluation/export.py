"""Writes a model as a Hugging Face checkpoint that transformers loads directly: safetensors +
config.json, the tokenizer's files (the bundled demo tokenizer becomes a fast tokenizer with its
ChatML template) and generation_config.json; locally or to gs://."""

from __future__ import annotations

import json
import os
import tempfile

import jax
from etils import epath

from scope_jax import tokenizer as tok_lib
from scope_jax.models import hf_io
from scope_jax.models import lora as lora_lib

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def hf_tokenizer(tokenizer):
  """A transformers tokenizer for `tokenizer` (the demo BPE is wrapped; HF ones pass through)."""
  if isinstance(tokenizer, tok_lib.DemoTokenizer):
    import transformers
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer._tok, eos_token="<|im_end|>",  # pylint: disable=protected-access
        pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE)
  if isinstance(tokenizer, tok_lib.ByteTokenizer):
    raise ValueError("The 'byte' test tokenizer has no Hugging Face form; export a model trained "
                     "with the 'demo' tokenizer or a HF one.")
  return tokenizer


def generation_config(tokenizer, model_config) -> dict:
  eos = tok_lib.eos_ids(tokenizer) or tuple(model_config.eos_ids)
  out = {"eos_token_id": list(eos) if len(eos) != 1 else eos[0]}
  for key in ("pad_token_id", "bos_token_id"):
    value = getattr(tokenizer, key, None)
    if value is not None:
      out[key] = int(value)
  return out


def export(model, out, *, dtype=None, info: dict | None = None) -> epath.Path:
  """Writes `model` (evaluation.models.Model) to `out` as a HF checkpoint; returns the path.
  A LoRA model is written merged (W + scale·a·b: plain weights any HF reader loads)."""
  out = epath.Path(out)
  tok = hf_tokenizer(model.tokenizer)
  params = lora_lib.merge(model.params)
  hf_io.save_hf(model.config, params, out, dtype=dtype)  # gathers on every host
  if jax.process_index() != 0:
    return out
  with tempfile.TemporaryDirectory() as tmp:
    tok.save_pretrained(tmp)
    for name in sorted(os.listdir(tmp)):
      (out / name).write_bytes(epath.Path(tmp, name).read_bytes())
  (out / "generation_config.json").write_text(
      json.dumps(generation_config(model.tokenizer, model.config), indent=2))
  if info:
    (out / "scope_jax_export.json").write_text(json.dumps(info, indent=2))
  return out
