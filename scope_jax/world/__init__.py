"""A bundled, seeded synthetic world: what a method learns from on one CPU, and held-out gold sets
that show whether it did.

`World(seed)` generates (never downloads) entities with invented names, one document per entity
(the corpus the search methods index and document clusters are drawn from), arithmetic word
problems over the same names, and six held-out gold sets:

  doc     the entity's document is in the question; answer a fact from it        ('qa')
  attr    as doc, for the closed-class facts (profession, industry, language)    ('qa')
  hop1    one search finds the document that answers                             ('qa_search')
  attr_search  as hop1, for the closed-class facts                              ('qa_search')
  hop2    two searches: the first answer names the entity the second is about    ('qa_search')
  arith   word problems with an integer answer                                   ('math')

Gold sets are for evaluation only: no training input holds a gold question (the arithmetic
problems a method trains on are drawn apart from `arith` and checked against it). Arithmetic is
split by its numbers (`render.operands_half`): `arith` holds only held-out (operands, answer)
pairs and training problems only the others, in every world. Entities are split in two halves
(`World.heldout_names`): with `world.heldout_entities`, no training path reads the held-out
half's documents, and evaluation scores each half apart (`question_halves`, `half_scores`), so
reading is told apart from remembering.

    w = World(0); w.write("runs/world0")   # corpus.jsonl and gold/<set>.jsonl
    python -m scope_jax.evaluate --benchmarks=file:runs/world0/gold/hop1.jsonl:qa_search ...
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import uuid

import numpy as np
from etils import epath

from scope_jax.retrieval.corpus import Passage
from scope_jax.world import entities as E
from scope_jax.world import render as R

GOLD_SETS = {"doc": "qa", "attr": "qa", "hop1": "qa_search", "attr_search": "qa_search",
             "hop2": "qa_search", "arith": "math"}
MANIFEST = "world.json"  # seed, gold size and digest of a written world
GOLD_SIZE = 400  # questions per gold set (at least 300, the smallest a held-out claim may use)
HALVES = ("trained_half", "heldout_half")  # the entity halves evaluation scores apart


class World:
  """World `seed`: entities, documents, gold sets and training problems, all from the seed."""

  def __init__(self, seed: int = 0, gold_size: int = GOLD_SIZE):
    if seed < 0:
      raise ValueError(f"world.seed={seed}: use a non-negative integer.")
    self.seed, self.gold_size = int(seed), int(gold_size)
    self.entities = E.generate(self.seed)

  @functools.cached_property
  def documents(self) -> list[Passage]:
    return R.documents(self.entities, self.seed)

  @functools.cached_property
  def gold(self) -> dict[str, list[dict]]:
    """The held-out sets, by name (`GOLD_SETS`)."""
    n, w = self.gold_size, self.entities
    return {"doc": R.doc_questions(w, self.documents, self.seed, n),
            "attr": R.doc_questions(w, self.documents, self.seed, n, R.ATTR, "attr"),
            "hop1": R.hop_questions(w, R.HOP1, self.seed, n, "hop1"),
            "attr_search": R.hop_questions(w, R.ATTR, self.seed + 2, n, "attr_search"),
            "hop2": R.hop_questions(w, R.HOP2, self.seed, n, "hop2"),
            "arith": R.arithmetic(w, np.random.default_rng([self.seed, 0xA7]), n, "arith",
                                  half="heldout")}

  @functools.cached_property
  def heldout_names(self) -> frozenset[str]:
    """The held-out half of the entities, by name: of each kind (countries, cities,
    organisations, people), the first half of a permutation drawn from the world's seed."""
    rng = np.random.default_rng([self.seed, 0x4A1F])
    e = self.entities
    return frozenset(group[int(i)].name
                     for group in (e.countries, e.cities, e.organisations, e.people)
                     for i in rng.permutation(len(group))[:len(group) // 2])

  def half(self, name: str) -> str:
    """'trained_half' or 'heldout_half': which half the entity `name` is in."""
    return HALVES[name in self.heldout_names]

  @functools.cached_property
  def training_documents(self) -> list[Passage]:
    """The documents of the trained half alone: what a run with `world.heldout_entities` may
    train on (the held-out half's documents are for evaluation only)."""
    return [d for d in self.documents if d.title not in self.heldout_names]

  def trained_entities(self) -> E.Entities:
    """The entities of the trained half alone (whose names training problems may use)."""
    keep = lambda group: tuple(x for x in group if x.name not in self.heldout_names)
    e = self.entities
    return dataclasses.replace(e, countries=keep(e.countries), cities=keep(e.cities),
                               organisations=keep(e.organisations), people=keep(e.people))

  def training_problems(self, count: int, worked: bool = False,
                        heldout_entities: bool = False) -> list[dict]:
    """Arithmetic problems to train on (e.g. seed problems), none of them a gold question nor
    sharing an (operands, answer) pair with one (`render.operands_half`); `worked` adds each
    one's worked sums (`steps`) and template (`form`); `heldout_entities` names only the trained
    half's entities in them."""
    held_out = {q["question"] for q in self.gold["arith"]}
    rng = np.random.default_rng([self.seed, 0x7A])
    names = self.trained_entities() if heldout_entities else self.entities
    out, seen = [], set(held_out)
    while len(out) < count:
      for q in R.arithmetic(names, rng, count, "train", worked, half="train"):
        if q["question"] not in seen and len(out) < count:
          seen.add(q["question"])
          out.append(dict(q, id=f"train-{len(out)}"))
    return out

  def questions(self, count: int, rng: np.random.Generator, skill: str = "hop1") -> list[dict]:
    """Up to `count` one-hop questions of this world that are not in its `skill` gold set (what
    a warm-up from another world's seed demonstrates), in `rng`'s order; `skill='attr'` asks
    only the closed-class facts."""
    if skill not in ("hop1", "attr"):
      raise ValueError(f"Unknown question skill {skill!r}; choose 'hop1' or 'attr'.")
    held_out = {q["question"].rsplit("\nQuestion: ", 1)[-1] for q in self.gold[skill]}
    templates = R.ATTR if skill == "attr" else R.HOP1
    every = R.hop_questions(self.entities, templates, self.seed + 7, 10 ** 6, "world")
    pool = [q for q in every if q["question"] not in held_out]
    return [pool[int(i)] for i in rng.permutation(len(pool))[:count]]

  def files(self) -> dict[str, str]:
    """What `write` writes: relative path → text (the corpus, then each gold set)."""
    lines = [json.dumps({"id": d.id, "title": d.title, "text": d.text, "contents": d.contents})
             for d in self.documents]
    out = {"corpus.jsonl": "\n".join(lines) + "\n"}
    for name, records in self.gold.items():
      out[f"gold/{name}.jsonl"] = "\n".join(json.dumps(r) for r in records) + "\n"
    return out

  def manifest(self) -> dict:
    """What defines the written files: the seed, the gold sets' size and their content's
    digest (a change of the generator changes it too)."""
    h = hashlib.sha256()
    for name, text in sorted(self.files().items()):
      h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return {"seed": self.seed, "gold_size": self.gold_size, "digest": h.hexdigest()[:24]}

  def write(self, directory) -> epath.Path:
    """`corpus.jsonl` (id, title, text, contents), `gold/<set>.jsonl` and `world.json` (the
    manifest, last) under `directory`; each file is replaced whole, never left cut."""
    root = epath.Path(directory)
    (root / "gold").mkdir(parents=True, exist_ok=True)
    if (root / MANIFEST).exists():  # another world's files: no longer whole until rewritten
      (root / MANIFEST).unlink()
    for name, text in self.files().items():
      _write_whole(root / name, text)
    _write_whole(root / MANIFEST, json.dumps(self.manifest(), sort_keys=True))
    return root

  def written(self, directory) -> bool:
    """Whether `directory` holds this world's files, whole (its manifest is this world's)."""
    path = epath.Path(directory) / MANIFEST
    try:
      return path.exists() and json.loads(path.read_text()) == self.manifest()
    except ValueError:  # a damaged manifest: write again
      return False

  def benchmark(self, directory, name: str) -> str:
    """The `file:` benchmark spec of gold set `name` written under `directory`."""
    if name not in GOLD_SETS:
      raise ValueError(f"Unknown world gold set {name!r}; choose from {', '.join(GOLD_SETS)}.")
    return f"file:{epath.Path(directory) / 'gold' / f'{name}.jsonl'}:{GOLD_SETS[name]}"


def _write_whole(path: epath.Path, text: str) -> None:
  """Replaces the file at once (a temporary file of this writer's own, renamed over it; one
  object write on gs://): a reader never sees it cut."""
  if "://" in str(path):
    path.write_text(text)
    return
  tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:12]}.tmp"
  tmp.write_text(text)
  tmp.replace(path)


