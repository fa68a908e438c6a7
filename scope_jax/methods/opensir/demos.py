"""Format demonstrations of OpenSIR's two roles for the demo warm-up (`core/warmup.py`).

The papers start from instruction-tuned models that already write `<think>`, `<problem>` and
`<concepts>` and end solutions with a boxed answer. The demo's 0.8M-parameter model learns the
formats on small arithmetic: the teacher turns a reference problem into a different operation
with fresh numbers, the student works the sum out and states the boxed answer. A model of that
size gets the arithmetic right only sometimes, so the students' answers disagree, solve rates
spread over the solvability band, and both roles have reward variance to train on.
"""

from __future__ import annotations

import numpy as np

from scope_jax.rl import sft
from scope_jax.rollout.types import Trajectory

# (problem form, worked step, concepts, how it differs from another form)
FORMS = {
    "add": ("What is {a} + {b}?", "{a} + {b} = {r}.", "integer addition", "adds two numbers"),
    "sub": ("What is {a} - {b}?", "{a} - {b} = {r}.", "integer subtraction",
            "takes one number from another"),
    "mul": ("What is {a} * {b}?", "{a} * {b} = {r}.", "integer multiplication",
            "multiplies two numbers"),
    "apples": ("Tom has {a} apples and buys {b} more. How many apples does he have?",
               "He has {a} + {b} = {r} apples.", "word problems, integer addition",
               "tells a story about apples"),
    "books": ("A shelf holds {a} books and {b} are taken away. How many books are left?",
              "{a} - {b} = {r} books are left.", "word problems, integer subtraction",
              "tells a story about books"),
    "boxes": ("There are {a} boxes with {b} pens in each. How many pens are there?",
              "{a} * {b} = {r} pens.", "word problems, integer multiplication",
              "tells a story about boxes of pens"),
}
_RESULT = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
           "apples": lambda a, b: a + b, "books": lambda a, b: a - b, "boxes": lambda a, b: a * b}
SEED_PROBLEM = "What is 1+1?"


def draw(rng: np.random.Generator, form: str | None = None) -> tuple[str, str, str, int]:
  """(form, problem, worked step, answer) with small numbers (no negative results)."""
  form = form or list(FORMS)[int(rng.integers(len(FORMS)))]
  a, b = sorted(int(x) for x in rng.integers(1, 13, size=2))[::-1]
  r = _RESULT[form](a, b)
  text, step, _, _ = FORMS[form]
  return form, text.format(a=a, b=b), step.format(a=a, b=b, r=r), r


def teacher_text(new: str, new_form: str, old_form: str | None) -> str:
  _, _, concepts, how = FORMS[new_form]
  old = f"the original problem {FORMS[old_form][3]}" if old_form else "the original problem is 1+1"
  return (f"<think>The new problem {how}, while {old}.</think>\n"
          f"<problem>{new}</problem>\n<concepts>{concepts}</concepts>")


def student_text(step: str, answer: int) -> str:
  return f"{step}\nTherefore, the final answer is: $\\boxed{{{answer}}}$"


def demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  """4 × warmup.documents teacher demonstrations (reference: the seed problem or a drawn one)
  and as many student ones."""
  rt = method.rt
  eos = rt.tokenizer.decode([rt.eos_ids[0]], skip_special_tokens=False)
  demo = lambda prompt, text: sft.demonstration(prompt, [("generated", text + eos)], rt.tokenizer)
  out: list[Trajectory] = []
  for i in range(4 * rt.config.warmup.documents):
    if i % 4 == 0:
      old_form, reference = None, SEED_PROBLEM
    else:
      old_form, reference, _, _ = draw(rng)
    new_form = [f for f in FORMS if f != old_form][int(rng.integers(len(FORMS) - bool(old_form)))]
    _, problem, step, answer = draw(rng, new_form)
    out.append(demo(method.teacher_prompt(reference), teacher_text(problem, new_form, old_form)))
    _, problem, step, answer = draw(rng)
    out.append(demo(method.student_prompt(problem), student_text(step, answer)))
  return out
