"""Demonstrations of every SCOPE role: the formats for the demo warm-up (`core/warmup.py`), and
the world's closed-class facts for fitting the `learn` preset's start (`world_demonstrations`).

SCOPE starts from instruction-tuned 7–8B models that already think, search, write <task>s,
rubrics and <score>s when asked. The CPU demo's small model does none of that, so the warm-up
fine-tunes it on these short demonstrations, built from the corpus with real retrieval results
as observations; M0 (hence the Judge, the KL reference and both policies' initialisation) is the
warmed model.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from scope_jax.methods.scope import prompts as P
from scope_jax.retrieval.corpus import Passage
from scope_jax.rl import sft
from scope_jax.rollout.agent import render_chat
from scope_jax.rollout.search_agent import observation_ids, search_action
from scope_jax.rollout.types import Trajectory
from scope_jax.world import entities as E

QUESTION_FORMS = {
    "longform_qa": "How is {a} connected to {b}, and why does it matter?",
    "summarisation": "Summarise what is known about {a} and its link to {b}.",
    "planning": "Make a step-by-step plan to study {a}, including a visit to {b}.",
    "writing": "Write a short report on {a} and {b}, with an introduction and a conclusion.",
    "creative_writing": "Write a short story in which {a} meets {b}.",
}
GENERIC_QUESTION = "Explain the main topic of this text in detail."


def _first_words(text: str, n: int) -> str:
  return " ".join(text.split()[:n]).rstrip(".,;:")


def _short(title: str, words: int = 4) -> str:
  """Queries are at most a few words: easy to imitate for a small model."""
  return " ".join(title.split()[:words])


class _Demos:
  """Builds demonstration trajectories for every SCOPE role."""

  def __init__(self, scope, rng: np.random.Generator):
    self.scope, self.rt, self.cfg, self.rng = scope, scope.rt, scope.cfg, rng
    self.tok, self.prompts = self.rt.tokenizer, scope.prompts
    self.eos = self.tok.decode([self.rt.eos_ids[0]], skip_special_tokens=False)
    self.max_obs = self.cfg.roles.solver.get("max_obs_tokens", 500)

  def prompt(self, role: str, prompt) -> list[int]:
    return self.scope.roles[role].prompt(prompt)

  def observation(self, hits: list[Passage]) -> list[int]:
    return observation_ids(self.tok, hits, self.cfg.syntax, self.max_obs)

  def search_chain(self, doc: Passage, k: int) -> tuple[list[str], list[list[Passage]]]:
    """k queries, the first on the document's title, each next one on an entity (title) found
    in the previous results; returns the queries and what each retrieved."""
    queries, results, query = [], [], _short(doc.title)
    for _ in range(k):
      hits = [p for p, _ in self.scope.tool.retrieve([query])[0]]
      queries.append(query)
      results.append(hits)
      fresh = [_short(p.title) for p in hits if _short(p.title) not in queries
               and p.title != doc.title]
      query = fresh[0] if fresh else _short(doc.title)
    return queries, results

  def for_document(self, doc: Passage, other: Passage, task_types: Sequence[str],
                   k: int) -> list[Trajectory]:
    """One Challenger and one Solver demonstration per task type (the policies' formats are the
    hard part), then the Judge's rubric and five verdicts, for one source document."""
    queries, results = self.search_chain(doc, k)
    b = queries[-1] if len(queries) > 1 else (results[0][1].title if len(results[0]) > 1
                                               else other.title)
    questions = [QUESTION_FORMS[t].format(a=doc.title, b=b) for t in task_types]
    answer = f"{_first_words(doc.text, 12)}."
    out = []
    for task_type, question in zip(task_types, questions):
      out.append(self.challenger(doc, task_type, k, queries, results, question))
      out.append(self.solver(question, queries, results, answer))
    return out + self.judge(doc, other, questions[0], answer)

  def challenger(self, doc, task_type, k, queries, results, question) -> Trajectory:
    """k searches, then the task."""
    pieces = []
    for q, hits in zip(queries, results):
      pieces += [("generated", f"<think>Search for the task.</think>\n"
                               f"{search_action(q, self.cfg.syntax)}"),
                 ("observation", self.observation(hits))]
    pieces.append(("generated", "<think>Write the task.</think>\n" +
                   P.task_output(question, self.prompts.task_form) + self.eos))
    prompt = self.prompt("challenger", self.prompts.challenger(doc, task_type, k))
    return sft.demonstration(prompt, pieces, self.tok)

  def solver(self, question, queries, results, answer) -> Trajectory:
    """Search the named entities, then answer from what came back."""
    cfg, pieces = self.cfg, []
    for q, hits in zip(queries[:cfg.roles.solver.max_turns], results):
      pieces += [("generated", f"<think>Search for the answer.</think>\n"
                               f"{search_action(q, cfg.syntax)}"),
                 ("observation", self.observation(hits))]
    pieces.append(("generated", f"<think>Answer.</think>\n<answer>{answer}</answer>" + self.eos))
    prompt = self.prompt("solver", self.prompts.solver(question, cfg.roles.solver.max_turns))
    return sft.demonstration(prompt, pieces, self.tok)

  def judge(self, doc, other, question, answer) -> list[Trajectory]:
    """A 3-criterion rubric (one names the document's entity, two are general: a small model
    copies titles poorly), two positive gate verdicts and one negative (vague or unrelated, at
    random), and the first criterion graded on a matching and a non-matching answer."""
    criteria = [("critical", f"Identifies {doc.title}"),
                ("important", "Explains how the entities are linked"),
                ("bonus", "Ends with a short conclusion")]
    rubric = "<rubric>\n" + "\n".join(f"{i}. [{p}] {c}." for i, (p, c) in enumerate(criteria, 1))
    out = [sft.demonstration(self.prompt("rubric", self.prompts.rubric(question, doc)),
                             [("generated", rubric + "\n</rubric>" + self.eos)], self.tok)]
    entity, source = self.prompts.gates(question, doc)
    generic, _ = self.prompts.gates(GENERIC_QUESTION, doc)
    _, unrelated = self.prompts.gates(question, other)
    negative = (generic, "Vague.") if self.rng.random() < 0.5 else (unrelated, "Unrelated.")
    criterion = criteria[0][1]
    good = int(doc.title.lower() in answer.lower())
    wrong = f"{_first_words(other.text, 12)}."
    verdicts = [("gate", entity, "Named.", 1), ("gate", source, "Grounded.", 1),
                ("gate", *negative, 0),
                ("grader", self.prompts.grader(question, criterion + ".", answer),
                 "Covered." if good else "Missed.", good),
                ("grader", self.prompts.grader(question, criterion + ".", wrong), "Missed.", 0)]
    for role, prompt, why, score in verdicts:
      out.append(sft.demonstration(self.prompt(role, prompt), [
          ("generated", f"<think>{why}</think>\n<score>{score}</score>{self.eos}")], self.tok))
    return out

  def build(self, num_docs: int) -> list[Trajectory]:
    passages = self.scope.passages
    picks = self.rng.choice(len(passages), min(2 * num_docs, len(passages)), replace=False)
    docs, others = picks[:num_docs], picks[num_docs:]
    types = self.cfg.task_types
    mix = self.scope._mix(0, 99, len(docs))
    demos = []
    for i, (d, (task_type, k)) in enumerate(zip(docs, mix)):
      other = passages[others[i % max(len(others), 1)]] if len(others) else passages[d]
      second = types[(types.index(task_type) + 1) % len(types)]
      demos += self.for_document(passages[d], other, dict.fromkeys([task_type, second]), k)
    return demos


