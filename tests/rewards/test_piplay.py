"""π-Play's formulas (ALGORITHMS §5) against values computed by hand."""

import chex
import jax.numpy as jnp
import re

import numpy as np
import pytest

from scope_jax.methods.piplay import rewards as R
from scope_jax.rl import advantages as adv_lib
from scope_jax.rl.ema import ema_update

DOC = "Ada Lovelace was an English mathematician known for work on the Analytical Engine."


@pytest.mark.parametrize("k, expected", [(0, 0.0), (1, 1.0), (2, 0.75), (3, 0.5), (4, 0.25),
                                         (5, 0.0)])
def test_difficulty_reward_over_five_attempts(k, expected):
  """r_d = 1[0 < k < 5]·(5 − k)/4 + r_f: 1, 3/4, 2/4, 1/4 for k = 1..4; 0 when none or all are
  right (here with r_f = 0, then with r_f = 0.4 added on top)."""
  assert R.difficulty_reward(k, 5, 0.0) == pytest.approx(expected)
  assert R.difficulty_reward(k, 5, 0.4) == pytest.approx(expected + 0.4)


def test_difficulty_reward_needs_two_attempts():
  with pytest.raises(ValueError, match="at least 2"):
    R.difficulty_reward(0, 1, 0.0)


def _format(final, turns, hops, calls, attempts=None, sources=(DOC,)):
  return R.format_reward(R.parse_examiner(final), turns, list(sources), calls,
                         calls if attempts is None else attempts, hops)


def test_format_reward_well_formed_transcript():
  """Two turns, both opening with <think>; 2 hops and 1 valid call of 1: tool = min(2/2, 1) = 1;
  the answer 'English mathematician' (2 words) is in the document: ans = 1.
  r_f = 0.5·(1 + 1 + 1 + 1)/4 = 0.5."""
  turns = ["<think>search</think><search>Ada</search>",
           "<think>ask</think><question>What was Ada Lovelace?</question>"
           "<answer>English mathematician</answer>"]
  parts = _format(turns[-1], turns, hops=2, calls=1)
  assert parts == {"think": 1.0, "tool": 1.0, "ans": 1.0, "format": 0.5}


def test_format_reward_missing_think_and_too_few_calls():
  """Think counts only turns that open with <think>: 1 of 2. Four hops with 1 valid call of 1:
  tool = min(2/4, 1) = 0.5; the answer is in a tool result, not the document.
  r_f = 0.5·(1 + 1/2 + 1/2 + 1)/4 = 0.375."""
  turns = ["<search>Ada</search> <think>late</think>",
           "<think>ask</think><question>Who designed the engine?</question>"
           "<answer>Charles Babbage</answer>"]
  parts = _format(turns[-1], turns, hops=4, calls=1,
                  sources=(DOC, "Doc 1(Title: Engine) Charles Babbage designed it."))
  assert parts == {"think": 0.5, "tool": 0.5, "ans": 1.0, "format": 0.375}


@pytest.mark.parametrize("hops, calls, attempts, tool", [
    (1, 0, 0, 1.0), (1, 2, 3, 1.0),  # one hop: always 1
    (3, 0, 0, 0.0),  # no search for a 3-hop question
    (3, 1, 2, 0.0),  # an invalid call among the attempts
    (3, 1, 1, 2 / 3), (3, 2, 2, 1.0), (3, 4, 4, 1.0)])
def test_tool_part_follows_dr_zero(hops, calls, attempts, tool):
  assert R.tool_score(calls, attempts, hops) == pytest.approx(tool)


def test_format_reward_long_answers_and_answers_not_in_the_sources():
  """7 words present: ans = 0.5; 11 words present: 0; absent from every source: 0; 'yes' counts
  as present; a title counts as part of the document. One hop: tool = 1. No think at all."""
  seven = "English mathematician known for work on the"
  long_doc = '(Title: "Ada Lovelace") ' + DOC + " one two three four five six seven eight nine ten eleven"
  for answer, ans in ((seven, 0.5), ("one two three four five six seven eight nine ten eleven", 0.0),
                      ("Grace Hopper", 0.0), ("Yes", 1.0), ("Ada Lovelace", 1.0)):
    final = f"<question>Who was she?</question><answer>{answer}</answer>"
    parts = _format(final, [final], hops=1, calls=0, sources=(long_doc,))
    assert parts["tool"] == 1.0 and parts["think"] == 0.0 and parts["ans"] == ans
    assert parts["format"] == pytest.approx(0.5 * (1 + 0 + 1 + ans) / 4)