def corpus(seed: int, corpus_seeds=(), heldout_entities: bool = False) -> list[Passage]:
  """World `seed`'s documents, then each of `corpus_seeds`' worlds' whose id is not yet taken: a
  larger corpus to draw pages from and search among, while the gold sets stay world `seed`'s.
  With `heldout_entities`, world `seed` lends only its trained half (`World.training_documents`),
  and no other world's page may stand in for a held-out one (the same id is left out)."""
  extra = [int(s) for s in corpus_seeds]
  if seed in extra or len(set(extra)) != len(extra):
    raise ValueError(f"world.corpus_seeds={tuple(extra)} must be distinct and leave out "
                     f"world.seed={seed}, whose documents come first anyway.")
  own = World(seed)
  by_id: dict[str, Passage | None] = {}
  for d in own.documents:
    by_id[d.id] = None if heldout_entities and d.title in own.heldout_names else d
  for s in extra:
    for d in World(s).documents:
      by_id.setdefault(d.id, d)
  return [d for d in by_id.values() if d is not None]


def question_halves(world: World, name: str) -> dict[str, str]:
  """Gold set `name`'s question id → the half ('trained_half' or 'heldout_half') of the entity it
  asks about (the first document its answer is read from); {} for `arith`, which names no
  entity it asks about."""
  return {q["id"]: world.half(q["support"][0].split(":", 1)[1])
          for q in world.gold[name] if q["support"]}


