"""What a method is to the runner: a class that declares its players once (`players`: policies,
frozen and tracked params, and the roles they play, which `Method.__init__` builds and the plan
compiles) and the config fields it needs (checked before anything loads), and then runs one
self-play step at a time."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np

from scope_jax.core.bounds import Bound
from scope_jax.core.guard import ParseGuard
from scope_jax.retrieval import search as retrieval_search
from scope_jax.world import search
from scope_jax.rollout.types import Trajectory


def check_choice(name: str, value, choices) -> None:
  """`value` is one of `choices`, or a one-line error listing them (an empty string as '')."""
  if value not in choices:
    shown = ", ".join(repr(c) if c == "" else str(c) for c in choices)
    raise ValueError(f"{name}={value!r} is not valid; choose one of: {shown}.")


def field(section: ml_collections.ConfigDict, dotted: str) -> Any:
  for part in dotted.split("."):
    section = section[part]
  return section


@dataclasses.dataclass(frozen=True)
class PolicyPlan:
  """A trained policy: the rows of its largest update (what `scope_jax.plan` compiles), its loss
  and optimizer overrides, and whether its step distils from a teacher."""
  rows: int
  loss: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  teacher: bool = False
  optim: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RolePlan:
  """A role: the policy, frozen or tracked params that play it (`by`), whether it searches with the
  run's search tool, the tags that end its answer, and whether its rollouts drop `<think>`."""
  by: str
  tool: bool = False
  final: tuple[str, ...] = ()
  strip_think: bool = False


@dataclasses.dataclass(frozen=True)
class Players:
  """What a method holds on device: trained policies, frozen copies of the base model (judges),
  tracked params it moves itself (an EMA teacher), and the roles they play (each role's sampling
  settings are `config.<method>.roles.<role>`). The KL reference is the runtime's."""
  policies: Mapping[str, PolicyPlan]
  frozen: tuple[str, ...] = ()
  tracked: tuple[str, ...] = ()
  roles: Mapping[str, RolePlan] = dataclasses.field(default_factory=dict)


