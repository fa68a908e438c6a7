"""SCOPE's prompts (templates in `prompts/scope/`, written from the paper's App. H descriptions;
the grader's is the shared criterion-grade judge, `rewards.judges`) and its prompt mix: task
types and the 4:3:2 stratified number of required searches (App. G).

Only the search action differs between syntaxes ('xml' `<search>` for Qwen2.5, 'qwen'
`<tool_call>` for Qwen3, 'function_calls' for OLMo-3); tasks, answers and every Judge prompt use
the same XML tags. The Challenger's task is the plain `<task>` text (as released) or a
`<question>` inside it (`scope.task_form`).
"""

from __future__ import annotations

from typing import Sequence

from scope_jax import prompts
from scope_jax.retrieval.corpus import Passage
from scope_jax.rewards import judges
from scope_jax.rollout.search_agent import search_instructions

TASK_TYPES = {  # name → how prompts call it; creative writing is defined but off by default
    "longform_qa": "long-form QA",
    "summarisation": "summarisation",
    "planning": "planning",
    "writing": "writing",
    "creative_writing": "creative writing",
}
DEFAULT_TASK_TYPES = ("longform_qa", "summarisation", "planning", "writing")


STYLES = {"paper": "scope", "compact": "scope_compact"}  # prompt style → template directory
TASK_PLACEHOLDER = {"paper": "the complete task, as the assistant will read it",
                    "compact": "the task"}


def rubric_size(max_criteria: int) -> str:
  """How many criteria the compact rubric prompt asks for: the paper's 3 to 5, or one where the
  rubric holds a single criterion (`scope.max_criteria=1`, a closed-class fact's). The paper
  style's prompt always asks for 3 to 5, as its example rubric shows."""
  return "one criterion" if max_criteria == 1 else "3 to 5 criteria"


def task_output(text: str, form: str) -> str:
  """A task as the Challenger writes it: the released plain `<task>` or one holding a
  `<question>` (`scope.task_form`)."""
  if form == "plain":
    return f"<task>\n{text}\n</task>"
  return f"<task>\n<question>{text}</question>\n</task>"


def _shared(name: str) -> str:
  """Task-type descriptions, the same in every style."""
  return prompts.load("scope", name)


class Prompts:
  """SCOPE's role prompts in one style: 'paper' (App. H) or 'compact' (the same roles, fields and
  output tags in a few lines, for the demo's small model: short prompts are quicker to warm up on
  and put the title it copies close to where it writes). Each returns a `Prompt` whose inserted
  content (documents, tasks, answers) a role may cut to its prompt limit, never the template."""

  def __init__(self, style: str = "paper", syntax: str = "xml", max_doc_chars: int = 4000,
               task_form: str = "question", max_criteria: int = 5):
    if style not in STYLES:
      raise ValueError(f"Unknown prompt style {style!r}; use one of {sorted(STYLES)}.")
    self.style, self.syntax, self.max_doc_chars = style, syntax, max_doc_chars
    self.task_form, self.rubric_size = task_form, rubric_size(max_criteria)

  def _prompt(self, name: str, fit: tuple[str, ...], **fields) -> prompts.Prompt:
    return prompts.Prompt(prompts.load(STYLES[self.style], name), fields, fit)

  def document(self, passage: Passage) -> str:
    return passage.text[:self.max_doc_chars]

  def challenger(self, passage: Passage, task_type: str, num_searches: int) -> prompts.Prompt:
    return self._prompt("challenger", ("document",), task_type=TASK_TYPES[task_type],
                        task_description=_shared(f"task_{task_type}"), title=passage.title,
                        document=self.document(passage), num_searches=num_searches,
                        search_instructions=search_instructions(self.syntax),
                        task_block=task_output(TASK_PLACEHOLDER[self.style], self.task_form))

  def solver(self, question: str, max_searches: int) -> prompts.Prompt:
    return self._prompt("solver", ("question",), question=question, max_searches=max_searches,
                        search_instructions=search_instructions(self.syntax))

  def gates(self, task: str, passage: Passage) -> tuple[prompts.Prompt, prompts.Prompt]:
    """(entity identifiability, source relevance) Judge prompts for one task."""
    return (self._prompt("gate_entity", ("task",), task=task),
            self._prompt("gate_source", ("document", "task"), task=task, title=passage.title,
                         document=self.document(passage)))

  def rubric(self, task: str, passage: Passage, found: Sequence[str] = ()) -> prompts.Prompt:
    """The rubric Judge's prompt: the source document and, as released, the search results the
    Challenger read (`found`; the paper's text gives it the document alone)."""
    document = "\n\n---\n\n".join([self.document(passage), *found])
    size = {"rubric_size": self.rubric_size} if self.style == "compact" else {}
    return self._prompt("rubric", ("document", "task"), task=task, title=passage.title,
                        document=document, **size)

  def grader(self, task: str, criterion: str, response: str) -> prompts.Prompt:
    return prompts.Prompt(judges.template(judges.CRITERION_GRADE, self.style),
                          dict(task=task, criterion=criterion, response=response),
                          ("response", "task", "criterion"))
