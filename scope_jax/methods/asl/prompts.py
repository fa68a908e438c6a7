"""ASL's prompts (templates in `prompts/asl/`, from the paper's App. A) and its topic lists.

The paper's system prompts (Figs. 7–8: tools, formats, tasks) go in the system turn, as the
released code sends them: the Prompt Generator's (`pg_header`) for the PG, the retrieval one
(`retrieval_sys`) for the PM and the GRM; the user prompts (Figs. 9–12) are the user turn. The
'compact' style keeps one user turn. Meta prompts for the Prompt Generator: a topic in
iteration 0 (Fig. 9); the previous question, its answer and a HARDER/EASIER flag in iteration 1
(Fig. 10) and, adding or removing one reasoning hop, in later iterations (Fig. 11). Only the
search action differs between syntaxes: 'qwen' (the paper's `<tool_call>` to `retrieve`) and
'xml' (`<search>`, for the demo). The 'compact' style has the same fields and output tags in a
few lines, for the demo's small model.
"""

from __future__ import annotations

import pathlib

from scope_jax import prompts
from scope_jax.data import ASL_TOPICS
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.methods.asl import rewards as R
from scope_jax.world import World

STYLES = {"paper": "asl", "compact": "asl_compact"}  # prompt style → template directory
SYNTAXES = ("xml", "qwen")
SHIPPED_TOPICS = ASL_TOPICS
SEARCH_EXAMPLE = {
    "xml": "<search>Beijing cuisine</search>",
    "qwen": '<tool_call>\n{\n    "name": "retrieve",\n    "arguments": {\n        "query": '
            '"Beijing cuisine"\n    }\n}\n</tool_call>'}
SEARCH_TAGS = {"xml": "<search></search>", "qwen": "<tool_call></tool_call>"}
# Fig. 11's {question_constraint} and {demo} per flag; the example is Fig. 16's evolved question.
HOP = {
    R.HARDER: ("adding", "'Which Israeli city is known as the holiest city in Judaism?' "
                         "(Jerusalem) becomes 'Which most important religious site is located in "
                         "the holiest city in Judaism?' (The Western Wall)."),
    R.EASIER: ("removing", "'Which most important religious site is located in the holiest city "
                           "in Judaism?' (The Western Wall) becomes 'Which Israeli city is known "
                           "as the holiest city in Judaism?' (Jerusalem)."),
}
MAX_TOPIC_CHARS = 200
WORLD_TOPIC_KINDS = ("person", "organisation", "country")


def world_topics(seed: int, heldout_entities: bool = False) -> list[str]:
  """World `seed`'s people, organisations and countries by name: the entities whose pages state
  a closed-class fact (profession, industry, language) to ask about; with `heldout_entities`,
  those of the trained half alone."""
  w = World(seed)
  docs = w.training_documents if heldout_entities else w.documents
  return [d.title for d in docs if d.id.split(":", 1)[0] in WORLD_TOPIC_KINDS]


def load_topics(spec: str, world_seed: int = 0, heldout_entities: bool = False) -> list[str]:
  """Topics for iteration-0 meta prompts: '' = the shipped list, 'corpus' = the bundled corpus's
  categories (the demo), 'world' = the entities of world `world_seed` (`world_topics`; the
  trained half alone with `heldout_entities`), else a text file with one topic per line ('#'
  starts a comment)."""
  if spec == "corpus":
    return demo.demo_categories()
  if spec == "world":
    return world_topics(world_seed, heldout_entities)
  path = SHIPPED_TOPICS if not spec else pathlib.Path(spec).expanduser()
  if not path.exists():
    raise ValueError(f"asl.topics={spec!r}: no such file; give a text file with one topic per "
                     "line, 'corpus' (the bundled corpus's categories), 'world' (the world's "
                     "entities) or '' (the shipped list).")
  topics = []
  for line in path.read_text(encoding="utf-8").splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
      topics.append(line[:MAX_TOPIC_CHARS])
  if not topics:
    raise ValueError(f"asl.topics={spec!r} holds no topic (one per line; '#' starts a comment).")
  return list(dict.fromkeys(topics))


class Prompts:
  """The four role prompts in one style and search syntax, as `Prompt`s whose inserted content
  (questions, answers, topics) a role may cut to its prompt limit, never the instructions."""

  def __init__(self, style: str = "paper", syntax: str = "xml"):
    if style not in STYLES:
      raise ValueError(f"Unknown prompt style {style!r}; use one of {sorted(STYLES)}.")
    if syntax not in SYNTAXES:
      raise ValueError(f"Unknown search syntax {syntax!r}; use one of {list(SYNTAXES)}.")
    self.style, self.syntax = style, syntax
    self.dir = STYLES[style]
    shared = dict(tools=prompts.load(self.dir, f"tools_{syntax}"),
                  search_example=SEARCH_EXAMPLE[syntax], search_tags=SEARCH_TAGS[syntax])
    self.shared = shared
    self.systems = {}
    if style == "paper":
      pg = prompts.render(prompts.load(self.dir, "pg_header"), **shared).strip()
      retrieval = prompts.render(prompts.load(self.dir, "retrieval_sys"), **shared).strip()
      self.systems = {"pg": pg, "pm": retrieval, "grm": retrieval}

  def system(self, role: str) -> str | None:
    """The role's system turn (the paper style), or None (the compact style's one user turn)."""
    return self.systems.get(role)

  def _prompt(self, name: str, fit: tuple[str, ...], **fields) -> prompts.Prompt:
    template = prompts.load(self.dir, name)
    used = prompts.placeholders(template)
    fields = {k: v for k, v in dict(self.shared, **fields).items() if k in used}
    return prompts.Prompt(template, fields, tuple(f for f in fit if f in used))

  def pg(self, meta: dict, iteration: int) -> prompts.Prompt:
    """The PG's meta prompt: a topic (Fig. 9), or a previous task with its flag (Fig. 10 in
    iteration 1, Fig. 11 later)."""
    if meta.get("topic") is not None:
      return self._prompt("pg_topic", ("topic",), topic=meta["topic"])
    flag = meta["flag"]
    fields = dict(question=meta["question"], answer=meta["answer"], question_type=flag,
                  answer_type="CORRECT" if flag == R.HARDER else "WRONG")
    if iteration <= 1:
      return self._prompt("pg_followup", ("question", "answer"), **fields)
    constraint, example = HOP[flag]
    return self._prompt("pg_hop", ("question", "answer"), question_constraint=constraint,
                        demo=example, **fields)

  def pm(self, question: str) -> prompts.Prompt:
    return self._prompt("pm", ("question",), question=question)

  def grm(self, question: str, completion: str) -> prompts.Prompt:
    return self._prompt("grm", ("completion", "question"), question=question,
                        completion=completion)