def demonstrations(scope, rng: np.random.Generator) -> list[Trajectory]:
  return _Demos(scope, rng).build(scope.rt.config.warmup.documents)


# ------------------------------------------------------------------------------ world demos

WORLD_ROLES = ("challenger", "solver", "gate", "rubric", "grader")


def criterion(answer: str) -> str:
  """The one criterion a closed-class fact's rubric holds."""
  return f"Answers {answer}."


GRADER_REASONING = ("none", "both")


def grade_turn(fact: str, response: str, reasoning: str = "none") -> str:
  """The grader's turn on a one-criterion rubric: a one-word reason ('none'), or the fact the
  criterion asks for and the answer given, side by side ('both'), then the verdict. Naming both
  turns grading into comparing two words next to each other, which a small model learns where
  comparing an answer with a criterion a line above it stays near chance (docs/learning.md)."""
  right = int(response == fact)
  why = {"none": "Covered." if right else "Missed.",
         "both": f"The criterion asks for {fact}. The answer is {response}."}[reasoning]
  return f"<think>{why}</think>\n<score>{right}</score>"


def near_copy(name: str, other: str) -> str:
  """A garbled copy of `name`: its first half, then the second half of `other` (what a small
  model's copy looks like, and a task about no entity of the document)."""
  return name[:len(name) // 2] + other[len(other) // 2:]


def world_demonstrations(tokenizer, prompts: P.Prompts, world, questions: Sequence[dict],
                         right_share: float = 1.0, seed: int = 0, max_obs: int = 160,
                         max_turns: int = 1, grades: int = 1, near_copies: bool = False,
                         grader_reasoning: str = "none") -> dict[str, list[Trajectory]]:
  """Every SCOPE role on each of `world`'s closed-class questions, whole turns with one search
  result, keyed by role: the Challenger searches the document's title and asks the question;
  the Solver searches the entity's name, reads its page and answers (right in `right_share` of
  them, else another member of the fact's class); the Judge passes the task through both gates
  and fails one about another document or with no name in it, writes the one-criterion rubric
  the document states, and grades `grades` right and as many wrong answers against it (comparing
  two names is the slowest of these to learn; `grader_reasoning`, `grade_turn`). With
  `near_copies` the source gate also fails the task with a near copy of the entity's name, which
  asks about no entity of the document. How the `learn` preset's start is fitted, on other worlds
  (`tools/world_reading.py --format=scope`)."""
  rng = np.random.default_rng(seed)
  eos = "<|im_end|>"
  chat = lambda prompt: render_chat(tokenizer, [{"role": "user", "content": prompt.text()}])
  by_id = {d.id: d for d in world.documents}
  think = lambda why, text: ("generated", f"<think>{why}</think>\n{text}")
  verdict = lambda why, score: [think(why, f"<score>{score}</score>{eos}")]
  out = {role: [] for role in WORLD_ROLES}
  demo = lambda role, prompt, pieces: out[role].append(
      sft.demonstration(chat(prompt), pieces, tokenizer))
  for i, q in enumerate(questions):
    doc, gold, question = by_id[q["support"][0]], q["gold"][0], q["question"]
    other = by_id[questions[(i + 1) % len(questions)]["support"][0]]
    search = think("Search.", search_action(doc.title, prompts.syntax))
    seen = ("observation", observation_ids(tokenizer, [doc], prompts.syntax, max_obs))
    wrong = E.other_members(gold)
    pick = lambda: wrong[rng.integers(len(wrong))] if wrong else gold
    reply = gold if rng.random() < right_share else pick()
    demo("challenger", prompts.challenger(doc, "longform_qa", 1),
         [search, seen, think("Ask.", P.task_output(question, prompts.task_form) + eos)])
    demo("solver", prompts.solver(question, max_turns),
         [search, seen, think("Answer.", f"<answer>{reply}</answer>{eos}")])
    entity, source = prompts.gates(question, doc)
    _, unrelated = prompts.gates(question, other)
    generic, _ = prompts.gates(GENERIC_QUESTION, doc)
    demo("gate", entity, verdict("Named.", 1))
    demo("gate", source, verdict("Grounded.", 1))
    if other.id != doc.id:
      demo("gate", unrelated if rng.random() < 0.5 else generic, verdict("No.", 0))
    if near_copies and other.id != doc.id:
      _, garbled = prompts.gates(question.replace(doc.title, near_copy(doc.title, other.title)),
                                 doc)
      demo("gate", garbled, verdict("No.", 0))
    rubric = f"<rubric>\n1. [critical] {criterion(gold)}\n</rubric>{eos}"
    demo("rubric", prompts.rubric(question, doc), [("generated", rubric)])
    for response in [gold] * grades + [pick() for _ in range(grades)]:
      demo("grader", prompts.grader(question, criterion(gold), response),
           [("generated", grade_turn(gold, response, grader_reasoning) + eos)])
  return out
