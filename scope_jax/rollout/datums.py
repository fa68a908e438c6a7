"""Per-turn training datums for thinking models (SCOPE §3; Qwen3's chat template drops earlier
turns' reasoning): one datum per assistant turn, whose context holds the earlier turns with their
<think>…</think> removed and whose trained tokens are that turn's tokens exactly as sampled.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from scope_jax.rollout.types import Span, Trajectory

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_think(text: str) -> str:
  return _THINK.sub("", text)


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
      kept = tokenizer.encode(strip_think(span.text), add_special_tokens=False)
      spans_ctx = spans_ctx + [Span(n, n + len(kept), "context", strip_think(span.text))]
      context += kept
    else:
      piece = traj.tokens[span.start:span.end].tolist()
      spans_ctx = spans_ctx + [Span(len(context), len(context) + len(piece), span.kind, span.text)]
      context += piece
  return out
