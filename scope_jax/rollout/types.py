"""Host-side records of multi-turn rollouts."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

import numpy as np


class SearchTool(Protocol):
  """The rollout's tool interface: one batched call, one observation text per query."""

  def __call__(self, queries: Sequence[str]) -> list[str]: ...


@dataclasses.dataclass
class Span:
  start: int  # token offsets into Trajectory.tokens, [start, end)
  end: int
  kind: str  # 'prompt' | 'generated' | 'observation'
  text: str = ""


@dataclasses.dataclass
class ToolCall:
  turn: int
  queries: list[str]
  result: str = ""
  error: str | None = None


@dataclasses.dataclass
class Trajectory:
  """One row of a rollout: every token of the context, and which of them the policy generated."""

  tokens: np.ndarray  # [T] int32: prompt + generated turns + observations
  loss_mask: np.ndarray  # [T] int32: 1 exactly on tokens the policy generated
  logprobs: np.ndarray  # [T] float32: sampled log-prob on generated tokens, 0 elsewhere
  prompt_len: int
  spans: list[Span]
  tool_calls: list[ToolCall]
  final_tag: str | None  # e.g. 'answer' or 'task' when the row ended with a final element
  answer: str | None  # the final element's content
  finish_reason: str  # 'final' | 'eos' | 'length' | 'max_turns' | 'context'
  num_invalid: int = 0
  prompt_index: int = 0
  sample_index: int = 0
  meta: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def num_searches(self) -> int:
    return sum(1 for c in self.tool_calls if c.error is None)

  @property
  def response_tokens(self) -> np.ndarray:
    return self.tokens[self.prompt_len:]

  def generated_turns(self) -> list[Span]:
    return [s for s in self.spans if s.kind == "generated"]

  def response_text(self) -> str:
    return "".join(s.text for s in self.spans if s.kind != "prompt")

  def turn_texts(self) -> list[str]:
    """The text of each turn the policy generated (observations left out)."""
    return [s.text for s in self.spans if s.kind == "generated"]

  def final(self, tag: str) -> str | None:
    """The content of the final element `<tag>` the row ended with; None if it ended otherwise."""
    return self.answer if self.final_tag == tag else None
