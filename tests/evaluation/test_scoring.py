"""Evaluation scoring: pass@k and maj@k by hand and by brute force, answer extraction, the
per-type scores, and `aggregate` on a hand-computed two-example benchmark."""

import itertools

import chex
import pytest

from scope_jax.evaluation import scoring
from scope_jax.rewards import mathcheck


def test_pass_at_k_by_hand():
  # n=5, c=2: pass@k = 1 - C(3, k) / C(5, k).
  assert scoring.pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 1 - 3/5
  assert scoring.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - 3/10
  assert scoring.pass_at_k(5, 2, 5) == 1.0  # n - c = 3 < 5: exact
  assert scoring.pass_at_k(5, 0, 1) == 0.0 and scoring.pass_at_k(5, 0, 5) == 0.0
  assert scoring.pass_at_k(5, 5, 1) == 1.0 and scoring.pass_at_k(1, 1, 1) == 1.0


@pytest.mark.parametrize("n, c, k", [(5, 2, 1), (5, 2, 2), (5, 2, 3), (6, 1, 3), (7, 3, 2),
                                     (8, 4, 5), (4, 0, 2), (9, 8, 1)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_correct_sample(n, c, k):
  samples = [1] * c + [0] * (n - c)
  subsets = list(itertools.combinations(samples, k))
  brute = sum(any(s) for s in subsets) / len(subsets)
  assert scoring.pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
  for n, c, k in [(5, 2, 6), (5, 6, 1), (5, 2, 0), (5, -1, 1)]:
    with pytest.raises(ValueError, match=f"n={n}, c={c}, k={k}"):
      scoring.pass_at_k(n, c, k)


# One example, n = 5 samples, c = 2 correct (gold 'Paris'):
#   sample   0       1        2            3       4
#   answer   Lyon    Paris    'the Paris!' Nice    (none)
#   correct  0       1        1            0       0
# maj@1: {lyon: 1} -> lyon -> 0.
# maj@2: {lyon: 1, paris: 1}, a tie -> lyon (first) -> 0.
# maj@5: {lyon: 1, paris: 2, nice: 1}; None never votes -> paris -> 1.
QA_PREDS = ["Lyon", "Paris", "the Paris!", "Nice", None]
EXPECTED_MAJ = {1: 0.0, 2: 0.0, 5: 1.0}


def test_maj_at_k_through_the_qa_scorer():
  correct = [scoring.score_qa(p, ["Paris"])["em"] for p in QA_PREDS]
  assert correct == [0.0, 1.0, 1.0, 0.0, 0.0]
  answers = [scoring.canonical_answer(p, "qa") for p in QA_PREDS]
  assert answers == ["lyon", "paris", "paris", "nice", None]
  for k, want in EXPECTED_MAJ.items():
    assert scoring.maj_at_k(answers, correct, k) == want, k
  assert [scoring.pass_at_k(5, int(sum(correct)), k) for k in (1, 2, 5)] == pytest.approx(
      [0.4, 0.7, 1.0])


class SpacelessChecker:
  """A stand-in for MathChecker: answers are equal when equal without spaces."""

  def canonical(self, a):
    return "".join(str(a).split()) or None

  def equivalent(self, a, b):
    return self.canonical(a) == self.canonical(b)


# The same shape in math (gold 1/2): 1/3, '1 / 2', '\boxed{1/2}', 3/4, no answer.
MATH_PREDS = ["1/3", "1 / 2", "so \\boxed{1/2}", "3/4", None]


def test_maj_at_k_through_the_math_scorer():
  checker = SpacelessChecker()
  correct = [scoring.score_math(p, ["1/2"], checker)["acc"] for p in MATH_PREDS]
  assert correct == [0.0, 1.0, 1.0, 0.0, 0.0]
  answers = [scoring.canonical_answer(p, "math", checker) for p in MATH_PREDS]
  assert answers == ["1/3", "1/2", "1/2", "3/4", None]
  for k, want in EXPECTED_MAJ.items():
    assert scoring.maj_at_k(answers, correct, k) == want, k


def test_math_scoring_with_the_real_checker():
  checker = mathcheck.MathChecker(timeout=10)  # correctness here, not timing
  try:
    preds = ["0.5", "The answer is $\\boxed{\\frac{1}{2}}$.", "\\boxed{1/3}", "apples", None]
    assert [scoring.score_math(p, ["\\frac{1}{2}"], checker)["acc"] for p in preds] == [
        1.0, 1.0, 0.0, 0.0, 0.0]
    # 0.5 and \frac{1}{2} vote together; the unparseable answer votes as its own text.
    assert [scoring.canonical_answer(p, "math", checker) for p in preds] == [
        "1/2", "1/2", "1/3", "apples", None]
  finally:
    checker.close()


def test_maj_at_k_edge_cases():
  assert scoring.maj_at_k([None, None], [1.0, 1.0], 2) == 0.0  # no answers: 0
  assert scoring.maj_at_k(["b", "a", "a"], [0.0, 1.0, 1.0], 3) == 1.0
  with pytest.raises(ValueError, match="1 <= k <= 2"):
    scoring.maj_at_k(["a", "b"], [1.0, 0.0], 3)


def test_extract_answer():
  assert scoring.extract_answer("think <answer>x</answer> <answer> Paris </answer>", "qa") == "Paris"
  assert scoring.extract_answer("<answer> </answer> The answer is Lyon", "qa") is None
  assert scoring.extract_answer("so \\boxed{\\frac{1}{2}} then \\boxed{3}", "math") == "3"
  assert scoring.extract_answer("Therefore, the answer is: 42.\nDone", "math") == "42"
  assert scoring.extract_answer("The answer is Paris", "qa") == "Paris"
  assert scoring.extract_answer("I pick (C)", "mc") == "C"
  assert scoring.extract_answer("x" * 1000 + " so (B)", "mc") == "B"
  assert scoring.extract_answer("no idea", "qa") is None
  assert scoring.extract_answer("no idea", "mc") is None


def test_extract_answer_is_fast_on_adversarial_text():
  # Unclosed tags, braces and phrases repeated: plain scans, so this is instant.
  text = "<answer>" * 20_000 + "\\boxed{" * 20_000 + "the answer is " * 5_000 + "(" * 20_000
  for type in ("qa", "math", "mc"):
    scoring.extract_answer(text, type)


def test_scores():
  assert scoring.score_qa("The Eiffel Tower", ["Eiffel tower", "tower"]) == {
      "em": 1.0, "cem": 1.0, "f1": 1.0}
  got = scoring.score_qa("in Paris, France", ["Paris"])
  chex.assert_trees_all_close(got, {"em": 0.0, "cem": 1.0, "f1": 0.5})  # f1: p=1/2, r=1
  assert scoring.score_qa(None, ["Paris"]) == {"em": 0.0, "cem": 0.0, "f1": 0.0}
  assert [scoring.score_mc(p, ["C"])["acc"] for p in ["C", "(C) Paris", "answer is B", None]] == [
      1.0, 1.0, 0.0, 0.0]
  assert scoring.score_mc("(F)", ["F"])["acc"] == 1.0  # beyond A-D: a bare letter
  assert scoring.score_math("\\boxed{}", ["0"], SpacelessChecker())["acc"] == 0.0


def test_ks():
  assert scoring.ks(1) == [1] and scoring.ks(5) == [1, 2, 4, 5] and scoring.ks(8) == [1, 2, 4, 8]
  assert scoring.ks(3) == [1, 2, 3] and scoring.ks(16) == [1, 2, 4, 8, 16]


# Two qa examples, n = 3 samples each:
#   A: em [0, 1, 1], cem [1, 1, 1], f1 [.5, 1, 1]; answers lyon, paris, paris;
#      lengths 10, 20, 30; searches 1, 2, 3.
#   B: em [0, 0, 1], cem [0, 1, 1], f1 [0, .5, 1]; answers none, rome, milan;
#      lengths 5, 5, 20; searches 0, 0, 0.
# mean@n: em (2/3 + 1/3)/2 = 1/2; cem (1 + 2/3)/2 = 5/6; f1 (2.5/3 + 1.5/3)/2 = 2/3.
# pass@1: A c=2: 1 - C(1,1)/C(3,1) = 2/3; B c=1: 1 - C(2,1)/C(3,1) = 1/3 -> 1/2.
# pass@2: A: n - c = 1 < 2 -> 1; B: 1 - C(2,2)/C(3,2) = 2/3 -> 5/6.  pass@3: 1 and 1 -> 1.
# maj@1: A lyon (0); B none (0) -> 0.   maj@2: A lyon/paris tie -> lyon (0); B rome (0) -> 0.
# maj@3: A paris (1); B rome/milan tie -> rome (0) -> 1/2.
# length/mean = 90/6 = 15; searches/mean = 6/6 = 1.
# answers: paris twice of 6 samples -> top_share 1/3; lyon, paris, rome, milan -> distinct 4.
def _two_examples():
  def scores(em, cem, f1):
    return [{"em": a, "cem": b, "f1": c} for a, b, c in zip(em, cem, f1)]
  return [
      {"type": "qa", "scores": scores([0, 1, 1], [1, 1, 1], [.5, 1, 1]),
       "answers": ["lyon", "paris", "paris"], "lengths": [10, 20, 30], "searches": [1, 2, 3]},
      {"type": "qa", "scores": scores([0, 0, 1], [0, 1, 1], [0, .5, 1]),
       "answers": [None, "rome", "milan"], "lengths": [5, 5, 20], "searches": [0, 0, 0]}]


def test_aggregate_two_examples_by_hand():
  got = scoring.aggregate(_two_examples())
  want = {"mean@n/em": 1 / 2, "mean@n/cem": 5 / 6, "mean@n/f1": 2 / 3,
          "pass@1": 1 / 2, "pass@2": 5 / 6, "pass@3": 1.0,
          "maj@1": 0.0, "maj@2": 0.0, "maj@3": 1 / 2,
          "length/mean": 15.0, "searches/mean": 1.0, "num_examples": 2.0, "num_samples": 6.0,
          "answers/top_share": 1 / 3, "answers/distinct": 4.0}
  chex.assert_trees_all_close(got, want)
  got = scoring.aggregate(_two_examples(), ks=[2])
  assert {k for k in got if "@" in k and "/" not in k} == {"pass@2", "maj@2"}


def test_aggregate_errors():
  with pytest.raises(ValueError, match="at least one example"):
    scoring.aggregate([])
  uneven = _two_examples()
  uneven[1]["scores"] = uneven[1]["scores"][:2]
  with pytest.raises(ValueError, match="same number"):
    scoring.aggregate(uneven)
  with pytest.raises(ValueError, match="must lie in 1..3"):
    scoring.aggregate(_two_examples(), ks=[4])
