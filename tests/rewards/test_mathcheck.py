"""Math answers: math-verify equivalence, answers in words, the size screen, the worker's timeout, and a fuzz of 10,000
random and adversarial strings within a stated time budget."""

import subprocess
import sys
import time

import numpy as np
import pytest

from scope_jax.rewards import mathcheck

# The fuzz's budget on one CPU core: the screen answers in microseconds, a parse in milliseconds
# (about 15 s for the 10,000 strings here), and no single call may exceed the worker's deadline.
FUZZ_BUDGET_S = 120.0


@pytest.fixture(scope="module")
def checker():
  """For what an answer is worth: a budget no ordinary parse nears, even on a busy core."""
  c = mathcheck.MathChecker(timeout=10)
  yield c
  c.close()


@pytest.fixture(scope="module")
def fast_checker():
  """For how long an answer may take: the production default of one second a call."""
  c = mathcheck.MathChecker(timeout=1)
  yield c
  c.close()


def test_equivalent_answers(checker):
  assert checker.canonical("1/2") == checker.canonical("0.5") == checker.canonical("\\frac{1}{2}")
  # A decimal is one vote with its exact value: 12.0 with 12, -2.50 with -5/2.
  assert checker.canonical("12.0") == checker.canonical("12") == "12"
  assert checker.canonical("-2.50") == checker.canonical("-\\frac{5}{2}") == "-5/2"
  assert checker.boxed("so \\boxed{1/2}") == checker.boxed("$\\boxed{0.5}$") == "1/2"
  assert checker.equivalent("1/2", "0.5") and checker.equivalent("\\frac{1}{2}", "0.5")
  assert checker.equivalent("2^{10}", "1024") and checker.equivalent("x+1", "1+x")
  assert checker.boxed("\\boxed{2}") != checker.boxed("\\boxed{3}")
  assert not checker.equivalent("2", "3")
  assert checker.boxed("Therefore, the final answer is: $\\boxed{\\frac{3}{4}}$") == "3/4"


def test_what_is_not_an_answer(checker):
  for text in ("no box here", "\\boxed{", "\\boxed{}", "\\boxed{ANSWER}", "\\boxed{None}",
               "\\boxed{\\text{answer}}"):
    assert checker.boxed(text) is None, text
  assert not checker.equivalent(None, "1") and not checker.equivalent("answer", "1")
  assert checker.canonical("answer") is None  # a placeholder casts no vote (OpenSIR)
  assert checker.boxed("\\boxed{apples}") == "apples"  # words are text answers


@pytest.mark.parametrize("answer, reason", [
    ("1" * 300, "too_long"), ("(" * 20 + "1" + ")" * 20, "too_deep"),
    ("10^{10^{10}}", "too_large"), ("9^9^9", "too_large"), ("2^{10000000}", "too_large"),
    ("(10!)!", "too_large"), ("123456!", "too_large"), ("e^{9^{9^{9}}}", "too_large"),
    ("0.5^{10^{10}}", "too_large"), ("10^{-10^{10}}", "too_large"), ("9^{(9^{9})}", "too_large"),
    ("\\left(10!\\right)!", "too_large")])
def test_the_screen_rejects_only_size_without_parsing(answer, reason):
  assert mathcheck.screen(answer) == reason


@pytest.mark.parametrize("answer", [
    "x^2+y^2", "(2^3)^4", "x^2y^2", "e^{x^2}", "x^4+x^3+x^2+x+1", "2^{1000}", "10!!!!",
    "1" * 50, "even", "Monday", "\\text{even}", "true", "x^{2^{3}}", "(3!)!", "(6!)!"])
def test_the_screen_passes_ordinary_answers(answer):
  assert mathcheck.screen(answer) is None


@pytest.mark.parametrize("pred, gold", [
    ("1+x+x^2+x^3+x^4", "x^4+x^3+x^2+x+1"), ("(xy)^2", "x^2y^2"), ("\\exp(x^2)", "e^{x^2}"),
    ("a^2b^3c^4", "c^4 b^3 a^2"), ("2^{10}", "1024"), ("x^{2^{3}}", "x^8"),
    ("Even", "\\text{even}"), ("monday.", "Monday"), ("\\text{True}", "true"),
    ("\\textbf{yes}", "Yes"), ("x - y - z", "x-y-z"), ("none", "\\text{None}"),
    ("new  york", "New York")])
