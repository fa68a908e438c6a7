"""π-Play (ALGORITHMS §5, PiPlay.txt §3 and Algorithm 1): an examiner, a student and an EMA
teacher of the student that sees how each question was built.

Each iteration t has `examiner_steps` examiner steps, then data generation, then `student_steps`
student steps:
  Examiner: source document + hop count n (4:3:2:1 over {1, 2, 3, 4}) → one multi-turn search
    rollout that should make n − 1 searches and end with <question> and <answer>; its whole
    trajectory is the question-construction path (QCP). k of 5 student attempts exactly right →
    r_d = 1[0 < k < 5]·(5 − k)/4 + r_f (Dr.Zero's format reward) → advantages z-scored within
    each hop group → update (KL 0).
  Data (before the first student step): the trained examiner writes one sample per fresh
    document; well-formed (q, QCP, o*) are kept until student_batch × student_steps.
  Student: G rollouts per question → 1[EM] → GRPO + λ_t · D_distill, the reverse top-K KL along
    the student's own rollout to the teacher, whose prompt holds the QCP (the student's does not);
    tool output is masked from both. Then ψ ← (1 − τ)ψ + τθ.
One runner step is one examiner or student step, so checkpoints land inside and between stages.
The teacher's params are checkpointed with the policies; each iteration's data set (with the
exact text the teacher sees) is written once to <workdir>/data/iteration_<t>.jsonl, and
checkpoints keep its digest.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from scope_jax.core.method import Players, PolicyPlan, RolePlan
from scope_jax.core.runtime import Runtime
from scope_jax.core.stages import Staged
from scope_jax.methods.piplay import bounds as piplay_bounds
from scope_jax.methods.piplay import demos as piplay_demos
from scope_jax.methods.piplay import prompts as P
from scope_jax.methods.piplay import report
from scope_jax.methods.piplay import rewards as R
from scope_jax.retrieval.corpus import Passage
from scope_jax.rl import advantages as adv_lib
from scope_jax.rl.ema import ema_update
from scope_jax.rollout.search_agent import stratified
from scope_jax.rollout.types import Trajectory
from scope_jax.world import search


@dataclasses.dataclass
class Question:
  """One examiner sample: the QCP, the parsed (question, answer), and the students' attempts."""

  doc: Passage
  hops: int
  traj: Trajectory
  out: R.ExaminerOutput
  parts: dict[str, float]
  header: str  # the examiner's task line (the QCP's first piece)
  attempts: list[float] = dataclasses.field(default_factory=list)  # EM of each student attempt
  reward: float = 0.0

  @property
  def valid(self) -> bool:
    return self.out.malformed is None

  def qcp_pieces(self) -> list[str]:
    """The task line, then every generated turn and observation of the examiner, in order."""
    return [self.header + "\n"] + [s.text for s in self.traj.spans if s.kind != "prompt"]


