"""Format demonstrations of SPELL's three roles for the demo warm-up (`core/warmup.py`).

A small model can learn to copy from a fixed place, so every demonstrated question is a copy
task on the first document of the questioner's context: "What comes after 'w1 w2 w3'?" quoting
its first three plain words, with the next two as the answer (for math, the words before its
first number and that number; for multiple choice, the following spans of the same document as
distractors). The questioner learns the JSON format on real clusters; the responder learns to
find the quoted words in the whole cluster and answer in the rule-checked form; the verifier
learns [[YES]] for the same answer and [[NO]] for another. An answer needs the documents, so the
grounding filter passes what the warmed model proposes, and the responder is right only
sometimes: groups have reward variance to train on.

The `learn` preset demonstrates on other worlds instead (`warmup.world_seed`): their one-hop
questions about a document (`spell.warmup.skill`), asked right by the questioner and answered
wrong by the responder — with another fact of the same document, or for a closed-class fact
another member of its class — formats without this world's facts or the skill.
"""

from __future__ import annotations

import json
import re

import numpy as np

from scope_jax.methods.spell import rewards as R
from scope_jax.methods.spell.clusters import render_context
from scope_jax.rl import sft
from scope_jax.rollout.types import Trajectory
from scope_jax.world import World
from scope_jax.world import entities as E

_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9\-]*$")
_NUMBER = re.compile(r"^\d[\d,]*(?:\.\d+)?$")


def _spans(text: str, numeric: bool, follow: int = 1) -> list[tuple[str, ...]]:
  """(three words, what follows, ...) in text order: `follow` next two-word spans, or the next
  word if it is a number (`numeric`)."""
  words = [w.strip(".,;:()") for w in text.split()][:-1]  # the last word may be cut
  plain = lambda ws: all(_WORD.match(w) for w in ws)
  out = []
  for i in range(len(words) - 3):
    key = words[i:i + 3]
    if not plain(key):
      continue
    if numeric:
      if _NUMBER.match(words[i + 3]):
        out.append((" ".join(key), words[i + 3].replace(",", "")))
      continue
    nxt = [words[i + 1 + 2 * k:i + 3 + 2 * k] for k in range(1, follow + 1)]
    if all(len(w) == 2 and plain(w) for w in nxt):
      out.append((" ".join(key), *(" ".join(w) for w in nxt)))
  return out


def _question(key: str) -> str:
  return f"What comes after '{key}'?"


def demonstrations(spell, rng: np.random.Generator) -> list[Trajectory]:
  """The demo warm-up's demonstrations: copy tasks on the run's corpus, or (with
  `warmup.world_seed`) other worlds' document questions."""
  if spell.rt.config.warmup.get("world_seed", -1) >= 0:
    return world_demonstrations(spell, rng)
  return copy_demonstrations(spell, rng)


CLASSES = E.CLASSES


SKILLS = ("hop1", "attr")  # the world's questions `spell.warmup.skill` can ask
ANSWERS = ("wrong", "chance")  # how the warmed responder answers (`spell.warmup.answers`)


def check_warmup(c) -> None:
  """`spell.warmup.*`, the knobs of the demonstrations from other worlds (when it runs)."""
  w = c.spell.warmup
  if not c.warmup.steps:
    return
  if w.skill not in SKILLS:
    raise ValueError(f"spell.warmup.skill={w.skill!r}: use 'hop1' or 'attr'.")
  if w.answers not in ANSWERS:
    raise ValueError(f"spell.warmup.answers={w.answers!r}: use 'wrong' or 'chance'.")
  if not 0.0 <= w.right_share < 1.0:
    raise ValueError(f"spell.warmup.right_share={w.right_share}: use a share in [0, 1).")


