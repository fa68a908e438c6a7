"""Per-turn training datums for thinking models (Qwen3's chat template drops earlier
turns' reasoning): one datum per assistant turn, whose context holds the earlier turns with their
<think>…</think> removed and whose trained tokens are that turn's tokens exactly as sampled.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scope_jax.rollout.types import Span, Trajectory

OPEN, CLOSE = "<think>", "</think>"


def strip_think(text: str) -> str:
  """Removes every closed <think>…</think> block and the whitespace after it, in linear time
  (an unclosed <think> is kept: the model never finished it)."""
  out, pos = [], 0
  while True:
    start = text.find(OPEN, pos)
    end = text.find(CLOSE, start + len(OPEN)) if start >= 0 else -1
    if end < 0:
      break
    out.append(text[pos:start])
    pos = end + len(CLOSE)
    while pos < len(text) and text[pos].isspace():
      pos += 1
  out.append(text[pos:])
  return "".join(out)


def context_tokens(text: str, tokenizer) -> list[int]:
  """How an earlier generated turn re-enters the context of later turns: reasoning removed and
  re-tokenized. The rollout (with `strip_think`) and `per_turn_datums` both use this, so a datum's
  context is exactly what the sampler saw."""
  return list(tokenizer.encode(strip_think(text), add_special_tokens=False))


def per_turn_datums(traj: Trajectory, tokenizer) -> list[Trajectory]:
  """Splits a multi-turn trajectory into one single-turn datum per generated turn."""
  out = []
  prompt = traj.tokens[:traj.prompt_len].tolist()
  context: list[int] = list(prompt)
  spans_ctx: list[Span] = [Span(0, len(prompt), "prompt", "")]
  for span in traj.spans:
    if span.kind == "prompt":
      continue
    if span.kind == "generated":
      turn = traj.tokens[span.start:span.end]
      n = len(context)
      tokens = np.concatenate([np.asarray(context, np.int32), turn.astype(np.int32)])
      mask = np.concatenate([np.zeros(n, np.int32), traj.loss_mask[span.start:span.end]])
      logp = np.concatenate([np.zeros(n, np.float32), traj.logprobs[span.start:span.end]])
      turn_span = Span(n, len(tokens), "generated", span.text)
      out.append(dataclasses.replace(traj, tokens=tokens, loss_mask=mask, logprobs=logp,
                                     prompt_len=n, spans=spans_ctx + [turn_span]))
      kept = context_tokens(span.text, tokenizer)
      spans_ctx = spans_ctx + [Span(n, n + len(kept), "context", strip_think(span.text))]
      context += kept
    else:
      piece = traj.tokens[span.start:span.end].tolist()
      spans_ctx = spans_ctx + [Span(len(context), len(context) + len(piece), span.kind, span.text)]
      context += piece
  return out
