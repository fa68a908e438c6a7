"""SCOPE's prompts (templates in `prompts/scope/`, written from the paper's App. H descriptions)
and its prompt mix: task types and the 4:3:2 stratified number of required searches (App. G).

Only the search action differs between syntaxes ('xml' `<search>` for Qwen2.5, 'qwen'
`<tool_call>` for Qwen3); tasks, answers and every Judge prompt use the same XML tags.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from scope_jax import prompts
from scope_jax.retrieval.corpus import Passage

TASK_TYPES = {  # name → how prompts call it; creative writing is defined but off by default
    "longform_qa": "long-form QA",
    "summarisation": "summarisation",
    "planning": "planning",
    "writing": "writing",
    "creative_writing": "creative writing",
}
DEFAULT_TASK_TYPES = ("longform_qa", "summarisation", "planning", "writing")


STYLES = {"paper": "scope", "compact": "scope_compact"}  # prompt style → template directory


def _shared(name: str) -> str:
  """Task-type descriptions and search instructions, the same in every style."""
  return prompts.load("scope", name)


def search_instructions(syntax: str) -> str:
  return _shared(f"search_{syntax}")


class Prompts:
  """SCOPE's role prompts in one style: 'paper' (App. H) or 'compact' (the same roles, fields and
  output tags in a few lines, for the demo's small model: short prompts are quicker to warm up on
  and put the title it copies close to where it writes). Each returns a `Prompt` whose inserted
  content (documents, tasks, answers) a role may cut to its prompt limit, never the template."""

  def __init__(self, style: str = "paper", syntax: str = "xml", max_doc_chars: int = 4000):
    if style not in STYLES:
      raise ValueError(f"Unknown prompt style {style!r}; use one of {sorted(STYLES)}.")
    self.style, self.syntax, self.max_doc_chars = style, syntax, max_doc_chars

  def _prompt(self, name: str, fit: tuple[str, ...], **fields) -> prompts.Prompt:
    return prompts.Prompt(prompts.load(STYLES[self.style], name), fields, fit)

  def document(self, passage: Passage) -> str:
    return passage.text[:self.max_doc_chars]

  def challenger(self, passage: Passage, task_type: str, num_searches: int) -> prompts.Prompt:
    return self._prompt("challenger", ("document",), task_type=TASK_TYPES[task_type],
                        task_description=_shared(f"task_{task_type}"), title=passage.title,
                        document=self.document(passage), num_searches=num_searches,
                        search_instructions=search_instructions(self.syntax))

  def solver(self, question: str, max_searches: int) -> prompts.Prompt:
    return self._prompt("solver", ("question",), question=question, max_searches=max_searches,
                        search_instructions=search_instructions(self.syntax))

  def gates(self, task: str, passage: Passage) -> tuple[prompts.Prompt, prompts.Prompt]:
    """(entity identifiability, source relevance) Judge prompts for one task."""
    return (self._prompt("gate_entity", ("task",), task=task),
            self._prompt("gate_source", ("document", "task"), task=task, title=passage.title,
                         document=self.document(passage)))

  def rubric(self, task: str, passage: Passage) -> prompts.Prompt:
    return self._prompt("rubric", ("document", "task"), task=task, title=passage.title,
                        document=self.document(passage))

  def grader(self, task: str, criterion: str, response: str) -> prompts.Prompt:
    return self._prompt("grader", ("response", "task", "criterion"), task=task,
                        criterion=criterion, response=response)


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
