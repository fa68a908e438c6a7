"""SPELL reward formulas with hand-computed values (ALGORITHMS §1)."""

import math

import pytest

from scope_jax.methods.spell.clusters import HistoryEntry, HistoryMemory
from scope_jax.methods.spell import difficulty
from scope_jax.rewards import match
from scope_jax.methods.spell import rewards as R


@pytest.mark.parametrize("p,expected", [
    (0.0, 0.0), (1.0, 0.0), (0.5, 1.0),
    (0.25, math.exp(-(0.25 ** 2) / (2 * (1 / 6) ** 2))),  # = exp(-1.125) = 0.32465
    (0.125, math.exp(-(0.375 ** 2) / (2 * (1 / 6) ** 2))),  # = exp(-2.53125) = 0.07956
    (0.875, math.exp(-2.53125))])
def test_gaussian_questioner_reward(p, expected):
  assert difficulty.spell_gaussian(p) == pytest.approx(expected, abs=1e-12)
  assert difficulty.spell_gaussian(0.25) == pytest.approx(0.324652, abs=1e-6)


def test_variant_mappings():
  assert difficulty.questioner_difficulty(0.25, "reverse") == 0.75
  assert difficulty.questioner_difficulty(1.0, "reverse") == 0.0
  assert difficulty.questioner_difficulty(0.0, "reverse") == 0.0
  assert difficulty.questioner_difficulty(0.25, "rzero") == 0.5
  assert difficulty.questioner_difficulty(0.5, "rzero") == 1.0
  with pytest.raises(ValueError, match="valid: gaussian, reverse, rzero"):
    difficulty.questioner_difficulty(0.5, "linear")


def test_questioner_reward_from_responses():
  assert R.questioner_reward([1, 1, 0, 0]) == pytest.approx(1.0)
  assert R.questioner_reward([1, 1, 1, 1]) == 0.0
  assert R.questioner_reward([0, 0, 0, 0]) == 0.0
  assert R.questioner_reward([1, 0, 0, 0]) == pytest.approx(math.exp(-1.125))
  assert R.BAD_FORMAT == -1.0 and R.UNGROUNDED == -0.5


def test_majority_vote_with_ties():
  assert R.majority([1, 1, 0]) == 1
  assert R.majority([1, 1, 0, 0]) == 0  # a tie is not a majority (> G/2)
  assert R.majority([1, None, None, 1, 1]) == 1
  assert R.majority([None, None, 1]) == 0
  assert R.majority([1] * 5 + [0] * 3) == 1


def test_responder_max_rule_and_verifier_reward():
  assert R.responder_reward(0.0, 1) == 1.0
  assert R.responder_reward(1.0, 0) == 1.0
  assert R.responder_reward(0.0, 0) == 0.0
  assert R.verifier_rewards([1, 0, None, 1], vote=1) == [1.0, 0.0, -1.0, 1.0]


def test_verdict_and_proposal_parsing():
  assert R.parse_verdict("Explanation: same. Decision: [[YES]]") == 1
  assert R.parse_verdict("[[YES]] ... on reflection [[ no ]]") == 0
  assert R.parse_verdict("Decision: YES") is None
  p = R.parse_proposal('reasoning {not json} ... {"question": "Q?", "answer": "Paris",}', "doc_qa")
  assert p == R.Proposal("Q?", "Paris")
  mc = ('{"question": "Q?", "options": {"A": "a", "B": "b", "C": "c", "D": "d"}, "answer": "(C)"}')
  assert R.parse_proposal(mc, "doc_mc").answer == "C"
  assert R.parse_proposal('{"question": "Q?", "options": {"A": "a"}, "answer": "A"}', "doc_mc") is None
  assert R.parse_proposal('{"question": "How much?", "answer": "about twelve"}', "doc_math") is None
  assert R.parse_proposal('{"question": "How much?", "answer": "1,250.5"}', "doc_math").answer == "1,250.5"
  assert R.parse_proposal("no json at all", "doc_qa") is None