class PiPlay(Staged):
  name = "piplay"
  bounds, section_bound = piplay_bounds.RULES, piplay_bounds.SECTION  # ranges: core/bounds.py
  stages = ("examiner", "student")  # examiner steps, then student steps on the data set
  set_section, set_metrics, set_timer, set_folder, window_seed = "data", "data", "data", "data", 23
  answering_role = "student"  # held-out evaluation scores it (config.eval)
  world_demonstrations = True  # warmup.world_seed: demonstrations from other worlds
  at_least_one = ("iterations", "examiner_steps", "student_steps", "examiner_batch",
                  "student_batch", "group_size")
  choices = {"prompt_style": tuple(P.STYLES), "variant": P.VARIANTS, "teacher": R.PRIVILEGED,
             "hop_choices": R.HOPS, "adv_std": adv_lib.STD_KINDS}
  searches = True
  smoke = {"piplay.iterations": 1, "piplay.examiner_steps": 1, "piplay.student_steps": 1,
           "piplay.examiner_batch": 2, "piplay.student_batch": 2, "piplay.group_size": 2,
           "piplay.attempts": 2, "piplay.data.candidates_per_round": 2, "piplay.data.max_rounds": 1}

  @classmethod
  def players(cls, c) -> Players:
    """Examiner φ and student θ are two policies from the base model; the teacher ψ, θ's EMA, is
    tracked (checkpointed) and distils into the student's step when λ > 0."""
    s = c.piplay
    distils = s.teacher != "none" and max(tuple(s.lambdas)) > 0
    role = lambda by: RolePlan(by, tool=True, final=("answer",))
    return Players({"examiner": PolicyPlan(s.examiner_batch, dict(s.examiner_loss),
                                           optim=dict(s.examiner_optim)),
                    "student": PolicyPlan(s.student_batch * s.group_size, dict(s.student_loss),
                                          teacher=distils, optim=dict(s.student_optim))},
                   tracked=("teacher",),
                   roles={name: role(name) for name in ("examiner", "student", "teacher")})

  @classmethod
  def check(cls, c) -> None:
    piplay_demos.check_warmup(c)
    s = c.piplay
    if len(s.hop_ratio) != len(s.hop_choices):
      raise ValueError(f"piplay.hop_ratio {tuple(s.hop_ratio)} needs one weight per entry of "
                       f"piplay.hop_choices {tuple(s.hop_choices)}.")
    if not s.lambdas or any(x < 0 for x in s.lambdas):
      raise ValueError(f"piplay.lambdas={tuple(s.lambdas)} needs at least one value, none "
                       "negative (one per iteration; 0 turns distillation off for that iteration).")
    if not 0.0 < s.tau <= 1.0:
      raise ValueError(f"piplay.tau={s.tau} must be in (0, 1] (ψ ← (1 − τ)ψ + τθ).")
    if s.attempts < 2:
      raise ValueError(f"piplay.attempts={s.attempts}: the difficulty reward needs at least 2 "
                       "student attempts per question.")
    for name in s.restart_optimizer:
      if name not in ("examiner", "student"):
        raise ValueError(f"piplay.restart_optimizer names {name!r}; the policies are 'examiner' "
                         "and 'student'.")
    if s.roles.examiner.max_turns < max(s.hop_choices) - 1:
      raise ValueError(f"piplay.roles.examiner.max_turns={s.roles.examiner.max_turns} is below "
                       f"the searches the largest hop count needs ({max(s.hop_choices) - 1}).")

  def __init__(self, rt: Runtime):
    cfg = rt.config.piplay
    super().__init__(rt, P.Prompts(cfg.prompt_style, cfg.variant, cfg.syntax, cfg.max_doc_chars))

  def demonstrations(self, rng):
    return piplay_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    return self.prompts.student(question) if kind == "qa_search" else None

  # ------------------------------------------------------------------------------ prompts
  def distill_coef(self, it: int) -> float:
    """λ_t: the schedule's entry for iteration t (its last entry after that); 0 with no teacher."""
    if self.cfg.teacher == "none":
      return 0.0
    lambdas = tuple(self.cfg.lambdas)
    return float(lambdas[min(it, len(lambdas) - 1)])

  def _picks(self, docs: Sequence[Passage], it: int, phase: int) -> list[tuple[Passage, int]]:
    """(document, hops) pairs, hops stratified in `hop_ratio` over `hop_choices`."""
    rng = np.random.default_rng([self.rt.config.seed, it, phase])
    hops = stratified(len(docs), self.cfg.hop_ratio, rng)
    return [(d, int(self.cfg.hop_choices[h])) for d, h in zip(docs, hops)]

  def examiner_prompts(self, it: int) -> list[tuple[Passage, int]]:
    return self._picks(self.window(it)[0], it, 1)

  def data_prompts(self, it: int) -> list[tuple[Passage, int]]:
    return self._picks(self.window(it)[1], it, 2)

  # ------------------------------------------------------------------------------ roles
  def propose(self, picks: Sequence[tuple[Passage, int]]) -> list[Question]:
    """One examiner rollout per (document, hops), parsed and format-scored."""
    role = self.roles["examiner"]
    trajs = role.generate([role.prompt(self.prompts.examiner(d, n)) for d, n in picks])
    out = []
    for traj in trajs:
      doc, hops = picks[traj.prompt_index]
      turns = traj.turn_texts()
      parsed = self.guard(R.parse_examiner, turns[-1] if turns else "",
                          malformed=R.ExaminerOutput(None, None, "parse_error"))
      sources = [self.prompts.document(doc)] + [c.result for c in traj.tool_calls
                                                 if c.error is None]
      attempts = len(traj.tool_calls) + traj.num_invalid
      parts = R.format_reward(parsed, turns, sources, traj.num_searches, attempts, hops)
      out.append(Question(doc, hops, traj, parsed, parts, self.prompts.qcp_header(doc, hops)))
    return out

  def solve(self, questions: Sequence[str], num_samples: int) -> list[Trajectory]:
    role = self.roles["student"]
    return role.generate([role.prompt(self.prompts.student(q)) for q in questions],
                         num_samples=num_samples)

  def teacher_prompts(self, records: Sequence[dict]) -> list[list[int]]:
    role = self.roles["teacher"]
    return [role.prompt(self.prompts.teacher(r["privileged"], r["question"])) for r in records]

  def teacher_inputs(self, records: Sequence[dict], trajs: Sequence[Trajectory],
                     metrics: dict | None = None) -> list[list[int]]:
    """The teacher's prompt per student rollout, cut so that prompt and response fit the
    teacher's context (Table 7: 8,192 tokens). The privileged part (QCP) is cut first, from its
    end; when the template and question alone leave no room, the prompt without the QCP is cut
    from the left, as verl's `truncation='left'` does, so the question and the assistant header
    next to the response stay. A long response never stops a run; `metrics` counts both cuts."""
    role, prompts = self.roles["teacher"], self.teacher_prompts(records)
    out, cut, left = [], 0, 0
    for t in trajs:
      room = max(role.max_context - (len(t.tokens) - t.prompt_len), 1)
      ids = prompts[t.prompt_index]
      if len(ids) > room:
        r = records[t.prompt_index]
        ids, from_left = fit_teacher(role, self.prompts.teacher("", r["question"]),
                                     self.prompts.teacher(r["privileged"], r["question"]), room)
        cut, left = cut + 1, left + from_left
      out.append(ids)
    if metrics is not None:
      metrics.update({"teacher/truncated_rows": float(cut),
                      "teacher/left_truncated_rows": float(left)})
    return out

  def privileged(self, q: Question, it: int, index: int) -> str:
    rng = np.random.default_rng([self.rt.config.seed, it, 5, index])  # partial QCP's half
    return R.privileged_text("qcp" if self.cfg.teacher == "none" else self.cfg.teacher,
                             q.qcp_pieces(), q.out.answer, q.hops, rng)

  # ------------------------------------------------------------------------------ stages
  def examiner_step(self, it: int, k: int, step: int) -> dict[str, float]:
    """One rollout per (document, hops) → `attempts` student tries → r_d + r_f → update."""
    cfg = self.cfg
    b = cfg.examiner_batch
    qs = self.propose(self.examiner_prompts(it)[k * b:(k + 1) * b])
    valid = [q for q in qs if q.valid]
    attempts = self.solve([q.out.question for q in valid], cfg.attempts)
    for t in attempts:
      q = valid[t.prompt_index]
      q.attempts.append(R.outcome(t.final("answer"), q.out.answer))
    for q in qs:
      q.reward = (R.difficulty_reward(int(sum(q.attempts)), cfg.attempts, q.parts["format"])
                  if q.valid else 0.0)
    advs = adv_lib.keyed_zscore([q.reward for q in qs], [q.hops for q in qs], delta=cfg.adv_eps,
                                std=cfg.adv_std)
    self.rt.metrics.samples(step, [report.examiner_record(q) for q in qs[:2]])
    metrics = report.examiner_metrics(qs)
    metrics.update(self.rt.train("examiner", [q.traj for q in qs], advs))
    return metrics

  def student_step(self, it: int, k: int, step: int) -> dict[str, float]:
    """G rollouts per question of the data set → 1[EM] → GRPO + λ_t·D_distill → ψ's EMA step."""
    cfg = self.cfg
    metrics, picked = self.set_batch(it, k, step)
    if not picked:
      return metrics
    trajs = self.solve([r["question"] for r in picked], cfg.group_size)
    rewards = [R.outcome(t.final("answer"), picked[t.prompt_index]["answer"]) for t in trajs]
    advs = adv_lib.group_zscore(np.reshape(rewards, (len(picked), cfg.group_size)),
                                std=cfg.adv_std, eps=cfg.adv_eps).reshape(-1)
    lam = self.distill_coef(it)
    teacher_ids = self.teacher_inputs(picked, trajs, metrics) if lam > 0 else None
    student = self.rt.policies["student"]
    metrics.update(self.rt.train(student, trajs, advs, teacher="teacher",
                                 loss=dataclasses.replace(student.loss, distill_coef=lam),
                                 teacher_prompts=teacher_ids))
    metrics.update(report.student_metrics(trajs, rewards, lam))
    if cfg.teacher != "none":
      teacher = ema_update(self.rt.trained_part("teacher"), student.state.params, cfg.tau)
      self.rt.set_trained_part("teacher", teacher)
      if k % max(cfg.teacher_eval_every, 1) == 0:
        metrics.update(self.teacher_eval(picked, trajs, rewards, step))
    return metrics

  def teacher_eval(self, picked, trajs, rewards, step) -> dict[str, float]:
    """The teacher's EM on the same questions with its privileged prompt (the paper's premise
    is that it beats the student's); samples of both answers."""
    n = self.cfg.teacher_eval_samples
    if n < 1:
      return {}
    answers = self.roles["teacher"].generate(self.teacher_prompts(picked), num_samples=n)
    em = [R.outcome(t.final("answer"), picked[t.prompt_index]["answer"]) for t in answers]
    records = report.teacher_records(picked, trajs, answers, n)
    self.rt.metrics.samples(step, records)
    self.examples = (records + self.examples)[:3]
    return {"teacher/em": float(np.mean(em)),
            "teacher/em_minus_student": float(np.mean(em)) - float(np.mean(rewards))}

  def build_set(self, it: int, metrics: dict) -> list[dict]:
    """The data set: well-formed (question, privileged information, answer) from the trained
    examiner over fresh documents, until student_batch × student_steps (or the round budget)."""
    def take(picks, records):
      qs = self.propose(picks)
      for q in qs:
        if q.valid and len(records) < self.set_target():
          records.append({"doc_id": q.doc.id, "hops": q.hops, "question": q.out.question,
                          "answer": q.out.answer,
                          "privileged": self.privileged(q, it, len(records))})
      return qs

    records, cands, counts = self.rounds(it, self.data_prompts(it), take)
    metrics.update(counts)
    metrics.update(report.data_metrics(cands, records, self.cfg.hop_choices))
    return records

  def summary(self) -> str:
    return "\n".join([self.set_sizes(), *report.summary(self.examples)])


def fit_teacher(role, bare, full, room: int) -> tuple[list[int], bool]:
  """(ids, cut from the left): the teacher prompt `full` with its QCP cut to `room` tokens, or,
  when `bare` (the same prompt without a QCP) is itself over `room`, `bare`'s last `room` tokens."""
  bare_ids = role.prompt(bare)
  if len(bare_ids) > room:
    return list(bare_ids[-room:]), True
  return role.prompt(full, limit=room), False


METHOD = PiPlay


def make_method(rt: Runtime) -> PiPlay:
  return PiPlay(rt)
