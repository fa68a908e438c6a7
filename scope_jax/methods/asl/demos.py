"""Format demonstrations of ASL's three roles for the demo warm-up (`core/warmup.py`).

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
from scope_jax.rollout.search_agent import observation_ids
from scope_jax.rollout.types import Trajectory

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