def test_rule_scores():
  assert R.rule_score("... The correct answer is the Eiffel Tower.", "Eiffel Tower", "doc_qa") == 1.0
  assert R.rule_score("The correct answer is (B).", "B", "doc_mc") == 1.0
  assert R.rule_score("The correct answer is (C).", "B", "doc_mc") == 0.0
  assert R.rule_score("Therefore, the answer is 100.1.", "100", "doc_math") == 1.0  # within 0.15%
  assert R.rule_score("Therefore, the answer is 100.2.", "100", "doc_math") == 0.0
  assert R.rule_score("no final sentence", "x", "doc_qa") == 0.0


def test_matching_rules():
  assert match.normalize("The  Eiffel-Tower!") == "eiffeltower"
  assert match.exact_match("the Paris", "Paris") == 1.0
  assert match.cover_exact_match("It is in Paris, France", "paris") == 1.0
  assert match.f1("red big apple", "big red ball") == pytest.approx(2 / 3)


def test_history_memory_fifo_and_growing_context():
  mem = HistoryMemory(size=3)
  assert mem.context_doc_ids("c", ["d1", "d2"]) == ["d1", "d2"]
  for i in range(4):
    mem.push("c", HistoryEntry([f"d{i}", f"d{i + 1}"], f"q{i}", f"a{i}"))
  assert [e.question for e in mem.get("c")] == ["q1", "q2", "q3"]  # q0 evicted
  assert mem.context_doc_ids("c", ["d9", "d2"]) == ["d1", "d2", "d3", "d4", "d9"]
  again = HistoryMemory.from_json(3, mem.to_json())
  assert [e.question for e in again.get("c")] == ["q1", "q2", "q3"]


@pytest.mark.parametrize("text,letter", [
    ("A good choice is (C)", "C"), ("The answer is D, not A", "D"), ("answer: b", None),
    ("(B) Paris", "B"), ("B. Paris", "B"), ("B", "B"), ("I would pick C", "C"),
    ("A dog ran", None), ("a", None), ("Answer is (A)", "A")])
def test_choice_letter_prefers_explicit_forms(text, letter):
  assert match.choice_letter(text) == letter


@pytest.mark.parametrize("text,answer", [
    ("The answer is ", None), ("Therefore, the answer is:\r\n", None), ("the answer is\x85", None),
    ("The correct answer is (Paris).", "Paris"), ("the answer is\nBerlin", "Berlin"),
    ("The answer is A. Actually, the answer is B.", "B"), ("Therefore, the answer is: 42.", "42"),
    ("no phrase here", None)])
def test_extract_final_answer_on_cut_and_odd_endings(text, answer):
  assert match.extract_final_answer(text) == answer
  assert R.rule_score(text, "Paris", "doc_qa") in (0.0, 1.0)  # never raises


def test_extract_final_answer_is_linear_on_long_whitespace():
  import time
  start = time.perf_counter()
  assert match.extract_final_answer("the answer is" + "\n" * 20000) is None
  assert match.extract_final_answer("the answer is" + " " * 15000 + "x") == "x"
  assert time.perf_counter() - start < 0.05


def test_questioner_reward_without_responses_and_odd_answers():
  assert R.questioner_reward([]) == 0.0
  for answer in ("NaN", "Infinity", "true", "-Infinity"):
    assert R.parse_proposal('{"question": "Which?", "answer": %s}' % answer, "doc_qa") is None
  assert R.parse_proposal('{"question": "Which?", "answer": 42}', "doc_qa").answer == "42"


@pytest.mark.parametrize("text,answer", [
    (r"so the total is \boxed{42}.", "42"),
    (r"\boxed{\frac{1}{2}} first, then \boxed{3}", "3"),
    (r"nested \boxed{\sqrt{\frac{a}{b}}} kept", r"\sqrt{\frac{a}{b}}"),
    (r"$\boxed 7$", "7"),
    (r"\fbox{x}", "x"),
    (r"cut off \boxed{\frac{1}{2}", None),
    (r"\boxed{}", None),
    (r"\boxed", None),
    ("no box at all", None),
])
def test_last_boxed(text, answer):
  assert match.last_boxed(text) == answer
