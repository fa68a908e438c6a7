"""The entities of a synthetic world and their facts, drawn from one seed.

Countries, cities, organisations and people with invented names (no pretrained model knows them),
linked by relations: a city lies in a country, an organisation has its headquarters in a city and
a founder, a person was born in a city and works for an organisation. Every fact is a value a
question can ask for and a document states, so held-out answers are derivable from the corpus.
"""

from __future__ import annotations

import dataclasses

import numpy as np

ONSETS = ("b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s",
          "st", "t", "tr", "v", "z", "th", "sh", "c", "j")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "io")
CODAS = ("", "", "n", "r", "l", "s", "m", "th", "nd", "rk", "x")
INDUSTRIES = ("shipbuilding", "textiles", "publishing", "glassmaking", "mining", "brewing",
              "printing", "clockmaking", "banking", "pottery", "rail transport", "papermaking")
PROFESSIONS = ("engineer", "chemist", "architect", "historian", "surgeon", "painter", "lawyer",
               "economist", "botanist", "journalist", "astronomer", "composer")
LANGUAGES = ("Velmic", "Orrish", "Tandese", "Quorvian", "Sileth", "Marundi", "Ekkaran", "Pollish")
CLASSES = {"profession": PROFESSIONS, "industry": INDUSTRIES, "language": LANGUAGES}
COUNTRY_SUFFIXES = ("ia", "land", "mark", "ora", "istan", "avia")
CITY_SUFFIXES = ("ford", "burg", "haven", "wick", "port", "dale", "stead", "mouth")
ORG_SUFFIXES = ("Works", "Company", "Guild", "Foundry", "Society", "Holdings", "Press", "Mills")


def other_members(value: str) -> list[str]:
  """The rest of the closed class (professions, industries, languages) `value` belongs to:
  answers of the right form that are wrong; [] for a value of no class."""
  for members in CLASSES.values():
    if value in members:
      return sorted(m for m in members if m != value)
  return []


@dataclasses.dataclass(frozen=True)
class Country:
  name: str
  language: str
  capital: str  # a city's name (set once cities exist)


@dataclasses.dataclass(frozen=True)
class City:
  name: str
  country: str
  founded: int
  population: int


@dataclasses.dataclass(frozen=True)
class Organisation:
  name: str
  industry: str
  founded: int
  headquarters: str  # a city
  founder: str  # a person
  employees: int


@dataclasses.dataclass(frozen=True)
class Person:
  name: str
  born: int
  birthplace: str  # a city
  employer: str  # an organisation
  profession: str


@dataclasses.dataclass(frozen=True)
class Entities:
  countries: tuple[Country, ...]
  cities: tuple[City, ...]
  organisations: tuple[Organisation, ...]
  people: tuple[Person, ...]

  def by_name(self) -> dict[str, object]:
    return {e.name: e for group in (self.countries, self.cities, self.organisations, self.people)
            for e in group}


class _Names:
  """Unique invented words: syllables from `rng`, never a name drawn before."""

  def __init__(self, rng: np.random.Generator):
    self.rng, self.used = rng, set()

  def word(self, syllables: int) -> str:
    while True:
      w = "".join(self.rng.choice(ONSETS) + self.rng.choice(VOWELS) for _ in range(syllables))
      w = (w + self.rng.choice(CODAS)).capitalize()
      if w not in self.used and len(w) >= 4:
        self.used.add(w)
        return w


def generate(seed: int, *, countries: int = 8, cities: int = 40, organisations: int = 60,
             people: int = 160) -> Entities:
  """The entities of world `seed` (the same seed, the same world)."""
  rng = np.random.default_rng([seed, 0x5EED])
  names = _Names(rng)
  country_names = [names.word(2) + str(rng.choice(COUNTRY_SUFFIXES)) for _ in range(countries)]
  city_list = [City(names.word(1) + str(rng.choice(CITY_SUFFIXES)),
                    country_names[i % countries], int(rng.integers(1050, 1900)),
                    int(rng.integers(20, 900)) * 1000) for i in range(cities)]
  country_list = [Country(n, LANGUAGES[i % len(LANGUAGES)], city_list[i].name)
                  for i, n in enumerate(country_names)]
  people_names = [f"{names.word(1)} {names.word(2)}" for _ in range(people)]
  org_list = [Organisation(f"{names.word(2)} {rng.choice(ORG_SUFFIXES)}",
                           str(rng.choice(INDUSTRIES)), int(rng.integers(1800, 1990)),
                           city_list[int(rng.integers(cities))].name,
                           people_names[int(rng.integers(people))],
                           int(rng.integers(3, 400)) * 10) for _ in range(organisations)]
  person_list = [Person(n, int(rng.integers(1900, 2000)),
                        city_list[int(rng.integers(cities))].name,
                        org_list[int(rng.integers(organisations))].name,
                        str(rng.choice(PROFESSIONS))) for n in people_names]
  return Entities(tuple(country_list), tuple(city_list), tuple(org_list), tuple(person_list))
