"""What a method is to the runner: a class that declares its roles and the config fields it needs
(checked before anything loads), declares its roles, policies and frozen params with the runtime
in `__init__`, and then runs one self-play step at a time."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np

from scope_jax.core.bounds import Bound
from scope_jax.retrieval import search
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
  """A trained policy as `scope_jax.plan` compiles it: the rows of its largest update, its loss
  overrides (as given to `Runtime.add_policy`), and whether its step distils from a teacher."""
  rows: int
  loss: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  teacher: bool = False


@dataclasses.dataclass(frozen=True)
class Players:
  """What a method holds on device: trained policies, frozen copies of the base model (judges),
  and tracked params it moves itself (an EMA teacher). The KL reference is the runtime's."""
  policies: Mapping[str, PolicyPlan]
  frozen: tuple[str, ...] = ()
  tracked: tuple[str, ...] = ()


class Method:
  """One self-play method. Subclasses declare, as class attributes:

  roles: the entries `config.<method>.roles` must have (each role's sampling settings);
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
  roles: tuple[str, ...] = ()
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

  def __init__(self, rt):
    self.rt = rt

  # ------------------------------------------------------------------------ declarations
  @classmethod
  def validate(cls, config: ml_collections.ConfigDict, data: bool = True) -> None:
    """The declared checks, then `check`: fails fast, before anything loads. `data=False`
    (planning) skips the checks that data paths (retrieval index, encoders) are set."""
    section = config[cls.name]
    for role in cls.roles:
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
      search.validate(config.retrieval)
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
    """The policies, frozen and tracked params `__init__` adds under `config` (a wiring test
    holds the two equal), with each update's rows: what `scope_jax.plan` compiles."""
    raise NotImplementedError(f"{cls.__name__} does not declare its players.")

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
