"""SCOPE rewards (ALGORITHMS §2): format scores, difficulty, length penalty, search reward, rubric
parsing and grading, quality gates. Judge and policy output is untrusted text; anything malformed
is reported (``None`` / ``malformed``), never raised.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

from scope_jax.rewards.judges import parse_binary_grade  # noqa: F401 — the grader's format
from scope_jax.rollout.parsers import extract_tag
from scope_jax.rollout.types import Trajectory

LENGTH_FULL = 1024  # answers up to this many tokens keep the full rubric reward
LENGTH_FLOOR_AT = 2048  # from here on the reward is scaled by LENGTH_FLOOR
LENGTH_FLOOR = 0.05
PRIORITIES = {"critical": 1.0, "important": 1.0, "bonus": 1.0}  # uniform weights (paper, w_k = 1)
MAX_TEXT = 50_000


# ------------------------------------------------------------------------------- difficulty

def f_diff(g_bar: float, tau: float = 0.5) -> float:
  """Tent difficulty: max(0, 1 − |ḡ − τ| / min(τ, 1 − τ)); 1 at τ, 0 at 0 and 1."""
  return max(0.0, 1.0 - abs(g_bar - tau) / min(tau, 1.0 - tau))


def in_difficulty_window(g_bar: float, low: float = 0.2, high: float = 0.8) -> bool:
  """Task-set filter: keep tasks whose mean rubric score is within [low, high]."""
  return low <= g_bar <= high


def rubric_key(criteria) -> str:
  """What makes two tasks' rubrics the same: their criteria's texts, case and order aside."""
  return " | ".join(sorted(" ".join(c.text.lower().split()) for c in criteria or []))


def length_penalty(num_tokens: int, full: int = LENGTH_FULL, floor_at: int = LENGTH_FLOOR_AT,
                   floor: float = LENGTH_FLOOR) -> float:
  """Cosine length penalty L(n): 1 up to `full`, `floor` from `floor_at`, cosine in between."""
  if num_tokens <= full:
    return 1.0
  if num_tokens >= floor_at:
    return floor
  t = (num_tokens - full) / (floor_at - full)
  return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * t))


def search_reward(valid_searches: int, target: int = 3) -> float:
  """r_search = min(valid searches / 3, 1)."""
  return min(valid_searches / target, 1.0)


# ------------------------------------------------------------------------------- format scores

THINK_RULES = ("closed", "opening", "tag")


def think_share(turns: Sequence[str], rule: str = "closed") -> float:
  """Fraction of assistant turns that think: 'closed', a <think>…</think> block anywhere (App.
  F.1); 'opening', one the turn opens with (the released Solver reward's `^\\s*<think>(.*?)
  </think>`); 'tag', a `<think>` anywhere, closed or not (the released Challenger reward's
  `re.search("<think>", content)` on the original messages)."""
  if rule not in THINK_RULES:
    raise ValueError(f"Unknown think rule {rule!r}; valid: {', '.join(THINK_RULES)}.")
  if not turns:
    return 0.0
  if rule == "opening":
    return sum(t.lstrip().startswith("<think>") and _has_think(t.lstrip()[:MAX_TEXT])
               for t in turns) / len(turns)
  if rule == "tag":
    return sum("<think>" in t[:MAX_TEXT] for t in turns) / len(turns)
  return sum(_has_think(t[:MAX_TEXT]) for t in turns) / len(turns)


def _has_think(text: str) -> bool:
  """A '<think>' later closed by '</think>' (two linear scans, no regex backtracking)."""
  start = text.find("<think>")
  return start >= 0 and text.find("</think>", start + len("<think>")) >= 0


TASK_FORMS = ("plain", "question")  # the released <task>text</task>; <task><question>…</question>


def task_text(text: str, form: str = "question") -> str | None:
  """The task a Challenger turn wrote: the text of its last <task> ('plain', as the released
  `extract_task` reads it) or that <task>'s <question> ('question'); None if absent or empty."""
  task = extract_tag(text[-MAX_TEXT:], "task")
  if task and form == "question":
    task = extract_tag(task, "question")
  return task or None


def well_formed_task(text: str, form: str = "question") -> bool:
  return task_text(text, form) is not None


def task_question(turns: Sequence[str], form: str = "question") -> str | None:
  """The task of a well-formed <task> in the last turn (None otherwise)."""
  return task_text(turns[-1], form) if turns else None


def challenger_format(traj: Trajectory, required_searches: int, released: bool = False,
                      form: str = "question") -> float:
  """(think + tool + structure) / 3; tool = valid searches / required, clamped to [0, 1]. As
  released: a turn thinks when it has a `<think>` anywhere, and tool = max(valid − invalid, 0) /
  required (an invalid call or a failed search cancels a valid one)."""
  turns = traj.turn_texts()
  searches = traj.num_searches
  if released:
    invalid = traj.num_invalid + sum(c.error is not None for c in traj.tool_calls)
    searches = max(searches - invalid, 0)
  tool = min(max(searches / max(required_searches, 1), 0.0), 1.0)
  structure = float(bool(turns) and well_formed_task(turns[-1], form))
  return (think_share(turns, "tag" if released else "closed") + tool + structure) / 3.0


def solver_format(traj: Trajectory, released: bool = False) -> float:
  """(think + tool + answer) / 3; tool = min(valid searches in non-final turns / (turns − 1), 1).
  As released, a turn thinks only when it opens with <think>…</think>."""
  turns = traj.turn_texts()
  if not turns:
    return 0.0
  final_turn = len(turns) - 1
  searches = sum(1 for c in traj.tool_calls if c.error is None and c.turn < final_turn)
  tool = min(searches / final_turn, 1.0) if final_turn > 0 else 0.0
  answer = float(bool(extract_tag(turns[-1][-MAX_TEXT:], "answer")))
  return (think_share(turns, "opening" if released else "closed") + tool + answer) / 3.0


# ------------------------------------------------------------------------------- rubrics

@dataclasses.dataclass(frozen=True)
class Criterion:
  text: str
  priority: str = "important"

  @property
  def weight(self) -> float:
    return PRIORITIES.get(self.priority, 1.0)


_RUBRIC_LINE = re.compile(  # matched on a stripped line: no trailing-whitespace backtracking
    r"(?:[-*•]|\d+[.)])?\s*(?:\[(critical|important|bonus)\]|\((critical|important|bonus)\)|"
    r"(critical|important|bonus)\s*[:\-–])?\s*(.+)", re.IGNORECASE)


def parse_rubrics(text: str, min_items: int = 3, max_items: int = 5) -> list[Criterion] | None:
  """Criteria from a <rubric> block (or the whole text): one per line, an optional priority.

  Returns None when fewer than `min_items` criteria are found (a malformed rubric); extra
  criteria beyond `max_items` are dropped.
  """
  body = extract_tag(str(text)[-MAX_TEXT:], "rubric") or str(text)[-MAX_TEXT:]
  items = []
  for line in body.splitlines():
    line = line.strip()
    if len(line) < 8 or line.startswith("<"):  # too short, or a tag (<rubric>, special tokens)
      continue
    m = _RUBRIC_LINE.fullmatch(line)
    if not m or not m.group(4) or len(m.group(4)) < 8:
      continue
    priority = (m.group(1) or m.group(2) or m.group(3) or "important").lower()
    items.append(Criterion(m.group(4).strip(), priority))
    if len(items) == max_items:
      break
  if len(items) < min_items:
    return None
  return items[:max_items]


def rubric_grade(criteria: Sequence[Criterion], verdicts: Sequence[int | None],
                 min_coverage: float = 0.5) -> float | None:
  """g = Σ w_k b_k / Σ w_k. Unparsed verdicts count as 0 if at least `min_coverage` of the
  criteria were parsed; otherwise the grade is discarded (None)."""
  if not criteria or len(verdicts) != len(criteria):
    return None
  parsed = sum(v is not None for v in verdicts)
  if parsed / len(criteria) < min_coverage:
    return None
  total = sum(c.weight for c in criteria)
  return sum(c.weight * (v or 0) for c, v in zip(criteria, verdicts)) / total


def quality_gate(entity: int | None, source_relevance: int | None) -> tuple[bool, bool]:
  """(passed, malformed) from the two gate verdicts (entity identifiability, source relevance),
  each a parsed <score>: passes iff both parsed and both are 1; an unparsed one fails the gate."""
  if entity is None or source_relevance is None:
    return False, True
  return entity + source_relevance >= 2, False


# ------------------------------------------------------------------------------- totals

def mean_grade(grades: Sequence[float | None], answered: Sequence[bool],
               answered_only: bool = False) -> float | None:
  """ḡ over a task's Solver rollouts: discarded grades (None) left out, and, as released, the
  rollouts that gave no answer too (the paper's text counts them as g = 0); None if none is left."""
  kept = [g for g, a in zip(grades, answered) if g is not None and (a or not answered_only)]
  return sum(kept) / len(kept) if kept else None


def challenger_reward(fmt: float, passed_gate: bool, g_bar: float | None,
                      formed: bool = True) -> float:
  """R_C = 0.5·r_fmt + 1.0·1[QG]·f_diff(ḡ); 0 when the format score is 0, or (as released) when
  the task could not be read or its rubric was malformed (`formed` False)."""
  if fmt <= 0.0 or not formed:
    return 0.0
  diff = f_diff(g_bar) if (passed_gate and g_bar is not None) else 0.0
  return 0.5 * fmt + diff


def solver_reward(grade: float | None, answer_tokens: int, fmt: float, searches: int) -> float:
  """R_S = 1.0·L(|a|)·g + 0.5·r_fmt + 0.1·r_search (a discarded grade counts as 0)."""
  return length_penalty(answer_tokens) * (grade or 0.0) + 0.5 * fmt + 0.1 * search_reward(searches)
