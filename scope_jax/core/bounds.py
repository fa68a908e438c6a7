"""The valid range of every numeric setting, declared as data and checked before anything loads.

A size of 0 hangs the engine (`rollout.slots`, `rollout.prefill_chunk`), a negative learning
rate or a NaN temperature trains nonsense, a group of one has no advantage: each is refused here
in one line that names the field. Every numeric field of every bundled preset has a rule (a test
sweeps them all with values out of range), matched by its dotted path with `*` wildcards, first
match wins; a method of your own declares its fields' rules as `Method.bounds` (a field no rule
names is left to the method's `validate`); relations between fields (min ≤ max, a band's ends)
stay with the method's `validate`.
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

RULES: tuple[tuple[str, Bound | None], ...] = (
    # The run and its schedule.
    ("seed", Bound(0, integer=True, why="a non-negative seed")),
    ("total_steps", COUNT), ("checkpoint_every", SIZE), ("smoke_warmup", COUNT),
    ("keep_checkpoints", Bound(1, integer=True, why="0 would keep no checkpoint, and delete the "
                                                    "ones there")),
    ("mesh.shape", Bound(-1, integer=True, why="-1 takes the remaining devices")),
    # Optimiser and loss.
    # (`*optim.…` also names a policy's own overrides, e.g. π-Play's `piplay.examiner_optim.lr`.)
    ("*optim.lr", POSITIVE), ("*optim.weight_decay", NONNEGATIVE),
    ("*optim.grad_clip", NONNEGATIVE), ("*optim.warmup_steps", COUNT), ("*optim.total_steps", SIZE),
    ("*loss.temperature", Bound(0, open_low=True, why="log-probs divide by it")),
    ("*loss.eps_low", CLIP), ("*loss.eps_high", CLIP),
    ("*loss.dual_clip", NONNEGATIVE), ("*loss.kl_beta", NONNEGATIVE),
    ("*loss.router_aux_coef", NONNEGATIVE),
    ("*loss.entropy_coef", NONNEGATIVE), ("*loss.chunk", SIZE),
    ("learner.micro_batch_rows", SIZE), ("*loss.norm_length", COUNT),
    ("*loss.distill_topk", COUNT),
    # The model (a random-init preset) and the warm-up.
    ("model.tiny.rope_theta", POSITIVE), ("model.tiny.*", SIZE),
    ("warmup.lr", POSITIVE), ("warmup.steps", COUNT), ("warmup.right_share", SHARE),
    ("warmup.guess_share", SHARE),
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
    ("data.max_cluster_size", COUNT), ("data.max_passages", COUNT), ("data.num_clusters", COUNT),
    ("data.cluster_size", COUNT), ("data.min_cluster_size", COUNT),
    ("data.*", SIZE), ("*.max_doc_chars", COUNT), ("*.data.size", COUNT),
    ("*.task_set.size", COUNT), ("*.task_set.max_per_rubric", COUNT),
    # Rewards and advantages, shared names.
    ("*.group_size", GROUP), ("*.adv_eps", POSITIVE),
    ("*.verifier_agreement", Bound(0, 1, why="a share of verifier votes")),
    ("*.solve_rate_band", SHARE), ("*.task_set.window", SHARE),
    ("*.questioner_negative_ratio", NONNEGATIVE), ("*.history_size", COUNT),
    ("*.teacher_weights.*", NONNEGATIVE), ("*.selection_weights.*", NONNEGATIVE),
    ("*.student_format_weight", NONNEGATIVE),
    ("opensir.initial_pool.size", COUNT), ("opensir.initial_pool.min_chars", COUNT),
    ("*.length_baseline", POSITIVE), ("*.length_cap", POSITIVE),
    ("*.lambdas", Bound(0, why="distillation weights, none negative")),
    ("*.tau", Bound(0, 1, open_low=True, why="the EMA teacher's rate, in (0, 1]")), ("*.hop_ratio", NONNEGATIVE),
    ("*.search_ratio", NONNEGATIVE), ("*.search_choices", COUNT),
    ("asl.slope_ema", Bound(0, 1, why="an EMA weight in [0, 1]")),
    ("asl.slope_threshold", NONNEGATIVE), ("asl.validity_threshold", SHARE),
    ("asl.verification_share", SHARE), ("asl.verification_from_iteration", COUNT),
    ("asl.slope_window", Bound(2, integer=True, why="a slope needs a window of 2 steps or more")),
    ("asl.plateau_window.*", Bound(4, integer=True, why="halves and quarters of it are compared")),
    ("asl.plateau_tolerance", NONNEGATIVE),
    ("piplay.teacher_eval_samples", COUNT),
    # A policy's own loss or optimizer overrides: a name `loss`/`optim` lacks is the policy
    # check's to report (it says where the setting goes), not a count.
    ("*_loss.*", None), ("*_optim.*", None),
    # Everything else a method counts: batches, steps, samples, store sizes, rounds.
    ("scope.stage1_grader_temperature", NONNEGATIVE), ("scope.stage1_solver_sampling", NONNEGATIVE),
    ("scope.task_set.solver_sampling", NONNEGATIVE), ("*.max_obs_chars", COUNT),
    ("spell.verifier_update_ratio", SHARE), ("spell.generation_batch", COUNT),
    ("spell.*", SIZE), ("scope.*", SIZE), ("opensir.*", SIZE), ("asl.*", SIZE),
    ("piplay.*", SIZE),
)


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


def rule(path: str, extra: tuple[tuple[str, Bound], ...] = ()) -> Bound | None:
  """The bound of the field at `path` (`extra` rules first), or None when no rule names it."""
  return next((b for pattern, b in (*extra, *RULES) if fnmatch.fnmatchcase(path, pattern)), None)


def check(config: ml_collections.ConfigDict, extra: tuple[tuple[str, Bound], ...] = ()) -> None:
  """A one-line ValueError for the first numeric field outside its range (`extra`: a method's
  own rules, matched first). The method's own section goes first: run-level fields such as
  `optim.total_steps` are often derived from it (π-Play's from its iterations and steps), and
  the cause is what to name."""
  fields = sorted(numeric_fields(config),
                  key=lambda f: not f[0].startswith(f"{config.get('method', '')}."))
  for path, value in fields:
    bound = rule(path, extra)
    if bound is None:
      continue  # a field of a method's own that it checks itself
    for x in value if isinstance(value, tuple) else (value,):
      problem = bound.problem(x)
      if problem and isinstance(value, tuple):
        raise ValueError(f"{path}={value!r}: {x!r} {problem} ({bound.why}).")
      if problem:
        raise ValueError(f"{path}={value!r} {problem} ({bound.why}).")


