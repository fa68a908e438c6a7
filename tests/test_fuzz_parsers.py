"""Every parser of model output, driven with random and adversarial text: it never raises, and
no call takes more than 50 ms on text up to the 50k-character cap (longer text is cut first)."""

import functools
import time

import numpy as np
import pytest

from scope_jax import tokenizer
from scope_jax.methods.asl import rewards as A
from scope_jax.methods.opensir import rewards as O
from scope_jax.rewards import match
from scope_jax.rewards import mathcheck
from scope_jax.methods.scope import rewards as S
from scope_jax.methods.spell import rewards as R
from scope_jax.rollout import parsers
from scope_jax.rollout.datums import strip_think

N = 2000
CAP = 50_000
PIECES = ["<think>", "</think>", "<search>", "</search>", "<tool_call>", "</tool_call>",
          "<answer>", "</answer>", "<task>", "</task>", "<question>", "</question>", "<rubric>",
          "</rubric>", "<score>", "</score>", "<score>1</score>", "[[YES]]", "[[NO]]", "[[", "]]",
          "{", "}", "[", "]", '"', "'", ":", ",", '{"question": "Q?", "answer": "A"}',
          '{"name": "search", "arguments": {"query": "x"}}', '"query_list": ["a", "b"]',
          "The correct answer is ", "Therefore, the answer is", "the answer is:", "(A)", "(B)",
          " C ", "D.", "1. [critical] ", "- (bonus) ", "important: ", "\\boxed{", "NaN",
          "Infinity", "true", "1e308", "9" * 400, "-", "\n", "\r\n", "\x85", "\t", " " * 64, "é",
          "\ud800", "😀", "\x00", "<|im_end|>", "\\boxed", "\\fbox{", "\\boxed ", "{\\frac{1}{2}}",
          "conclusion: ", "conclusion:", "correct", "wrong", "correct/wrong", "**"]


def _random_text(rng: np.random.Generator) -> str:
  n = int(rng.integers(0, 60))
  return "".join(PIECES[int(i)] for i in rng.integers(0, len(PIECES), n))


def _adversarial() -> list[str]:
  return [
      " " * CAP, "\n" * CAP, "the answer is" + "\n" * 20_000, "the answer is" + " " * CAP,
      "<think>" * (CAP // 7), "</think>" * (CAP // 8), "<search>" * (CAP // 8) + "</search>",
      "<tool_call>" * 4000 + "</tool_call>", "{" * CAP, "}" * CAP, "[" * CAP + "]" * CAP,
      '{"a": ' * 10_000 + "1" + "}" * 10_000, "9" * CAP, "1. [critical] " + " " * CAP + "x",
      "- " + " " * CAP + "criterion text here", "<rubric>\n" + ("1. [bonus] text\n" * 5000),
      "<score>" * 8000, "[[YES" * 8000, "(" * CAP, "A" * CAP, "x" * (1 << 20),
      '{"question": "' + "q" * CAP + '", "answer": "a"}', "<answer>" + "a" * CAP,
      "<task><question>" * 3000 + "</question></task>", "\ud800" * 1000,
      "\\boxed{" * (CAP // 7), "\\boxed{" + "{" * CAP, "\\boxed " + " " * CAP,
      "<answer>conclusion" + " " * CAP + "correct</answer>", "<answer>" + "conclusion: " * 4000,
      "<question>" + "x " * CAP + "</question><answer>" + "y " * CAP + "</answer>",
      "Therefore, the final answer is: $\\boxed{" * (CAP // 40), "9^{" * 20 + "9" + "}" * 20,
      "2^" * (CAP // 2) + "2", "\\text{" * (CAP // 7) + "even", "(" * 9 + "9!)!" * 5000]


PARSERS = {
    "proposal_qa": functools.partial(R.parse_proposal, task="doc_qa"),
    "proposal_mc": functools.partial(R.parse_proposal, task="doc_mc"),
    "proposal_math": functools.partial(R.parse_proposal, task="doc_math"),
    "verdict": R.parse_verdict,
    "rule_score": lambda t: R.rule_score(t, "Paris", "doc_qa") + R.rule_score(t, "B", "doc_mc")
    + R.rule_score(t, "42", "doc_math"),
    "rubric": S.parse_rubrics,
    "grade": S.parse_binary_grade,
    "final_answer": match.extract_final_answer,
    "mc_letter": match.choice_letter,
    "numbers": match.numbers,
    "boxed": match.last_boxed,
    "action_xml": functools.partial(parsers.parse_action, syntax="xml",
                                    final_tags=("answer", "task")),
    "action_qwen": functools.partial(parsers.parse_action, syntax="qwen"),
    "tag": lambda t: parsers.extract_tag(t, "answer"),
    "task": S.well_formed_task,
    "think": lambda t: S.think_share([t, t[:100]]),
    "datum_strip": strip_think,
    "asl_task": A.parse_task,
    "asl_verdict": A.parse_verdict,
    "student_format": O.student_format,
    "math_screen": mathcheck.screen,  # what reaches the math worker, and what is text
    "math_text": mathcheck.text_answer,
    "tool_output": tokenizer.clean_text,  # search results, before they are encoded plain
}


LIMIT_S = 0.05


def _timed(fn, text: str) -> float:
  start = time.perf_counter()
  fn(text)
  return time.perf_counter() - start


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parser_never_raises_and_stays_fast(name):
  fn = PARSERS[name]
  rng = np.random.default_rng(abs(hash(name)) % 2**32)
  texts = _adversarial()
  texts += [_random_text(rng) for _ in range(N - len(texts))]
  worst, worst_text = 0.0, ""
  for text in texts:
    took = _timed(fn, text)  # must not raise
    if took > LIMIT_S / 2:  # a slow call is timed twice more: a busy machine's pause is not the parser
      took = min(took, _timed(fn, text), _timed(fn, text))
    if took > worst and len(text) <= CAP:
      worst, worst_text = took, text
  assert len(texts) == N
  assert worst < LIMIT_S, f"{name} took {worst * 1e3:.1f} ms on {worst_text[:80]!r}… ({len(worst_text)} chars)"
