"""A world's documents and questions, in varied phrasing.

Each entity has one document: its facts, each in one of several phrasings, in a shuffled order
after the sentence that names it. Questions are records `{id, question, gold, support}`: the
gold answer and the documents that hold it, in the order a reader follows them (one for a 1-hop
question, two for a 2-hop one). Arithmetic problems carry their numbers in the text.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import numpy as np

from scope_jax.retrieval.corpus import Passage
from scope_jax.world.entities import City, Country, Entities, Organisation, Person

PERSON = {
    "born": ("{n} was born in {born}.", "{n}'s year of birth is {born}.",
             "Born in {born}, {n} grew up far from the capital."),
    "birthplace": ("{n} was born in the city of {birthplace}.", "{n} is a native of {birthplace}.",
                   "{n}'s hometown is {birthplace}."),
    "employer": ("{n} works for {employer}.", "{n} is employed by {employer}.",
                 "Since leaving school, {n} has worked at {employer}."),
}
PERSON_LEAD = ("{n} is {a_profession}.", "{n} works as {a_profession}.")
ORG = {
    "founded": ("{n} was founded in {founded}.", "{n} dates from {founded}.",
                "The year {founded} saw the founding of {n}."),
    "headquarters": ("{n} has its headquarters in {headquarters}.",
                     "{n} is based in {headquarters}.", "The head office of {n} is in {headquarters}."),
    "founder": ("{n} was founded by {founder}.", "{founder} is the founder of {n}.",
                "{n} was started by {founder}."),
    "employees": ("{n} employs {employees} people.", "About {employees} people work at {n}."),
}
ORG_LEAD = ("{n} is a {industry} firm.", "{n} is known for {industry}.")
CITY = {
    "country": ("{n} is a city in {country}.", "{n} lies in {country}.",
                "{n} is one of the cities of {country}."),
    "founded": ("{n} was founded in {founded}.", "The city of {n} dates from {founded}."),
    "population": ("{n} has a population of {population}.", "About {population} people live in {n}."),
}
COUNTRY = {
    "capital": ("The capital of {n} is {capital}.", "{capital} is the capital of {n}."),
    "language": ("People in {n} speak {language}.", "The language of {n} is {language}."),
}
COUNTRY_LEAD = ("{n} is a country.",)

# (set, question template, the fact's path: attribute of the entity, then of the linked one)
HOP1 = (
    ("person", "In which city was {n} born?", ("birthplace",)),
    ("person", "Which organisation does {n} work for?", ("employer",)),
    ("person", "In what year was {n} born?", ("born",)),
    ("organisation", "Who founded {n}?", ("founder",)),
    ("organisation", "In which city does {n} have its headquarters?", ("headquarters",)),
    ("organisation", "In what year was {n} founded?", ("founded",)),
    ("city", "In which country is the city of {n}?", ("country",)),
    ("country", "What is the capital of {n}?", ("capital",)),
)
# Closed-class facts, each asked two ways: a reader answers by finding the one word of a small
# class (12 professions, 12 industries, 8 languages) its document states; no name is copied.
ATTR = (
    ("person", "What is the profession of {n}?", ("profession",)),
    ("person", "What does {n} do for a living?", ("profession",)),
    ("organisation", "Which industry is {n} in?", ("industry",)),
    ("organisation", "What line of business is {n} in?", ("industry",)),
    ("country", "What language do people in {n} speak?", ("language",)),
    ("country", "What is the language of {n}?", ("language",)),
)
HOP2 = (
    ("person", "In which country was {n} born?", ("birthplace", "country")),
    ("person", "In which city is the organisation that employs {n} headquartered?",
     ("employer", "headquarters")),
    ("person", "Who founded the organisation that {n} works for?", ("employer", "founder")),
    ("person", "In what year was the organisation that employs {n} founded?", ("employer", "founded")),
    ("organisation", "In which city was the founder of {n} born?", ("founder", "birthplace")),
    ("organisation", "In which country is {n} headquartered?", ("headquarters", "country")),
)
# (problem, answer from (a, b, c), worked solution): `ab` is a·b, `s` is a + b, `r` the answer.
ARITHMETIC: tuple[tuple[str, Callable[[int, int, int], int], str], ...] = (
    ("{p} packs {a} crates with {b} bottles in each crate and then sells {c} bottles. How many "
     "bottles does {p} have left?", lambda a, b, c: a * b - c,
     "{a} * {b} = {ab}. {ab} - {c} = {r}."),
    ("{o} had {a} workers. It hired {b} more and later {c} of them left. How many workers does "
     "{o} have now?", lambda a, b, c: a + b - c, "{a} + {b} = {s}. {s} - {c} = {r}."),
    ("{p} reads {a} pages a day for {b} days and then {c} more pages. How many pages did {p} read "
     "in all?", lambda a, b, c: a * b + c, "{a} * {b} = {ab}. {ab} + {c} = {r}."),
    ("{p} shares {ab} coins equally among {b} friends. How many coins does each friend get?",
     lambda a, b, c: a, "{ab} / {b} = {r}."),
    ("A train leaves {city} and travels {a} kilometres every hour for {b} hours, then {c} more "
     "kilometres. How far does it travel?", lambda a, b, c: a * b + c,
     "{a} * {b} = {ab}. {ab} + {c} = {r}."),
    ("{p} buys {a} boxes of {b} pencils each and gives {c} pencils to a friend. How many pencils "
     "does {p} keep?", lambda a, b, c: a * b - c, "{a} * {b} = {ab}. {ab} - {c} = {r}."),
)


def _kind(e) -> str:
  return {Person: "person", Organisation: "organisation", City: "city", Country: "country"}[type(e)]


def doc_id(e) -> str:
  return f"{_kind(e)}:{e.name}"


def document(e, rng: np.random.Generator) -> Passage:
  """One entity's document: a lead sentence, then each fact in a random phrasing and order."""
  facts = {"person": PERSON, "organisation": ORG, "city": CITY, "country": COUNTRY}[_kind(e)]
  lead = {"person": PERSON_LEAD, "organisation": ORG_LEAD, "city": (), "country": COUNTRY_LEAD}
  values = {k: (f"{v:,}" if isinstance(v, int) and v >= 10_000 else v)
            for k, v in vars(e).items()}
  values["n"] = e.name
  if "profession" in values:
    values["a_profession"] = ("an " if e.profession[0] in "aeiou" else "a ") + e.profession
  sentences = [str(rng.choice(t)).format(**values) for t in facts.values()]
  order = rng.permutation(len(sentences))
  leads = [str(rng.choice(lead[_kind(e)])).format(**values)] if lead[_kind(e)] else []
  return Passage(doc_id(e), e.name, " ".join(leads + [sentences[i] for i in order]))


