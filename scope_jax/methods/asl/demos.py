"""Demonstrations of ASL's three roles: the formats for the demo warm-up (`core/warmup.py`), and
the world's closed-class facts for fitting the `learn` preset's start (`world_demonstrations`).

The paper starts from Qwen2.5-7B-Instruct, which already searches and writes `<question>`,
`<answer>` and "conclusion: correct/wrong" when asked. The demo's small model learns the formats
from these, built from the bundled corpus with real search results as observations:
  PG (topic): search the topic → a question about one retrieved document, answered by its title;
  PG (flagged previous task): search the previous answer → a new question about what it finds;
  PM: search the question → the first retrieved title;
  GRM: search the question → "correct" when the student's answer is the first retrieved title,
    else "wrong" (one right and one wrong answer per question).
Five demonstrations per `warmup.documents`.
"""

from __future__ import annotations

import json

import numpy as np

from scope_jax.retrieval.corpus import Passage
from scope_jax.methods.asl import rewards as R
from scope_jax.rewards.match import normalize
from scope_jax.rl import sft
from scope_jax.rollout.agent import render_chat
from scope_jax.rollout.search_agent import observation_ids
from scope_jax.rollout.types import Trajectory
from scope_jax.world import entities as E

PHRASE_WORDS = 8


def search_action(query: str, syntax: str) -> str:
  if syntax == "xml":
    return f"<search>{query}</search>"
  return ('<tool_call>{"name": "retrieve", "arguments": {"query": ' + json.dumps(query) +
          "}}</tool_call>")


def question_about(doc: Passage, part: int = 0) -> str | None:
  """'Which entity <words of the lead after the title>?' (words 8·part onwards): answered by the
  title, which it must not contain (None if it would, or if the lead is too short)."""
  words = doc.text.split()
  norm = [normalize(w) for w in words[:20]]
  title = [w for w in (normalize(w) for w in doc.title.split()) if w]
  start = next((i + len(title) for i in range(len(norm)) if title and
                norm[i:i + len(title)] == title), 0)
  start += part * PHRASE_WORDS
  phrase = " ".join(words[start:start + PHRASE_WORDS]).rstrip(".,;:")
  question = f"Which entity {phrase}?"
  if len(phrase.split()) < 3 or R.answer_leaked(question, doc.title) or len(doc.title) > 60:
    return None
  return question


class _Demos:
  def __init__(self, method, rng: np.random.Generator):
    self.m, self.rt, self.cfg, self.rng = method, method.rt, method.cfg, rng
    self.tok = self.rt.tokenizer
    self.eos = self.tok.decode([self.rt.eos_ids[0]], skip_special_tokens=False)
    self.max_obs = self.cfg.roles.pm.get("max_obs_tokens", 500)

  def search(self, queries: list[str]) -> list[tuple[list[Passage], list[int]]]:
    """(documents, observation tokens) per query, in one batched retrieval."""
    out = []
    for hits in self.m.tool.retrieve(queries):
      docs = [p for p, _ in hits]
      out.append((docs, observation_ids(self.tok, docs, self.cfg.syntax, self.max_obs)))
    return out

  def demo(self, role: str, prompt, query: str, obs: list[int], final: str) -> Trajectory:
    pieces = [("generated", search_action(query, self.cfg.syntax)), ("observation", obs),
              ("generated", final + self.eos)]
    return sft.demonstration(self.m.roles[role].prompt(prompt), pieces, self.tok)

  def build(self, n: int) -> list[Trajectory]:
    """Per topic: PG on the topic (a question about the first result, which the observation
    shows), PM and two GRM verdicts on that question, and PG on the flagged question (a second
    question about the first result of searching the old answer, from later words of it)."""
    P, passages = self.m.prompts, self.m.passages
    topics = [self.m.topics[i] if i < len(self.m.topics) else
              passages[int(self.rng.integers(len(passages)))].title for i in range(n)]
    picked = []
    for topic, (hits, obs) in zip(topics, self.search(topics)):
      question = question_about(hits[0]) if hits else None
      if question is not None:
        picked.append((topic, hits[0], question, obs))
    q_results = self.search([q for _, _, q, _ in picked])
    a_results = self.search([d.title for _, d, _, _ in picked])
    out: list[Trajectory] = []
    for i, ((topic, doc, question, obs), (q_hits, q_obs), (a_hits, a_obs)) in enumerate(
        zip(picked, q_results, a_results)):
      out.append(self.demo("pg", P.pg({"topic": topic}, 0), topic, obs,
                           f"<question>{question}</question>\n<answer>{doc.title}</answer>"))
      first = q_hits[0].title
      out.append(self.demo("pm", P.pm(question), question, q_obs, f"<answer>{first}</answer>"))
      other = passages[int(self.rng.integers(len(passages)))].title
      for completion in dict.fromkeys((first, other)):
        verdict = "correct" if completion == first else "wrong"
        out.append(self.demo("grm", P.grm(question, completion), question, q_obs,
                             f"<answer>conclusion: {verdict}</answer>"))
      flag = (R.HARDER, R.EASIER)[int(self.rng.integers(2))]
      meta = {"question": question, "answer": doc.title, "flag": flag}
      new_q = question_about(a_hits[0], part=1) if a_hits else None
      if new_q is not None:
        out.append(self.demo("pg", P.pg(meta, 1 + i % 2), doc.title, a_obs,
                             f"<question>{new_q}</question>\n<answer>{a_hits[0].title}</answer>"))
    return out


def demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  return _Demos(method, rng).build(method.rt.config.warmup.documents)


# ------------------------------------------------------------------------------ world demos

WORLD_ROLES = ("pg", "pm", "grm")


GRM_REASONING = ("both", "page", "none")  # what the GRM's demonstrated turn says before its verdict


def verdict(fact: str, response: str, reasoning: str = "both") -> str:
  """The GRM's last turn: what the page states and what the answer was ('both'), the page alone
  ('page') or nothing ('none'), then its verdict (Fig. 12's "conclusion: correct/wrong"). Naming
  both turns the judgment into comparing two words side by side: a small model does not learn
  to compare an answer with a page it read a hundred tokens later (docs/learning.md)."""
  said = {"both": f"The page says {fact}. The answer is {response}.\n",
          "page": f"The page says {fact}.\n", "none": ""}[reasoning]
  return f"{said}<answer>conclusion: {'correct' if response == fact else 'wrong'}</answer>"


def world_demonstrations(tokenizer, prompts, world, questions, right_share: float = 1.0,
                         seed: int = 0, max_obs: int = 160, grades: int = 1,
                         reasoning: str = "both") -> dict[str, list[Trajectory]]:
  """ASL's three roles on each of `world`'s closed-class questions, whole turns with one search
  result, keyed by role: the PG is given the entity's name as its topic, searches it and writes
  the question with the fact its page states; the PM searches the name and answers (right in
  `right_share` of them, else another member of the fact's class); the GRM searches the name,
  says what the page states and what the answer was (`reasoning`, `verdict`), and judges
  `grades` right and as many wrong answers. How the `learn`
  preset's start is fitted, on other worlds (`tools/world_reading.py --format=asl`)."""
  rng = np.random.default_rng(seed)
  eos = "<|im_end|>"
  chat = lambda prompt: render_chat(tokenizer, [{"role": "user", "content": prompt.text()}])
  by_id = {d.id: d for d in world.documents}
  out = {role: [] for role in WORLD_ROLES}
  for q in questions:
    doc, gold, question = by_id[q["support"][0]], q["gold"][0], q["question"]
    turn = lambda role, prompt, final: out[role].append(sft.demonstration(chat(prompt), [
        ("generated", search_action(doc.title, prompts.syntax)),
        ("observation", observation_ids(tokenizer, [doc], prompts.syntax, max_obs)),
        ("generated", final + eos)], tokenizer))
    wrong = E.other_members(gold)
    pick = lambda: str(wrong[rng.integers(len(wrong))]) if wrong else gold
    reply = gold if rng.random() < right_share else pick()
    turn("pg", prompts.pg({"topic": doc.title}, 0),
         f"<question>{question}</question>\n<answer>{gold}</answer>")
    turn("pm", prompts.pm(question), f"<answer>{reply}</answer>")
    for response in [gold] * grades + [pick() for _ in range(grades)]:
      turn("grm", prompts.grm(question, response), verdict(gold, response, reasoning))
  return out