def wrong_answers(entity, doc_text: str, gold: str) -> list[str]:
  """Wrong answers in the right form: for a closed-class fact, the class's other members (the
  model learns to name a profession, not which); otherwise the entity's other facts that its
  document states."""
  for attr, members in CLASSES.items():
    if getattr(entity, attr, None) == gold:
      return sorted(m for m in members if m != gold)
  values = [str(v) for k, v in vars(entity).items() if k != "name"]
  values += [f"{v:,}" for v in vars(entity).values() if isinstance(v, int) and v >= 10_000]
  return sorted({v for v in values if v != gold and v in doc_text})


def chance_answers(entity, doc_text: str, gold: str) -> list[str]:
  """Answers drawn without reading: for a closed-class fact, every member of its class (right
  one time in the class's size, whatever the document says); otherwise `wrong_answers`."""
  for attr, members in CLASSES.items():
    if getattr(entity, attr, None) == gold:
      return sorted(members)
  return wrong_answers(entity, doc_text, gold)


def role_prompts(spell):
  """(questioner(template, **fields), verifier(problem, answer_1, answer_2)): token ids of the
  questioner's template `name` with its context cut to fit, and of the verifier's prompt."""
  questioner = lambda name, **fields: spell.roles["questioner"].prompt(
      spell.prompts.template(name, ("context",), **fields))
  verifier = lambda *answers: spell.roles["verifier"].prompt(spell.prompts.verifier(*answers))
  return questioner, verifier


