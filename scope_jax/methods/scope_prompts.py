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


def _load(name: str) -> str:
  return prompts.load("scope", name)


def search_instructions(syntax: str) -> str:
  return _load(f"search_{syntax}")


def document_text(passage: Passage, max_chars: int) -> str:
  return passage.text[:max_chars]


def challenger_prompt(passage: Passage, task_type: str, num_searches: int, syntax: str,
                      max_doc_chars: int) -> str:
  return prompts.render(_load("challenger"), task_type=TASK_TYPES[task_type],
                        task_description=_load(f"task_{task_type}"), title=passage.title,
                        document=document_text(passage, max_doc_chars), num_searches=num_searches,
                        search_instructions=search_instructions(syntax))


def solver_prompt(question: str, max_searches: int, syntax: str) -> str:
  return prompts.render(_load("solver"), question=question, max_searches=max_searches,
                        search_instructions=search_instructions(syntax))


def gate_prompts(task: str, passage: Passage, max_doc_chars: int) -> tuple[str, str]:
  """(entity identifiability, source relevance) Judge prompts for one task."""
  return (prompts.render(_load("gate_entity"), task=task),
          prompts.render(_load("gate_source"), task=task, title=passage.title,
                         document=document_text(passage, max_doc_chars)))


def rubric_prompt(task: str, passage: Passage, max_doc_chars: int) -> str:
  return prompts.render(_load("rubric"), task=task, title=passage.title,
                        document=document_text(passage, max_doc_chars))


def grader_prompt(task: str, criterion: str, response: str) -> str:
  return prompts.render(_load("grader"), task=task, criterion=criterion, response=response)


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
