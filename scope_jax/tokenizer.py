"""Tokenizers: the checkpoint's own Hugging Face tokenizer, or a dependency-free byte tokenizer.

`ByteTokenizer` (UTF-8 bytes + ChatML special tokens) lets the CPU demo run offline with a small
random model; it speaks the subset of the HF tokenizer API the project uses (`encode`, `decode`,
`apply_chat_template`, `eos_token_id`, `pad_token_id`).
"""

from __future__ import annotations

import re
from typing import Sequence

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class ByteTokenizer:
  """ids 0..255 are bytes; 256.. are ChatML specials. Vocabulary size 259 (pad to 320 in configs)."""

  def __init__(self):
    self.special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
    self.id_to_special = {i: s for s, i in self.special_ids.items()}
    self._split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
    self.pad_token_id = self.special_ids["<|endoftext|>"]
    self.eos_token_id = self.special_ids["<|im_end|>"]
    self.vocab_size = 256 + len(SPECIALS)

  def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
    ids: list[int] = []
    for part in self._split.split(text):
      if part in self.special_ids:
        ids.append(self.special_ids[part])
      elif part:
        ids.extend(part.encode("utf-8"))
    return ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    out, buf = [], bytearray()
    for i in ids:
      i = int(i)
      if i < 256:
        buf.append(i)
        continue
      out.append(buf.decode("utf-8", errors="replace"))
      buf = bytearray()
      if not skip_special_tokens:
        out.append(self.id_to_special.get(i, ""))
    out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)

  def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False,
                          **_):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    if add_generation_prompt:
      text += "<|im_start|>assistant\n"
    return self.encode(text) if tokenize else text


def load_tokenizer(spec: str):
  """'byte', a HF tokenizer directory, or 'gguf:<path-or-asset>' (tokenizer read from a GGUF)."""
  if spec == "byte":
    return ByteTokenizer()
  import transformers
  if spec.startswith("gguf:"):
    import pathlib
    from scope_jax import assets
    target = spec[len("gguf:"):]
    path = pathlib.Path(target) if pathlib.Path(target).exists() else assets.fetch(target)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  return transformers.AutoTokenizer.from_pretrained(spec)


def eos_ids(tokenizer) -> tuple[int, ...]:
  ids = getattr(tokenizer, "eos_token_id", None)
  if ids is None:
    return ()
  return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)
