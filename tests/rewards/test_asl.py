"""ASL's rewards and rules (ALGORITHMS §4) with hand-computed values."""

import math

import chex
import numpy as np
import pytest

from scope_jax.methods.asl import rewards as R

LN2 = math.log(2.0)


# ------------------------------------------------------------------------------ PG reward

@pytest.mark.parametrize("correct, expected", [
    (0, 0.0),  # every answer wrong: no information
    (5, LN2),  # 0.6931…: the maximum, at 50 %
    (3, 0.6108643020548935),  # −0.3 ln 0.3 − 0.7 ln 0.7 = 0.36119 + 0.24967
    (10, 0.0),  # every answer right
])
def test_binary_entropy_of_ten_scores(correct, expected):
  scores = [1] * correct + [0] * (10 - correct)
  assert R.pg_reward(scores, "entropy") == pytest.approx(expected, abs=1e-12)
  assert R.binary_entropy(correct / 10) == pytest.approx(expected, abs=1e-12)


def test_three_of_ten_by_hand():
  by_hand = -(0.3 * math.log(0.3) + 0.7 * math.log(0.7))
  assert by_hand == pytest.approx(0.36119184 + 0.24967246, abs=1e-8)
  assert R.binary_entropy(0.3) == pytest.approx(by_hand, abs=1e-15)
  assert R.binary_entropy(0.7) == pytest.approx(by_hand, abs=1e-15)  # symmetric


def test_azr_option_and_malformed_questions():
  assert R.pg_reward([1, 1, 1, 0], "azr") == pytest.approx(0.25)  # 1 − 3/4
  assert R.pg_reward([1] * 10, "azr") == 0.0 and R.pg_reward([0] * 10, "azr") == 0.0
  assert R.pg_reward(None) == 0.0 and R.pg_reward([]) == 0.0  # malformed or invalid question
  # A malformed GRM verdict counts as 0: one right, one wrong, one malformed → p̄ = 1/3.
  assert R.pg_reward([1, 0, None]) == pytest.approx(-(1 / 3) * math.log(1 / 3)
                                                    - (2 / 3) * math.log(2 / 3))
  with pytest.raises(ValueError, match="Unknown PG reward 'gauss'"):
    R.pg_reward([1, 0], "gauss")


# ------------------------------------------------------------------- gate, flag, GRM reward

def test_validity_gate_is_strictly_above_c():
  assert not R.is_valid([1, 1, 1, 1, 0], 0.8)  # s̄ = 0.8 is not > 0.8: rejected
  assert R.is_valid([1, 1, 1, 1, 1], 0.8)  # s̄ = 1.0: kept
  assert not R.is_valid([1, 1, 1, 1, None], 0.8)  # a malformed verdict counts as 0
  assert R.mean_score([1, 0, 1, 1, 1]) == pytest.approx(0.8)


def test_harder_easier_flag():
  assert R.difficulty_flag(0.5) == R.EASIER  # s̄ ≤ 0.5: too hard for the PM
  assert R.difficulty_flag(0.6) == R.HARDER  # s̄ > 0.5: too easy
  assert R.difficulty_flag(0.0) == R.EASIER and R.difficulty_flag(1.0) == R.HARDER


def test_harder_at_half_is_the_released_flag():
  """The released `"HARDER" if score >= 0.5`: at s̄ = 0.5 (2 of G = 4) the question is flagged
  HARDER; the paper's > 0.5 flags it EASIER."""
  assert R.difficulty_flag(0.5, harder_at_half=True) == R.HARDER
  assert R.difficulty_flag(0.5, harder_at_half=False) == R.EASIER
  assert R.difficulty_flag(0.25, harder_at_half=True) == R.EASIER
  assert R.difficulty_flag(0.75, harder_at_half=True) == R.HARDER


@pytest.mark.parametrize("text, released, paper", [
    # a paraphrased conclusion: the released scorer reads "correct" after "conclusion"
    ("<answer>Conclusion: the student's answer is correct.</answer>", 1, None),
    ("Conclusion: the student's answer is correct.", 1, None),  # no <answer> needed as released
    ("<answer>correct</answer>", None, 1),  # a bare verdict: no "conclusion", 0 as released
    ("<answer>conclusion: incorrect</answer>", 0, 0),
    ("<answer>conclusion: correct</answer>", 1, 1),
    ("<answer>conclusion: wrong</answer>", 0, 0),
    ("<answer>conclusion: correct/wrong</answer>", 1, None),  # the placeholder: "correct" first
    ("In conclusion, I am unsure.", 0, None),
    ("no verdict at all", None, None),
])
def test_released_verdict_scorer_against_the_papers_parse(text, released, paper):
  assert R.released_verdict(text) == released
  assert R.parse_verdict(text) == paper
  assert R.score(R.released_verdict(text)) == (released or 0)


