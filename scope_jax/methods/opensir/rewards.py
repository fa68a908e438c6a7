"""OpenSIR's scores (ALGORITHMS §3): legal problems, solve rate, solvability, length, diversity,
format, the teacher and student rewards, and which group and problem are trained.

Pure functions over host values; the method (`methods/opensir.py`) wires them to rollouts.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Sequence

import numpy as np

MIN_PROBLEM_CHARS = 10  # a shorter problem is not legal (released code)
MAX_CONCEPTS = 3
MIN_CONCEPT_CHARS = 10  # shorter concepts are dropped; at least one must remain (released code)
LENGTH_CAP = 1000.0  # tokens: min(mean length, cap) / baseline
LENGTH_BASELINE = 1000.0
TOP_K_SIMILAR = 5
MAX_TEXT = 20_000
_STUDENT_FORMAT = "Therefore, the final answer is: $\\boxed{"  # then at least one character, '}$'


@dataclasses.dataclass(frozen=True)
class Problem:
  """A legal teacher problem: its text and its concepts (lower-cased)."""

  text: str
  concepts: tuple[str, ...]


def tag_content(text: str, tag: str) -> tuple[int, int] | None:
  """(start, end) character offsets of the first `<tag>…</tag>` element, tags included, matched
  case-insensitively as the released code does; None if it is missing or never closes. Two
  `find`s on the lower-cased text: linear time on any input (no backtracking regex)."""
  low = text.lower()
  start = low.find(f"<{tag}>")
  if start < 0:
    return None
  end = low.find(f"</{tag}>", start)
  return None if end < 0 else (start, end + len(tag) + 3)


def _inner(text: str, tag: str) -> str | None:
  span = tag_content(text, tag)
  return None if span is None else text[span[0] + len(tag) + 2:span[1] - len(tag) - 3].strip()


def parse_problem(text: str) -> Problem | None:
  """The teacher's problem if it is legal: a `<problem>` of at least 10 characters that is not
  '...', and a one-line `<concepts>` list of at most 3 comma-separated items of which at least
  one has 10 or more characters (shorter ones are dropped)."""
  text = str(text)[:MAX_TEXT]
  problem = _inner(text, "problem")
  if problem is None or problem == "..." or len(problem) < MIN_PROBLEM_CHARS:
    return None
  concepts = _inner(text, "concepts")
  if not concepts or "\n" in concepts or "\r" in concepts:
    return None
  items = [c.strip().lower() for c in concepts.split(",")]
  if len(items) > MAX_CONCEPTS:
    return None
  kept = tuple(c for c in items if len(c) >= MIN_CONCEPT_CHARS)
  return Problem(problem, kept) if kept else None


def teacher_format(text: str, problem: Problem | None) -> float:
  """1 iff the problem is legal and the response explains it inside `<think>…</think>`."""
  return float(problem is not None and tag_content(str(text)[:MAX_TEXT], "think") is not None)


def student_format(text: str) -> float:
  """1 iff the response states 'Therefore, the final answer is: $\\boxed{…}$'."""
  for line in str(text)[-MAX_TEXT:].split("\n"):  # in linear time: a regex backtracks per start
    at = line.find(_STUDENT_FORMAT)  # a later start on the line closes on a suffix of this one's
    if at >= 0 and line.find("}$", at + len(_STUDENT_FORMAT) + 1) >= 0:
      return 1.0
  return 0.0


def solve_rate(answers: Sequence[str | None]) -> tuple[str | None, float | None]:
  """(majority answer, its share of the valid answers); (None, None) when none is valid. Ties
  go to the answer seen first."""
  valid = [a for a in answers if a is not None]
  if not valid:
    return None, None
  counts = collections.Counter(valid)
  best = max(counts.values())
  majority = next(a for a in valid if counts[a] == best)
  return majority, best / len(valid)


def solvability(s: float | None, n: int, low: float = 0.5, high: float = 0.9) -> float:
  """Triangular on [low, high]: 1 at the midpoint m, y2 = 1/|grid| at both edges (grid = the
  solve rates i/n inside the band), 0 outside or without a solve rate."""
  if s is None or s < low or s > high:
    return 0.0
  grid = [i / n for i in range(1, n + 1) if low <= i / n <= high]
  y2 = 1.0 / len(grid) if grid else 0.0
  m = (low + high) / 2
  h = m - low
  return 1.0 - (1.0 - y2) * abs(s - m) / h


def length_score(lengths: Sequence[float], cap: float = LENGTH_CAP,
                 baseline: float = LENGTH_BASELINE) -> float:
  """min(mean student tokens, cap) / baseline; 0 without solutions."""
  if not len(lengths):
    return 0.0
  mean = float(np.mean(lengths))
  return max(min(mean, cap), 0.0) / baseline


def diversity(new_ND: np.ndarray, pool_PD: np.ndarray, k: int = TOP_K_SIMILAR) -> np.ndarray:
  """[N] (1 − mean of the k largest cosine similarities) / 2 of each new problem against the
  pool and the other new problems (never itself); vectors are L2-normalised. A problem with
  nothing to compare with scores 0.5 (cosine 0)."""
  new_ND = np.asarray(new_ND, np.float32)
  n = len(new_ND)
  if n == 0:
    return np.zeros((0,), np.float32)
  pool_PD = np.asarray(pool_PD, np.float32).reshape(-1, new_ND.shape[-1])
  siblings_NN = np.einsum("nd,md->nm", new_ND, new_ND)
  np.fill_diagonal(siblings_NN, -np.inf)
  sims = np.concatenate([siblings_NN, np.einsum("nd,pd->np", new_ND, pool_PD)], axis=1)
  out = np.zeros((n,), np.float32)
  for i, row in enumerate(sims):
    row = row[np.isfinite(row)]
    top = np.sort(row)[::-1][:min(k, len(row))]
    out[i] = (1.0 - (float(top.mean()) if len(top) else 0.0)) / 2.0
  return out


def teacher_reward(solv: float, div: float, length: float, fmt: float,
                   weights: Sequence[float] = (1.0, 1.0, 1.0, 0.1)) -> float:
  """R_teacher = w·(solvability, diversity, length, format); an illegal problem scores 0."""
  return float(np.dot(weights, [solv, div, length, fmt]))


def student_reward(answer: str | None, majority: str | None, fmt: float,
                   format_weight: float = 0.1) -> float:
  """1[answer = majority answer] + 0.1·format; an invalid answer is never correct."""
  correct = answer is not None and majority is not None and answer == majority
  return float(correct) + format_weight * fmt


def combined(solv: float | None, div: float | None, w_solv: float = 1.0,
             w_div: float = 1.0) -> float | None:
  """The selection score c = w_solv·solv + w_div·div (the released config's weights are 1 and 1),
  defined where its weighted parts are: with w_div = 0 (no diversity) c is solvability alone."""
  if solv is None or (div is None and w_div != 0):
    return None
  return w_solv * solv + (w_div * div if w_div != 0 else 0.0)


def select_group(c_GP: Sequence[Sequence[float | None]]) -> int:
  """The group whose combined scores vary most (population variance over the defined scores, as
  the released code computes it; a group with none defined ranks last). Ties go to the first."""
  def variance(group):
    vals = [c for c in group if c is not None]
    return float(np.var(vals)) if vals else -1.0
  scores = [variance(g) for g in c_GP]
  return int(np.argmax(scores))


def select_problem(c: Sequence[float | None]) -> int | None:
  """The problem with the highest defined combined score (None if no score is defined)."""
  defined = [(v, -i) for i, v in enumerate(c) if v is not None]
  return -max(defined)[1] if defined else None


def span_token_mask(ids: Sequence[int], decode, span: tuple[int, int] | None) -> np.ndarray:
  """[T] int32: 0 on the tokens of `ids` whose text overlaps the character span [start, end) of
  `decode(ids)`, 1 elsewhere. Token boundaries are found by binary search over prefix decodes
  (O(log T) decodes, exact for byte-level tokenizers whose prefixes decode to text prefixes)."""
  mask = np.ones((len(ids),), np.int32)
  if span is None or not len(ids):
    return mask
  start, end = span
  prefix = lambda k: len(decode(list(ids[:k])))

  def first_past(chars: int, strict: bool) -> int:  # smallest k with prefix(k) (>|>=) chars
    lo, hi = 0, len(ids)
    while lo < hi:
      mid = (lo + hi) // 2
      n = prefix(mid)
      if n > chars or (not strict and n >= chars):
        hi = mid
      else:
        lo = mid + 1
    return lo

  first = max(first_past(start, strict=True) - 1, 0)
  last = first_past(end, strict=False)
  mask[first:last] = 0
  return mask


def concepts_mask(ids: Sequence[int], decode) -> np.ndarray:
  """[T] int32 loss mask of a teacher response with `<concepts>…</concepts>` (tags included)
  masked out: the concepts are a label for the pool, not part of the problem to learn."""
  return span_token_mask(ids, decode, tag_content(decode(list(ids)), "concepts"))


def unit_token_weights(tokens: Sequence[int], units: Sequence[int]) -> np.ndarray:
  """[rows] weights w_r = (T / U) / T_u(r), with T_u a unit's loss tokens, T their sum and U the
  units with tokens. A global token-mean of w_r·A_r·(per-token term) is TRL's loss: the token
  mean of each micro-batch (one unit), averaged over micro-batches. It holds for the policy
  term, linear in A while the ratio is 1 (TRL's one iteration, `learner.recompute_old_logp`)."""
  tokens_R = np.asarray(tokens, np.float64)
  units_R = np.asarray(units)
  per_unit = {u: tokens_R[units_R == u].sum() for u in set(units_R.tolist())}
  live = [u for u, n in per_unit.items() if n > 0]
  if not live:
    return np.ones(len(tokens_R))
  mean = tokens_R.sum() / len(live)
  return np.asarray([mean / per_unit[u] if per_unit[u] > 0 else 0.0 for u in units_R.tolist()])