def test_ordinary_answers_are_checked_right(checker, pred, gold):
  """Several powers, exponentials of powers and words: equal to the gold, and the gold to itself
  (the old screen rejected each of these golds, so every prediction scored 0)."""
  assert checker.equivalent(pred, gold), (pred, gold)
  assert checker.equivalent(gold, gold), gold


@pytest.mark.parametrize("pred, gold", [
    ("x^2y^3", "x^2y^2"), ("e^{x^3}", "e^{x^2}"), ("odd", "even"), ("Tuesday", "Monday"),
    ("ann", "nan"), ("even", "1"), ("2", "two"), ("b - c - a", "a - b - c"), ("a b c", "a - b - c")])
def test_different_answers_differ(checker, pred, gold):
  assert not checker.equivalent(pred, gold), (pred, gold)


def test_the_gold_is_never_screened(checker):
  """A gold the screen would reject in a prediction is still read: long, or deeply nested."""
  gold = "+".join(f"x^{{{k}}}" for k in range(40, 0, -1))  # 40 powers, 240 characters
  assert mathcheck.screen(gold) == "too_long" and checker.canonical(gold) is None
  assert checker.canonical(gold, gold=True) is not None
  pred = "+".join(f"x^{{{k}}}" for k in range(1, 41)).replace("^{1}+", "+")
  assert not checker.equivalent(pred, gold)  # the prediction itself is too long to check
  # Nine nested roots: deeper than the screen lets a prediction go (MAX_DEPTH = 8). Nested
  # parentheses would not do here: math-verify's grammar spends about 0.1 s a level on them, so
  # nine or ten exceed the worker's one-second budget on a slow core and the gold goes unread.
  deep = "\\sqrt{" * 9 + "4" + "}" * 9  # 4^(1/512) = 2^(1/256)
  assert mathcheck.screen(deep) == "too_deep" and checker.canonical(deep) is None
  assert checker.equivalent("2^{1/256}", deep)
  assert not checker.equivalent("2^{1/128}", deep)


def test_what_could_not_be_checked_is_counted():
  c = mathcheck.MathChecker(timeout=1)
  try:
    assert c.unchecked() == 0
    assert c.canonical("9^9^9") is None and c.canonical("1" * 300) is None
    assert c.canonical("even") == "even" and c.unchecked() == 2
    assert c.is_unchecked("9^9^9") and not c.is_unchecked("even") and not c.is_unchecked("1/2")
  finally:
    c.close()


def test_a_pathological_expression_costs_bounded_time(monkeypatch):
  """A power tower past the screen: math-verify's own timeout ends the comparison."""
  monkeypatch.setattr(mathcheck, "screen", lambda answer: None)
  c = mathcheck.MathChecker(timeout=1)
  try:
    c.canonical("1")  # the worker is up
    start = time.perf_counter()
    assert not c.equivalent("10^{10^{10}}", "5")
    assert time.perf_counter() - start < 3 * c.timeout + c.grace
    assert c.equivalent("1/2", "0.5")  # and the worker still answers
  finally:
    c.close()


class _HungChecker(mathcheck.MathChecker):
  """A worker that starts, then never answers (a computation no signal interrupts)."""

  def _start(self):
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; print('{\"ready\": true}', flush=True); "
         "time.sleep(600)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert self._read(proc, 60) == {"ready": True}
    return proc


def test_a_worker_that_never_answers_is_killed_and_replaced():
  c = _HungChecker(timeout=1, grace=0.5)
  try:
    start = time.perf_counter()
    assert c.canonical("1/2") is None  # counts as invalid
    assert time.perf_counter() - start < c.timeout + c.grace + 5
    assert c.counters["timeouts"] == 1 and c._proc is None
    assert c.canonical("3/4") is None and c.counters["timeouts"] == 2  # a fresh worker each time
  finally:
    c.close()


ALPHABET = list("0123456789+-*/^()[]{}.,=!xy \\") + [
    "\\frac", "\\sqrt", "\\pi", "\\cdot", "\\boxed{", "}", "^{", "\\left(", "\\right)", "e",
    "\\infty", "\\sum", "\\int", "\\text{", "$", "\\\\", "%"]