def test_an_answer_inside_a_word_of_the_question_is_not_given_away():
  """'Art' is not in 'start' (a substring test once called this question malformed)."""
  out = R.parse_examiner("<question>Where does the race start?</question><answer>Art</answer>")
  assert out.malformed is None and out.answer == "Art"
  out = R.parse_examiner("<question>Where is the Art museum?</question><answer>art</answer>")
  assert out.malformed == "answer_in_question"


@pytest.mark.parametrize("final, reason", [
    ("<answer>London</answer>", "no_question"),  # no <question>
    ("<question>Where?</question><answer> </answer>", "no_answer"),  # an empty answer
    ("<question>Where?</question>", "no_answer"),
    ("<question>Is the capital London?</question><answer>London</answer>",
     "answer_in_question"),  # the answer given away inside the question
    ("<question>Is it the city?</question><answer>The</answer>", "no_answer"),  # only an article
])
def test_malformed_examiner_output_scores_zero(final, reason):
  out = R.parse_examiner(final)
  assert out.malformed == reason
  parts = R.format_reward(out, ["<think>x</think>" + final], [DOC + " London"], 1, 1, 2)
  assert parts["format"] == 0.0 and parts["ans"] == 0.0


def test_outcome_is_exact_match_after_normalisation():
  assert R.outcome("The Analytical  Engine.", "analytical engine") == 1.0
  assert R.outcome("Analytical Engine 2", "analytical engine") == 0.0
  assert R.outcome(None, "x") == 0.0


def test_hop_keyed_zscore_by_hand():
  """Hop 1: rewards 1, 0 → mean ½, population std ½ → ±1. Hop 2: 0.5, 0.5, 0.8 → mean 0.6,
  std √(0.01·2 + 0.04)/√3 = √0.02 → (−0.1, −0.1, 0.2)/√0.02. A hop with one row gets 0."""
  rewards = [1.0, 0.5, 0.0, 0.5, 0.8, 0.3]
  hops = [1, 2, 1, 2, 2, 3]
  got = adv_lib.keyed_zscore(rewards, hops, delta=0.0)
  s = np.sqrt(0.02)
  chex.assert_trees_all_close(got, np.asarray([1.0, -0.1 / s, -1.0, -0.1 / s, 0.2 / s, 0.0],
                                              np.float32), atol=1e-5, rtol=0)


def test_ema_after_three_steps_by_hand():
  """ψ ← 0.95ψ + 0.05θ three times, with θ = 2, 4, 6 after each student step and ψ₀ = 0:
  0.1, then 0.295, then 0.58025."""
  teacher = {"w": jnp.zeros((2,), jnp.float32)}
  for theta in (2.0, 4.0, 6.0):
    teacher = ema_update(teacher, {"w": jnp.full((2,), theta)}, 0.05)
  chex.assert_trees_all_close(teacher, {"w": jnp.full((2,), 0.58025)}, atol=1e-6, rtol=0)


def test_privileged_information_variants():
  pieces = ["n = 2. Document: D\n", "<think>a</think><search>q</search>", "<information>r</information>",
            "<think>b</think><question>Q?</question><answer>A</answer>"]
  assert R.privileged_text("qcp", pieces, "A", 2) == "".join(pieces)
  assert R.privileged_text("gt", pieces, "A", 2) == "<answer> A </answer>"
  assert R.privileged_text("gt_hops", pieces, "A", 2) == \
      "The question takes n = 2 hops.\n<answer> A </answer>"
  half = R.privileged_text("partial_qcp", pieces, "A", 2, np.random.default_rng(0))
  whole = "".join(pieces)
  assert 0 < len(half) <= len(whole) // 2
  units = re.split(r"(?<=[.!?\n])", whole)
  assert half == "".join(u for u in units if u in half)  # whole sentences, in order


def test_partial_qcp_keeps_half_of_a_one_hop_path():
  """A 1-hop path (the task line with its document, one answer turn) came back whole when the
  task line was always kept and half of the other pieces rounded up; now half its characters."""
  doc = " ".join(f"Sentence {i} of the source document." for i in range(40))
  pieces = [f"n = 1. Document: {doc}\n", "<think>easy</think><question>Q?</question><answer>A</answer>"]
  whole = "".join(pieces)
  shares = []
  for seed in range(100):
    half = R.privileged_text("partial_qcp", pieces, "A", 1, np.random.default_rng(seed))
    assert half != whole
    shares.append(len(half) / len(whole))
  assert 0.45 <= min(shares) and max(shares) <= 0.5
  assert len({R.privileged_text("partial_qcp", pieces, "A", 1, np.random.default_rng(s))
              for s in range(5)}) == 5  # a random half, not a fixed one
  assert R.privileged_text("partial_qcp", ["x" * 11], "A", 1, np.random.default_rng(0)) == "x" * 5
  with pytest.raises(ValueError, match="choose one of"):
    R.privileged_text("everything", pieces, "A", 2)
