"""The valid range of every numeric setting, declared as data and checked before anything loads.

A size of 0 hangs the engine (`rollout.slots`, `rollout.prefill_chunk`), a negative learning
rate or a NaN temperature trains nonsense, a group of one has no advantage: each is refused here
in one line that names the field. Every numeric field of every bundled preset has a rule (a test
sweeps them all with values out of range), matched by its dotted path with `*` wildcards, first
match wins. The rules shared by every method are here; each method declares the rules of its
own fields as `Method.bounds` (matched first) and the range of the rest of its section as
`Method.section_bound` (matched last; None leaves them to the method's `validate`). Relations
between fields (min ≤ max, a band's ends) stay with the method's `validate`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from typing import Any, Iterator

import ml_collections


@dataclasses.dataclass(frozen=True)
class Bound:
  """low ≤ x ≤ high (`open_low`: low < x); `integer` asks for a whole number; `why` ends the
  message (what the value means, or what to use)."""
  low: float = -math.inf
  high: float = math.inf
  open_low: bool = False
  integer: bool = False
  why: str = ""

  def problem(self, x) -> str | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
      return "is not a number"
    if not math.isfinite(x):
      return "is not finite"
    if self.integer and x != int(x):
      return "is not a whole number"
    if x < self.low or (self.open_low and x == self.low):
      return f"must be {'above' if self.open_low else 'at least'} {_fmt(self.low)}"
    if x > self.high:
      return f"must be at most {_fmt(self.high)}"
    return None


def _fmt(x: float) -> str:
  return str(int(x)) if float(x).is_integer() else str(x)


SIZE = Bound(1, integer=True, why="a size or count: at least 1")
COUNT = Bound(0, integer=True, why="a count; 0 turns it off (or means 'all')")
GROUP = Bound(2, integer=True, why="a group of one has no advantage (its mean is itself)")
SHARE = Bound(0, 1, why="a share or probability")
POSITIVE = Bound(0, open_low=True, why="a positive number")
NONNEGATIVE = Bound(0, why="0 turns it off")
CLIP = Bound(0, 1, why="a PPO clip range in [0, 1]")
ANY = Bound(why="any finite number")

Rules = tuple[tuple[str, "Bound | None"], ...]  # (dotted pattern, its bound; None: unchecked)

RULES: Rules = (
    # The run and its schedule.
    ("seed", Bound(0, integer=True, why="a non-negative seed")),
    ("total_steps", COUNT), ("checkpoint_every", SIZE), ("smoke_warmup", COUNT),
    ("keep_checkpoints", Bound(1, integer=True, why="0 would keep no checkpoint, and delete the "
                                                    "ones there")),
    ("mesh.shape", Bound(-1, integer=True, why="-1 takes the remaining devices")),
    # Optimiser and loss.
    # (`*optim.…` also names a policy's own overrides, e.g. `<method>.examiner_optim.lr`.)
    ("*optim.lr", POSITIVE), ("*optim.weight_decay", NONNEGATIVE),
    ("*optim.grad_clip", NONNEGATIVE), ("*optim.warmup_steps", COUNT), ("*optim.total_steps", SIZE),
    ("*loss.temperature", Bound(0, open_low=True, why="log-probs divide by it")),
    ("*loss.eps_low", CLIP), ("*loss.eps_high", CLIP),
    ("*loss.dual_clip", NONNEGATIVE), ("*loss.kl_beta", NONNEGATIVE),
    ("*loss.router_aux_coef", NONNEGATIVE),
    ("*loss.entropy_coef", NONNEGATIVE), ("*loss.chunk", SIZE),
    ("learner.micro_batch_rows", SIZE), ("*loss.norm_length", COUNT),
    ("*loss.distill_topk", COUNT), ("*loss.distill_kl_clip", NONNEGATIVE),
    ("*loss.rollout_correction.threshold", Bound(1, open_low=True, why="weights are kept within "
                                                 "[1/C, C]: C must be above 1, e.g. 2.0")),
    ("lora.rank", COUNT), ("lora.alpha", NONNEGATIVE),
    ("lora.dropout", Bound(0, 0, why="adapter dropout is not supported: set it to 0")),
    # The model (a random-init preset) and the warm-up.
    ("model.tiny.rope_theta", POSITIVE), ("model.tiny.*", SIZE),
    ("model.moe_capacity_factor", Bound(0, why="0 is dropless; else a multiple of the balanced "
                                           "load, e.g. 1.25")),
    ("warmup.lr", POSITIVE), ("warmup.steps", COUNT), ("warmup.max_tokens", COUNT),
    ("warmup.world_seed", Bound(-1, integer=True, why="a world's seed; -1 demonstrates on the "
                                "method's own data")), ("warmup.*", SIZE),
    # Rollouts: the engine hangs or loops on a size of 0.
    ("rollout.*", SIZE),
    ("*.roles.*.temperature", Bound(0, why="0 is greedy")),
    ("*.roles.*.top_p", Bound(0, 1, open_low=True, why="1 keeps every token")),
    ("*.roles.*.top_k", Bound(0, 1_000_000, integer=True, why="0 keeps every token")),
    ("*.roles.*.max_turns", COUNT), ("*.roles.*.max_prompt_tokens", COUNT),
    ("*.roles.*.max_context", COUNT), ("*.roles.*.*", SIZE),
    # Retrieval and corpora.
    ("retrieval.topk", SIZE), ("retrieval.max_documents", COUNT),
    ("world.seed", Bound(0, integer=True, why="a non-negative seed")),
    ("world.corpus_seeds", Bound(0, integer=True, why="other worlds' non-negative seeds")),
    ("eval.every", COUNT), ("eval.limit", COUNT), ("eval.max_turns", COUNT),
    ("eval.temperature", Bound(0, why="0 is greedy")), ("eval.*", SIZE),
    ("*.max_doc_chars", COUNT),
    # Rewards and advantages: the names several methods share.
    ("*.group_size", GROUP), ("*.adv_eps", POSITIVE),
    # A policy's own loss or optimizer overrides: a name `loss`/`optim` lacks is the policy
    # check's to report (it says where the setting goes), not a count.
    ("*_loss.*", None), ("*_optim.*", None),
    ("*.max_obs_chars", COUNT),
)
# A method's own fields: its `Method.bounds` (matched before these) and `Method.section_bound`
# (after them: everything else a method counts, its batches, steps, samples, store sizes, rounds).


def numeric_fields(config: ml_collections.ConfigDict, prefix: str = ""
                   ) -> Iterator[tuple[str, Any]]:
  """(dotted path, value) of every number and tuple of numbers in `config`."""
  for key, value in config.items():
    path = f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      yield from numeric_fields(value, path + ".")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      yield path, value
    elif isinstance(value, (tuple, list)) and value and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
      yield path, tuple(value)


def rule(path: str, extra: Rules = (), last: Rules = ()) -> Bound | None:
  """The bound of the field at `path`: the first match of `extra` (a method's own rules), the
  shared RULES, then `last` (its section's remaining fields); None when no rule names it."""
  return next((b for pattern, b in (*extra, *RULES, *last) if fnmatch.fnmatchcase(path, pattern)),
              None)


def section_rules(name: str, bound: Bound | None) -> Rules:
  """`last` for a method whose section `name` has one range for the fields no rule names."""
  return ((f"{name}.*", bound),) if name and bound is not None else ()


def of_method(method) -> tuple[Rules, Rules]:
  """(`extra`, `last`) of a `core.method.Method` class: its own rules, then its section's range."""
  return tuple(method.bounds), section_rules(method.name, getattr(method, "section_bound", None))


def check(config: ml_collections.ConfigDict, extra: Rules = (), last: Rules = ()) -> None:
  """A one-line ValueError for the first numeric field outside its range (`extra`: a method's
  own rules, matched first; `last`: matched after the shared ones). The method's own section goes
  first: run-level fields such as `optim.total_steps` are often derived from it (from a method's
  iterations and steps), and the cause is what to name."""
  fields = sorted(numeric_fields(config),
                  key=lambda f: not f[0].startswith(f"{config.get('method', '')}."))
  for path, value in fields:
    bound = rule(path, extra, last)
    if bound is None:
      continue  # a field of a method's own that it checks itself
    for x in value if isinstance(value, tuple) else (value,):
      problem = bound.problem(x)
      if problem and isinstance(value, tuple):
        raise ValueError(f"{path}={value!r}: {x!r} {problem} ({bound.why}).")
      if problem:
        raise ValueError(f"{path}={value!r} {problem} ({bound.why}).")


