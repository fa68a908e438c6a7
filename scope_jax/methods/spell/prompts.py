"""SPELL's role prompts (the released templates, or the compact style for small models): the
questioner's over new documents (and the cluster's history), the responder's over the cluster,
the verifier's over a response (the shared answer-match judge, `rewards.judges`). Each returns a `Prompt` whose inserted content (documents,
questions, answers) a role may cut to its prompt limit, never the template."""

from __future__ import annotations

from typing import Sequence

from scope_jax import prompts
from scope_jax.rewards import judges

STYLES = {"paper": "spell", "compact": "spell_compact"}  # prompt style → template directory


def split_document_question(question: str) -> tuple[str, str] | None:
  """("<documents>", "<question>") of "Document: <documents>\nQuestion: <question>"; None when
  the text is not written so."""
  head, sep, text = str(question).rpartition("\nQuestion: ")
  if not sep or not head.startswith("Document: "):
    return None
  return head[len("Document: "):], text.strip()


class Prompts:

  def __init__(self, style: str = "paper"):
    self.style, self.dir = style, STYLES[style]

  def template(self, name: str, fit: Sequence[str] = (), **fields) -> prompts.Prompt:
    """The template `name` of this style with its fields; `fit` may be cut."""
    return prompts.Prompt(prompts.load(self.dir, name), fields, tuple(fit))

  def questioner(self, task: str, context: str, history: Sequence = (),
                 correct_letter: str | None = None) -> prompts.Prompt:
    """The questioner's prompt over `context`, with the cluster's earlier (question, answer)
    `history` as examples when it has any; `correct_letter` places a doc_mc answer."""
    fields = {}
    if history:
      fields["examples"] = "\n".join(f"### Example {i}:\nQuestion: {e.question}\nAnswer: {e.answer}"
                                     for i, e in enumerate(history, 1))
    if correct_letter is not None:
      fields["correct_letter"] = correct_letter
    name = f"questioner_{task}_history" if history else f"questioner_{task}"
    return self.template(name, ("context",), context=context, **fields)

  def responder(self, task: str, proposal, context: str) -> prompts.Prompt:
    fields = {"context": context, "question": proposal.question}
    if task == "doc_mc":
      fields.update({f"choice_{k}": v for k, v in proposal.options.items()})
    return self.template(f"responder_{task}", ("context", "question"), **fields)

  def verifier(self, problem: str, answer_1: str, answer_2: str) -> prompts.Prompt:
    return prompts.Prompt(judges.template(judges.ANSWER_MATCH, self.style),
                          dict(problem=problem, answer_1=answer_1, answer_2=answer_2),
                          ("answer_2", "problem", "answer_1"))
