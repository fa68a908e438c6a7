"""Evaluation scoring: a sample's answer, its per-type scores, and pass@k / maj@k over samples.

Every sample of an example is scored on its own (`score_qa`, `score_mc`, `score_math`); the
benchmark's PRIMARY score then decides whether a sample is correct (>= 0.5), and `aggregate`
reports mean@n of every score, pass@k (the unbiased estimator of Chen et al., 2021) and maj@k
(majority vote over the first k samples' canonical answers).
"""

from __future__ import annotations

import collections
import math
from typing import Any, Sequence

from scope_jax.rewards import match
from scope_jax.rollout import parsers

PRIMARY = {"qa": "em", "qa_search": "em", "math": "acc", "mc": "acc", "judge": "acc"}
_TAIL = 200  # characters of a multiple-choice response searched for a bare option letter


def pass_at_k(n: int, c: int, k: int) -> float:
  """1 - C(n-c, k) / C(n, k): the chance that k of the n samples, drawn without replacement,
  include one of the c correct ones. Computed as a product (no big binomials); exactly 1.0 when
  n - c < k."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}.")
  if n - c < k:
    return 1.0
  return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def maj_at_k(answers: Sequence[str | None], correct: Sequence[float], k: int) -> float:
  """Majority vote over the first k samples: the most frequent canonical answer among
  `answers[:k]` wins, a tie going to the answer that appeared first; None (no answer) never
  wins, and k samples with no answer score 0. Returns `correct` of the first sample giving the
  winning answer. `answers` must already be canonical (see `canonical_answer`), so equal answers
  are equal strings."""
  if len(answers) != len(correct) or not 1 <= k <= len(answers):
    raise ValueError(f"maj@k needs 1 <= k <= {len(answers)} and one correctness per answer "
                     f"({len(correct)} given); got k={k}.")
  counts: dict[str, int] = {}
  first: dict[str, int] = {}
  for i, a in enumerate(answers[:k]):
    if a is not None:
      counts[a] = counts.get(a, 0) + 1
      first.setdefault(a, i)
  if not counts:
    return 0.0
  winner = max(counts, key=lambda a: (counts[a], -first[a]))
  return float(correct[first[winner]])


def extract_answer(text: str, type: str) -> str | None:
  """What a sample answers: the last <answer>...</answer>, else (math) the last \\boxed{}, else
  the line after 'The answer is', else (mc) an option letter near the end. Linear time."""
  text = str(text)
  tagged = parsers.extract_tag(text, "answer")
  if tagged is not None:  # an explicit answer, even an empty one, is the answer
    return tagged or None
  if type == "math":
    boxed = match.last_boxed(text)
    if boxed:
      return boxed
  final = match.extract_final_answer(text)
  if final:
    return final
  if type == "mc":
    return match.choice_letter(text[-_TAIL:])
  return None


def _letter(pred: str) -> str | None:
  """`match.choice_letter` (A-D), or a bare option letter beyond D ('E', '(E)', 'E.')."""
  letter = match.choice_letter(pred)
  if letter is None:
    bare = pred.strip().strip("()").rstrip(".").strip()
    letter = bare if len(bare) == 1 and "A" <= bare <= "Z" else None
  return letter


def canonical_answer(pred: str | None, type: str, checker: Any = None) -> str | None:
  """The form maj@k votes on: `match.normalize` for qa and judge, the letter for mc, and for
  math the checker's canonical form (`MathChecker.canonical`) of the boxed answer, else (no
  checker, or it cannot parse the answer) the answer without spaces. None: no answer."""
  if pred is None:
    return None
  if type == "mc":
    return _letter(pred)
  if type == "math":
    if "\\boxed" in pred:
      pred = match.last_boxed(pred) or pred
    spaceless = "".join(pred.split()) or None
    canonical = checker.canonical(pred) if hasattr(checker, "canonical") else None
    return canonical or spaceless  # an unparseable answer still votes (and is wrong)
  return match.normalize(pred) or None


def score_qa(pred: str | None, gold: Sequence[str]) -> dict[str, float]:
  """EM, cover-EM and token F1, each the best over the gold answers; no answer scores 0."""
  if pred is None or not gold:
    return {"em": 0.0, "cem": 0.0, "f1": 0.0}
  return {"em": max(match.exact_match(pred, g) for g in gold),
          "cem": max(match.cover_exact_match(pred, g) for g in gold),
          "f1": max(match.f1(pred, g) for g in gold)}


def score_mc(pred: str | None, gold: Sequence[str]) -> dict[str, float]:
  """1 when the answer's option letter is the gold letter."""
  return {"acc": float(pred is not None and bool(gold) and _letter(pred) == gold[0])}


