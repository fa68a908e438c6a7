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
from scope_jax.world import World

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


# The synthetic world's problem templates (`world.render.ARITHMETIC`, by index): the concepts
# a problem needs and how it differs from another template, for the teacher's demonstrations.
WORLD_FORMS = (
    ("multiplication, subtraction", "multiplies crates by bottles and takes away those sold"),
    ("addition, subtraction", "adds the workers hired and takes away those who left"),
    ("multiplication, addition", "multiplies pages by days and adds the extra pages"),
    ("division", "shares coins equally among friends"),
    ("multiplication, addition, distance", "multiplies speed by time and adds a last stretch"),
    ("multiplication, subtraction", "multiplies boxes by pencils and takes away those given"),
)


def demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  """The demo warm-up's demonstrations: small sums, or (with `warmup.world_seed`) other worlds'
  word problems."""
  if method.rt.config.warmup.get("world_seed", -1) >= 0:
    return world_demonstrations(method, rng)
  return sum_demonstrations(method, rng)


def _demo(rt):
  eos = rt.tokenizer.decode([rt.eos_ids[0]], skip_special_tokens=False)
  return lambda prompt, text: sft.demonstration(prompt, [("generated", text + eos)], rt.tokenizer)


def sum_demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  """4 × warmup.documents teacher demonstrations (reference: the seed problem or a drawn one)
  and as many student ones."""
  rt = method.rt
  demo = _demo(rt)
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


def world_demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  """Both roles on `warmup.worlds` other worlds' word problems (seeds from `warmup.world_seed`),
  `warmup.documents` of each role: the teacher turns a reference problem (one of theirs, or the
  seed problem) into one of another template; the student works a problem's sums out and boxes
  the result, which is right in an `opensir.warmup.right_share` of them and otherwise off by
  1–10 (the sums before it stay right), so the warmed student is often wrong and its answers spread. The
  run's own world lends no problem: `world.training_problems` of the others, never a gold one."""
  rt, w, own = method.rt, method.rt.config.warmup, method.rt.config.opensir.warmup
  demo, worlds = _demo(rt), max(int(w.get("worlds", 1)), 1)
  right_share, guess_share = float(own.right_share), float(own.guess_share)
  ways = int(own.worked_ways)
  per_world = -(-w.documents // worlds)
  problems = [q for k in range(worlds)
              for q in World(w.world_seed + k).training_problems(2 * per_world, worked=True)]
  problems = [problems[int(i)] for i in rng.permutation(len(problems))]
  out: list[Trajectory] = []
  for i in range(w.documents):
    reference, new = problems[2 * i], problems[2 * i + 1]
    if new["form"] == reference["form"]:
      new = next(q for q in problems if q["form"] != reference["form"])
    concepts, how = WORLD_FORMS[new["form"]]
    old = ("the original problem is 1+1" if i % 4 == 0 else
           f"the original problem {WORLD_FORMS[reference['form']][1]}")
    out.append(demo(method.teacher_prompt(SEED_PROBLEM if i % 4 == 0 else reference["question"]),
                    f"<think>The new problem {how}, while {old}.</think>\n"
                    f"<problem>{new['question']}</problem>\n<concepts>{concepts}</concepts>"))
    solved = problems[(2 * i + 7) % len(problems)]
    out.append(demo(method.student_prompt(solved["question"]),
                    student_solution(solved, rng, right_share, guess_share, ways)))
  return out


# Ways to open worked sums, each with its own first token (and none "Therefore", the guess's).
OPENINGS = ("First, ", "", "Step by step, ", "Working it out, ")
GUESSES = 250  # a guess is a whole number below this, drawn uniformly (answers reach 417)


def check_warmup(c) -> None:
  """`opensir.warmup.*`, the knobs of the demonstrations from other worlds (when it runs)."""
  w = c.opensir.warmup
  if not c.warmup.steps:
    return
  for name in ("right_share", "guess_share"):
    if not 0.0 <= w[name] < 1.0:
      raise ValueError(f"opensir.warmup.{name}={w[name]}: use a share in [0, 1).")
  if not 1 <= w.worked_ways <= len(OPENINGS):
    raise ValueError(f"opensir.warmup.worked_ways={w.worked_ways}: use 1 to {len(OPENINGS)} "
                     "openings.")


def _off(answer: int, rng: np.random.Generator) -> int:
  """Another whole number 1–10 away from `answer`."""
  offsets = [d for d in range(-10, 11) if d and answer + d >= 0]
  return answer + offsets[int(rng.integers(len(offsets)))]


def student_solution(problem: dict, rng: np.random.Generator, right_share: float,
                     guess_share: float = 0.0, ways: int = 1) -> str:
  """A demonstrated solution of a worked world problem. The sums are worked out and the last
  one is right in `right_share` of them (else off by 1–10). With `guess_share` > 0, that share
  states a guess without working (a wrong number drawn uniformly, so two guesses seldom agree),
  and the worked rest opens one of `ways` ways drawn uniformly (`OPENINGS`), each less common
  than the guess: the warmed student's first choice is then to guess, while its samples that
  work the sums out reach one answer by any route — a start whose vote beats its greedy answer
  (docs/learning.md, OpenSIR). More ways widen the guess's lead without making it commoner."""
  steps, answer = problem["steps"], int(problem["gold"][0])
  if guess_share and rng.random() < guess_share:
    guess = answer
    while guess == answer:
      guess = int(rng.integers(GUESSES))
    return student_text("", guess).lstrip("\n")
  if not rng.random() < right_share:  # a wrong last sum: another number, never negative
    answer = _off(answer, rng)
    steps = f"{steps.rsplit(' = ', 1)[0]} = {answer}."
  if ways > 1:
    steps = OPENINGS[int(rng.random() * ways)] + steps
  return student_text(steps, answer)
