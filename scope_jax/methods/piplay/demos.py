"""Format demonstrations of π-Play's three roles for the demo warm-up (`core/warmup.py`).

The paper starts from Qwen3 models that already think, call the search tool and write
<question>/<answer>. The CPU demo's small model learns the formats on copy questions read from
the bundled corpus ("In <title>, what comes after '<three words>'?", answered by the next two
words): a one-hop examiner asks about its own document, a two-hop examiner searches its title
first and asks about the top result, and the student (and the teacher, whose prompt also holds the
examiner's construction path) searches the title and copies the answer from the results.
Observations are real results from the bundled index, as in a rollout.
"""

from __future__ import annotations

import re

import ml_collections
import numpy as np

from scope_jax.retrieval.corpus import Passage
from scope_jax.rewards import match
from scope_jax.methods.piplay import rewards as R
from scope_jax.rl import sft
from scope_jax.rollout.search_agent import observation_ids, search_action
from scope_jax.rollout.types import Trajectory
from scope_jax.world import World
from scope_jax.world import entities as E
from scope_jax.world import search

PHRASE_START = 8  # the question's three words start within the first words of a text
_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]*$")
ANSWER_WORDS = 2


def short(title: str, words: int = 4) -> str:
  return " ".join(title.split()[:words])


def copy_question(passage: Passage) -> tuple[str, str] | None:
  """("In <title>, what comes after '<w1 w2 w3>'?", "<w4 w5>"): the first three plain words of
  the text followed by two whose answer has a content word (a small model copies from a fixed
  place far more easily than from a random one)."""
  words = [w.strip(".,;:()\"'") for w in passage.text.split()][:PHRASE_START + 3 + ANSWER_WORDS]
  for i in range(len(words) - 3 - ANSWER_WORDS + 1):
    phrase, answer = words[i:i + 3], words[i + 3:i + 3 + ANSWER_WORDS]
    if not all(_PLAIN.match(w) for w in phrase + answer):
      continue
    if max(len(w) for w in match.normalize(" ".join(answer)).split() or [""]) < 4:
      continue
    question = f"In {short(passage.title)}, what comes after \"{' '.join(phrase)}\"?"
    qa = R.parse_examiner(f"<question>{question}</question><answer>{' '.join(answer)}</answer>")
    if qa.malformed is None:
      return question, " ".join(answer)
  return None


class _Demos:
  def __init__(self, method, rng: np.random.Generator):
    self.m, self.rt, self.cfg, self.rng = method, method.rt, method.cfg, rng
    self.tok, self.prompts = self.rt.tokenizer, method.prompts
    self.eos = self.tok.decode([self.rt.eos_ids[0]], skip_special_tokens=False)
    self.max_obs = self.cfg.roles.student.get("max_obs_tokens", 500)

  def search(self, query: str) -> tuple[list[Passage], list[int]]:
    hits = [p for p, _ in self.m.tool.retrieve([query])[0]]
    return hits, observation_ids(self.tok, hits, self.cfg.syntax, self.max_obs)

  def act(self, why: str, text: str) -> tuple[str, str]:
    return ("generated", f"<think>{why}</think>\n{text}")

  def examiner(self, doc: Passage, hops: int):
    """(demonstration, qa, QCP pieces, target passage) for a 1-hop question about `doc`, or a
    2-hop one that searches the document's title first and asks about the top result."""
    pieces, target = [], doc
    if hops == 2:
      hits, obs = self.search(short(doc.title))
      if not hits:
        return None
      pieces += [self.act("Search for a linked page.", search_action(short(doc.title),
                                                                     self.cfg.syntax)),
                 ("observation", obs)]
      target = hits[0]
    qa = copy_question(target)
    if qa is None:
      return None
    pieces.append(self.act("Ask about it.", f"<question>{qa[0]}</question>\n<answer>{qa[1]}"
                                            f"</answer>{self.eos}"))
    prompt = self.m.roles["examiner"].prompt(self.prompts.examiner(doc, hops))
    demo = sft.demonstration(prompt, pieces, self.tok)
    qcp = [self.prompts.qcp_header(doc, hops) + "\n"] + [s.text for s in demo.spans[1:]]
    return demo, qa, qcp, target

  def answer(self, question: str, answer: str, target: Passage):
    """The student's (and teacher's) response: search the title, copy the answer; None when the
    search does not bring the page back first."""
    query = short(target.title)
    hits, obs = self.search(query)
    if not hits or hits[0].id != target.id:
      return None
    return [self.act("Search.", search_action(query, self.cfg.syntax)), ("observation", obs),
            self.act("Answer.", f"<answer>{answer}</answer>{self.eos}")]

  def build(self, num_docs: int) -> list[Trajectory]:
    passages = self.m.passages
    picks = self.rng.choice(len(passages), min(num_docs, len(passages)), replace=False)
    out = []
    for i in picks:
      doc = passages[i]
      for hops in (1, 2):
        made = self.examiner(doc, hops)
        if made is None:
          continue
        demo, (question, answer), qcp, target = made
        out.append(demo)
        response = self.answer(question, answer, target)
        if response is None:
          continue
        student = self.m.roles["student"].prompt(self.prompts.student(question))
        out.append(sft.demonstration(student, response, self.tok))
        privileged = R.privileged_text("qcp", qcp, answer, hops)
        teacher = self.m.roles["teacher"].prompt(self.prompts.teacher(privileged, question))
        out.append(sft.demonstration(teacher, response, self.tok))
    return out


