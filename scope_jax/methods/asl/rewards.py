"""ASL rewards and rules (ALGORITHMS §4, ASL.txt §3): parsing the Prompt Generator's (x, a) and
the GRM's verdict, the validity gate, the PG reward (binary entropy, or AZR's 1 − p̄), the GRM's
agreement reward, the PM's HARDER/EASIER flag, and the reward-curve slope that ends the GRM and
PM phases. Model output is untrusted text: malformed output is reported (an error name or
``None``), never raised.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Sequence

import numpy as np

from scope_jax.rewards import match
from scope_jax.rollout.parsers import extract_tag

MAX_TEXT = 20_000  # characters of model output looked at (the end: where the final tags are)
MAX_QUESTION_CHARS = 2_000
MAX_ANSWER_CHARS = 500
HARDER, EASIER = "HARDER", "EASIER"
PG_REWARDS = ("entropy", "azr")
# How a GRM verdict becomes a score: 'released' (asl3.py's `compute_score` for the gate, r_PM
# and r_PG, and its sub-string match of the stored label for the GRM phase's reward) or 'paper'
# (one strict parse of `<answer>conclusion: correct/wrong</answer>`, r_GRM = 1[ŝ = s]).
VERDICT_RULES = ("released", "paper")
_ANSWER = re.compile(r".*<answer>(.*?)</answer>", re.DOTALL)
# "conclusion: correct/wrong" (Fig. 12); bounded: at most 40 characters between the two words.
# A copied "correct/wrong" placeholder is no verdict.
_VERDICT = re.compile(r"conclusion\s{0,4}[:：]?\s{0,40}\**\s{0,4}(correct|wrong|incorrect)\b(?!\s{0,4}/)",
                      re.IGNORECASE)
PG_ERRORS = ("no_question", "empty_question", "no_answer", "empty_answer", "answer_in_question",
             "too_long")


# ------------------------------------------------------------------------------- parsing

@dataclasses.dataclass(frozen=True)
class Task:
  """A generated question x and its reference answer a (both stripped, non-empty)."""

  question: str
  answer: str


def parse_task(text: str) -> tuple[Task | None, str | None]:
  """(Task, None) from the PG's final turn `<question>x</question> <answer>a</answer>`, or
  (None, error) with error in PG_ERRORS: no or empty <question>, no or empty <answer>, an answer
  inside the question (an <answer> tag in it, or the answer's words leaked into it), too long."""
  text = str(text)[-MAX_TEXT:]
  question = extract_tag(text, "question")
  if question is None:
    return None, "no_question"
  if not question:
    return None, "empty_question"
  if "<answer>" in question or "</answer>" in question:
    return None, "answer_in_question"
  answer = extract_tag(text[text.rfind("</question>"):], "answer")
  if answer is None:
    return None, "no_answer"
  if not answer:
    return None, "empty_answer"
  if len(question) > MAX_QUESTION_CHARS or len(answer) > MAX_ANSWER_CHARS:
    return None, "too_long"
  if answer_leaked(question, answer):
    return None, "answer_in_question"
  return Task(question, answer), None


def answer_leaked(question: str, answer: str) -> bool:
  """True if the normalised answer occurs as whole words in the normalised question."""
  return match.contains_phrase(question, answer)


def parse_verdict(text: str | None) -> int | None:
  """The GRM's score from `<answer>conclusion: correct/wrong</answer>`: 1, 0, or None when
  there is no <answer> or no conclusion in it (malformed)."""
  if text is None:
    return None
  body = extract_tag(str(text)[-MAX_TEXT:], "answer")
  if body is None:
    return None
  found = _VERDICT.search(body[:MAX_ANSWER_CHARS])
  if found is not None:
    return int(found.group(1).lower() == "correct")
  # A bare verdict, `<answer>correct</answer>`, counts too (the released GRM-phase reward reads
  # the word without the label; its scorer, `released_verdict`, gives such an answer 0).
  bare = body.strip().strip(".!*").strip().lower()
  return {"correct": 1, "wrong": 0, "incorrect": 0}.get(bare)


def released_verdict(text: str | None) -> int | None:
  """The released scorer (`compute_score`): the lower-cased text after the last "conclusion"
  scores 0 if it holds "incorrect", else 1 if it holds "correct", else 0; None (scored 0, and
  counted malformed) when the text has no "conclusion"."""
  if text is None:
    return None
  text = str(text)[-MAX_TEXT:].lower()
  if "conclusion" not in text:
    return None
  tail = text.rsplit("conclusion", 1)[-1]
  return 0 if "incorrect" in tail else int("correct" in tail)


def released_grm_reward(text: str | None, reference: int) -> float:
  """The released GRM-phase reward (`subem`): 1 when the stored label, "correct" or "wrong",
  occurs in the normalised body of the last <answer> ("No answer found." without one), so
  "incorrect" agrees with a stored "correct" and a copied "correct/wrong" with either."""
  found = _ANSWER.search(str(text or "")[-MAX_TEXT:])
  body = found.group(1).strip() if found else ""
  label = "correct" if int(reference) == 1 else "wrong"
  return float(label in match.normalize(body or "No answer found."))


def score(verdict: int | None) -> int:
  """A malformed verdict counts as 0 (no credit, and not stored as a reference score)."""
  return 0 if verdict is None else int(verdict)


# ------------------------------------------------------------------------------- rewards

def mean_score(scores: Sequence[int | None]) -> float:
  """s̄ over K (or M, or N) GRM scores, malformed ones counted as 0."""
  return float(np.mean([score(s) for s in scores])) if len(scores) else 0.0


def is_valid(scores: Sequence[int | None], threshold: float = 0.8,
             inclusive: bool = False) -> bool:
  """Validity gate: keep (x, a) iff s̄ of the GRM's K judgments is above C (the paper's text),
  or at least C (`inclusive`: the released code, where 4 of 5 pass C = 0.8)."""
  s = mean_score(scores)
  return s >= threshold if inclusive else s > threshold


def pm_worthy(question: str, reward: float) -> bool:
  """The released code's last filter before D_PM: a PG reward above 0 and a question of more
  than 20 characters ending in '?'."""
  q = question.strip()
  return reward > 0 and len(q) > 20 and q.endswith("?")


def balanced_judgments(scores: Sequence[int], rng: np.random.Generator) -> list[int]:
  """Indices of one question's judged answers that join D_GRM as the released code picks them:
  every answer with the minority score and as many randomly drawn majority ones (at s̄ = 0.5,
  1 is the minority); none when every score agrees. A GRM that always says "correct" then
  scores 0.5 on D_GRM, not the majority share."""
  s = np.asarray(scores, np.int64)
  if not len(s):
    return []
  minority = 0 if s.mean() > 0.5 else 1
  few, many = np.flatnonzero(s == minority), np.flatnonzero(s != minority)
  if not len(few) or not len(many):
    return []
  return sorted([int(i) for i in few] + [int(i) for i in rng.choice(many, len(few), replace=False)])


def format_reward(turns: Sequence[str], used_tool: bool) -> float:
  """The released format reward, added to every role's: (share of the generated turns that
  open with <think> and close it + 1[a search returned results]) / 4, at most 0.5."""
  thinking = [t.lstrip().startswith("<think>") and "</think>" in t.lstrip()[7:] for t in turns]
  share = sum(thinking) / len(thinking) if thinking else 0.0
  return (share + float(used_tool)) / 4.0


def binary_entropy(p: float) -> float:
  """H(p) = −p ln p − (1 − p) ln(1 − p) in nats (0 at p ∈ {0, 1}, ln 2 at 1/2)."""
  if p <= 0.0 or p >= 1.0:
    return 0.0
  return float(-p * math.log(p) - (1.0 - p) * math.log(1.0 - p))


def azr_reward(p: float) -> float:
  """Absolute Zero's proposer reward: 1 − p̄, but 0 when every answer is right or wrong."""
  if p <= 0.0 or p >= 1.0:
    return 0.0
  return 1.0 - p


def pg_reward(scores: Sequence[int | None] | None, kind: str = "entropy") -> float:
  """r_PG from the GRM's scores s_m of the PM's M answers: the entropy of {s_m} (binary
  entropy of their mean), or AZR's 1 − p̄. None (a malformed or invalid question) → 0."""
  if kind not in PG_REWARDS:
    raise ValueError(f"Unknown PG reward {kind!r}; choose one of: {', '.join(PG_REWARDS)}.")
  if not scores:
    return 0.0
  p = mean_score(scores)
  return binary_entropy(p) if kind == "entropy" else azr_reward(p)


def grm_reward(predicted: int | None, reference: int) -> float:
  """r_GRM = 1[ŝ = s]: agreement with the stored reference score (malformed ŝ → 0)."""
  return float(predicted is not None and int(predicted) == int(reference))


def difficulty_flag(s_bar: float, harder_at_half: bool = False) -> str:
  """HARDER when the PM's mean score s̄ > 0.5 (too easy; the paper's §3.4), or s̄ ≥ 0.5 with
  `harder_at_half` (the released `score >= 0.5`), else EASIER."""
  return HARDER if s_bar > 0.5 or (harder_at_half and s_bar == 0.5) else EASIER


# ------------------------------------------------------------------------- phase termination

def smooth(values: Sequence[float], ema: float) -> np.ndarray:
  """Exponential moving average y_t = ema·y_{t−1} + (1 − ema)·x_t, y_0 = x_0 (ema 0: none)."""
  x = np.asarray(values, np.float64)
  if not 0.0 <= ema < 1.0:
    raise ValueError(f"EMA factor {ema} must be in [0, 1).")
  out = x.copy()
  for t in range(1, len(x)):
    out[t] = ema * out[t - 1] + (1.0 - ema) * x[t]
  return out


def slope(values: Sequence[float], window: int, ema: float = 0.0) -> float | None:
  """Least-squares slope (reward per step) of the last `window` points of the smoothed curve;
  None when the curve is shorter than the window."""
  if window < 2:
    raise ValueError(f"The slope window must be at least 2 points, got {window}.")
  if len(values) < window:
    return None
  y = smooth(values, ema)[-window:]
  x = np.arange(window, dtype=np.float64)
  x -= x.mean()
  return float((x * (y - y.mean())).sum() / (x * x).sum())


def relative_gain(newer: Sequence[float], older: Sequence[float]) -> float:
  """(mean(newer) − mean(older)) / mean(older), signed; 0 when both are 0, +inf when only the
  older one is (a gain from nothing)."""
  a, b = float(np.mean(newer)), float(np.mean(older))
  if b == 0.0:
    return 0.0 if a == 0.0 else math.copysign(math.inf, a)
  return (a - b) / b


def plateau_done(values: Sequence[float], *, window: int, tolerance: float = 0.005,
                 max_steps: int = 0) -> tuple[bool, str]:
  """The released rule that ends a GRM (window 200) or PM (400) phase: after more than `window`
  steps, when both the relative gain of the newest half-window over the one before and that of
  the newest quarter-window over the one before are below `tolerance` (0.5%; signed, so a
  falling reward ends it too). At `max_steps` (0: none) it ends regardless."""
  n = len(values)
  if max_steps and n >= max_steps:
    return True, "max_steps"
  if n <= window:
    return False, "window"
  rs = np.asarray(values, np.float64)[::-1][:window]  # newest first
  half, quarter = window // 2, window // 4
  long = relative_gain(rs[:half], rs[half:window])
  short = relative_gain(rs[:quarter], rs[quarter:half])
  return (True, "plateau") if long < tolerance and short < tolerance else (False, "rising")


def phase_done(values: Sequence[float], *, window: int, threshold: float, min_steps: int,
               max_steps: int, ema: float = 0.0) -> tuple[bool, str]:
  """(done, why) for a slope-terminated phase after len(values) steps: done at max_steps
  ('max_steps'); never before min_steps or before the window is full; else done when the slope
  is below the threshold ('slope')."""
  n = len(values)
  if n >= max_steps:
    return True, "max_steps"
  if n < min_steps:
    return False, "min_steps"
  s = slope(values, window, ema)
  if s is None:
    return False, "window"
  return (True, "slope") if s < threshold else (False, "rising")


# ------------------------------------------------------------------------------- stores

def bounded_add(store: list, items: Sequence, limit: int) -> int:
  """Appends `items` to `store`, then drops the oldest entries beyond `limit` (FIFO); returns
  how many were dropped."""
  store.extend(items)
  over = max(len(store) - limit, 0)
  del store[:over]
  return over
