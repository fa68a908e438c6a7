"""ASL (Agentic Self-Learning, ALGORITHMS §4, ASL.txt §3): a Prompt Generator (PG), a Policy
Model (PM) and a Generative Reward Model (GRM) share one policy and the search tool, and are
trained in turn, PG → GRM → PM, each while the other two act fixed.

Iteration t:
  PG phase: meta prompts from D_PG (a topic in iteration 0; later a previous task, its answer and
    a HARDER/EASIER flag) → G PG rollouts each, searching, ending in <question>x</question>
    <answer>a</answer> → the GRM judges (x, a) K times; valid iff s̄ > C → valid pairs join D_PM;
    the PM answers each valid x M times, the GRM scores each answer s_m ∈ {0, 1}, the triples
    (x, y_m, s_m) join D_GRM, r_PG = binary entropy of {s_m} (AZR's 1 − p̄ as an option; 0 for
    a malformed or invalid question) → GRPO update. Ends when |D_PM| reaches its target.
  GRM phase: (x, y, s) from D_GRM (and optionally real verification data) → G GRM rollouts each,
    r_GRM = 1[ŝ = s] → GRPO update. Ends when the reward curve's slope falls below a threshold.
  PM phase: x from D_PM → G PM rollouts, each scored once by the GRM, r_PM = s → GRPO update;
    s̄ > 0.5 flags x HARDER, else EASIER, and (x, a, flag) joins the next iteration's D_PG.
    Ends on the slope rule too.
One runner step is one update of the current phase; the method's host state (stores, iteration,
phase, the phase's reward curve, RNG) decides what comes next and is saved with every checkpoint.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from scope_jax.core.method import Method, Players, PolicyPlan, RolePlan
from scope_jax.core.runtime import Runtime
from scope_jax.methods.asl import bounds as asl_bounds
from scope_jax.methods.asl import demos as asl_demos
from scope_jax.methods.asl import prompts as P
from scope_jax.methods.asl import report
from scope_jax.methods.asl import rewards as R
from scope_jax.rewards.match import normalize
from scope_jax.rl import advantages as adv_lib
from scope_jax.rollout.types import Trajectory
from scope_jax.world import search

PHASES = ("pg", "grm", "pm")
GRM_MODES = ("co_trained", "no_grm_phase", "frozen")
PHASE_ENDS = ("plateau", "slope")  # the released rule, or a reward-slope threshold


@dataclasses.dataclass
class Proposal:
  """One PG sample: its meta prompt, the parsed task, and the GRM's and PM's verdicts on it."""

  meta: dict
  traj: Trajectory
  task: R.Task | None = None
  error: str | None = None
  validity: list = dataclasses.field(default_factory=list)  # K GRM verdicts on (x, a)
  valid: bool = False
  new: bool = False  # joined D_PM (not a duplicate)
  answers: list = dataclasses.field(default_factory=list)  # the PM's M answers (str | None)
  scores: list = dataclasses.field(default_factory=list)  # the GRM's verdicts on them
  reward: float = 0.0


def final_text(traj: Trajectory) -> str:
  """The last generated turn (where the final tags are)."""
  turns = traj.turn_texts()
  return turns[-1] if turns else ""


def final_answer(traj: Trajectory) -> str | None:
  """The PM's answer, cut to the length the GRM reads (None if it gave none)."""
  return (traj.final("answer") or "")[:R.MAX_ANSWER_CHARS] or None


