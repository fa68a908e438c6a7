"""OpenSIR's scores (ALGORITHMS §3) against values computed by hand."""

import re
import time

import chex
import numpy as np
import pytest

from scope_jax import tokenizer as tok_lib
from scope_jax.methods.opensir import rewards as R

TEACHER = ("<think>Multiplication instead of addition.</think>\n"
           "<problem>What is 7 * 8?</problem>\n<concepts>integer multiplication</concepts>")


@pytest.mark.parametrize("s, expected", [
    (0.4, 0.0),  # below the band
    (0.5, 0.25),  # lower edge: y2 = 1/|{0.5, 0.625, 0.75, 0.875}|
    (0.625, 0.71875),  # 1 − 0.75·0.075/0.2
    (0.7, 1.0),  # the midpoint
    (0.9, 0.25),  # upper edge
    (1.0, 0.0),  # too easy
    (None, 0.0),  # no valid answer
])
def test_solvability_for_eight_attempts(s, expected):
  np.testing.assert_allclose(R.solvability(s, 8, 0.5, 0.9), expected, rtol=0, atol=1e-12)


def test_solvability_edge_value_follows_the_grid():
  # N = 4: the grid in [0.5, 0.9] is {0.5, 0.75}, so the edges score 1/2; 0.75 → 1 − 0.5·0.05/0.2.
  np.testing.assert_allclose([R.solvability(s, 4) for s in (0.5, 0.75, 0.9)],
                             [0.5, 0.875, 0.5], rtol=0, atol=1e-12)


def test_solve_rate_counts_only_valid_answers():
  assert R.solve_rate(["2", "2", None, "3", "2", None]) == ("2", 0.75)  # 3 of 4 valid
  assert R.solve_rate(["3", "2", "2", "3"]) == ("3", 0.5)  # a tie goes to the first seen
  assert R.solve_rate(["5", None]) == ("5", 1.0)  # one valid answer: solve rate 1
  assert R.solve_rate([None, None, None]) == (None, None)
  assert R.solve_rate([]) == (None, None)


def test_diversity_on_hand_made_unit_vectors():
  e1, e2 = np.eye(2, dtype=np.float32)
  diag = (e1 + e2) / np.sqrt(2)
  new, pool = np.stack([e1, diag]), e2[None]
  # e1: sibling cos 1/√2, pool cos 0 → mean 0.35355 → (1 − 0.35355)/2.
  # diag: sibling 1/√2, pool 1/√2 → mean 0.70711 → (1 − 0.70711)/2.
  expected = np.array([(1 - 0.5 / np.sqrt(2)) / 2, (1 - 1 / np.sqrt(2)) / 2], np.float32)
  chex.assert_trees_all_close(R.diversity(new, pool), expected, rtol=0, atol=1e-6)
  # k = 1 keeps only the most similar: 1/√2 for both.
  chex.assert_trees_all_close(R.diversity(new, pool, k=1),
                              np.full(2, (1 - 1 / np.sqrt(2)) / 2, np.float32), rtol=0, atol=1e-6)
  # A duplicate of a pool problem scores 0; an orthogonal one alone scores 1/2.
  chex.assert_trees_all_close(R.diversity(e2[None], pool), np.zeros(1, np.float32), atol=1e-7)
  chex.assert_trees_all_close(R.diversity(e1[None], pool), np.full(1, 0.5, np.float32), atol=1e-7)
  chex.assert_shape(R.diversity(np.zeros((0, 2)), pool), (0,))


def test_length_score():
  assert R.length_score([500, 1500]) == 1.0  # mean 1000
  assert R.length_score([200, 400]) == 0.3
  assert R.length_score([3000, 5000]) == 1.0  # capped at 1000
  assert R.length_score([]) == 0.0


def test_format_rewards():
  problem = R.parse_problem(TEACHER)
  assert R.teacher_format(TEACHER, problem) == 1.0
  no_think = TEACHER.split("\n", 1)[1]
  assert R.teacher_format(no_think, R.parse_problem(no_think)) == 0.0
  unclosed = "<think>" + " " * 20_000 + no_think  # linear time, no backtracking
  assert R.teacher_format(unclosed, R.parse_problem(unclosed)) == 0.0
  assert R.teacher_format("<think>x</think> <problem>2+2</problem>", None) == 0.0  # not legal
  assert R.student_format("7 * 8 = 56.\nTherefore, the final answer is: $\\boxed{56}$") == 1.0
  assert R.student_format("The answer is \\boxed{56}.") == 0.0
  assert R.student_format("Therefore, the final answer is: $\\boxed{}$") == 0.0


