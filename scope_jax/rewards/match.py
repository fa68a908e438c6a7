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


def contains_phrase(text: str, phrase: str) -> bool:
  """Whether the normalised `phrase` occurs in the normalised `text` as whole words ('Art' is
  not in 'start', 'the Louvre' is in 'Where is the Louvre?')."""
  p, t = normalize(phrase), normalize(text)
  return bool(p) and f" {p} " in f" {t} "


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


_FINAL_PHRASES = ("the correct answer is", "therefore, the answer is", "the answer is")


def extract_final_answer(text: str) -> str | None:
  """The first line after the last 'The correct answer is' / 'Therefore, the answer is' /
  'The answer is' (case-insensitive; an optional ':' or '-' after it), or None when there is no
  such phrase or nothing follows it. Plain scans: linear time on any input."""
  text = str(text)[-MAX_TEXT:]
  lower = text.lower()
  ends = [i + len(p) for p in _FINAL_PHRASES for i in (lower.rfind(p),) if i >= 0]
  if not ends:
    return None
  rest = text[max(ends):].lstrip()
  if rest[:1] in (":", "-"):
    rest = rest[1:].lstrip()
  lines = rest.splitlines()
  ans = lines[0].strip().strip("*").strip().rstrip(".").strip() if lines else ""
  if ans.startswith("(") and ans.endswith(")") and len(ans) > 2:
    ans = ans[1:-1].strip()
  return ans or None


_ANSWER_IS = re.compile(r"\b(?i:answer)\s*(?i:is|:)\s*\(?([A-D])\b")
_PAREN = re.compile(r"\(([A-D])\)")
_LEADING = re.compile(r"^\s*\(?([A-D])(?:[.:)]|\s*$)")
_TRAILING = re.compile(r"(?:^|\s)\(?([A-D])\)?[.!]?\s*$")


def choice_letter(text: str) -> str | None:
  """The option letter A-D of a multiple-choice answer, from the explicit forms only, in order:
  'answer is C', '(C)', a leading 'C.' / 'C)' / 'C', a lone final letter. The article 'A' in
  'A good choice is (C)' is never taken for a letter."""
  text = str(text)[:200]
  for pattern in (_ANSWER_IS, _PAREN, _LEADING, _TRAILING):
    m = pattern.search(text)
    if m:
      return m.group(1)
  return None


_BOXED = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
  """The content of the last `\\boxed{...}` (or `\\fbox{...}`, or `\\boxed 7`) in `text`, with
  nested braces kept, or None when there is none or its braces never close. One forward scan
  from the last marker: linear time on any input."""
  text = str(text)[-MAX_TEXT:]
  start = max(text.rfind(m) for m in _BOXED)
  if start < 0:
    return None
  rest = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
  if rest.startswith(" "):  # `\boxed 7`: the token up to the next space or `$`
    ans = rest[1:].split("$", 1)[0].split(None, 1)
    return ans[0] if ans else None
  if not rest.startswith("{"):
    return None
  depth = 0
  for i, ch in enumerate(rest):
    depth += (ch == "{") - (ch == "}")
    if depth == 0:
      return rest[1:i].strip() or None
  return None