class Asl(Method):
  name = "asl"
  bounds, section_bound = asl_bounds.RULES, asl_bounds.SECTION  # ranges: core/bounds.py
  roles = ("pg", "grm", "pm")
  answering_role = "pm"  # held-out evaluation scores it (config.eval)
  at_least_one = ("pg_batch", "grm_batch", "pm_batch", "group_size", "validity_samples",
                  "pm_samples", "pm_target_first", "pm_target", "stores.pg", "stores.pm",
                  "stores.grm")
  choices = {"prompt_style": tuple(P.STYLES), "pg_reward": R.PG_REWARDS, "grm_mode": GRM_MODES,
             "adv_std": adv_lib.STD_KINDS, "phase_end": PHASE_ENDS,
             "verdict_rule": R.VERDICT_RULES}
  searches = True
  smoke = {"total_steps": 3, "asl.pg_batch": 2, "asl.grm_batch": 2, "asl.pm_batch": 2,
           "asl.group_size": 2, "asl.validity_samples": 2,
           # M = 4: D_PM keeps questions whose answers the GRM splits (r_PG > 0), rare at M = 2
           "asl.pm_samples": 4,
           "asl.pm_target_first": 1, "asl.pm_target": 1, "asl.phases.pg.min_steps": 1,
           "asl.phases.pg.max_steps": 1,
           "asl.phases.grm.min_steps": 1, "asl.phases.grm.max_steps": 1,
           "asl.phases.pm.min_steps": 1, "asl.phases.pm.max_steps": 1}

  @classmethod
  def players(cls, c) -> Players:
    """One policy plays PG, GRM and PM (a phase's update: its batch × G), each role searching;
    the frozen-GRM ablation judges with the base model M0 instead."""
    a = c.asl
    rows = max(a.pg_batch, a.grm_batch, a.pm_batch) * a.group_size
    frozen = a.grm_mode == "frozen"
    role = lambda by: RolePlan(by, tool=True, final=("answer",))
    return Players({"policy": PolicyPlan(rows)}, frozen=("grm",) if frozen else (),
                   roles={"pg": role("policy"), "pm": role("policy"),
                          "grm": role("grm" if frozen else "policy")})

  @classmethod
  def check(cls, c) -> None:
    a = c.asl
    P.load_topics(a.topics, c.world.seed)
    if not 0.0 <= a.validity_threshold <= 1.0 or (a.validity_threshold == 1.0
                                                   and not a.validity_inclusive):
      raise ValueError(f"asl.validity_threshold={a.validity_threshold} must be in [0, 1] (below 1 "
                       "with validity_inclusive=False, where a pair needs a mean score above it).")
    if a.stores.pm < max(a.pm_target_first, a.pm_target):
      raise ValueError(f"asl.stores.pm={a.stores.pm} is below the PG phase's target "
                       f"{max(a.pm_target_first, a.pm_target)}; the phase could never end on it.")
    if a.slope_window < 2:
      raise ValueError(f"asl.slope_window={a.slope_window} must be at least 2 steps.")
    if not 0.0 <= a.slope_ema < 1.0:
      raise ValueError(f"asl.slope_ema={a.slope_ema} must be in [0, 1) (0 = no smoothing).")
    for name in PHASES:
      lim = a.phases[name]
      if not 1 <= lim.min_steps <= lim.max_steps:
        raise ValueError(f"asl.phases.{name}: need 1 <= min_steps <= max_steps, got "
                         f"{lim.min_steps} and {lim.max_steps}.")
    if not 0.0 <= a.verification_share <= 1.0:
      raise ValueError(f"asl.verification_share={a.verification_share} must be in [0, 1].")
    if a.verification_share > 0 and not a.verification_data:
      raise ValueError("asl.verification_share > 0 needs asl.verification_data (a JSONL file of "
                       "question, response, score).")
    if a.verification_share > 0 and a.grm_mode != "co_trained":
      raise ValueError("asl.verification_share mixes data into the GRM phase, which "
                       f"asl.grm_mode={a.grm_mode!r} has none of.")
    for name in ("pg", "pm", "grm"):
      if a.roles[name].get("max_turns", 0) < 1:
        raise ValueError(f"asl.roles.{name}.max_turns must be at least 1: every ASL role searches.")

  def __init__(self, rt: Runtime):
    super().__init__(rt, P.Prompts(rt.config.asl.prompt_style, rt.config.asl.syntax))
    cfg = self.cfg
    self.topics = P.load_topics(cfg.topics, rt.config.world.seed,
                                rt.config.world.get("heldout_entities", False))
    self.verification = report.load_verification(cfg.verification_data) \
        if cfg.verification_share > 0 else []
    self.verdict = R.released_verdict if cfg.verdict_rule == "released" else R.parse_verdict
    self.rng = np.random.default_rng([rt.config.seed, 4])
    self.iteration, self.phase = 0, "pg"
    self.rewards: list[float] = []  # this phase's mean training reward per step
    self.history: list[dict] = []  # finished phases: iteration, phase, steps, why it ended
    self.d_pg: list[dict] = []  # meta prompts of this iteration (x, a, flag)
    self.d_pg_next: list[dict] = []  # filled by this iteration's PM phase
    self.d_pm: list[dict] = []  # valid (x, a) of this iteration
    self.d_grm: list[dict] = []  # (x, y, s) of this iteration
    self.examples: list[dict] = []
    self.counts: dict[str, int] = {}

  def demonstrations(self, rng):
    return asl_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    """The PM's prompt for a held-out search question (`eval.prompt='role'`)."""
    return self.prompts.pm(question) if kind == "qa_search" else None

  # ------------------------------------------------------------------------------ roles
  def judge(self, pairs: list[tuple[str, str]], k: int) -> list[list[int | None]]:
    """k GRM verdicts per (question, completion); malformed ones are None (and counted)."""
    role = self.roles["grm"]
    trajs = role.generate([role.prompt(self.prompts.grm(q, c)) for q, c in pairs], num_samples=k)
    verdicts = self.verdicts(trajs)
    return [verdicts[i * k:(i + 1) * k] for i in range(len(pairs))]

  def verdicts(self, trajs: list[Trajectory]) -> list[int | None]:
    """The GRM's verdict per rollout, None when malformed (both counted)."""
    verdicts = [self.guard(self.verdict, final_text(t), malformed=None) for t in trajs]
    self._count("grm_verdicts", len(verdicts))
    self._count("grm_malformed", sum(v is None for v in verdicts))
    return verdicts

  def answer(self, questions: list[str], n: int) -> list[Trajectory]:
    role = self.roles["pm"]
    return role.generate([role.prompt(self.prompts.pm(q)) for q in questions], num_samples=n)

  def _count(self, key: str, n: int) -> None:
    self.counts[key] = self.counts.get(key, 0) + n

  def score_answers(self, items: list[tuple[str, Trajectory]]) -> list[tuple[str | None, int | None]]:
    """(answer, GRM verdict) per PM rollout; no <answer> → (None, 0) without asking the GRM."""
    answers = [final_answer(t) for _, t in items]
    asked = [(q, a) for (q, _), a in zip(items, answers) if a is not None]
    verdicts = iter(v[0] for v in self.judge(asked, 1))
    self._count("pm_no_answer", sum(a is None for a in answers))
    return [(a, next(verdicts) if a is not None else 0) for a in answers]

  # ------------------------------------------------------------------------------ phases
  def step(self, step: int) -> dict[str, float]:
    self.counts = {}
    metrics: dict[str, float] = {}
    self._skip_empty(metrics)
    phase = self.phase
    metrics.update(getattr(self, f"{phase}_step")(step))
    self.rewards.append(metrics[f"{phase}/reward/mean"])
    metrics.update({"iteration": float(self.iteration), "phase": float(PHASES.index(phase)),
                    "phase/step": float(len(self.rewards) - 1), **report.step_counts(self.counts)})
    if phase != "pg":
      s = R.slope(self.rewards, self.cfg.slope_window, self.cfg.slope_ema)
      if s is not None:
        metrics[f"{phase}/slope"] = s
    done, why = self.phase_done()
    if done:
      metrics[f"{phase}/phase_length"] = float(len(self.rewards))
      self.advance(why, step)
    metrics.update(report.store_metrics(self))
    return metrics

  def phase_done(self) -> tuple[bool, str]:
    cfg, limits = self.cfg, self.cfg.phases[self.phase]
    if self.phase == "pg":
      n = len(self.rewards)
      if len(self.d_pm) >= self.pm_target() and n >= limits.min_steps:
        return True, "target"
      return n >= limits.max_steps, "max_steps"
    if cfg.phase_end == "plateau":
      return R.plateau_done(self.rewards, window=cfg.plateau_window[self.phase],
                            tolerance=cfg.plateau_tolerance, max_steps=limits.max_steps)
    return R.phase_done(self.rewards, window=cfg.slope_window, threshold=cfg.slope_threshold,
                        min_steps=limits.min_steps, max_steps=limits.max_steps,
                        ema=cfg.slope_ema)

  def pm_target(self) -> int:
    return self.cfg.pm_target_first if self.iteration == 0 else self.cfg.pm_target

  def next_phase(self) -> str:
    if self.phase == "pg":
      return "pm" if self.cfg.grm_mode != "co_trained" else "grm"
    return "pm" if self.phase == "grm" else "pg"

  def advance(self, why: str, step: int) -> None:
    """Ends the current phase (recorded in the history); a PM phase ends the iteration."""
    self.history.append({"iteration": self.iteration, "phase": self.phase,
                         "steps": len(self.rewards), "end": why, "last_step": step})
    logging.info("ASL iteration %d: %s phase ended after %d steps (%s).", self.iteration,
                 self.phase, len(self.rewards), why)
    if why == "max_steps" and self.phase == "pg":
      logging.warning("The PG phase reached %d steps with |D_PM| = %d of %d; going on with it.",
                      len(self.rewards), len(self.d_pm), self.pm_target())
    nxt = self.next_phase()
    if nxt == "pg":
      self.iteration += 1
      self.d_pg, self.d_pg_next = self.d_pg_next, []
      self.d_pm, self.d_grm = [], []
    self.phase, self.rewards = nxt, []

  def _skip_empty(self, metrics: dict) -> None:
    """A GRM phase without D_GRM or a PM phase without D_PM has nothing to train on: skipped."""
    while (self.phase == "grm" and not self.d_grm) or (self.phase == "pm" and not self.d_pm):
      logging.warning("ASL iteration %d: the %s phase has an empty store; skipping it.",
                      self.iteration, self.phase)
      metrics[f"{self.phase}/skipped"] = 1.0
      self.advance("empty_store", self.rt.step)

  def _sample(self, store: list, n: int) -> list:
    """n entries without replacement (with replacement when the store is smaller)."""
    idx = self.rng.choice(len(store), n, replace=len(store) < n)
    return [store[int(i)] for i in idx]

  def format_bonus(self, traj: Trajectory) -> float:
    """The released format reward added to a role's task reward (0 when `format_reward` is off);
    the phase curves and r_PG's metrics stay the task rewards alone."""
    if not self.cfg.format_reward:
      return 0.0
    used = any(c.error is None for c in traj.tool_calls)
    bonus = R.format_reward(traj.turn_texts(), used)
    self.counts["format_bonus_sum"] = self.counts.get("format_bonus_sum", 0.0) + bonus
    self.counts["format_bonus_n"] = self.counts.get("format_bonus_n", 0) + 1
    return bonus

  def _train(self, trajs: list[Trajectory], rewards: np.ndarray) -> tuple[dict, np.ndarray]:
    advs = adv_lib.group_zscore(rewards, std=self.cfg.adv_std, eps=self.cfg.adv_eps).reshape(-1)
    return self.rt.train("policy", trajs, advs), advs

  # ---------------------------------------------------------------------------- PG phase
  def meta_prompts(self, n: int) -> list[dict]:
    """From D_PG when it has entries (iterations ≥ 1), else topics."""
    if self.d_pg:
      return [dict(m) for m in self._sample(self.d_pg, n)]
    return [{"topic": t} for t in self._sample(self.topics, n)]

  def propose(self, metas: list[dict]) -> list[Proposal]:
    role = self.roles["pg"]
    trajs = role.generate([role.prompt(self.prompts.pg(m, self.iteration)) for m in metas],
                          num_samples=self.cfg.group_size)
    out = []
    for t in trajs:
      p = Proposal(metas[t.prompt_index], t)
      p.task, p.error = self.guard(R.parse_task, final_text(t), malformed=(None, "parse_error"))
      out.append(p)
    return out

  def pg_step(self, step: int) -> dict[str, float]:
    cfg = self.cfg
    metas = self.meta_prompts(cfg.pg_batch)
    props = self.propose(metas)
    formed = [p for p in props if p.task is not None]
    for p, v in zip(formed, self.judge([(p.task.question, p.task.answer) for p in formed],
                                       cfg.validity_samples)):
      p.validity, p.valid = v, R.is_valid(v, cfg.validity_threshold, cfg.validity_inclusive)
    # As released, the PM answers every well-formed question: its judged answers feed D_GRM
    # whether or not the question passed the gate (which only zeroes r_PG).
    checked = formed
    rollouts = self.answer([p.task.question for p in checked], cfg.pm_samples)
    scored = self.score_answers([(checked[t.prompt_index].task.question, t) for t in rollouts])
    for t, (a, s) in zip(rollouts, scored):
      p = checked[t.prompt_index]
      p.answers.append(a)
      p.scores.append(s)
    for p in props:
      gated = p.task is None or (cfg.gate_reward and not p.valid)
      p.reward = R.pg_reward(None if gated else p.scores, cfg.pg_reward)
    self.store_pg(props)
    fmt = [self.format_bonus(p.traj) for p in props]
    rewards = np.asarray([p.reward + f for p, f in zip(props, fmt)]).reshape(
        len(metas), cfg.group_size)
    train, _ = self._train([p.traj for p in props], rewards)
    self.rt.metrics.samples(step, report.pg_records(props, self.examples))
    return {**report.pg_metrics(props, metas, self.counts), **train}

  def store_pg(self, props: list[Proposal]) -> None:
    """Valid pairs with r_PG > 0 and a question of the released shape join D_PM (one per
    question); every judged question's answers join D_GRM, class-balanced per question."""
    seen = {normalize(x["question"]) for x in self.d_pm}
    fresh, triples = [], []
    for p in props:
      if p.task is None:
        continue
      judged = [(a, int(s)) for a, s in zip(p.answers, p.scores) if a is not None and s is not None]
      keep = (R.balanced_judgments([s for _, s in judged], self.rng) if self.cfg.balance_grm
              else range(len(judged)))
      triples += [{"question": p.task.question, "response": judged[i][0], "score": judged[i][1]}
                  for i in keep]
      if not p.valid or (self.cfg.filter_pm and not R.pm_worthy(p.task.question, p.reward)):
        continue
      key = normalize(p.task.question)
      if key not in seen:
        seen.add(key)
        p.new = True
        fresh.append({"question": p.task.question, "answer": p.task.answer})
    limits = self.cfg.stores
    self.counts["dropped_pm"] = R.bounded_add(self.d_pm, fresh, limits.pm)
    self.counts["dropped_grm"] = R.bounded_add(self.d_grm, triples, limits.grm)

  # ---------------------------------------------------------------------------- GRM phase
  def grm_items(self) -> list[dict]:
    cfg = self.cfg
    late = self.iteration >= cfg.verification_from_iteration
    n_real = int(round(cfg.verification_share * cfg.grm_batch)) if self.verification and late \
        else 0
    items = self._sample(self.d_grm, cfg.grm_batch - n_real)
    if n_real:
      items += [dict(x, real=True) for x in self._sample(self.verification, n_real)]
    return items

  def grm_step(self, step: int) -> dict[str, float]:
    g = self.cfg.group_size
    items = self.grm_items()
    role = self.roles["grm"]
    trajs = role.generate([role.prompt(self.prompts.grm(x["question"], x["response"]))
                           for x in items], num_samples=g)
    preds = self.verdicts(trajs)
    if self.cfg.verdict_rule == "released":  # the stored label's words in the last <answer>
      rewards = np.asarray([self.guard(R.released_grm_reward, final_text(t),
                                       items[t.prompt_index]["score"], malformed=0.0)
                            for t in trajs])
    else:
      rewards = np.asarray([R.grm_reward(p, items[t.prompt_index]["score"])
                            for t, p in zip(trajs, preds)])
    m = report.grm_metrics(items, trajs, rewards)
    bonus = np.asarray([self.format_bonus(t) for t in trajs])
    train, _ = self._train(trajs, (rewards + bonus).reshape(len(items), g))
    self.rt.metrics.samples(step, report.grm_records(items, trajs, preds))
    return {**m, **train}

  # ---------------------------------------------------------------------------- PM phase
  def pm_step(self, step: int) -> dict[str, float]:
    cfg, g = self.cfg, self.cfg.group_size
    items = self._sample(self.d_pm, cfg.pm_batch)
    trajs = self.answer([x["question"] for x in items], g)
    scored = self.score_answers([(items[t.prompt_index]["question"], t) for t in trajs])
    rewards = np.asarray([float(R.score(s)) for _, s in scored]).reshape(len(items), g)
    flags = [R.difficulty_flag(float(r.mean()), cfg.harder_at_half) for r in rewards]
    self.upsert_pg([dict(x, flag=f) for x, f in zip(items, flags)])
    m = report.pm_metrics(rewards, flags)
    bonus = np.asarray([self.format_bonus(t) for t in trajs]).reshape(rewards.shape)
    train, _ = self._train(trajs, rewards + bonus)
    self.rt.metrics.samples(step, report.pm_records(items, trajs, scored, flags))
    return {**m, **train}

  def upsert_pg(self, entries: list[dict]) -> None:
    """(x, a, flag) into the next iteration's D_PG; a question seen again takes its newest flag
    and moves to the end (the bound drops the least recently judged first)."""
    merged = {normalize(e["question"]): e for e in self.d_pg_next}
    for e in entries:
      key = normalize(e["question"])
      merged.pop(key, None)
      merged[key] = e
    self.d_pg_next = []
    R.bounded_add(self.d_pg_next, list(merged.values()), self.cfg.stores.pg)

  # ---------------------------------------------------------------------------- state
  def host_state(self) -> dict:
    return {"iteration": self.iteration, "phase": self.phase, "rewards": self.rewards,
            "history": self.history, "d_pg": self.d_pg, "d_pg_next": self.d_pg_next,
            "d_pm": self.d_pm, "d_grm": self.d_grm, "rng": self.rng.bit_generator.state,
            "examples": self.examples}

  def load_host_state(self, state: dict) -> None:
    self.iteration, self.phase = int(state["iteration"]), state["phase"]
    self.rewards = [float(r) for r in state["rewards"]]
    self.history = list(state["history"])
    self.d_pg, self.d_pg_next = list(state["d_pg"]), list(state["d_pg_next"])
    self.d_pm, self.d_grm = list(state["d_pm"]), list(state["d_grm"])
    self.rng.bit_generator.state = state["rng"]
    self.examples = list(state.get("examples", []))

  def summary(self) -> str:
    return report.summary(self)


METHOD = Asl


def make_method(rt: Runtime) -> Asl:
  return Asl(rt)