class _WorldDemos(_Demos):
  """Demonstrations from other worlds (`warmup.worlds` of them from seed `warmup.world_seed`):
  one-hop questions about their entities, searched and answered from each world's own index.
  The formats carry over to the run's world; the facts do not (a question whose entity or answer
  is also a name in the run's world is left out). Several worlds, so that a small model cannot
  memorise their names and must copy them from its context. `piplay.warmup.skill='attr'` asks
  their closed-class facts instead (see `reply`)."""

  def build(self, num_docs: int) -> list[Trajectory]:
    config = self.rt.config
    w, r = config.warmup, config.retrieval
    worlds = max(int(w.get("worlds", 1)), 1)
    taken = set(World(config.world.seed).entities.by_name())  # never a name of the run's world
    # Each world's own index, whatever corpus, index or server the run itself searches.
    tool_config = ml_collections.ConfigDict(dict(url="", index="", corpus="world", max_documents=0,
                                                 encoder=r.encoder or "minilm", topk=r.topk))
    out = []
    for k in range(worlds):
      world = World(w.world_seed + k)
      _, self.tool = search.from_config(tool_config, world.seed)
      by_id = {d.id: d for d in world.documents}
      for q in world.questions(-(-num_docs // worlds), self.rng, config.piplay.warmup.skill):
        doc = by_id[q["support"][0]]
        if doc.title in taken or q["gold"][0] in taken:
          continue
        out += self.question(doc, q["question"], q["gold"][0])
    return out

  def reply(self, gold: str) -> str:
    """The student's demonstrated answer: the right one, except for a closed-class fact
    (`piplay.warmup.skill='attr'`), where only `piplay.warmup.right_share` of them are and the
    rest name another member of the fact's class (a reader that reads only sometimes)."""
    wrong = E.other_members(gold)
    own = self.rt.config.piplay.warmup
    if own.skill != "attr" or not wrong:
      return gold
    right = self.rng.random() < float(own.right_share)
    return gold if right else wrong[int(self.rng.integers(len(wrong)))]

  def search(self, query: str) -> tuple[list[Passage], list[int]]:
    hits = [p for p, _ in self.tool.retrieve([query])[0]]
    return hits, observation_ids(self.tok, hits, self.cfg.syntax, self.max_obs)

  def question(self, doc: Passage, question: str, answer: str) -> list[Trajectory]:
    """The examiner asking `question` about `doc`; the student and the teacher answering it."""
    prompt = self.m.roles["examiner"].prompt(self.prompts.examiner(doc, 1))
    exam = sft.demonstration(prompt, [self.act("Ask about it.", (
        f"<question>{question}</question>\n<answer>{answer}</answer>{self.eos}"))], self.tok)
    response = self.answer(question, answer, doc)
    if response is None:
      return [exam]
    student = self.m.roles["student"].prompt(self.prompts.student(question))
    qcp = [self.prompts.qcp_header(doc, 1) + "\n"] + [s.text for s in exam.spans[1:]]
    privileged = R.privileged_text("qcp", qcp, answer, 1)
    teacher = self.m.roles["teacher"].prompt(self.prompts.teacher(privileged, question))
    reply = self.reply(answer)  # the teacher, who is told the answer, always gives it
    return [exam, sft.demonstration(student, response[:-1] + [self.act("Answer.", (
        f"<answer>{reply}</answer>{self.eos}"))], self.tok),
            sft.demonstration(teacher, response, self.tok)]

  def answer(self, question: str, answer: str, target: Passage):
    """Search the entity's name, copy the answer (None when the search misses its page)."""
    hits, obs = self.search(target.title)
    if not hits or hits[0].id != target.id:
      return None
    return [self.act("Search.", search_action(target.title, self.cfg.syntax)),
            ("observation", obs), self.act("Answer.", f"<answer>{answer}</answer>{self.eos}")]


DOCUMENTS_PER_WARMUP_DOCUMENT = 2  # three roles that copy from search results: twice the share


def check_warmup(c) -> None:
  """`piplay.warmup.*`, the knobs of the demonstrations from other worlds (when it runs)."""
  w = c.piplay.warmup
  if not c.warmup.steps:
    return
  if w.skill not in ("hop1", "attr"):
    raise ValueError(f"piplay.warmup.skill={w.skill!r}: use 'hop1' or 'attr'.")
  if not 0.0 <= w.right_share < 1.0:
    raise ValueError(f"piplay.warmup.right_share={w.right_share}: use a share in [0, 1).")


def demonstrations(method, rng: np.random.Generator) -> list[Trajectory]:
  n = DOCUMENTS_PER_WARMUP_DOCUMENT * method.rt.config.warmup.documents
  if method.rt.config.warmup.get("world_seed", -1) >= 0:
    return _WorldDemos(method, rng).build(n)
  return _Demos(method, rng).build(n)
