"""SCOPE reward formulas with hand-computed values (ALGORITHMS §2)."""

import math

import numpy as np
import pytest

from scope_jax.methods.scope import rewards as S
from scope_jax.rollout.types import Span, ToolCall, Trajectory


@pytest.mark.parametrize("g,expected", [(0.0, 0.0), (0.25, 0.5), (0.5, 1.0), (0.8, 0.4), (1.0, 0.0)])
def test_f_diff(g, expected):
  assert S.f_diff(g) == pytest.approx(expected)


@pytest.mark.parametrize("n,expected", [
    (100, 1.0), (1024, 1.0), (1536, 0.05 + 0.95 * 0.5), (2048, 0.05), (5000, 0.05),
    (1280, 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi / 4)))])
def test_length_penalty(n, expected):
  assert S.length_penalty(n) == pytest.approx(expected)


def test_search_reward_and_window():
  assert [S.search_reward(k) for k in (0, 1, 3, 7)] == [0.0, pytest.approx(1 / 3), 1.0, 1.0]
  assert S.in_difficulty_window(0.2) and S.in_difficulty_window(0.8)
  assert not S.in_difficulty_window(0.19) and not S.in_difficulty_window(0.81)


def test_rubric_key_ignores_case_spacing_and_order():
  a = [S.Criterion("Answers  Painter.", "critical"), S.Criterion("Names the city.", "minor")]
  b = [S.Criterion("names the city.", "critical"), S.Criterion("answers painter.", "minor")]
  assert S.rubric_key(a) == S.rubric_key(b) == "answers painter. | names the city."
  assert S.rubric_key([S.Criterion("Answers surgeon.", "critical")]) != S.rubric_key(a[:1])
  assert S.rubric_key(None) == ""


def _traj(turns, searches_in_turns=(), errors=()):
  spans, toks = [Span(0, 1, "prompt", "")], 1
  for i, t in enumerate(turns):
    spans.append(Span(toks, toks + 1, "generated", t))
    toks += 1
    if i < len(turns) - 1:
      spans.append(Span(toks, toks + 1, "observation", "<information>...</information>"))
      toks += 1
  calls = [ToolCall(turn, ["q"], "docs", "err" if turn in errors else None)
           for turn in searches_in_turns]
  return Trajectory(np.zeros(toks, np.int32), np.zeros(toks, np.int32), np.zeros(toks, np.float32),
                    1, spans, calls, None, None, "final")


def test_challenger_format_on_a_multi_turn_transcript():
  t = _traj(["<think>plan</think><search>a</search>", "no think <search>b</search>",
             "<think>ok</think><task><question>What?</question></task>"], [0, 1])
  # think 2/3, tool min(2/2, 1) = 1, structure 1 → (2/3 + 1 + 1)/3
  assert S.challenger_format(t, required_searches=2) == pytest.approx((2 / 3 + 2) / 3)
  # 3 required, 2 valid → tool 2/3
  assert S.challenger_format(t, required_searches=3) == pytest.approx((2 / 3 + 2 / 3 + 1) / 3)
  bad = _traj(["<task>no question</task>"])
  assert S.challenger_format(bad, 1) == 0.0
  assert S.challenger_reward(0.0, True, 0.5) == 0.0  # format 0 → total 0
  assert S.challenger_reward(0.5, True, 0.25) == pytest.approx(0.25 + 0.5)
  assert S.challenger_reward(0.5, False, 0.5) == pytest.approx(0.25)


def test_solver_format_on_a_multi_turn_transcript():
  t = _traj(["<think>a</think><search>x</search>", "<think>b</think><search>y</search>",
             "<think>c</think><answer>Long answer.</answer>"], [0, 1], errors=[1])
  # think 1, tool = 1 valid search in 2 non-final turns = 0.5, answer 1
  assert S.solver_format(t) == pytest.approx((1 + 0.5 + 1) / 3)
  one = _traj(["<answer>x</answer>"])
  assert S.solver_format(one) == pytest.approx((0 + 0 + 1) / 3)
  late = _traj(["Plan: <think>a</think><search>x</search>", "<think>c</think><answer>y</answer>"],
               [0])
  # The released Solver reward: a turn thinks only when it opens with <think>…</think>.
  assert S.solver_format(late) == pytest.approx((1 + 1 + 1) / 3)
  assert S.solver_format(late, released=True) == pytest.approx((0.5 + 1 + 1) / 3)
  assert S.solver_reward(0.5, 1536, 0.5, 2) == pytest.approx(0.525 * 0.5 + 0.25 + 0.1 * 2 / 3)
  assert S.solver_reward(None, 10, 0.0, 0) == 0.0