def fuzz_strings(n: int, seed: int = 0) -> list[str]:
  """Random token soups and adversarial shapes: deep nesting, power towers, huge exponents and
  literals, unbalanced braces, very long inputs."""
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    kind = i % 10
    if kind < 5:
      out.append("".join(rng.choice(ALPHABET, int(rng.integers(1, 40)))))
    elif kind == 5:
      d = int(rng.integers(1, 400))
      out.append("{" * d + "1" + "}" * int(rng.integers(0, d + 1)))
    elif kind == 6:
      a, b, c = (int(x) for x in rng.integers(2, 99, size=3))
      out.append(rng.choice([f"{a}^{{{b}^{{{c}}}}}", f"{a}^{b}^{c}", f"{a}^{{{10**7 + b}}}",
                             f"{a}!!!", "9" * int(rng.integers(30, 400))]))
    elif kind == 7:
      out.append("1+" * int(rng.integers(100, 50_000)) + "1")
    elif kind == 8:
      out.append("\\frac{" * int(rng.integers(1, 60)) + "1" + "}" * int(rng.integers(0, 3)))
    else:
      out.append("x" * int(rng.integers(1, 200_000)))
  return out


def test_fuzz_ten_thousand_strings_within_budget(fast_checker):
  checker = fast_checker
  strings = fuzz_strings(10_000)
  start, worst = time.perf_counter(), 0.0
  for i, s in enumerate(strings):
    t0 = time.perf_counter()
    for value in (checker.canonical(s), checker.boxed(f"Answer: \\boxed{{{s}}}"),
                  checker.boxed(s)):
      assert value is None or isinstance(value, str)
    if i % 50 == 0:
      assert isinstance(checker.equivalent(s, "2"), bool)
    worst = max(worst, time.perf_counter() - t0)
  total = time.perf_counter() - start
  assert total < FUZZ_BUDGET_S, total
  assert worst < 4 * (3 * checker.timeout + checker.grace) + 10, worst
  assert checker.counters["calls"] > 1000  # the worker parsed most of the short ones


@pytest.mark.parametrize("text, expected", [
    ("So the final answer is $7$.", "7"),  # no \boxed: math-verify's anchored LaTeX
    ("The final answer is: $\\frac{1}{2}$", "\\frac{1}{2}"),
    ("The final answer to the question is \\(x^2\\).", "x^2"),
    ("Therefore, the final answer is: $\\boxed{5}$", "5"),  # \boxed first
    ("\\boxed{3} … so the final answer is $4$", "3"),
    ("The final answer is 7", None),  # unanchored text: no LaTeX, no answer (as released)
    ("I think $7$ is right", None),
    # math-verify's "answer:" (priority 100) and "answer" (200) anchors, after "final answer"
    ("The answer is $7$.", "7"),
    ("**Answer:** $12$", "12"),
    ("Answer: $\\frac34$", "\\frac34"),
    ("The answer is $3$. Final answer: $5$", "5"),  # the last "answer:" before a bare "answer"
    ("So the final answer is $4$. The answer is $9$.", "4"),  # "final answer" ranks first
    ("Answer: 5", None),  # no LaTeX
    ("The answer, after a long derivation that runs on for far too many words, is $7$", None),
])
def test_final_answer_boxed_then_anchored_latex(text, expected):
  assert mathcheck.final_answer(text) == expected


@pytest.mark.parametrize("text", [
    "The answer is $7$.", "**Answer:** $12$", "Answer: $\\frac34$", "So the final answer is $7$.",
    "The answer is $3$. Final answer: $5$", "Answer: 5", "I think $7$ is right",
    "The answer, after a long derivation that runs on for far too many words, is $7$",
])
def test_final_answer_agrees_with_math_verify(text):
  """OpenSIR's released parse (boxed first, anchored LaTeX only) reads the same answer."""
  import math_verify
  from math_verify import LatexExtractionConfig
  config = [LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)]
  theirs = math_verify.parse(text, config, fallback_mode="no_fallback")
  ours = mathcheck.final_answer(text)
  assert bool(theirs) == (ours is not None)
  if ours is not None:
    assert math_verify.verify(math_verify.parse(f"${ours}$"), theirs)
