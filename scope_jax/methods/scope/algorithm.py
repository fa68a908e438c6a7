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
from typing import Sequence

import numpy as np

from scope_jax.core.method import Players, PolicyPlan, RolePlan
from scope_jax.core.runtime import Runtime
from scope_jax.core.stages import Staged
from scope_jax.methods.scope import bounds as scope_bounds
from scope_jax.methods.scope import demos as scope_demos
from scope_jax.methods.scope import prompts as P
from scope_jax.methods.scope import report
from scope_jax.methods.scope import rewards as R
from scope_jax.methods.scope.report import GradeStats
from scope_jax.retrieval.corpus import Passage
from scope_jax.rl import advantages as adv_lib
from scope_jax.rollout.datums import per_turn_datums
from scope_jax.rollout.search_agent import stratified
from scope_jax.rollout.types import Trajectory
from scope_jax.world import search


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


class Scope(Staged):
  name = "scope"
  bounds, section_bound = scope_bounds.RULES, scope_bounds.SECTION  # ranges: core/bounds.py
  stages = ("challenger", "solver")  # Stage 1, then Stage 2 on the task set
  set_section, set_metrics, set_timer, set_folder, window_seed = (
      "task_set", "taskset", "task_set", "tasks", 17)
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

  @classmethod
  def players(cls, c) -> Players:
    """Challenger and Solver are two policies trained from M0; the Judge (gate, rubric and
    grader roles) is M0 itself, frozen (so is the KL reference)."""
    s = c.scope
    thinking = s.per_turn_datums  # rollouts match the per-turn datums
    return Players(
        {"challenger": PolicyPlan(s.challenger_batch * s.group_size, dict(s.challenger_loss),
                                  optim=dict(s.challenger_optim)),
         "solver": PolicyPlan(s.solver_batch * s.group_size, dict(s.solver_loss),
                              optim=dict(s.solver_optim))},
        frozen=("judge",),
        roles={"challenger": RolePlan("challenger", True, ("task",), thinking),
               "solver": RolePlan("solver", True, ("answer",), thinking),
               **{name: RolePlan("judge") for name in ("gate", "rubric", "grader")}})

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
    if s.roles.challenger.max_turns < max(s.search_choices):
      raise ValueError(f"scope.roles.challenger.max_turns={s.roles.challenger.max_turns} is below "
                       f"the largest required search count {max(s.search_choices)}.")

  def __init__(self, rt: Runtime):
    cfg = rt.config.scope
    super().__init__(rt, P.Prompts(cfg.prompt_style, cfg.syntax, cfg.max_doc_chars, cfg.task_form,
                                   cfg.max_criteria))

  def demonstrations(self, rng):
    return scope_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    """The Solver's prompt for a held-out search question (`eval.prompt='role'`)."""
    return self.prompts.solver(question, self.cfg.roles.solver.max_turns) \
        if kind == "qa_search" else None

  # ------------------------------------------------------------------------------ prompts
  def _mix(self, it: int, phase: int, n: int) -> list[tuple[str, int]]:
    """(task type, required searches) for n prompts: types uniform, searches 4:3:2 (stratified)."""
    rng = np.random.default_rng([self.rt.config.seed, it, phase])
    types = stratified(n, [1.0] * len(self.cfg.task_types), rng)
    searches = stratified(n, self.cfg.search_ratio, rng)
    return [(self.cfg.task_types[t], int(self.cfg.search_choices[s]))
            for t, s in zip(types, searches)]

  def stage1_prompts(self, it: int) -> list[tuple[Passage, str, int]]:
    docs = self.window(it)[0]
    return [(d, t, k) for d, (t, k) in zip(docs, self._mix(it, 1, len(docs)))]

  def candidate_prompts(self, it: int) -> list[tuple[Passage, str, int]]:
    docs = self.window(it)[1]
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
  def challenger_step(self, it: int, k: int, step: int) -> dict[str, float]:
    """Stage 1: G tasks per prompt, gated, rubric'd and graded on the Solver → R_C → update."""
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
    self.rt.metrics.samples(step, [report.record("challenger", c) for c in cands[:2]])
    metrics = report.challenger_metrics(cands, stats, cfg.retrievable_tasks)
    metrics.update(self._train("challenger", [c.traj for c in cands], advs))
    return metrics

  def solver_step(self, it: int, k: int, step: int) -> dict[str, float]:
    """Stage 2: G Solver rollouts per task of the set → per-criterion grades → R_S → update."""
    cfg = self.cfg
    metrics, picked = self.set_batch(it, k, step)
    if not picked:
      return metrics
    criteria = [[R.Criterion(t, p) for t, p in task["criteria"]] for task in picked]
    trajs = self.solve([t["question"] for t in picked], cfg.group_size)
    stats = GradeStats()
    grades = self.grade([(picked[t.prompt_index]["question"], criteria[t.prompt_index], t)
                         for t in trajs], stats)
    parts = [self.solver_parts(t, g) for t, g in zip(trajs, grades)]
    rewards = np.asarray([p["reward"] for p in parts]).reshape(len(picked), cfg.group_size)
    advs = adv_lib.group_zscore(rewards, std=cfg.adv_std, eps=cfg.adv_eps).reshape(-1)
    self.rt.metrics.samples(step, [report.solver_record(picked[t.prompt_index], t, p)
                                   for t, p in list(zip(trajs, parts))[:2]])
    metrics.update(report.solver_metrics(trajs, parts, stats))
    metrics.update(self._train("solver", trajs, advs))
    return metrics

  def build_set(self, it: int, metrics: dict) -> list[dict]:
    """The task set: difficulty-filtered tasks from the current Challenger over fresh documents,
    at most one per document (App. G)."""
    ts = self.cfg.task_set
    lo, hi = ts.window
    seen, per_rubric = set(), collections.Counter()  # tasks kept per rubric (`max_per_rubric`)
    stats = GradeStats()

    def take(picks, tasks):
      cands = self.propose(picks, ts.samples_per_document)
      self.evaluate(cands, ts.solver_rollouts, stats, ts.solver_sampling)
      for c in cands:
        key = R.rubric_key(c.criteria)
        if c.gate and c.g_bar is not None and R.in_difficulty_window(c.g_bar, lo, hi) \
            and c.doc.id not in seen and len(tasks) < self.set_target() \
            and (not ts.max_per_rubric or per_rubric[key] < ts.max_per_rubric):
          seen.add(c.doc.id)
          per_rubric[key] += 1
          tasks.append(c.task_record())
      return cands

    tasks, cands, counts = self.rounds(it, self.candidate_prompts(it), take)
    metrics.update(counts)
    metrics.update(report.task_set_metrics(cands, tasks, self.cfg.retrievable_tasks))
    self.examples = ([report.record("task_set", c) for c in cands if c.question][:3]
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

  def _train(self, policy: str, trajs: Sequence[Trajectory], advs: np.ndarray) -> dict[str, float]:
    if self.cfg.per_turn_datums:
      pairs = [(d, a) for t, a in zip(trajs, advs) for d in per_turn_datums(t, self.rt.tokenizer)]
      trajs, advs = [p[0] for p in pairs], [p[1] for p in pairs]
    return self.rt.train(policy, trajs, advs)

  def summary(self) -> str:
    return "\n".join([self.set_sizes(), *report.summary(self.examples)])


METHOD = Scope


def make_method(rt: Runtime) -> Scope:
  return Scope(rt)