def test_rubric_parsing_and_weighted_grade():
  text = ("<rubric>\n1. [critical] Identify the 1998 treaty by name\n"
          "2. (important) Explain the funding change in dollars\n"
          "- bonus: Mention the second organisation involved\n- short\n</rubric>")
  crit = S.parse_rubrics(text)
  assert [c.priority for c in crit] == ["critical", "important", "bonus"]
  assert crit[0].text == "Identify the 1998 treaty by name"
  assert S.parse_rubrics("only one line that is long enough") is None
  assert S.rubric_grade(crit, [1, 0, 1]) == pytest.approx(2 / 3)
  assert S.rubric_grade(crit, [1, None, None]) is None  # coverage 1/3 < 0.5: discarded
  assert S.rubric_grade(crit, [1, None, 1]) == pytest.approx(2 / 3)  # missing counts as 0
  assert S.parse_binary_grade("reasoning <score>1</score> ... <score>0</score>") == 0
  assert S.parse_binary_grade("score: 1") is None


def test_quality_gate_from_two_verdicts():
  judge = S.parse_binary_grade
  assert S.quality_gate(judge("<think>names Ada Lovelace</think><score>1</score>"),
                        judge("<score>1</score>")) == (True, False)
  assert S.quality_gate(judge("<score>1</score>"), judge("<score>0</score>")) == (False, False)
  assert S.quality_gate(judge("<score>yes</score>"), judge("<score>1</score>")) == (False, True)
  assert S.quality_gate(judge("<score>1</score>"), judge("")) == (False, True)


def test_rubric_tag_lines_are_not_criteria():
  text = "<rubric>\n1. [critical] Identifies Ada Lovelace.\n2. [important] Explains Librubric><|im_end|>"
  assert S.parse_rubrics(text) is None  # two criteria: malformed, the tag line does not count


def test_think_counts_anywhere_in_a_turn():
  """App. F.1: a turn thinks if it has <think>…</think> anywhere, not only at its start."""
  t = _traj(["Let me plan. <think>plan</think><search>a</search>",
             "<search>b</search> <think>late</think>", "<think>never closed <search>c</search>"],
            [0, 1])
  assert S.think_share(t.turn_texts()) == pytest.approx(2 / 3)
  assert S.think_share(["</think> before <think>"]) == 0.0


def test_challenger_format_and_reward_as_released():
  """The released Challenger reward: a turn thinks when it has a `<think>` anywhere, closed or
  not (`re.search("<think>", content)`), a failed search cancels a valid one in the tool score,
  and an unreadable task or a malformed rubric zeroes the reward that the paper's text would
  still pay for format."""
  t = _traj(["<think>plan</think><search>a</search>", "Now. <think>late, never closed <search>b"
             "</search>", "<task><question>What?</question></task>"], [0, 1], errors=[1])
  # Paper: think 1/3 (a closed block), tool 1 valid / 2 required, structure 1.
  assert S.challenger_format(t, 2) == pytest.approx((1 / 3 + 0.5 + 1) / 3)
  # Released: think 2/3 (an open tag counts), tool max(1 − 1, 0)/2 = 0.
  assert S.challenger_format(t, 2, released=True) == pytest.approx((2 / 3 + 0 + 1) / 3)
  assert S.think_share(["  <think>a</think>", "x<think>b</think>"], "opening") == 0.5
  assert S.think_share(["x <think>b", "none"], "tag") == 0.5
  assert S.challenger_reward(0.5, True, 0.5, formed=False) == 0.0
  assert S.challenger_reward(0.5, False, None, formed=True) == pytest.approx(0.25)


def test_mean_grade_leaves_out_unanswered_rollouts_as_released():
  grades, answered = [1.0, 0.0, None, 0.5], [True, False, True, True]
  assert S.mean_grade(grades, answered) == pytest.approx(0.5)  # (1 + 0 + 0.5) / 3
  assert S.mean_grade(grades, answered, answered_only=True) == pytest.approx(0.75)  # (1 + 0.5)/2
  assert S.mean_grade([0.0], [False], answered_only=True) is None


def test_task_forms_by_hand():
  plain, nested = "<think>ok</think><task>\n Plan a trip. \n</task>", \
      "<task><question>Plan a trip.</question></task>"
  assert S.task_text(plain, "plain") == "Plan a trip."  # the released extract_task
  assert S.task_text(plain, "question") is None  # the paper's text needs a <question>
  assert S.task_text(nested, "question") == "Plan a trip."
  assert S.task_text(nested, "plain") == "<question>Plan a trip.</question>"
  assert S.task_text("<task> </task>", "plain") is None
  assert S.task_question(["<search>x</search>", plain], "plain") == "Plan a trip."
  assert S.task_question([], "plain") is None
