"""SCOPE (ALGORITHMS §2, SCOPE.txt Algorithm 1): a Challenger and a Solver co-evolve from one base
model M0; a frozen Judge (M0, also the KL reference) writes quality gates, rubrics and grades.

Each iteration t has `challenger_steps` Stage-1 steps, then `solver_steps` Stage-2 steps:
  Stage 1: documents × task types × required searches (4:3:2 over {1,2,3}) → G Challenger
    rollouts with search → format score → quality gates → rubric (T = 0) → N rollouts of the
    current (previous-iteration) Solver graded per criterion → ḡ → R_C = 0.5·fmt + 1[QG]·f_diff(ḡ)
    → GRPO update of the Challenger.
  Task set (before the first Stage-2 step): the trained Challenger writes one task per fresh
    document; keep those passing the gates with ḡ ∈ [0.2, 0.8] from N = 4 Solver rollouts, until
    batch × steps tasks (or the round budget) are reached.
  Stage 2: tasks from the set → G Solver rollouts with search → per-criterion grades →
    R_S = L(|a|)·g + 0.5·fmt + 0.1·search → GRPO update of the Solver.
One runner step is one Stage-1 or Stage-2 step, so checkpoints land inside and between stages.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Sequence

import jax
import numpy as np
from absl import logging
from etils import epath

from scope_jax import metrics as metrics_lib
from scope_jax.core.guard import ParseGuard
from scope_jax.core.method import Method, Players, PolicyPlan
from scope_jax.core.runtime import Runtime, optim_settings
from scope_jax.core.schedule import Schedule, StageClock, corpus_window
from scope_jax.methods.scope import bounds as scope_bounds
from scope_jax.methods.scope import demos as scope_demos
from scope_jax.methods.scope import prompts as P
from scope_jax.methods.scope import rewards as R
from scope_jax.retrieval.corpus import Passage
from scope_jax.rl import advantages as adv_lib
from scope_jax.rollout.datums import per_turn_datums
from scope_jax.rollout.search_agent import stratified
from scope_jax.rollout.types import Trajectory
from scope_jax.world import search

STAGES = ("challenger", "solver")


@dataclasses.dataclass
class Candidate:
  """One Challenger sample (a candidate task) and the Judge's and Solver's verdicts on it."""

  doc: Passage
  task_type: str
  required: int  # searches the prompt asked for
  traj: Trajectory | None = None
  question: str | None = None  # the <question> of a well-formed <task>
  fmt: float = 0.0
  found_source: bool | None = None  # the question, searched, brings its document (when checked)
  gate: bool = False
  gate_malformed: bool = False
  criteria: list[R.Criterion] | None = None
  rubric_text: str = ""
  rollouts: list[Trajectory] = dataclasses.field(default_factory=list)
  grades: list[float | None] = dataclasses.field(default_factory=list)
  g_bar: float | None = None
  reward: float = 0.0

  def task_record(self) -> dict:
    return {"doc_id": self.doc.id, "task_type": self.task_type, "question": self.question,
            "criteria": [[c.text, c.priority] for c in self.criteria or []], "g_bar": self.g_bar}


@dataclasses.dataclass
class GradeStats:
  """Counters over one batch of gradings (malformed Judge output is counted, never raised)."""

  no_answer: int = 0
  discarded: int = 0  # fewer than half the criteria got a parsable verdict
  verdicts: int = 0
  malformed_verdicts: int = 0


class Scope(Method):
  name = "scope"
  bounds, section_bound = scope_bounds.RULES, scope_bounds.SECTION  # ranges: core/bounds.py
  roles = ("challenger", "solver", "gate", "rubric", "grader")
  answering_role = "solver"  # held-out evaluation scores it (config.eval)
  at_least_one = ("challenger_steps", "solver_steps", "challenger_batch", "solver_batch",
                  "group_size")
  choices = {"prompt_style": tuple(P.STYLES), "task_types": tuple(P.TASK_TYPES),
             "adv_std": adv_lib.STD_KINDS, "task_form": R.TASK_FORMS}
  searches = True
  syntaxes = ("xml", "qwen", "function_calls")  # OLMo-3's calls: the released paper_olmo3
  smoke = {"scope.iterations": 1, "scope.challenger_steps": 1, "scope.solver_steps": 1,
           "scope.challenger_batch": 2, "scope.solver_batch": 2, "scope.group_size": 2,
           "scope.solver_rollouts_train": 2, "scope.task_set.solver_rollouts": 2,
           "scope.task_set.candidates_per_round": 2, "scope.task_set.max_rounds": 1}
  host_local_keys = ("stage_seconds",)  # this host's wall times, not a decision

  @classmethod
  def players(cls, c) -> Players:
    """Challenger and Solver are two policies; the Judge is the frozen base model."""
    s = c.scope
    return Players({"challenger": PolicyPlan(s.challenger_batch * s.group_size,
                                             dict(s.challenger_loss)),
                    "solver": PolicyPlan(s.solver_batch * s.group_size, dict(s.solver_loss))},
                   frozen=("judge",))

  @classmethod
  def check(cls, c) -> None:
    s = c.scope
    if len(s.search_ratio) != len(s.search_choices):
      raise ValueError(f"scope.search_ratio {tuple(s.search_ratio)} needs one weight per entry "
                       f"of scope.search_choices {tuple(s.search_choices)}.")
    lo, hi = s.task_set.window
    if not 0.0 <= lo <= hi <= 1.0:
      raise ValueError(f"scope.task_set.window={tuple(s.task_set.window)} must satisfy "
                       "0 <= low <= high <= 1.")
    if not 1 <= s.min_criteria <= s.max_criteria:
      raise ValueError("scope.min_criteria must be at least 1 and at most scope.max_criteria.")
    for name, sampling in (("stage1_solver_sampling", s.stage1_solver_sampling),
                           ("task_set.solver_sampling", s.task_set.solver_sampling)):
      sampling = tuple(sampling)
      if sampling and (len(sampling) != 2 or not 0.0 < sampling[1] <= 1.0):
        raise ValueError(f"scope.{name}={sampling} must be (temperature, top_p) with top_p in "
                         "(0, 1], or () for the Solver role's own settings.")
    for name in ("challenger", "solver"):
      try:
        optim_settings(c, s[f"{name}_optim"])
      except ValueError as e:
        raise ValueError(f"scope.{name}_optim: {e}") from None
    if s.roles.challenger.max_turns < max(s.search_choices):
      raise ValueError(f"scope.roles.challenger.max_turns={s.roles.challenger.max_turns} is below "
                       f"the largest required search count {max(s.search_choices)}.")

  def __init__(self, rt: Runtime):
    super().__init__(rt)
    self.cfg = cfg = rt.config.scope
    self.passages, self.tool = search.from_config(rt.config.retrieval, rt.config.world.seed,
                                                  rt.config.world.corpus_seeds)
    self.prompts = P.Prompts(cfg.prompt_style, cfg.syntax, cfg.max_doc_chars, cfg.task_form,
                             cfg.max_criteria)
    self.task_sets: dict[str, list[dict]] = {}  # iteration → the Solver's task set
    self.clock = StageClock()
    self.schedule = Schedule((("challenger", cfg.challenger_steps), ("solver", cfg.solver_steps)))
    self.guard = ParseGuard()  # a parser error scores the sample as malformed, never ends the run
    self.examples: list[dict] = []  # a few tasks, rubrics and grades for the final summary
    # Challenger and Solver are trained from M0; the Judge is M0 itself, frozen (so is π_ref).
    rt.add_frozen("judge")
    self.challenger = rt.add_policy("challenger", loss_overrides=dict(cfg.challenger_loss),
                                    optim_overrides=dict(cfg.challenger_optim))
    self.solver = rt.add_policy("solver", loss_overrides=dict(cfg.solver_loss),
                                optim_overrides=dict(cfg.solver_optim))
    thinking = dict(strip_think=cfg.per_turn_datums)  # rollouts match the per-turn datums
    self.roles = {
        "challenger": rt.add_role("challenger", cfg.roles.challenger, policy=self.challenger,
                                  tool=self.tool, final_tags=("task",), **thinking),
        "solver": rt.add_role("solver", cfg.roles.solver, policy=self.solver, tool=self.tool,
                              final_tags=("answer",), **thinking),
        **{name: rt.add_role(name, cfg.roles[name], frozen="judge")
           for name in ("gate", "rubric", "grader")}}

  def demonstrations(self, rng):
    return scope_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    """The Solver's prompt for a held-out search question (`eval.prompt='role'`)."""
    return self.prompts.solver(question, self.cfg.roles.solver.max_turns) \
        if kind == "qa_search" else None

  # ------------------------------------------------------------------------------ schedule
  def locate(self, step: int) -> tuple[int, str, int]:
    """Global step → (iteration, stage, step within the stage)."""
    return self.schedule.locate(step)

  def _window(self, it: int) -> list[Passage]:
    """This iteration's documents (disjoint across iterations while the corpus lasts): Stage 1
    takes the front, the task set the rest."""
    cfg = self.cfg
    size = cfg.challenger_batch * cfg.challenger_steps + cfg.task_set.candidates_per_round * \
        cfg.task_set.max_rounds
    idx = corpus_window(len(self.passages), size, it, [self.rt.config.seed, 17])
    return [self.passages[i] for i in idx]

  def _mix(self, it: int, phase: int, n: int) -> list[tuple[str, int]]:
    """(task type, required searches) for n prompts: types uniform, searches 4:3:2 (stratified)."""
    rng = np.random.default_rng([self.rt.config.seed, it, phase])
    types = stratified(n, [1.0] * len(self.cfg.task_types), rng)
    searches = stratified(n, self.cfg.search_ratio, rng)
    return [(self.cfg.task_types[t], int(self.cfg.search_choices[s]))
            for t, s in zip(types, searches)]

  def stage1_prompts(self, it: int) -> list[tuple[Passage, str, int]]:
    n = self.cfg.challenger_batch * self.cfg.challenger_steps
    return [(d, t, k) for d, (t, k) in zip(self._window(it)[:n], self._mix(it, 1, n))]

  def candidate_prompts(self, it: int) -> list[tuple[Passage, str, int]]:
    n0 = self.cfg.challenger_batch * self.cfg.challenger_steps
    docs = self._window(it)[n0:]
    return [(d, t, k) for d, (t, k) in zip(docs, self._mix(it, 2, len(docs)))]

  # ------------------------------------------------------------------------------ roles
  def propose(self, picks: Sequence[tuple[Passage, str, int]], num_samples: int) -> list[Candidate]:
    """G Challenger rollouts per (document, task type, required searches), prompt-major."""
    role = self.roles["challenger"]
    trajs = role.generate([role.prompt(self.prompts.challenger(d, t, k)) for d, t, k in picks],
                          num_samples=num_samples)
    out = []
    for traj in trajs:
      d, t, k = picks[traj.prompt_index]
      c = Candidate(d, t, k, traj)
      c.fmt = self.guard(R.challenger_format, traj, k, self.cfg.rewards_as_released,
                         self.cfg.task_form, malformed=0.0)
      c.question = self.guard(R.task_question, traj.turn_texts(), self.cfg.task_form,
                              malformed=None)
      out.append(c)
    return out

  def judge(self, prompts, role: str, temperature: float | None = None) -> list[str]:
    """Single-turn Judge outputs (frozen M0) with the role's sampling settings."""
    judge = self.roles[role]
    return judge.texts([judge.prompt(p) for p in prompts], temperature=temperature)

  def solve(self, questions: Sequence[str], num_samples: int,
            sampling: Sequence[float] = ()) -> list[Trajectory]:
    """Solver rollouts at the role's sampling settings, or at (temperature, top-p) `sampling`
    for rollouts that only score a task (they are not trained on)."""
    role = self.roles["solver"]
    turns = self.cfg.roles.solver.max_turns
    temperature, top_p = tuple(sampling) or (None, None)
    return role.generate([role.prompt(self.prompts.solver(q, turns)) for q in questions],
                         num_samples=num_samples, temperature=temperature, top_p=top_p)

  def grade(self, items: Sequence[tuple[str, Sequence[R.Criterion], Trajectory]],
            stats: GradeStats, temperature: float | None = None) -> list[float | None]:
    """g per Solver rollout: each criterion judged on the final answer alone (the grader role's
    T = 0.6, or `temperature`). No <answer> → g = 0 without asking the Judge; too few parsable
    verdicts → None (discarded)."""
    prompts, owners = [], []
    for i, (question, criteria, traj) in enumerate(items):
      answer = traj.final("answer") or None
      if answer is None:
        stats.no_answer += 1
        continue
      for c in criteria:
        prompts.append(self.prompts.grader(question, c.text, answer[:self.cfg.max_answer_chars]))
        owners.append(i)
    verdicts: list[list[int | None]] = [[] for _ in items]
    for i, text in zip(owners, self.judge(prompts, "grader", temperature)):
      verdicts[i].append(self.guard(R.parse_binary_grade, text, malformed=None))
    grades: list[float | None] = []
    for (_, criteria, traj), v in zip(items, verdicts):
      if not v:
        grades.append(0.0)
        continue
      stats.verdicts += len(v)
      stats.malformed_verdicts += sum(x is None for x in v)
      g = R.rubric_grade(criteria, v)
      stats.discarded += g is None
      grades.append(g)
    return grades

  def evaluate(self, cands: Sequence[Candidate], num_rollouts: int, stats: GradeStats,
               sampling: Sequence[float] = ()) -> None:
    """Quality gates → rubrics → `num_rollouts` Solver rollouts (at `sampling`'s temperature and
    top-p if given) → grades → ḡ (in place)."""
    cfg = self.cfg
    live = [c for c in cands if c.fmt > 0 and c.question]
    if cfg.retrievable_tasks:  # identifiability checked by the search tool, before the Judge
      self._find_sources(live)
      live = [c for c in live if c.found_source]
    gate_texts = [g for c in live for g in self.prompts.gates(c.question, c.doc)]
    verdicts = [self.guard(R.parse_binary_grade, t, malformed=None)
                for t in self.judge(gate_texts, "gate")]
    for i, c in enumerate(live):
      c.gate, c.gate_malformed = R.quality_gate(verdicts[2 * i], verdicts[2 * i + 1])
    gated = [c for c in live if c.gate]
    rubric_texts = self.judge([self.prompts.rubric(c.question, c.doc, self._found(c))
                               for c in gated], "rubric")
    for c, text in zip(gated, rubric_texts):
      c.rubric_text = text
      c.criteria = self.guard(R.parse_rubrics, text, cfg.min_criteria, cfg.max_criteria,
                              malformed=None)
    ready = [c for c in gated if c.criteria]
    if not ready:
      return
    rollouts = self.solve([c.question for c in ready], num_rollouts, sampling)
    grades = self.grade([(ready[t.prompt_index].question, ready[t.prompt_index].criteria, t)
                         for t in rollouts], stats, cfg.stage1_grader_temperature)
    for t, g in zip(rollouts, grades):
      c = ready[t.prompt_index]
      c.rollouts.append(t)
      c.grades.append(g)
    for c in ready:
      c.g_bar = R.mean_grade(c.grades, [bool(t.final("answer")) for t in c.rollouts],
                             answered_only=cfg.rewards_as_released)

  def _find_sources(self, cands: Sequence[Candidate]) -> None:
    """Marks whether each task's question, searched as it stands, brings back its source
    document among the results a search returns (`scope.retrievable_tasks`)."""
    rows = self.tool.retrieve([c.question for c in cands]) if cands else []
    for c, hits in zip(cands, rows):
      c.found_source = any(p.id == c.doc.id for p, _ in hits)

  def _found(self, c: Candidate) -> list[str]:
    """The search results the Challenger read, for the rubric Judge (`scope.rubric_sees_searches`)."""
    if not self.cfg.rubric_sees_searches:
      return []
    return [call.result for call in c.traj.tool_calls if call.error is None and call.result]

  # ------------------------------------------------------------------------------ stages
  def step(self, step: int) -> dict[str, float]:
    it, stage, k = self.locate(step)
    start = time.perf_counter()
    if stage == "challenger":
      metrics = self.challenger_step(it, k, step)
    else:
      metrics = self.solver_step(it, k, step)
    dt = time.perf_counter() - start - metrics.get("time/task_set", 0.0)  # counted on its own
    self.clock.add(stage, dt)
    metrics.update({"iteration": it, "stage": STAGES.index(stage), f"time/{stage}_step": dt,
                    "parse_errors": float(self.guard.take())})
    return metrics

  def challenger_step(self, it: int, k: int, step: int) -> dict[str, float]:
    cfg = self.cfg
    b = cfg.challenger_batch
    picks = self.stage1_prompts(it)[k * b:(k + 1) * b]
    cands = self.propose(picks, cfg.group_size)
    stats = GradeStats()
    self.evaluate(cands, cfg.solver_rollouts_train, stats, cfg.stage1_solver_sampling)
    for c in cands:
      formed = c.question is not None and (not c.gate or bool(c.criteria))
      c.reward = R.challenger_reward(c.fmt, c.gate, c.g_bar,
                                     formed or not cfg.rewards_as_released)
    rewards = np.asarray([c.reward for c in cands]).reshape(len(picks), cfg.group_size)
    advs = adv_lib.group_zscore(rewards, std=cfg.adv_std, eps=cfg.adv_eps).reshape(-1)
    self.rt.metrics.samples(step, [self._record("challenger", c) for c in cands[:2]])
    metrics = self.challenger_metrics(cands, stats)
    metrics.update(self._train(self.challenger, [c.traj for c in cands], advs))
    return metrics

  def solver_step(self, it: int, k: int, step: int) -> dict[str, float]:
    cfg = self.cfg
    metrics: dict[str, float] = {}
    if str(it) not in self.task_sets:
      tasks, metrics["time/task_set"] = self.clock.timed("task_set", self.build_task_set, it,
                                                         metrics)
      self.task_sets = {str(it): tasks}  # only the current one is kept
    tasks = self.task_sets[str(it)]
    metrics["taskset/size"] = len(tasks)
    if not tasks:
      logging.warning("Iteration %d has an empty task set: no Solver update at step %d (no "
                      "candidate passed the gates with ḡ in [%s, %s]; see samples.log).", it, step,
                      *cfg.task_set.window)
      return metrics
    b = cfg.solver_batch
    order = np.random.default_rng([self.rt.config.seed, it, 3]).permutation(len(tasks))
    picked = [tasks[order[(k * b + j) % len(tasks)]] for j in range(b)]
    criteria = [[R.Criterion(t, p) for t, p in task["criteria"]] for task in picked]
    trajs = self.solve([t["question"] for t in picked], cfg.group_size)
    stats = GradeStats()
    grades = self.grade([(picked[t.prompt_index]["question"], criteria[t.prompt_index], t)
                         for t in trajs], stats)
    parts = [self.solver_parts(t, g) for t, g in zip(trajs, grades)]
    rewards = np.asarray([p["reward"] for p in parts]).reshape(b, cfg.group_size)
    advs = adv_lib.group_zscore(rewards, std=cfg.adv_std, eps=cfg.adv_eps).reshape(-1)
    self.rt.metrics.samples(step, [self._solver_record(picked[t.prompt_index], t, p)
                                   for t, p in list(zip(trajs, parts))[:2]])
    metrics.update(self.solver_metrics(trajs, parts, stats))
    metrics.update(self._train(self.solver, trajs, advs))
    return metrics

  def build_task_set(self, it: int, metrics: dict) -> list[dict]:
    """Difficulty-filtered tasks from the current Challenger over fresh documents (App. G)."""
    cfg, ts = self.cfg, self.cfg.task_set
    target = ts.size or cfg.solver_batch * cfg.solver_steps
    lo, hi = ts.window
    pool = self.candidate_prompts(it)
    tasks, seen, cands_all = [], set(), []
    per_rubric = collections.Counter()  # tasks kept per rubric (`max_per_rubric`)
    stats = GradeStats()
    rounds = 0
    while len(tasks) < target and rounds < ts.max_rounds:
      picks = pool[rounds * ts.candidates_per_round:(rounds + 1) * ts.candidates_per_round]
      cands = self.propose(picks, ts.samples_per_document)
      self.evaluate(cands, ts.solver_rollouts, stats, ts.solver_sampling)
      for c in cands:
        key = R.rubric_key(c.criteria)
        if c.gate and c.g_bar is not None and R.in_difficulty_window(c.g_bar, lo, hi) \
            and c.doc.id not in seen and len(tasks) < target \
            and (not ts.max_per_rubric or per_rubric[key] < ts.max_per_rubric):
          seen.add(c.doc.id)
          per_rubric[key] += 1
          tasks.append(c.task_record())
      cands_all += cands
      rounds += 1
    n = max(len(cands_all), 1)
    metrics.update({"taskset/candidates": len(cands_all), "taskset/rounds": rounds,
                    "taskset/share_gate_passed": sum(c.gate for c in cands_all) / n,
                    "taskset/share_in_window": len(tasks) / n})
    if cfg.retrievable_tasks:
      metrics["taskset/share_found_source"] = sum(bool(c.found_source) for c in cands_all) / n
    metrics.update(metrics_lib.summarize([c.g_bar for c in cands_all if c.g_bar is not None],
                                         "taskset/g_bar"))
    metrics.update(metrics_lib.summarize([t["g_bar"] for t in tasks], "taskset/kept_g_bar"))
    if len(tasks) < target:
      logging.warning("Task set for iteration %d has %d of %d tasks after %d rounds of %d "
                      "candidates (raise scope.task_set.max_rounds to search longer).", it,
                      len(tasks), target, rounds, ts.candidates_per_round)
    self._write_task_set(it, tasks)
    self.examples = ([self._record("task_set", c) for c in cands_all if c.question][:3]
                     or self.examples)
    return tasks

  def solver_parts(self, traj: Trajectory, grade: float | None) -> dict[str, float]:
    answer = traj.final("answer") or ""
    n = len(self.rt.tokenizer.encode(answer, add_special_tokens=False)) if answer else 0
    fmt = self.guard(R.solver_format, traj, self.cfg.rewards_as_released, malformed=0.0)
    return {"reward": R.solver_reward(grade, n, fmt, traj.num_searches),
            "rubric": grade if grade is not None else 0.0, "length_penalty": R.length_penalty(n),
            "format": fmt, "search": R.search_reward(traj.num_searches), "answer_tokens": n,
            "searches": traj.num_searches, "answered": float(bool(answer))}

  def _train(self, policy, trajs: Sequence[Trajectory], advs: np.ndarray) -> dict[str, float]:
    if self.cfg.per_turn_datums:
      pairs = [(d, a) for t, a in zip(trajs, advs) for d in per_turn_datums(t, self.rt.tokenizer)]
      trajs, advs = [p[0] for p in pairs], [p[1] for p in pairs]
    return self.rt.train(policy, trajs, advs)

  # ------------------------------------------------------------------------------ metrics
  def challenger_metrics(self, cands: Sequence[Candidate], stats: GradeStats) -> dict[str, float]:
    n = max(len(cands), 1)
    m = metrics_lib.summarize([c.reward for c in cands], "challenger/reward")
    m.update(metrics_lib.summarize([c.fmt for c in cands], "challenger/format"))
    m.update(metrics_lib.summarize([R.f_diff(c.g_bar) for c in cands if c.gate and c.g_bar is not None],
                                   "challenger/difficulty"))
    m.update(metrics_lib.summarize([c.g_bar for c in cands if c.g_bar is not None],
                                   "challenger/g_bar"))
    m.update(metrics_lib.summarize([c.traj.num_searches for c in cands], "challenger/searches"))
    m.update(metrics_lib.summarize([len(c.traj.response_tokens) for c in cands], "challenger/length"))
    asked = [c for c in cands if c.question and c.fmt > 0]
    m["challenger/share_task"] = len(asked) / n
    m["challenger/share_gate_passed"] = sum(c.gate for c in cands) / n
    if self.cfg.retrievable_tasks:
      m["challenger/share_found_source"] = (sum(bool(c.found_source) for c in asked)
                                            / max(len(asked), 1))
    m["challenger/share_gate_malformed"] = sum(c.gate_malformed for c in asked) / max(len(asked), 1)
    gated = [c for c in cands if c.gate]
    if gated:
      m["challenger/share_rubric_malformed"] = sum(c.criteria is None for c in gated) / len(gated)
    rolls = [t for c in cands for t in c.rollouts]
    m.update(metrics_lib.summarize([t.num_searches for t in rolls], "challenger/solver_searches"))
    m.update(_grade_metrics(stats, "challenger/judge"))
    return m

  def solver_metrics(self, trajs, parts, stats: GradeStats) -> dict[str, float]:
    m: dict[str, float] = {}
    for key in ("reward", "rubric", "length_penalty", "format", "search", "answer_tokens",
                "searches", "answered"):
      m.update(metrics_lib.summarize([p[key] for p in parts], f"solver/{key}"))
    m.update(metrics_lib.summarize([len(t.response_tokens) for t in trajs], "solver/length"))
    m.update(_grade_metrics(stats, "solver/judge"))
    return m

  def _record(self, stage: str, c: Candidate) -> dict:
    rec = {"stage": stage, "document": f"{c.doc.id} {c.doc.title}", "task type": c.task_type,
           "required searches": c.required, "format": f"{c.fmt:.3f}",
           "searches": [call.queries for call in c.traj.tool_calls] if c.traj else [],
           "challenger output": c.traj.response_text()[-1500:] if c.traj else "",
           "question": c.question, "found source": c.found_source, "gate passed": c.gate,
           "reward": f"{c.reward:.3f}"}
    if c.criteria is not None or c.rubric_text:
      rec["rubric"] = "\n".join(f"[{x.priority}] {x.text}" for x in c.criteria or []) or (
          "(malformed) " + c.rubric_text[-400:])
      rec["grades"] = ", ".join("discarded" if g is None else f"{g:.2f}" for g in c.grades)
      rec["g_bar"] = "none" if c.g_bar is None else f"{c.g_bar:.3f}"
    return rec

  def _solver_record(self, task: dict, traj: Trajectory, parts: dict) -> dict:
    return {"stage": "solver", "question": task["question"],
            "rubric": "\n".join(f"[{p}] {t}" for t, p in task["criteria"]),
            "searches": [call.queries for call in traj.tool_calls],
            "solver output": traj.response_text()[-1500:],
            "reward parts": json.dumps({k: round(float(v), 3) for k, v in parts.items()})}

  def _write_task_set(self, it: int, tasks: list[dict]) -> None:
    if jax.process_index() != 0:
      return
    out = epath.Path(self.rt.workdir) / "tasks"
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"iteration_{it}.jsonl").open("w") as f:
      for t in tasks:
        f.write(json.dumps(t, ensure_ascii=False) + "\n")

  # ------------------------------------------------------------------------------ state
  def host_state(self) -> dict:
    return {"task_sets": self.task_sets, "stage_seconds": self.clock.seconds,
            "examples": self.examples}

  def load_host_state(self, state: dict) -> None:
    self.task_sets = state.get("task_sets", {})
    self.clock.seconds = state.get("stage_seconds", {})
    self.examples = state.get("examples", [])

  def summary(self) -> str:
    lines = [self.clock.summary()]
    sizes = {k: len(v) for k, v in self.task_sets.items()}
    if sizes:
      lines.append(f"  task set (iteration: size): {sizes}")
    for ex in self.examples[:2]:
      lines.append(f"  task [{ex.get('task type')}] {ex.get('question')!r}")
      lines.append("    rubric: " + (ex.get("rubric") or "").replace("\n", " | "))
      lines.append(f"    grades: {ex.get('grades')} (ḡ {ex.get('g_bar')})")
    return "\n".join(lines)


def _grade_metrics(stats: GradeStats, prefix: str) -> dict[str, float]:
  m = {f"{prefix}/no_answer": float(stats.no_answer), f"{prefix}/discarded": float(stats.discarded)}
  if stats.verdicts:
    m[f"{prefix}/share_malformed_verdicts"] = stats.malformed_verdicts / stats.verdicts
  return m


METHOD = Scope


def make_method(rt: Runtime) -> Scope:
  return Scope(rt)
