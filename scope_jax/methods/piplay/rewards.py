"""π-Play rewards (ALGORITHMS §5): the examiner's difficulty reward with Dr.Zero's format reward,
the student's exact-match outcome, and the privileged information the teacher is shown.

The paper sets r_f "in the same way as the proposer's format reward in Dr.Zero"; its parts follow
Dr.Zero's released reward code where the spec's summary is looser: a turn counts as thinking
only when it opens with <think>, and the tool part is 0 for a multi-hop question with no search
or with an invalid call (the summary's min((1 + calls)/n, 1) applies when every call was valid).

Examiner and student output is untrusted text: tags are found with linear scans over a bounded
tail, and anything malformed scores 0 (it is counted by the method, never raised).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np

from scope_jax.rewards import match
from scope_jax.rollout.parsers import extract_tag

MAX_TEXT = 50_000  # characters of model output looked at (the end: where the final tags are)
HOPS = (1, 2, 3, 4)  # n: the examiner's required hops (n − 1 searches)
HOP_RATIO = (4, 3, 2, 1)  # sampled 4:3:2:1 (App. A)
ANSWER_WORDS_FULL = 5  # Dr.Zero: an answer of at most 5 words scores 1 ...
ANSWER_WORDS_HALF = 10  # ... at most 10 words 0.5, longer 0


@dataclasses.dataclass(frozen=True)
class ExaminerOutput:
  """The examiner's final (question, answer), and why it is malformed when it is."""

  question: str | None
  answer: str | None
  malformed: str | None = None  # 'no_question' | 'no_answer' | 'answer_in_question' | None


def parse_examiner(final_turn: str) -> ExaminerOutput:
  """(question, answer) from the examiner's last turn: both tags present and non-empty, and the
  answer not given away inside the question."""
  text = str(final_turn)[-MAX_TEXT:]
  question, answer = extract_tag(text, "question"), extract_tag(text, "answer")
  if not question:
    return ExaminerOutput(question or None, answer or None, "no_question")
  if not answer or not match.normalize(answer):
    return ExaminerOutput(question, answer or None, "no_answer")
  if match.contains_phrase(question, answer):  # whole words: 'Art' is not in 'start
    return ExaminerOutput(question, answer, "answer_in_question")
  return ExaminerOutput(question, answer)


def think_share(turns: Sequence[str]) -> float:
  """Fraction of turns that open with a <think>…</think> block (Dr.Zero's `^\s*<think>`)."""
  if not turns:
    return 0.0
  def opens(t: str) -> bool:
    t = t[:MAX_TEXT].lstrip()
    return t.startswith("<think>") and t.find("</think>", len("<think>")) >= 0
  return sum(opens(t) for t in turns) / len(turns)


def tool_score(valid_calls: int, attempts: int, hops: int) -> float:
  """Dr.Zero's tool part: 1 for a one-hop question; otherwise min((1 + valid calls)/n, 1) when
  the examiner searched and every call it tried was valid, else 0."""
  if hops <= 1:
    return 1.0
  if valid_calls > 0 and valid_calls == attempts:
    return min((1 + valid_calls) / hops, 1.0)
  return 0.0


def answer_score(answer: str, sources: Sequence[str]) -> float:
  """1 if the answer appears in the source document (its title included) or a tool result and
  has ≤ 5 words, 0.5 if it appears and has ≤ 10 words, else 0; 'yes' and 'no' count as found."""
  gold = match.normalize(answer)
  found = gold in ("yes", "no") or any(gold in match.normalize(s[-MAX_TEXT:]) for s in sources)
  if not gold or not found:
    return 0.0
  words = len(gold.split())
  return 1.0 if words <= ANSWER_WORDS_FULL else 0.5 if words <= ANSWER_WORDS_HALF else 0.0


def format_reward(out: ExaminerOutput, turns: Sequence[str], sources: Sequence[str],
                  valid_calls: int, attempts: int, hops: int) -> dict[str, float]:
  """Dr.Zero's proposer format reward r_f = 0.5·(1 + think + tool + ans)/4 for a well-formed
  (question, answer), else 0; returns r_f with its parts (for the metrics)."""
  parts = {"think": think_share(turns), "tool": tool_score(valid_calls, attempts, hops),
           "ans": answer_score(out.answer, sources) if out.malformed is None else 0.0}
  parts["format"] = (0.5 * (1.0 + parts["think"] + parts["tool"] + parts["ans"]) / 4.0
                     if out.malformed is None else 0.0)
  return parts


def difficulty_reward(k: int, n: int, r_f: float) -> float:
  """r_d = 1[0 < k < n]·(n − k)/(n − 1) + r_f, with k of n student attempts exactly right."""
  if n < 2:
    raise ValueError(f"The difficulty reward needs at least 2 student attempts, got n={n}.")
  return ((n - k) / (n - 1) if 0 < k < n else 0.0) + r_f


def outcome(answer: str | None, gold: str) -> float:
  """The student's reward 1[EM(o, o*)]; no <answer> scores 0."""
  return match.exact_match(answer, gold) if answer else 0.0


# ------------------------------------------------------------------------ privileged information

PRIVILEGED = ("qcp", "gt", "gt_hops", "partial_qcp", "none")  # Table 4's teacher variants


def half_path(text: str, rng: np.random.Generator) -> str:
  """A random half of `text` by characters, in order: sentences and lines taken in a random order
  while they fit in half the characters, so a 1-hop path (task line and one answer turn) loses
  half of itself too. Where no unit fits (one long line), its first half."""
  units = [u for u in re.split(r"(?<=[.!?\n])", text) if u]
  budget, kept, used = len(text) // 2, set(), 0
  for i in rng.permutation(len(units)):
    if used + len(units[i]) <= budget:
      kept.add(int(i))
      used += len(units[i])
  if not kept:
    return text[:budget]
  return "".join(u for i, u in enumerate(units) if i in kept)


def privileged_text(kind: str, qcp_pieces: Sequence[str], answer: str, hops: int,
                    rng: np.random.Generator | None = None) -> str:
  """What the teacher is shown between the '=====' rules of its prompt.

  qcp: the examiner's whole question-construction path (its task line with the source document,
  reasoning, searches and results, and the final question and answer); partial_qcp: half of it
  (Table 4's "randomly truncating half"), see `half_path`; gt: the answer alone; gt_hops: the
  answer and the hop count.
  """
  if kind == "qcp":
    return "".join(qcp_pieces)
  if kind == "partial_qcp":
    if rng is None:
      raise ValueError("partial_qcp needs a random generator.")
    return half_path("".join(qcp_pieces), rng)
  if kind == "gt":
    return f"<answer> {answer} </answer>"
  if kind == "gt_hops":
    return f"The question takes n = {hops} hops.\n<answer> {answer} </answer>"
  raise ValueError(f"Unknown privileged information {kind!r}; choose one of: "
                   f"{', '.join(PRIVILEGED)}.")