def half_scores(records, halves: dict[str, str]) -> dict[str, float]:
  """`<half>/pass@1` (the mean over the half's questions of each one's mean score) and
  `<half>/count` of prediction `records` ({id, scores}), for each half that has a question."""
  by_half: dict[str, list[float]] = {}
  for r in records:
    if r["id"] in halves and r["scores"]:
      by_half.setdefault(halves[r["id"]], []).append(sum(r["scores"]) / len(r["scores"]))
  out = {}
  for half in HALVES:
    if by_half.get(half):
      out[f"{half}/pass@1"] = sum(by_half[half]) / len(by_half[half])
      out[f"{half}/count"] = float(len(by_half[half]))
  return out


WORLD_PREFIX = "world:"  # a benchmark list names a world's gold set as world:<set>


def world_specs(spec: str, seed: int, root) -> str:
  """`world:<set>` items of a benchmark list as `file:` items of world `seed`'s gold sets,
  written under `root` unless its manifest says they are this world's, whole (another seed's,
  or files a kill cut short, are written again); other items unchanged."""
  items = [s.strip() for s in str(spec).split(",") if s.strip()]
  if not any(i.startswith(WORLD_PREFIX) for i in items):
    return spec
  world, out = World(seed), epath.Path(root)
  if not world.written(out):  # every process that sees no manifest writes the same bytes
    world.write(out)
  return ",".join(world.benchmark(out, i[len(WORLD_PREFIX):]) if i.startswith(WORLD_PREFIX) else i
                  for i in items)