def math_answer(pred: str | None) -> str | None:
  """What a math answer is checked as: its last \\boxed{} if it has one."""
  if pred is not None and "\\boxed" in pred:
    return match.last_boxed(pred)
  return pred


def score_math(pred: str | None, gold: Sequence[str], checker: Any) -> dict[str, float]:
  """1 when the answer (its last \\boxed{} if it has one) is mathematically equal to a gold
  answer by `checker.equivalent(a, b) -> bool` (a `mathcheck.MathChecker`)."""
  pred = math_answer(pred)
  if pred is None or not pred.strip():
    return {"acc": 0.0}
  return {"acc": float(any(checker.equivalent(pred, g) for g in gold))}


def ks(n: int) -> list[int]:
  """1, 2, 4, 8, ... up to n, and n itself: n=5 -> [1, 2, 4, 5]."""
  if n < 1:
    raise ValueError(f"n={n} samples: at least one is needed.")
  out = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
  return out if out[-1] == n else out + [n]


_ks = ks  # `aggregate` has a `ks` argument


def _mean(xs: Sequence[float]) -> float:
  return float(sum(xs) / len(xs))


def aggregate(per_example: Sequence[dict], ks: Sequence[int] | None = None) -> dict[str, float]:
  """Benchmark metrics from per-example dicts with `type` (the benchmark type), `scores` (one
  score dict per sample, same keys), `answers` (canonical answers, for maj@k), `lengths`
  (answer tokens per sample) and `searches` (search calls per sample).

  Returns `mean@n/<score>` (mean over examples of the mean over samples), `pass@k` and `maj@k`
  on the PRIMARY score (a sample is correct iff it is >= 0.5; pass@k is the unbiased estimator
  averaged over examples), `length/mean` and `searches/mean` (per sample), `num_examples` and
  `num_samples` (all samples), and `answers/top_share` and `answers/distinct`: the share of all
  samples giving the benchmark's most common answer, and how many answers differ (a policy that
  answers everything alike, scoring only where that answer happens to be right, shows as a top
  share near 1). Every example needs the same number of samples n; `ks` defaults
  to `ks(n)`.
  """
  if not per_example:
    raise ValueError("aggregate needs at least one example.")
  n = len(per_example[0]["scores"])
  keys = sorted(per_example[0]["scores"][0]) if n else []
  for ex in per_example:
    if len(ex["scores"]) != n or len(ex["answers"]) != n or n == 0:
      raise ValueError(f"Every example needs the same number (>= 1) of scores and answers; "
                       f"got {len(ex['scores'])} and {len(ex['answers'])}, expected {n}.")
    if any(sorted(s) != keys for s in ex["scores"]):
      raise ValueError(f"Every sample needs the same scores {keys}; got {ex['scores']}.")
  chosen = list(_ks(n) if ks is None else ks)
  if any(not 1 <= k <= n for k in chosen):
    raise ValueError(f"ks={chosen} must lie in 1..{n} (the samples per example).")
  out = {f"mean@n/{key}": _mean([_mean([s[key] for s in ex["scores"]]) for ex in per_example])
         for key in keys}
  correct = [[float(s[PRIMARY[ex["type"]]] >= 0.5) for s in ex["scores"]] for ex in per_example]
  for k in chosen:
    out[f"pass@{k}"] = _mean([pass_at_k(n, int(sum(c)), k) for c in correct])
    out[f"maj@{k}"] = _mean([maj_at_k(ex["answers"], c, k) for ex, c in zip(per_example, correct)])
  out["length/mean"] = _mean([x for ex in per_example for x in ex["lengths"]])
  out["searches/mean"] = _mean([x for ex in per_example for x in ex["searches"]])
  out["num_examples"] = float(len(per_example))
  out["num_samples"] = float(n * len(per_example))
  given = collections.Counter(a for ex in per_example for a in ex["answers"] if a is not None)
  out["answers/top_share"] = max(given.values(), default=0) / (n * len(per_example))
  out["answers/distinct"] = float(len(given))
  return out
