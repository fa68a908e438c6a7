"""What every searching method's roles share: the search instructions of each syntax, a search
call and its observation as a rollout writes them (for format demonstrations), and the
stratified draw of required searches or hops ('4:3:2' over 9 prompts is exactly 4, 3 and 2)."""

from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from scope_jax import prompts
from scope_jax.retrieval.corpus import Passage, format_passages
from scope_jax.rollout.agent import RolloutConfig


def search_instructions(syntax: str) -> str:
  """How to call the search tool in `syntax` ('xml' <search>, 'qwen' <tool_call> or
  'function_calls' <function_calls>search(query=…))."""
  return prompts.load("search", syntax)


def search_action(query: str, syntax: str) -> str:
  """A search call in the rollout's syntax ('xml' <search>, 'qwen' <tool_call> or
  'function_calls')."""
  if syntax == "xml":
    return f"<search>{query}</search>"
  if syntax == "function_calls":
    return f"<function_calls>search(query={json.dumps(query)})</function_calls>"
  return ('<tool_call>{"name": "search", "arguments": {"query": ' + json.dumps(query) +
          "}}</tool_call>")


def observation_ids(tok, hits: Sequence[Passage], syntax: str, max_obs: int) -> list[int]:
  """Search results as the rollout appends them: wrapped, the body cut to `max_obs` tokens."""
  prefix, suffix = RolloutConfig(syntax=syntax).observation_wrappers()
  body = tok.encode(format_passages(hits), add_special_tokens=False)[:max_obs]
  return (tok.encode(prefix, add_special_tokens=False) + body +
          tok.encode(suffix, add_special_tokens=False))


def stratified(n: int, weights: Sequence[float], rng: np.random.Generator) -> np.ndarray:
  """n category indices in the ratio `weights` (largest remainder), shuffled: '4:3:2' over 9
  prompts is exactly four 0s, three 1s and two 2s."""
  w = np.asarray(weights, np.float64)
  if n < 0 or w.ndim != 1 or not len(w) or (w < 0).any() or w.sum() <= 0:
    raise ValueError(f"stratified needs n >= 0 and non-negative weights with a positive sum; "
                     f"got n={n}, weights={list(weights)}.")
  exact = n * w / w.sum()
  counts = np.floor(exact).astype(int)
  for i in np.argsort(-(exact - counts), kind="stable")[:n - counts.sum()]:
    counts[i] += 1
  out = np.repeat(np.arange(len(w)), counts)
  rng.shuffle(out)
  return out