def world_demonstrations(spell, rng: np.random.Generator) -> list[Trajectory]:
  """Formats only, from `warmup.worlds` other worlds (seeds from `warmup.world_seed`): per
  one-hop question about one of their documents, the questioner writes that question and its
  answer; the responder, on the same document, answers with another of the document's facts
  (well-formed and wrong, so the warmed responder is mostly wrong), or with
  `spell.warmup.answers='chance'` names a member of the fact's class without reading (right only
  by chance); the verifier says [[YES]] to the same answer and [[NO]] to a wrong one
  (`spell.warmup.answer_first`: the questioner's JSON gives the answer first). No document about an entity of the run's world is
  shown and no answer is one of its names (another world's document may mention a place that
  shares a name with one of the run's world: a fact about another entity)."""
  rt, cfg, w = spell.rt, spell.cfg, spell.rt.config.warmup
  own = cfg.warmup  # this method's knobs (spell.warmup.*)
  eos = rt.tokenizer.decode([rt.eos_ids[0]], skip_special_tokens=False)
  demo = lambda prompt, text: sft.demonstration(prompt, [("generated", text + eos)], rt.tokenizer)
  questioner, verifier = role_prompts(spell)
  taken = set(World(rt.config.world.seed).entities.by_name())
  answers = chance_answers if own.answers == "chance" else wrong_answers
  worlds = max(int(w.get("worlds", 1)), 1)
  right_share = float(own.right_share)
  out: list[Trajectory] = []
  for k in range(worlds):
    world = World(w.world_seed + k)
    by_id, names = {d.id: d for d in world.documents}, world.entities.by_name()
    asked: list[tuple[str, str]] = []
    for q in world.questions(-(-w.documents // worlds), rng, own.skill):
      doc, gold = by_id[q["support"][0]], q["gold"][0]
      wrong = wrong_answers(names[doc.title], doc.text, gold)
      if doc.title in taken or gold in taken or not wrong:
        continue
      context = render_context([doc], cfg.max_doc_chars)
      name, fields = "questioner_doc_qa", {}
      if asked and rng.random() < 0.25:  # the history template: earlier questions as examples
        name, fields["examples"] = "questioner_doc_qa_history", "\n".join(
            f"### Example {i}:\nQuestion: {eq}\nAnswer: {ea}" for i, (eq, ea) in
            enumerate(asked[-cfg.history_size:], 1))
      proposal = {"question": q["question"], "answer": gold}
      if own.answer_first:  # the label read off the document, then its question
        proposal = {"answer": gold, "question": q["question"]}
      out.append(demo(questioner(name, context=context, **fields),
                      json.dumps(proposal, ensure_ascii=False)))
      asked.append((q["question"], gold))
      parsed = R.Proposal(q["question"], gold)
      answer = answers(names[doc.title], doc.text, gold)
      answer = answer[int(rng.integers(len(answer)))]
      if right_share and rng.random() < right_share:  # a reader that sometimes reads
        answer = gold
      out.append(demo(spell.responder_prompt("doc_qa", parsed, context),
                      f"The correct answer is {answer}."))
      other = answer if answer != gold else wrong[int(rng.integers(len(wrong)))]
      second, verdict = (gold, "[[YES]]") if len(out) % 2 else (other, "[[NO]]")
      prompt = verifier(parsed.display(), gold, second)
      out.append(demo(prompt, f"Decision: {verdict}"))
  return out


def copy_demonstrations(spell, rng: np.random.Generator) -> list[Trajectory]:
  """Per cluster drawn: one questioner, one responder and one verifier demonstration (the
  verifier's alternately [[YES]] and [[NO]]); 4 × warmup.documents draws."""
  rt, cfg = spell.rt, spell.cfg
  eos = rt.tokenizer.decode([rt.eos_ids[0]], skip_special_tokens=False)
  limit = cfg.max_doc_chars or None
  out: list[Trajectory] = []
  demo = lambda prompt, text: sft.demonstration(prompt, [("generated", text + eos)], rt.tokenizer)
  questioner, verifier = role_prompts(spell)
  attempts = 0
  while len(out) < 12 * rt.config.warmup.documents and attempts < 50 * rt.config.warmup.documents:
    attempts += 1
    task = spell.tasks[int(rng.integers(len(spell.tasks)))]
    members = spell.clusters[spell.clusters_for[task][int(rng.integers(len(spell.clusters_for[task])))]]
    m = min(cfg.docs_per_question, len(members))
    new_ids = [spell.passages[i].id for i in rng.choice(members, m, replace=False)]
    target = spell.by_id[new_ids[0]]  # the first document of the context
    spans = _spans(target.text[:limit], numeric=task == "doc_math",
                   follow=4 if task == "doc_mc" else 1)
    others = [s for d in new_ids[1:] for s in _spans(spell.by_id[d].text[:limit], numeric=False)]
    if not spans:
      continue
    key, gold = spans[0][:2]
    proposal = {"question": _question(key), "answer": gold}
    fields = {"context": spell.context(new_ids)}
    name = f"questioner_{task}"
    if task == "doc_mc":
      letter = "ABCD"[int(rng.integers(4))]
      wrong = list(spans[0][2:])  # the spans that follow, in order
      options = dict(zip([c for c in "ABCD" if c != letter], wrong), **{letter: gold})
      proposal = {"question": _question(key), "options": dict(sorted(options.items())),
                  "answer": letter}
      fields["correct_letter"] = letter
    if rng.random() < 0.25 and others:  # the history templates: earlier questions as examples
      name += "_history"
      fields["examples"] = f"### Example 1:\nQuestion: {_question(others[0][0])}\n" \
                           f"Answer: {others[0][1]}"
    out.append(demo(questioner(name, **fields),
                    json.dumps(proposal, ensure_ascii=False)))
    parsed = R.Proposal(proposal["question"], proposal["answer"],
                        proposal.get("options"))
    cluster_ids = [spell.passages[i].id for i in members]
    reply = {"doc_qa": f"The correct answer is {gold}.", "doc_mc": f"The correct answer is "
             f"({parsed.answer}).", "doc_math": f"Therefore, the answer is {gold}."}[task]
    out.append(demo(spell.responder_prompt(task, parsed, spell.context(cluster_ids)), reply))
    if task == "doc_mc":
      wrong_answer = "ABCD".replace(parsed.answer, "")[int(rng.integers(3))]
    else:
      wrong_answer = others[int(rng.integers(len(others)))][1] if others else "unknown"
    pairs = ((parsed.answer, "[[YES]]"), (wrong_answer, "[[NO]]"))
    for answer, verdict in pairs[len(out) // 3 % 2:][:1]:
      prompt = verifier(parsed.display(), parsed.answer, answer)
      out.append(demo(prompt, f"Decision: {verdict}"))
  return out