def test_student_format_is_the_papers_regex_in_linear_time():
  """Equal to the regex it replaces on random text, and linear where the regex is quadratic
  (48 ms on 20,000 characters of repeated openings; now well under 5 ms)."""
  regex = re.compile(r"Therefore, the final answer is: \$\\boxed\{(.+)\}\$")
  pieces = ["Therefore, the final answer is: $\\boxed{", "}$", "}", "$", "x", "\n", "\r", " "]
  rng = np.random.default_rng(0)
  for _ in range(3000):
    text = "".join(pieces[i] for i in rng.integers(0, len(pieces), int(rng.integers(0, 12))))
    assert R.student_format(text) == float(regex.search(text) is not None), repr(text)
  hostile = "Therefore, the final answer is: $\\boxed{" * 500
  start = time.perf_counter()
  assert R.student_format(hostile) == 0.0
  assert time.perf_counter() - start < 0.005


def test_legal_problems():
  p = R.parse_problem(TEACHER)
  assert p == R.Problem("What is 7 * 8?", ("integer multiplication",))
  assert R.parse_problem(TEACHER.replace("problem>", "PROBLEM>")) == p  # tags in any case
  assert R.parse_problem(TEACHER.replace("problem>", "question>")) is None  # released rule
  # Short concepts are dropped; at least one of 10+ characters must remain.
  mixed = "<problem>What is 7 * 8?</problem><concepts>Arithmetic, products, Integer Multiplication</concepts>"
  assert R.parse_problem(mixed).concepts == ("arithmetic", "integer multiplication")
  for bad in ("<problem>What is 7 * 8?</problem>",  # no concepts
              "<problem>2+2=?</problem><concepts>integer addition</concepts>",  # < 10 chars
              "<problem>...</problem><concepts>integer addition</concepts>",
              "<problem>What is 7 * 8?</problem><concepts>multiply, sums</concepts>",  # all short
              "<problem>What is 7 * 8?</problem><concepts>a long concept, b long concept, "
              "c long concept, d long concept</concepts>",  # more than three
              "<problem>What is 7 * 8?</problem><concepts>integer\nmultiplication</concepts>",
              "<problem>What is 7 * 8?<concepts>integer multiplication</concepts>",  # never closed
              ""):
    assert R.parse_problem(bad) is None, bad


def test_teacher_and_student_rewards():
  np.testing.assert_allclose(R.teacher_reward(0.25, 0.3, 0.5, 1.0), 1.15, rtol=0, atol=1e-12)
  np.testing.assert_allclose(R.teacher_reward(1.0, 0.2, 0.1, 0.0), 1.3, rtol=0, atol=1e-12)
  assert R.student_reward("2", "2", 1.0) == 1.1
  assert R.student_reward("3", "2", 0.0) == 0.0
  assert R.student_reward(None, None, 1.0) == 0.1


def test_selection_of_the_most_varied_group_and_the_best_problem():
  # Population variances: [1, 1, 1] → 0; [0, 2, None] → 1; none defined → ranks last.
  assert R.select_group([[1.0, 1.0, 1.0], [0.0, 2.0, None], [None, None]]) == 1
  assert R.select_group([[0.5], [None], [0.1, 0.3]]) == 2  # one score has variance 0
  # Two scores [0.2, 1.2] (0.25) against eight with population variance 0.3: the eight win
  # (an unbiased variance would pick the pair, 0.5 against 0.34).
  eight = list(0.5 + np.sqrt(0.3) * np.array([1, -1] * 4))
  assert R.select_group([[0.2, 1.2], eight]) == 1
  assert R.select_group([[None], [None]]) == 0
  assert R.combined(0.25, 0.5) == 0.75 and R.combined(None, 0.5) is None
  # Without diversity (its weight 0) c is solvability alone, defined without an embedding.
  assert R.combined(0.25, None, 1.0, 0.0) == 0.25 and R.combined(0.25, 0.5, 1.0, 0.0) == 0.25
  assert R.combined(0.25, 0.5, 2.0, 0.5) == 0.75
  assert R.select_problem([None, 0.3, 0.9, 0.9]) == 2  # the first of the best
  assert R.select_problem([None, None]) is None


