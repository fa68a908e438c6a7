"""Two judge formats, one definition for every reader: the methods that train or consult a judge
and held-out evaluation parse and prompt the same way.

  answer match     do two answers to one problem agree?  ([[YES]] / [[NO]], the last one written)
  criterion grade  does a response meet one criterion?   (<score>1</score> / <score>0</score>)

Each format has a template in the paper's wording (`prompts/judge/`) and a compact one
(`prompts/judge_compact/`), and a parser that reads untrusted model output with a bounded scan.
"""

from __future__ import annotations

import re

from scope_jax import prompts

ANSWER_MATCH = "answer_match"  # fields: problem, answer_1, answer_2
CRITERION_GRADE = "criterion_grade"  # fields: task, criterion, response
FORMATS = (ANSWER_MATCH, CRITERION_GRADE)
STYLES = {"paper": "judge", "compact": "judge_compact"}  # prompt style → template directory
VERDICT_CHARS = 20_000  # a verdict is read from this many characters at the end of the text
GRADE_CHARS = 50_000  # likewise a grade
_VERDICT = re.compile(r"\[\[\s*(YES|NO)\s*\]\]", re.IGNORECASE)
_SCORE = re.compile(r"<score>\s*([01])\s*</score>")


def template(fmt: str, style: str = "paper") -> str:
  """The prompt template of judge format `fmt` (`FORMATS`) in prompt style `style` (`STYLES`)."""
  if fmt not in FORMATS:
    raise ValueError(f"Unknown judge format {fmt!r}; use one of {FORMATS}.")
  if style not in STYLES:
    raise ValueError(f"Unknown prompt style {style!r}; use one of {sorted(STYLES)}.")
  return prompts.load(STYLES[style], fmt)


def parse_verdict(text: str) -> int | None:
  """1 for [[YES]], 0 for [[NO]] (the last one written), None when there is no verdict."""
  found = _VERDICT.findall(str(text)[-VERDICT_CHARS:])
  if not found:
    return None
  return 1 if found[-1].upper() == "YES" else 0


def parse_binary_grade(text: str) -> int | None:
  """A judge's strict binary verdict on one criterion: the last <score>0|1</score>."""
  found = _SCORE.findall(str(text)[-GRADE_CHARS:])
  return int(found[-1]) if found else None


PARSERS = {ANSWER_MATCH: parse_verdict, CRITERION_GRADE: parse_binary_grade}
