"""π-Play's prompts (App. D): the examiner, the teacher (which sees the question-construction
path, QCP) and the student, for the thinking (Qwen3-4B/8B) and Instruct variants.

The paper's prompts (`prompts/piplay/`) are written for Qwen3's native `<tool_call>` syntax, with
the tool's system prompt (Fig. 9); for the XML `<search>` syntax the same text is used with the
tags swapped (`xml_syntax`). The `compact` style (`prompts/piplay_compact/`) has the same roles,
fields and output tags in a few lines, for the CPU demo's small model.
"""

from __future__ import annotations

import re

from scope_jax import prompts
from scope_jax.retrieval.corpus import Passage
from scope_jax.rollout.search_agent import search_instructions

STYLES = {"paper": "piplay", "compact": "piplay_compact"}  # prompt style → template directory
VARIANTS = ("thinking", "instruct")  # Qwen3-4B/8B prompts, or Qwen3-4B-Instruct-2507's
_JSON_CALL = re.compile(  # the paper's example calls: <tool_call>\n{"name": "search", ...}\n</tool_call>
    r'<tool_call>?(?:\\n|\s)*\{"name": "search", "arguments": \{"query_list": \["([^"\]]*)"\]\}\}'
    r'(?:\\n|\s)*</tool_call>')


def xml_syntax(text: str) -> str:
  """The paper's `<tool_call>` / `<tool_response>` prompt text in Search-R1's `<search>` /
  `<information>` tags (example calls become `<search> query </search>`)."""
  text = _JSON_CALL.sub(lambda m: f"<search> {m.group(1)} </search>", text)
  for a, b in (("<tool_call>", "<search>"), ("</tool_call>", "</search>"),
               ("<tool_response>", "<information>"), ("</tool_response>", "</information>")):
    text = text.replace(a, b)
  return text


class Prompts:
  """π-Play's role prompts in one style, variant and search syntax. Each returns a `Prompt` whose
  inserted content (document, QCP, question) a role may cut to its limit, never the template."""

  def __init__(self, style: str = "paper", variant: str = "thinking", syntax: str = "qwen",
               max_doc_chars: int = 4000):
    if style not in STYLES:
      raise ValueError(f"Unknown prompt style {style!r}; use one of {sorted(STYLES)}.")
    if variant not in VARIANTS:
      raise ValueError(f"Unknown prompt variant {variant!r}; use one of {list(VARIANTS)}.")
    self.style, self.variant, self.syntax = style, variant, syntax
    self.max_doc_chars = max_doc_chars

  def template(self, role: str) -> str:
    name = role if self.style == "compact" or role in ("examiner", "qcp_header") else \
        f"{role}_{self.variant}"
    text = prompts.load(STYLES[self.style], name)
    if self.style == "compact" and "{search_instructions}" in text:
      text = prompts.render(text, search_instructions=search_instructions(self.syntax))
    return xml_syntax(text) if self.syntax == "xml" else text

  def system(self, role: str = "") -> str | None:
    """The tool's system prompt (Fig. 9), every role's, for the paper's prompts in the native
    syntax."""
    if self.style == "paper" and self.syntax == "qwen":
      return prompts.load("piplay", "system_qwen")
    return None

  def document(self, passage: Passage) -> str:
    return f'(Title: "{passage.title}") {passage.text}'[:self.max_doc_chars]

  def qcp_header(self, passage: Passage, hops: int) -> str:
    """The examiner's task line: the first piece of the question-construction path."""
    return prompts.render(self.template("qcp_header"), hops=hops, document=self.document(passage))

  def examiner(self, passage: Passage, hops: int) -> prompts.Prompt:
    return prompts.Prompt(self.template("examiner"),
                          {"qcp_header": self.qcp_header(passage, hops)}, ("qcp_header",))

  def teacher(self, privileged: str, question: str) -> prompts.Prompt:
    return prompts.Prompt(self.template("teacher"), {"demonstration": privileged,
                                                     "question": question}, ("demonstration",))

  def student(self, question: str) -> prompts.Prompt:
    return prompts.Prompt(self.template("student"), {"question": question}, ("question",))