def test_concepts_mask_on_a_hand_tokenised_example():
  vocab = ["<think>", "x", "</think>", "<problem>", "What is 2+2?", "</problem>", "\n<conc",
           "epts>", "integer addition", "</concepts>", "<|im_end|>"]
  decode = lambda ids: "".join(vocab[i] for i in ids)
  mask = R.concepts_mask(list(range(len(vocab))), decode)
  chex.assert_trees_all_equal(mask, np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1], np.int32))
  # A token that straddles the element's edge is masked; nothing else is.
  vocab2 = ["<problem>What is 2+2?</problem>", "\n<con", "cepts>integer", " addition</conc",
            "epts>\n", "Done"]
  decode2 = lambda ids: "".join(vocab2[i] for i in ids)
  chex.assert_trees_all_equal(R.concepts_mask(list(range(6)), decode2),
                              np.array([1, 0, 0, 0, 0, 1], np.int32))
  # No concepts element: nothing is masked.
  chex.assert_trees_all_equal(R.concepts_mask([0, 1, 2], decode), np.ones(3, np.int32))


def test_concepts_mask_with_the_demo_tokenizer():
  tok = tok_lib.load_tokenizer("demo")
  ids = tok.encode(TEACHER + "<|im_end|>", add_special_tokens=False)
  decode = lambda x: tok.decode(list(x), skip_special_tokens=False)
  mask = R.concepts_mask(ids, decode)
  masked = [i for i, m in zip(ids, mask) if not m]
  kept = [i for i, m in zip(ids, mask) if m]
  assert decode(masked).strip() == "<concepts>integer multiplication</concepts>"
  assert "concepts" not in decode(kept) and "What is 7 * 8?" in decode(kept)


@pytest.fixture(scope="module")
def checker():
  from scope_jax.rewards import mathcheck
  c = mathcheck.MathChecker(timeout=5)
  yield c
  c.close()


def test_symbolic_majority_and_solve_rate_through_the_checker(checker):
  """Six students answer 5x^4+4x^3+3x^2 and two 5x^4+4x^3 (the released code: solve rate 0.75
  with the first as the label); a screen that refused symbolic answers made the minority the
  label. The answers go through the checker OpenSIR uses, as students write them."""
  texts = (["Therefore, the final answer is: $\\boxed{5x^4+4x^3+3x^2}$"] * 6
           + ["So the final answer is $5x^4+4x^3$."] * 2)
  answers = [checker.final(t) for t in texts]
  assert None not in answers and len(set(answers)) == 2
  majority, rate = R.solve_rate(answers)
  assert majority == checker.final(texts[0]) and rate == 0.75
  assert R.solvability(rate, 8, 0.5, 0.9) == pytest.approx(0.8125)  # 1 − 0.75·0.05/0.2


def test_unit_token_weights_give_trls_micro_batch_token_mean():
  """A global token-mean of w_r·L_r equals the mean over units of each unit's token-mean (TRL's
  micro-batches): a unit of 2 rows × 100 tokens next to one of 2 × 1000 weighs 0.5, not 0.09."""
  tokens, units = [100, 100, 1000, 1000], [0, 0, 1, 1]
  w = R.unit_token_weights(tokens, units)
  chex.assert_trees_all_close(w, np.array([5.5, 5.5, 0.55, 0.55]), rtol=1e-12)
  rng = np.random.default_rng(0)
  per_token = [rng.normal(size=n) for n in tokens]  # a loss term per token of each row
  global_mean = sum(wr * x.sum() for wr, x in zip(w, per_token)) / sum(tokens)
  unit_means = [np.concatenate(per_token[:2]).mean(), np.concatenate(per_token[2:]).mean()]
  assert global_mean == pytest.approx(np.mean(unit_means), rel=1e-12)
  assert R.unit_token_weights([0, 0, 5], [0, 0, 1]).tolist() == [0.0, 0.0, 1.0]  # empty unit
