"""Vocabulary rows a checkpoint never trained, and a start for them before a warm-up.

A released vocabulary reserves ids it never trains: Qwen2.5-Coder-0.5B-Instruct's `<tool_call>`
and `</tool_call>` rows are the same vector as its ~280 padding rows (norm 0.32). A warm-up that
teaches such a token can only push the model's hidden state towards the fill vector, which
raises every copy at once: after 24 steps the model writes a random rare token where the tag
belongs. Each untrained row a warm-up's demonstrations use starts instead from the mean of the
rows of its own spelling as plain text (`<` + `tool_call>`), as new tokens are commonly
initialised, so the fit sharpens a row that already points where the text does.
"""

from __future__ import annotations

from typing import Iterable

import jax.numpy as jnp
import numpy as np

from scope_jax.tokenizer import encode_plain

FILL_COPIES = 8  # a row equal to this many others is the vocabulary's untrained fill
SAME = 1e-4  # "equal" up to a quantised checkpoint's rounding: norms within 0.01%, cosine
# within 1e-4 of 1 (the 0.5B GGUF's `<tool_call>` row: cosine 1 - 2e-6 with its padding rows)


def untrained(E_VD: np.ndarray, ids: Iterable[int]) -> list[int]:
  """Those of `ids` whose row of `E_VD` is the same vector as at least `FILL_COPIES` other rows,
  to `SAME` (a trained row is never another's near copy)."""
  norms_V = np.linalg.norm(E_VD, axis=1)
  out = []
  for i in sorted({int(x) for x in ids}):
    near = np.flatnonzero(np.abs(norms_V - norms_V[i]) <= SAME * norms_V[i])
    if len(near) <= FILL_COPIES:
      continue
    cos = E_VD[near] @ E_VD[i] / np.maximum(norms_V[near] * norms_V[i], 1e-30)
    if (cos >= 1 - SAME).sum() > FILL_COPIES:
      out.append(i)
  return out


def spelling(tokenizer, token_id: int) -> list[int]:
  """The ids of a token's text written as plain text: its first character, then the rest, so
  that the added token itself cannot match (`<tool_call>` → `<`, `tool`, `_call`, `>`)."""
  text = tokenizer.decode([token_id], skip_special_tokens=False)
  if len(text) < 2:
    return []
  return encode_plain(tokenizer, text[:1]) + encode_plain(tokenizer, text[1:])


def seed_untrained(params: dict, config, tokenizer, ids: Iterable[int]) -> tuple[dict, list[int]]:
  """`params` with each untrained row among `ids` (in the embedding, and the output projection
  when untied) set to the mean of its spelling's rows; returns (params, the ids seeded). A row
  whose spelling is itself untrained, or an embedding not on this process, is left as it is."""
  embed = params["embed"]
  if not getattr(embed, "is_fully_addressable", True):
    return params, []
  E_VD = np.asarray(embed, np.float32)
  fill = untrained(E_VD, ids)
  spelled = {i: spelling(tokenizer, i) for i in fill}
  spelled = {i: s for i, s in spelled.items() if s and not set(untrained(E_VD, s))}
  if not spelled:
    return params, []
  params = dict(params)
  names = ["embed"] + ([] if config.tie_embeddings else ["lm_head"])
  for name in names:
    table_VD = params[name]
    rows_KD = np.stack([np.asarray(table_VD[jnp.asarray(s)], np.float32).mean(0)
                        for s in spelled.values()])
    params[name] = table_VD.at[jnp.asarray(list(spelled))].set(
        jnp.asarray(rows_KD, table_VD.dtype))
  return params, list(spelled)