@pytest.mark.parametrize("text, reference, reward", [
    ("<answer>conclusion: correct</answer>", 1, 1.0),
    ("<answer>conclusion: incorrect</answer>", 1, 1.0),  # "correct" is in "incorrect"
    ("<answer>conclusion: incorrect</answer>", 0, 0.0),
    ("<answer>correct/wrong</answer>", 0, 1.0),  # the copied placeholder agrees with either
    ("<answer>correct/wrong</answer>", 1, 1.0),
    ("<answer>The student's answer is wrong.</answer>", 0, 1.0),
    ("<answer>first</answer> then <answer>conclusion: wrong</answer>", 0, 1.0),  # the last
    ("conclusion: correct", 1, 0.0),  # no <answer>: "No answer found."
    ("<answer> </answer>", 0, 0.0),
])
def test_released_grm_reward_is_a_substring_match_of_the_label(text, reference, reward):
  assert R.released_grm_reward(text, reference) == reward


def test_grm_agreement_reward():
  assert R.grm_reward(1, 1) == 1.0 and R.grm_reward(0, 0) == 1.0
  assert R.grm_reward(1, 0) == 0.0 and R.grm_reward(0, 1) == 0.0
  assert R.grm_reward(None, 0) == 0.0 and R.grm_reward(None, 1) == 0.0  # malformed ŝ


# ------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text, expected", [
    ("<answer>\nconclusion: correct\n</answer>", 1),
    ("<think>…</think><answer>conclusion: wrong</answer>", 0),
    ("<answer>Conclusion: **Incorrect**</answer>", 0),
    ("<answer>conclusion: correct/wrong</answer>", None),  # the placeholder copied
    ("conclusion: correct", None),  # outside <answer>
    ("<answer>It is right.</answer>", None),
    ("<answer>\ncorrect\n</answer>", 1),  # a bare verdict (the real 0.5B model writes this)
    ("<answer>Wrong.</answer>", 0),
    ("<answer>correct or wrong</answer>", None),
    ("<answer>correct/wrong</answer>", None),
    ("", None),
    (None, None),
])
def test_parse_verdict(text, expected):
  assert R.parse_verdict(text) == expected


@pytest.mark.parametrize("text, error", [
    ("<question>Who wrote Hamlet?</question>\n<answer>Shakespeare</answer>", None),
    ("<answer>Shakespeare</answer>", "no_question"),
    ("<question>Who wrote Hamlet?</question>", "no_answer"),
    ("<question>Who wrote Hamlet?</question>\n<answer>  </answer>", "empty_answer"),
    ("<question> </question>\n<answer>Shakespeare</answer>", "empty_question"),
    ("<question>Who wrote Hamlet? <answer>Shakespeare</answer></question>", "answer_in_question"),
    ("<question>Did Shakespeare write Hamlet?</question><answer>Shakespeare</answer>",
     "answer_in_question"),
    ("<question>" + "x " * 2000 + "?</question><answer>y</answer>", "too_long"),
])
def test_parse_task_and_its_malformed_cases(text, error):
  task, err = R.parse_task(text)
  assert err == error
  if error is None:
    assert task == R.Task("Who wrote Hamlet?", "Shakespeare")
  else:
    assert task is None


def test_answer_leak_is_whole_words():
  assert R.answer_leaked("Which city is Paris twinned with?", "Paris")
  assert not R.answer_leaked("Which city is Paris's twin?", "Paris")  # normalised: "pariss"
  assert not R.answer_leaked("Which city is the capital of France?", "Paris")
  assert not R.answer_leaked("Which number follows 12?", "1")  # '1' is not a word of it


# -------------------------------------------------------------------------- slope rule

def test_slope_by_hand():
  # x = −1, 0, 1 (centred); y = 0.1, 0.2, 0.4: Σxy / Σx² = (−0.1 + 0.4) / 2 = 0.15.
  assert R.slope([0.1, 0.2, 0.4], 3) == pytest.approx(0.15)
  # Only the last window counts: 0.9 is outside.
  assert R.slope([0.9, 0.1, 0.2, 0.4], 3) == pytest.approx(0.15)
  assert R.slope([0.5, 0.5], 3) is None  # shorter than the window


