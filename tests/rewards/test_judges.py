"""The two judge formats (`rewards.judges`): their parsers, their templates, and one definition
shared by the methods that use them and by held-out evaluation."""

import pytest

from scope_jax import prompts
from scope_jax.methods.scope import prompts as scope_prompts
from scope_jax.methods.scope import rewards as scope_rewards
from scope_jax.methods.spell import rewards as spell_rewards
from scope_jax.rewards import judges


@pytest.mark.parametrize("text,expected", [
    ("Explanation: same. Decision: [[YES]]", 1),
    ("[[YES]] ... on reflection [[ no ]]", 0),
    ("Decision: YES", None),
    ("[[YES]]" + "x" * judges.VERDICT_CHARS, None),  # read from the end only
])
def test_an_answer_match_verdict_is_the_last_one_written(text, expected):
  assert judges.parse_verdict(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("reasoning <score>1</score> ... <score>0</score>", 0),
    ("<think>.</think><score> 1 </score>", 1),
    ("score: 1", None),
    ("<score>2</score>", None),
])
def test_a_criterion_grade_is_the_last_binary_score(text, expected):
  assert judges.parse_binary_grade(text) == expected


@pytest.mark.parametrize("fmt,fields", [
    (judges.ANSWER_MATCH, {"problem", "answer_1", "answer_2"}),
    (judges.CRITERION_GRADE, {"task", "criterion", "response"}),
])
@pytest.mark.parametrize("style", sorted(judges.STYLES))
def test_each_format_has_a_template_in_each_style(fmt, fields, style):
  assert prompts.placeholders(judges.template(fmt, style)) == fields


def test_unknown_formats_and_styles_are_named():
  with pytest.raises(ValueError, match="judge format 'verifier'"):
    judges.template("verifier")
  with pytest.raises(ValueError, match="prompt style 'short'"):
    judges.template(judges.ANSWER_MATCH, "short")


def test_the_methods_parse_and_prompt_with_the_shared_definitions():
  assert spell_rewards.parse_verdict is judges.parse_verdict
  assert scope_rewards.parse_binary_grade is judges.parse_binary_grade
  assert judges.PARSERS == {judges.ANSWER_MATCH: judges.parse_verdict,
                            judges.CRITERION_GRADE: judges.parse_binary_grade}
  for style in judges.STYLES:
    grader = scope_prompts.Prompts(style).grader("T", "C", "R")
    assert grader.template == judges.template(judges.CRITERION_GRADE, style)
    assert grader.fit == ("response", "task", "criterion")
