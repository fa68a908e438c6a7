"""Answer matching (ALGORITHMS §0.5): normalisation, EM, cover-EM, token F1, numeric equality."""

from __future__ import annotations

import collections
import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
MAX_TEXT = 20_000


def normalize(s: str) -> str:
  """Lower-case, strip punctuation, drop articles, collapse whitespace (SQuAD style)."""
  s = str(s)[:MAX_TEXT].lower().translate(_PUNCT)
  return " ".join(_ARTICLES.sub(" ", s).split())


def exact_match(pred: str, gold: str) -> float:
  return float(normalize(pred) == normalize(gold))


def cover_exact_match(pred: str, gold: str) -> float:
  """1 if the normalised gold answer is a substring of the normalised prediction."""
  g = normalize(gold)
  return float(bool(g) and g in normalize(pred))


def f1(pred: str, gold: str) -> float:
  p, g = normalize(pred).split(), normalize(gold).split()
  common = sum((collections.Counter(p) & collections.Counter(g)).values())
  if not p or not g or common == 0:
    return 0.0
  precision, recall = common / len(p), common / len(g)
  return 2 * precision * recall / (precision + recall)


def numbers(text: str) -> list[float]:
  out = []
  for m in _NUMBER.findall(str(text)[:MAX_TEXT]):
    try:
      out.append(float(m.replace(",", "")))
    except ValueError:
      continue
  return out


def numeric_match(pred: str, gold: str, rel_tol: float = 0.0015) -> float:
  """1 if the last number in pred equals gold's number within ±rel_tol (SPELL: ±0.15%)."""
  p, g = numbers(pred), numbers(gold)
  if not p or not g:
    return 0.0
  a, b = p[-1], g[-1]
  return float(abs(a - b) <= rel_tol * max(abs(b), 1e-12))


_FINAL = re.compile(r"(?:the correct answer is|therefore, the answer is|the answer is)\s*[:\-]?\s*(.+)",
                    re.IGNORECASE)


def extract_final_answer(text: str) -> str | None:
  """The text after the last 'The correct answer is' / 'Therefore, the answer is' (one line)."""
  matches = _FINAL.findall(str(text)[-MAX_TEXT:])
  if not matches:
    return None
  ans = matches[-1].strip().splitlines()[0].strip()
  ans = ans.strip("*").strip()
  if ans.startswith("(") and ans.endswith(")") and len(ans) > 2:
    ans = ans[1:-1]
  return ans.rstrip(".").strip() or None


_CHOICE = re.compile(r"\(?\b([A-D])\b\)?")


def choice_letter(text: str) -> str | None:
  """The option letter A-D of a multiple-choice answer ('(B)', 'B', 'B. Paris')."""
  m = _CHOICE.search(str(text)[:200])
  return m.group(1) if m else None