def test_smoothing_by_hand():
  # ema 0.5: y = 0, 0.5, 0.75 → slope over 3 = (0.75 − 0) / 2 = 0.375.
  chex.assert_trees_all_close(R.smooth([0.0, 1.0, 1.0], 0.5), np.asarray([0.0, 0.5, 0.75]))
  assert R.slope([0.0, 1.0, 1.0], 3, ema=0.5) == pytest.approx(0.375)
  chex.assert_trees_all_close(R.smooth([0.3, 0.1], 0.0), np.asarray([0.3, 0.1]))


def _done(curve, **kw):
  args = dict(window=4, threshold=0.05, min_steps=4, max_steps=10, ema=0.0)
  args.update(kw)
  return R.phase_done(curve, **args)


def test_phase_ends_on_a_flat_curve():
  assert _done([0.5, 0.5, 0.5, 0.5]) == (True, "slope")  # slope 0 < 0.05


def test_phase_goes_on_while_rising():
  assert _done([0.1, 0.2, 0.3, 0.4]) == (False, "rising")  # slope 0.1 ≥ 0.05
  assert _done([0.1, 0.2, 0.3, 0.4, 0.42, 0.43, 0.44]) == (True, "slope")  # last 4: 0.01/step


def test_noisy_curve():
  noisy = [0.2, 0.6, 0.1, 0.5, 0.3, 0.7]
  # Last 4 points 0.1, 0.5, 0.3, 0.7: centred x = −1.5, −0.5, 0.5, 1.5; Σx² = 5;
  # Σx·(y − ȳ) = −1.5·(−0.3) − 0.5·0.1 + 0.5·(−0.1) + 1.5·0.3 = 0.8 → slope 0.16: goes on.
  assert R.slope(noisy, 4) == pytest.approx(0.16)
  assert _done(noisy) == (False, "rising")
  # It levels off: last 4 = 0.7, 0.6, 0.6, 0.6, ȳ = 0.625, Σx·(y − ȳ) = −0.15 → slope −0.03.
  assert R.slope(noisy + [0.6] * 3, 4) == pytest.approx(-0.03)
  assert _done(noisy + [0.6] * 3) == (True, "slope")
  assert _done([0.9, 0.1] * 5) == (True, "max_steps")  # never hangs: max_steps ends it


def test_curve_shorter_than_the_window_never_ends_early():
  assert _done([0.5, 0.5], min_steps=1) == (False, "window")
  assert _done([0.5, 0.5, 0.5], min_steps=1) == (False, "window")
  assert _done([0.5], min_steps=2) == (False, "min_steps")
  assert _done([0.5, 0.5], min_steps=1, max_steps=2) == (True, "max_steps")


def test_falling_curve_ends():
  assert _done([0.8, 0.6, 0.4, 0.2]) == (True, "slope")  # slope −0.2 < 0.05


def test_slope_rejects_bad_settings():
  with pytest.raises(ValueError, match="at least 2"):
    R.slope([1.0, 2.0], 1)
  with pytest.raises(ValueError, match="EMA factor"):
    R.smooth([1.0], 1.0)


# ------------------------------------------------------------------------------- stores

def test_store_bounds_drop_the_oldest():
  store = [1, 2, 3]
  assert R.bounded_add(store, [4, 5], 4) == 1
  assert store == [2, 3, 4, 5]
  assert R.bounded_add(store, [6, 7, 8, 9, 10], 3) == 6
  assert store == [8, 9, 10]
  assert R.bounded_add(store, [], 3) == 0 and store == [8, 9, 10]


# ------------------------------------------------------------------ as the released code does

def test_validity_gate_as_released_passes_four_of_five():
  assert R.is_valid([1, 1, 1, 1, 0], 0.8, inclusive=True)  # s̄ = 0.8 ≥ 0.8
  assert not R.is_valid([1, 1, 1, 0, 0], 0.8, inclusive=True)


def test_pm_store_keeps_rewarded_questions_of_the_released_shape():
  q = "Which city hosted the 1908 Olympics?"
  assert R.pm_worthy(q, 0.5)
  assert not R.pm_worthy(q, 0.0)  # unanimous answers: r_PG = 0
  assert not R.pm_worthy("Which city is it?", 0.5)  # 17 characters
  assert not R.pm_worthy("Name the city that hosted the 1908 Olympics.", 0.5)  # no '?'