class Method:
  """One self-play method. Subclasses declare their players in `players(config)` and, as class
  attributes:

  at_least_one: fields of `config.<method>` (dotted for nested) that must be at least 1;
  choices: field → its valid values (every element, for a list-valued field);
  searches: its roles call the search tool (`config.retrieval` and `<method>.syntax` are checked);
  syntaxes: the search syntaxes its prompts can ask for (one of them is `<method>.syntax`);
  answering_role: the trained role that answers questions, scored by held-out evaluation (`eval`);
  world_demonstrations: its warm-up can demonstrate on other worlds' questions (warmup.world_seed);
  smoke: the sizes of a smoke run — batch and group sizes 2, one step per phase (core/smoke.py);
  bounds, section_bound: the valid ranges of its numeric fields (core/bounds.py).
  `check(config)` adds the rules that relate several fields.
  """

  name: str = ""
  at_least_one: tuple[str, ...] = ()
  choices: Mapping[str, Sequence] = {}
  searches: bool = False
  syntaxes: tuple[str, ...] = ("xml", "qwen")
  answering_role: str = ""
  world_demonstrations: bool = False  # warm-up on other worlds (warmup.world_seed) is possible
  smoke: Mapping[str, Any] = {}  # --config.smoke=True: sizes (dotted from the config's root)
  bounds: tuple = ()  # (dotted pattern, core.bounds.Bound) of the method's own numeric fields,
  # matched before the shared rules of core/bounds.py (first match wins)
  section_bound: Bound | None = None  # the range of the rest of its section's numeric fields
  # (matched after the shared rules); None leaves them to `check`
  host_local_keys: tuple[str, ...] = ()  # host_state() entries that measure this host (wall
  # times): every other entry must be the same on every host of a multi-host run

  def __init__(self, rt, prompts=None):
    """Builds the declared players on `rt`; roles with `tool` search the run's retrieval index
    (built here, once). `prompts` gives each role its system message (`prompts.system(role)`).
    `self.guard` runs the method's parsers; the runner counts its errors per step."""
    self.rt, self.prompts = rt, prompts
    self.cfg = rt.config.get(self.name)
    self.guard = ParseGuard()
    self.tool = None
    try:
      cast = self.players(rt.config)
    except NotImplementedError:  # a method of one's own that adds its players itself
      self.roles = {}
      return
    if any(r.tool for r in cast.roles.values()):
      c = rt.config
      self.passages, self.tool = search.from_config(c.retrieval, c.world.seed, c.world.corpus_seeds,
                                                    c.world.get("heldout_entities", False))
    system = getattr(prompts, "system", lambda role: None)
    self.roles = rt.add_players(cast, self.cfg.roles, tool=self.tool, system=system)

  # ------------------------------------------------------------------------ declarations
  @classmethod
  def validate(cls, config: ml_collections.ConfigDict, data: bool = True) -> None:
    """The declared checks, then `check`: fails fast, before anything loads. `data=False`
    (planning) skips the checks that data paths (retrieval index, encoders) are set."""
    section = config[cls.name]
    for role in cls.role_names(config):
      if role not in section.get("roles", {}):
        raise ValueError(f"{cls.name}.roles needs a '{role}' entry (sampling settings).")
    for name in cls.at_least_one:
      value = field(section, name)
      if value < 1:
        raise ValueError(f"{cls.name}.{name}={value} must be at least 1.")
    for name, valid in cls.choices.items():
      value = field(section, name)
      values = value if isinstance(value, (list, tuple)) else [value]
      if isinstance(value, (list, tuple)) and not value:
        raise ValueError(f"{cls.name}.{name} is empty; choose from: {', '.join(map(str, valid))}.")
      for v in values:
        check_choice(f"{cls.name}.{name}", v, valid)
    if cls.searches and data:
      retrieval_search.validate(config.retrieval)
    if cls.searches:
      check_choice(f"{cls.name}.syntax", section.syntax, cls.syntaxes)
    for role, settings in section.get("roles", {}).items():
      own = settings.get("syntax")
      if own is not None and own != section.get("syntax", "xml"):
        raise ValueError(f"{cls.name}.roles.{role}.syntax={own!r} differs from "
                         f"{cls.name}.syntax={section.get('syntax', 'xml')!r}, the syntax its "
                         "prompts ask for; drop the role's own syntax.")
    cls.check(config)
    if data:
      cls.check_data(config)

  @classmethod
  def players(cls, config: ml_collections.ConfigDict) -> Players:
    """The method's one declaration of what it holds and who plays each role under `config`:
    `Method.__init__` builds it, `scope_jax.plan` compiles its update rows."""
    raise NotImplementedError(f"{cls.__name__} does not declare its players.")

  @classmethod
  def role_names(cls, config: ml_collections.ConfigDict) -> tuple[str, ...]:
    """The roles `config.<method>.roles` must have an entry for (their sampling settings)."""
    return tuple(cls.players(config).roles)

  @classmethod
  def check_data(cls, config: ml_collections.ConfigDict) -> None:
    """The method's own data paths are set (skipped by planning, which reads no data)."""

  @classmethod
  def check(cls, config: ml_collections.ConfigDict) -> None:
    """Rules that relate several fields (the declaration covers the rest)."""
    del config

  # ------------------------------------------------------------------------ the run
  def demonstrations(self, rng: np.random.Generator) -> Sequence[Trajectory]:
    """Format demonstrations of every role for the demo warm-up (`warmup.steps > 0`)."""
    raise NotImplementedError(f"{type(self).__name__} has no format demonstrations; set "
                              "--config.warmup.steps=0.")

  def answer_prompt(self, question: str, kind: str):
    """The answering role's own prompt (a `prompts.Prompt`, or token ids) for a held-out
    question of benchmark type `kind` ('qa', 'qa_search', …), which evaluation asks in with
    `eval.prompt='role'`; None for a type the role is never asked in training. Methods without
    any do not override it (`has_answer_prompt`)."""
    raise NotImplementedError(f"{type(self).__name__} has no answering prompt of its own; use "
                              "eval.prompt='benchmark'.")

  @classmethod
  def has_answer_prompt(cls) -> bool:
    return cls.answer_prompt is not Method.answer_prompt

  def step(self, step: int) -> dict[str, float]:
    raise NotImplementedError

  def host_state(self) -> dict:
    """JSON-able method state (memories, pools, RNG) saved with every checkpoint."""
    return {}

  def load_host_state(self, state: dict) -> None:
    del state

  def summary(self) -> str:
    return ""
