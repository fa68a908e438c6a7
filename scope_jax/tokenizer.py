"""Tokenizers: the checkpoint's own Hugging Face tokenizer, or small ChatML tokenizers for demos.

`DemoTokenizer` (a byte-level BPE trained on the bundled corpus, shipped with the package) and
`ByteTokenizer` (raw UTF-8 bytes) let the CPU demo run offline with a small random model; both
speak the subset of the HF tokenizer API the project uses (`encode`, `decode`,
`apply_chat_template`, `eos_token_id`, `pad_token_id`, `len`).
"""

from __future__ import annotations

import pathlib
import re
from typing import Sequence

from scope_jax import assets
from scope_jax.data import DEMO_TOKENIZER

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class ChatML:
  """Qwen-style chat template shared by the demo tokenizers."""

  def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = False,
                          **_):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    if add_generation_prompt:
      text += "<|im_start|>assistant\n"
    return self.encode(text) if tokenize else text

  def __len__(self) -> int:
    return self.vocab_size


class DemoTokenizer(ChatML):
  """The bundled byte-level BPE (2,048 ids; lossless)."""

  def __init__(self, path=None):
    import tokenizers  # optional heavy dependency, loaded when used
    self._tok = tokenizers.Tokenizer.from_file(str(path or DEMO_TOKENIZER))
    self.vocab_size = self._tok.get_vocab_size()
    self.pad_token_id = self._tok.token_to_id("<|endoftext|>")
    self.eos_token_id = self._tok.token_to_id("<|im_end|>")
    self._plain = None

  def encode(self, text: str, add_special_tokens: bool = False,
             split_special_tokens: bool = False) -> list[int]:
    """With `split_special_tokens`, special-token strings in `text` stay plain text."""
    if split_special_tokens:
      if self._plain is None:  # a second tokenizer: the first's flag is shared state
        import tokenizers
        self._plain = tokenizers.Tokenizer.from_str(self._tok.to_str())
        self._plain.encode_special_tokens = True
      return self._plain.encode(text, add_special_tokens=False).ids
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)


class ByteTokenizer(ChatML):
  """ids 0..255 are bytes; 256.. are ChatML specials (vocabulary 259)."""

  def __init__(self):
    self.special_ids = {s: 256 + i for i, s in enumerate(SPECIALS)}
    self.id_to_special = {i: s for s, i in self.special_ids.items()}
    self._split = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
    self.pad_token_id = self.special_ids["<|endoftext|>"]
    self.eos_token_id = self.special_ids["<|im_end|>"]
    self.vocab_size = 256 + len(SPECIALS)

  def encode(self, text: str, add_special_tokens: bool = False,
             split_special_tokens: bool = False) -> list[int]:
    if split_special_tokens:
      return list(text.encode("utf-8"))
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


_UNSAFE = re.compile("[\ud800-\udfff\x00]")


def clean_text(text) -> str:
  """Untrusted text as a string the tokenizers accept: lone surrogates (from JSON escapes or a
  corpus line) and NULs become U+FFFD."""
  if not isinstance(text, str):
    raise TypeError(f"expected text, got {type(text).__name__}")
  return _UNSAFE.sub("\ufffd", text)


def encode_plain(tokenizer, text: str) -> list[int]:
  """Ids of untrusted text (tool output, model output, benchmark questions) with special-token
  parsing off: a literal `<|im_end|>` in a document is text, never the control token."""
  return list(tokenizer.encode(clean_text(text), add_special_tokens=False,
                               split_special_tokens=True))


def load_tokenizer(spec: str):
  """'demo', 'byte', a HF tokenizer directory, or 'gguf:<path-or-asset>' (read from a GGUF)."""
  if spec == "demo":
    return DemoTokenizer()
  if spec == "byte":
    return ByteTokenizer()
  import transformers
  if spec.startswith("gguf:"):
    target = spec[len("gguf:"):]
    path = pathlib.Path(target) if pathlib.Path(target).exists() else assets.fetch(target)
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  check_spec(spec)
  return transformers.AutoTokenizer.from_pretrained(spec, local_files_only=True)


def check_spec(spec: str) -> None:
  """A tokenizer directory must exist here: a missing path is never taken for a hub id."""
  if spec in ("demo", "byte") or spec.startswith("gguf:") or "://" in spec:
    return
  if not pathlib.Path(spec).is_dir():
    raise FileNotFoundError(
        f"model.tokenizer={spec!r} is not a directory here ({pathlib.Path(spec).absolute()}): "
        "give the checkpoint's local directory (models are never downloaded at run time), "
        "'demo', 'byte' or 'gguf:<file or asset>'.")


def eos_ids(tokenizer) -> tuple[int, ...]:
  ids = getattr(tokenizer, "eos_token_id", None)
  if ids is None:
    return ()
  return tuple(ids) if isinstance(ids, (list, tuple)) else (int(ids),)
