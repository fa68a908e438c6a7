"""SPELL rewards (ALGORITHMS §1): questioner parsing, grounding, responder, verifier, questioner.

Model output is untrusted: the questioner's JSON is found with a bounded scan and parsed with
`json.loads`; a verdict is the last [[YES]] / [[NO]] in the text (anything else is invalid).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Sequence

from scope_jax.rewards import match
from scope_jax.rewards.judges import parse_verdict  # noqa: F401 — the verifier's format
from scope_jax.methods.spell.difficulty import questioner_difficulty

TASKS = ("doc_qa", "doc_mc", "doc_math")
# Which verifier groups train: 'paper' (§4.3: consistent ones, plus conflicting ones up to the
# number of questions) or 'released' (the released trainer: consistent ones only, a sample sized
# by the responder batch).
VERIFIER_SELECTIONS = ("paper", "released")
BAD_FORMAT = -1.0
UNGROUNDED = -0.5
INVALID_VERDICT = -1.0
MAX_JSON = 20_000


@dataclasses.dataclass(frozen=True)
class Proposal:
  question: str
  answer: str
  options: dict[str, str] | None = None  # multiple choice: {'A': ..., 'D': ...}

  def display(self) -> str:
    if not self.options:
      return self.question
    opts = " ".join(f"({k}) {v}" for k, v in sorted(self.options.items()))
    return f"{self.question} Choices: {opts}"


_BRACE = re.compile(r"[{}]")


def _json_objects(text: str):
  """Candidate {...} spans, last closed first (the answer's JSON closes the response): one
  linear pass pairs each '}' with its '{'; at most 20 candidates are tried."""
  text = text[-MAX_JSON:]
  stack, spans = [], []
  for m in _BRACE.finditer(text):
    i = m.start()
    if m.group() == "{":
      stack.append(i)
    elif stack:
      spans.append((stack.pop(), i))
  for start, end in reversed(spans[-20:]):
    yield text[start:end + 1]


def parse_proposal(text: str, task: str) -> Proposal | None:
  """The questioner's final JSON as a Proposal, or None when malformed for the task."""
  for blob in _json_objects(str(text)):
    cleaned = re.sub(r",\s*}", "}", blob.replace("“", '"').replace("”", '"'))
    try:
      obj = json.loads(cleaned)
    except (ValueError, RecursionError):
      continue
    if not isinstance(obj, dict):
      continue
    q, a = obj.get("question"), obj.get("answer")
    if not isinstance(q, str) or not q.strip() or isinstance(a, bool) or not (
        isinstance(a, str) or (isinstance(a, (int, float)) and math.isfinite(a))):
      continue  # booleans, NaN and infinities are not answers
    a = str(a).strip()
    if not a:
      continue
    if task == "doc_mc":
      opts = obj.get("options")
      if not (isinstance(opts, dict) and set(opts) == {"A", "B", "C", "D"}
              and all(isinstance(v, str) for v in opts.values())):
        continue
      letter = match.choice_letter(a)
      if letter is None:
        continue
      return Proposal(q.strip(), letter, {k: v.strip() for k, v in opts.items()})
    if task == "doc_math" and not match.numbers(a):
      continue
    return Proposal(q.strip(), a)
  return None


def rule_score(response: str, gold: str, task: str) -> float:
  """R_rule: cover-EM for QA, the option letter for MC, ±0.15% numeric match for math."""
  pred = match.extract_final_answer(response)
  if pred is None:
    return 0.0
  if task == "doc_mc":
    return float(match.choice_letter(pred) == gold)
  if task == "doc_math" and match.numbers(gold) and match.numbers(pred):
    return match.numeric_match(pred, gold)  # CEM would accept 100.2 for 100 ("1002" ⊃ "100")
  return match.cover_exact_match(pred, gold)


def majority(verdicts: Sequence[int | None]) -> int:
  """v_i = 1 iff strictly more than half of the G judgments say YES (ties → 0)."""
  yes = sum(1 for v in verdicts if v == 1)
  return int(yes > len(verdicts) / 2)


def verifier_rewards(verdicts: Sequence[int | None], vote: int) -> list[float]:
  """r_ver_ij = 1[v_ij = v_i]; an invalid judgment gets −1."""
  return [INVALID_VERDICT if v is None else float(v == vote) for v in verdicts]


def responder_reward(rule: float, vote: int) -> float:
  """r_res_i = max(R_rule(y_i, a), v_i)."""
  return float(max(rule, vote))


def questioner_reward(responder_rewards: Sequence[float], mapping: str = "gaussian") -> float:
  """r_que from the mean responder reward p̄ (0 when all right, all wrong, or no responses)."""
  if not len(responder_rewards):
    return 0.0
  p = sum(responder_rewards) / len(responder_rewards)
  return questioner_difficulty(p, mapping)


def released_verifier_groups(groups: Sequence[tuple[bool, Sequence[float]]], responder_rows: int,
                             ratio: float, group_size: int, band: tuple[float, float],
                             rng) -> tuple[list[int], int]:
  """(indices of the verifier groups to train, how many were eligible), as the released trainer
  picks them: a group (consistent with the rule check, its rewards) is eligible when its vote
  agrees with the rule and the share of its *valid* judgments that agree with the vote is in
  `band`; int(responder_rows · ratio / G) of them are drawn at random, and none at all when fewer
  are eligible than that (the released `_build_final_judge_batch` then skips the verifier)."""
  lo, hi = band
  eligible = []
  for j, (consistent, rewards) in enumerate(groups):
    valid = [r for r in rewards if r >= 0]
    if consistent and valid and lo <= sum(r == 1.0 for r in valid) / len(valid) <= hi:
      eligible.append(j)
  target = int(responder_rows * ratio / group_size)
  if target > len(eligible) or target == 0:
    return [], len(eligible)
  return sorted(int(eligible[k]) for k in rng.choice(len(eligible), target, replace=False)), \
      len(eligible)