def test_grm_store_is_class_balanced_per_question():
  rng = np.random.default_rng(0)
  keep = R.balanced_judgments([1, 1, 1, 1, 1, 1, 1, 0, 0, 1], rng)  # 8 right, 2 wrong
  assert len(keep) == 4 and {7, 8} <= set(keep)  # both 0s and two of the 1s
  assert sorted([1, 1, 1, 1, 1, 1, 1, 0, 0, 1][i] for i in keep) == [0, 0, 1, 1]
  assert R.balanced_judgments([1] * 10, rng) == [] and R.balanced_judgments([0] * 4, rng) == []
  assert R.balanced_judgments([], rng) == []
  keep = R.balanced_judgments([1, 0, 1, 0], rng)  # s̄ = 0.5: the 1s are the minority
  assert sorted(keep) == [0, 1, 2, 3]
  # A GRM that always says "correct" scored the majority share (0.68) on the unbalanced store
  # and scores 0.5 on the balanced one.
  scores = [1] * 17 + [0] * 8
  kept = [scores[i] for i in R.balanced_judgments(scores, rng)]
  assert np.mean(scores) == pytest.approx(0.68) and np.mean(kept) == pytest.approx(0.5)


def test_format_reward_by_hand():
  turns = ["<think>search first</think><search>x</search>", "no thinking here <answer>A</answer>",
           "<think>unclosed", "  <think>ok</think><answer>B</answer>"]
  assert R.format_reward(turns, used_tool=True) == pytest.approx((2 / 4 + 1) / 4)
  assert R.format_reward(turns[:1], used_tool=False) == pytest.approx(0.25)
  assert R.format_reward(["<think>a</think>"], used_tool=True) == 0.5  # the most it gives
  assert R.format_reward([], used_tool=False) == 0.0


def _plateau(curve, window=8, **kw):
  return R.plateau_done(curve, window=window, **kw)


def test_plateau_rule_by_hand():
  # Newest first: halves of 4 and quarters of 2. A flat curve ends as soon as it may.
  assert _plateau([0.5] * 8) == (False, "window")  # needs more than the window
  assert _plateau([0.5] * 9) == (True, "plateau")
  # 0.40 0.40 0.40 0.40 | 0.40 0.40 0.41 0.41 (oldest → newest, last 8): the newest half's mean
  # 0.405 over 0.40 is +1.25%, above 0.5%: it goes on.
  assert _plateau([0.4] * 7 + [0.41, 0.41]) == (False, "rising")
  # A falling reward ends it too (signed gains).
  assert _plateau([0.6] * 5 + [0.5] * 4) == (True, "plateau")
  assert R.relative_gain([0.0], [0.0]) == 0.0 and R.relative_gain([0.1], [0.0]) == float("inf")
  assert _plateau([0.9, 0.1] * 2, max_steps=4) == (True, "max_steps")


def test_plateau_rule_on_rising_saturating_and_noisy_curves():
  """The slope rule (window 10, EMA 0.5, 0.05/step) ends a steadily rising phase at its first
  allowed step; the released plateau rule (window 200) lets it rise and ends it once it
  saturates, and ends a noisy flat curve soon after its window."""
  steps = np.arange(2000)
  rising = 0.05 + 0.0004 * steps[:1000]  # +0.0004/step: 40% of the range in 1,000 steps
  saturating = 0.8 - 0.7 * np.exp(-steps / 100.0)
  noisy = 0.5 + np.random.default_rng(0).normal(0, 0.02, 2000)

  def first_end(curve, rule):
    for n in range(1, len(curve) + 1):
      if rule(list(curve[:n]))[0]:
        return n
    return None

  slope = lambda c: R.phase_done(c, window=10, threshold=0.05, min_steps=10, max_steps=10 ** 6,
                                 ema=0.5)
  plateau = lambda c: R.plateau_done(c, window=200)
  assert first_end(rising, slope) == 10  # the old rule: at its minimum
  assert first_end(rising, plateau) is None  # still rising after 1,000 steps: goes on
  end = first_end(saturating, plateau)
  assert end is not None and saturating[end - 1] > 0.79 and end > 400  # ends once saturated
  assert 200 < first_end(noisy, plateau) <= 260