def documents(world: Entities, seed: int) -> list[Passage]:
  rng = np.random.default_rng([seed, 0xD0C])
  return [document(e, rng) for group in (world.countries, world.cities, world.organisations,
                                         world.people) for e in group]


def _answer(world: Entities, entity, path: tuple[str, ...]) -> tuple[str, list[str]]:
  """(the value at the end of `path`, the documents read on the way)."""
  names = world.by_name()
  support, value = [], entity
  for attr in path:
    support.append(doc_id(value))
    value = getattr(value, attr)
    if attr != path[-1]:
      value = names[value]
  return str(value), support


def hop_questions(world: Entities, templates, seed: int, count: int, name: str) -> list[dict]:
  """`count` questions drawn without repeats from every (template, entity) pair."""
  groups = {"person": world.people, "organisation": world.organisations, "city": world.cities,
            "country": world.countries}
  pairs = [(t, e) for t in templates for e in groups[t[0]]]
  rng = np.random.default_rng([seed, 0x9A, len(templates)])
  out = []
  for i in rng.permutation(len(pairs))[:count]:
    (_, text, path), e = pairs[i]
    gold, support = _answer(world, e, path)
    out.append({"id": f"{name}-{len(out)}", "question": text.format(n=e.name), "gold": [gold],
                "support": support})
  return out


def doc_questions(world: Entities, docs: list[Passage], seed: int, count: int,
                  templates=HOP1, name: str = "doc") -> list[dict]:
  """1-hop questions with the entity's document (title, then text) given: reading
  comprehension, no search."""
  by_id = {d.id: d for d in docs}
  out = []
  for q in hop_questions(world, templates, seed + 1, count, name):
    d = by_id[q["support"][0]]
    out.append(dict(q, question=f"Document: {d.title}\n{d.text}\nQuestion: {q['question']}"))
  return out


DIVISION = 3  # the template whose text shows a·b and b (c is drawn but never shown)
ARITH_HALVES = ("train", "heldout")  # the two halves of arithmetic, by operands


def operands(form: int, a: int, b: int, c: int) -> tuple[tuple[int, ...], int]:
  """(the numbers a problem shows, in order; its answer): what a problem shares with another
  whose worked sums are the same, whatever its names, template wording or world."""
  answer = ARITHMETIC[form][1](a, b, c)
  return ((a * b, b) if form == DIVISION else (a, b, c)), answer


def operands_half(key: tuple[tuple[int, ...], int]) -> str:
  """'train' or 'heldout': a fixed hash of an (operands, answer) pair, the same in every world,
  so held-out arithmetic shares no pair with any problem trained on (world seeds do not
  separate arithmetic: the answer depends on the numbers alone)."""
  digest = hashlib.sha256(repr((tuple(key[0]), int(key[1]))).encode()).digest()
  return ARITH_HALVES[digest[0] & 1]


def arithmetic(world: Entities, rng: np.random.Generator, count: int, name: str,
               worked: bool = False, half: str | None = None) -> list[dict]:
  """Word problems over the world's names; the numbers are in the text, the answer an integer.
  `worked` adds each problem's `form` (its template's index) and `steps` (the worked sums, what
  a warm-up demonstrates); gold sets leave them out. `half` ('train' or 'heldout') keeps only
  problems whose (operands, answer) pair falls in that half (`operands_half`)."""
  if half is not None and half not in ARITH_HALVES:
    raise ValueError(f"Unknown arithmetic half {half!r}; choose from {', '.join(ARITH_HALVES)}.")
  out, seen = [], set()
  while len(out) < count:
    form = int(rng.integers(len(ARITHMETIC)))
    text, f, steps = ARITHMETIC[form]
    a, b = int(rng.integers(2, 20)), int(rng.integers(2, 12))
    c = int(rng.integers(1, a * b))
    if f(a, b, c) < 0:  # every answer is a whole, non-negative number
      continue
    if half is not None and operands_half(operands(form, a, b, c)) != half:
      continue
    q = text.format(p=world.people[int(rng.integers(len(world.people)))].name,
                    o=world.organisations[int(rng.integers(len(world.organisations)))].name,
                    city=world.cities[int(rng.integers(len(world.cities)))].name,
                    a=a, b=b, c=c, ab=a * b)
    if q in seen:
      continue
    seen.add(q)
    out.append({"id": f"{name}-{len(out)}", "question": q, "gold": [str(f(a, b, c))],
                "support": [], "operands": list(operands(form, a, b, c)[0])})
    if worked:
      out[-1].update(form=form, steps=steps.format(a=a, b=b, c=c, ab=a * b, s=a + b,
                                                   r=f(a, b, c)))
  return out
