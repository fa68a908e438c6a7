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
One runner step is one examiner or student step, so checkpoints land inside and between phases.
The teacher's params are checkpointed with the policies; each iteration's data set (with the
exact text the teacher sees) is written once to <workdir>/data/iteration_<t>.jsonl, and
checkpoints keep its digest.
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from scope_jax.methods.piplay import bounds as piplay_bounds
from scope_jax.methods.piplay import demos as piplay_demos
from scope_jax.methods.piplay import prompts as P
from scope_jax.methods.piplay import rewards as R
from scope_jax.retrieval.corpus import Passage
from scope_jax.rl import advantages as adv_lib
from scope_jax.rl.ema import ema_update
from scope_jax.rollout.search_agent import stratified
from scope_jax.rollout.types import Trajectory
from scope_jax.world import search

PHASES = ("examiner", "student")
MALFORMED = ("no_question", "no_answer", "answer_in_question", "parse_error")


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


class PiPlay(Method):
  name = "piplay"
  bounds, section_bound = piplay_bounds.RULES, piplay_bounds.SECTION  # ranges: core/bounds.py
  roles = ("examiner", "student", "teacher")
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
  host_local_keys = ("stage_seconds",)  # this host's wall times, not a decision

  @classmethod
  def players(cls, c) -> Players:
    """Examiner and student are two policies; the teacher, the student's EMA, is tracked and
    distils into the student's step when λ > 0."""
    s = c.piplay
    distils = s.teacher != "none" and max(tuple(s.lambdas)) > 0
    return Players({"examiner": PolicyPlan(s.examiner_batch, dict(s.examiner_loss)),
                    "student": PolicyPlan(s.student_batch * s.group_size, dict(s.student_loss),
                                          teacher=distils)},
                   tracked=("teacher",))

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
    for name in ("examiner", "student"):
      try:
        optim_settings(c, s[f"{name}_optim"])
      except ValueError as e:
        raise ValueError(f"piplay.{name}_optim: {e}") from None
    for name in s.restart_optimizer:
      if name not in ("examiner", "student"):
        raise ValueError(f"piplay.restart_optimizer names {name!r}; the policies are 'examiner' "
                         "and 'student'.")
    if s.roles.examiner.max_turns < max(s.hop_choices) - 1:
      raise ValueError(f"piplay.roles.examiner.max_turns={s.roles.examiner.max_turns} is below "
                       f"the searches the largest hop count needs ({max(s.hop_choices) - 1}).")

  def __init__(self, rt: Runtime):
    super().__init__(rt)
    self.cfg = cfg = rt.config.piplay
    self.passages, self.tool = search.from_config(rt.config.retrieval, rt.config.world.seed,
                                                  rt.config.world.corpus_seeds)
    self.prompts = P.Prompts(cfg.prompt_style, cfg.variant, cfg.syntax, cfg.max_doc_chars)
    self.guard = ParseGuard()
    self.datasets: dict[str, list[dict]] = {}  # iteration → its (q, privileged info, o*) records
    self._digests: dict[str, str] = {}  # iteration → sha256 of <workdir>/data/iteration_<t>.jsonl
    self.clock = StageClock()
    self.schedule = Schedule((("examiner", cfg.examiner_steps), ("student", cfg.student_steps)))
    self.examples: list[dict] = []  # a few triples with both answers, for the summary
    # Examiner φ and student θ start from the base model; the teacher ψ is θ's EMA, also
    # starting there; the runtime's KL reference (the base model) serves any β > 0.
    self.examiner = rt.add_policy("examiner", loss_overrides=dict(cfg.examiner_loss),
                                  optim_overrides=dict(cfg.examiner_optim))
    self.student = rt.add_policy("student", loss_overrides=dict(cfg.student_loss),
                                 optim_overrides=dict(cfg.student_optim))
    rt.add_tracked("teacher")
    kw = dict(tool=self.tool, final_tags=("answer",), system=self.prompts.system())
    self.roles = {
        "examiner": rt.add_role("examiner", cfg.roles.examiner, policy=self.examiner, **kw),
        "student": rt.add_role("student", cfg.roles.student, policy=self.student, **kw),
        "teacher": rt.add_role("teacher", cfg.roles.teacher, frozen="teacher", **kw)}

  def demonstrations(self, rng):
    return piplay_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    return self.prompts.student(question) if kind == "qa_search" else None

  # ------------------------------------------------------------------------------ schedule
  def locate(self, step: int) -> tuple[int, str, int]:
    """Global step → (iteration, phase, step within the phase)."""
    return self.schedule.locate(step)

  def distill_coef(self, it: int) -> float:
    """λ_t: the schedule's entry for iteration t (its last entry after that); 0 with no teacher."""
    if self.cfg.teacher == "none":
      return 0.0
    lambdas = tuple(self.cfg.lambdas)
    return float(lambdas[min(it, len(lambdas) - 1)])

  def _window(self, it: int) -> list[Passage]:
    """This iteration's source documents: a window of one seeded corpus permutation (disjoint
    across iterations while the corpus lasts); examiner steps take the front, data the rest."""
    cfg = self.cfg
    size = cfg.examiner_batch * cfg.examiner_steps + cfg.data.candidates_per_round * \
        cfg.data.max_rounds
    idx = corpus_window(len(self.passages), size, it, [self.rt.config.seed, 23])
    return [self.passages[i] for i in idx]

  def _picks(self, docs: Sequence[Passage], it: int, phase: int) -> list[tuple[Passage, int]]:
    """(document, hops) pairs, hops stratified in `hop_ratio` over `hop_choices`."""
    rng = np.random.default_rng([self.rt.config.seed, it, phase])
    hops = stratified(len(docs), self.cfg.hop_ratio, rng)
    return [(d, int(self.cfg.hop_choices[h])) for d, h in zip(docs, hops)]

  def examiner_prompts(self, it: int) -> list[tuple[Passage, int]]:
    n = self.cfg.examiner_batch * self.cfg.examiner_steps
    return self._picks(self._window(it)[:n], it, 1)

  def data_prompts(self, it: int) -> list[tuple[Passage, int]]:
    n = self.cfg.examiner_batch * self.cfg.examiner_steps
    return self._picks(self._window(it)[n:], it, 2)

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

  # ------------------------------------------------------------------------------ phases
  def step(self, step: int) -> dict[str, float]:
    it, phase, k = self.locate(step)
    start = time.perf_counter()
    if k == 0 and it > 0 and phase in self.cfg.restart_optimizer:
      self.rt.restart_optimizer(getattr(self, phase))  # a new trainer on the last weights
    if phase == "examiner":
      metrics = self.examiner_step(it, k, step)
    else:
      metrics = self.student_step(it, k, step)
    dt = time.perf_counter() - start - metrics.get("time/data", 0.0)  # counted on its own
    self.clock.add(phase, dt)
    metrics.update({"iteration": it, "phase": PHASES.index(phase), f"time/{phase}_step": dt,
                    "parse_errors": float(self.guard.take())})
    return metrics

  def examiner_step(self, it: int, k: int, step: int) -> dict[str, float]:
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
    self.rt.metrics.samples(step, [self._examiner_record(q) for q in qs[:2]])
    metrics = self.examiner_metrics(qs)
    metrics.update(self.rt.train(self.examiner, [q.traj for q in qs], advs))
    return metrics

  def student_step(self, it: int, k: int, step: int) -> dict[str, float]:
    cfg = self.cfg
    metrics: dict[str, float] = {}
    if str(it) not in self.datasets:
      records, metrics["time/data"] = self.clock.timed("data", self.build_dataset, it, metrics)
      self.datasets = {str(it): records}  # only the current one is kept
      self._digests = {str(it): self._write_dataset(it, records)}
    data = self.datasets[str(it)]
    metrics["data/size"] = len(data)
    if not data:
      logging.warning("Iteration %d has no well-formed examiner question: no student update at "
                      "step %d (see samples.log).", it, step)
      return metrics
    b = cfg.student_batch
    order = np.random.default_rng([self.rt.config.seed, it, 3]).permutation(len(data))
    picked = [data[order[(k * b + j) % len(data)]] for j in range(b)]
    trajs = self.solve([r["question"] for r in picked], cfg.group_size)
    rewards = [R.outcome(t.final("answer"), picked[t.prompt_index]["answer"]) for t in trajs]
    advs = adv_lib.group_zscore(np.reshape(rewards, (b, cfg.group_size)), std=cfg.adv_std,
                                eps=cfg.adv_eps).reshape(-1)
    lam = self.distill_coef(it)
    teacher_ids = self.teacher_inputs(picked, trajs, metrics) if lam > 0 else None
    loss = dataclasses.replace(self.student.loss, distill_coef=lam)
    metrics.update(self.rt.train(self.student, trajs, advs, loss=loss, teacher="teacher",
                                 teacher_prompts=teacher_ids))
    metrics.update(self.student_metrics(trajs, rewards, lam))
    if cfg.teacher != "none":
      teacher = ema_update(self.rt.frozen["teacher"], self.student.state.params, cfg.tau)
      self.rt.set_frozen("teacher", teacher)
      if k % max(cfg.teacher_eval_every, 1) == 0:
        metrics.update(self.teacher_eval(picked, trajs, rewards, step))
    return metrics

  def teacher_eval(self, picked, trajs, rewards, step) -> dict[str, float]:
    """The teacher's EM on the same questions with its privileged prompt (the paper's premise
    is that it beats the student's); samples of both answers."""
    n = self.cfg.teacher_eval_samples
    if n < 1:
      return {}
    role = self.roles["teacher"]
    answers = role.generate(self.teacher_prompts(picked), num_samples=n)
    em = [R.outcome(t.final("answer"), picked[t.prompt_index]["answer"]) for t in answers]
    student_em = float(np.mean(rewards))
    records = []
    for i, rec in enumerate(picked[:2]):
      s = next(t for t in trajs if t.prompt_index == i)
      records.append({"phase": "student", "question": rec["question"], "gold": rec["answer"],
                      "hops": rec["hops"], "teacher sees": rec["privileged"][-1500:],
                      "student": s.response_text()[-800:],
                      "student answer": s.final("answer"),
                      "teacher answer": answers[i * n].final("answer")})
    self.rt.metrics.samples(step, records)
    self.examples = (records + self.examples)[:3]
    return {"teacher/em": float(np.mean(em)), "teacher/em_minus_student": float(np.mean(em)) -
            student_em}

  def build_dataset(self, it: int, metrics: dict) -> list[dict]:
    """Well-formed (question, privileged information, answer) from the trained examiner over
    fresh documents, until student_batch × student_steps (or the round budget)."""
    cfg, dc = self.cfg, self.cfg.data
    target = dc.size or cfg.student_batch * cfg.student_steps
    pool = self.data_prompts(it)
    records, cands, rounds = [], [], 0
    while len(records) < target and rounds < dc.max_rounds:
      qs = self.propose(pool[rounds * dc.candidates_per_round:
                             (rounds + 1) * dc.candidates_per_round])
      for q in qs:
        if q.valid and len(records) < target:
          records.append({"doc_id": q.doc.id, "hops": q.hops, "question": q.out.question,
                          "answer": q.out.answer,
                          "privileged": self.privileged(q, it, len(records))})
      cands += qs
      rounds += 1
    n = max(len(cands), 1)
    metrics.update({"data/candidates": len(cands), "data/rounds": rounds,
                    "data/valid_rate": sum(q.valid for q in cands) / n})
    for h in cfg.hop_choices:
      metrics[f"data/hops_{h}"] = sum(r["hops"] == h for r in records)
    if len(records) < target:
      logging.warning("Data for iteration %d has %d of %d questions after %d rounds of %d "
                      "candidates (raise piplay.data.max_rounds to search longer).", it,
                      len(records), target, rounds, dc.candidates_per_round)
    return records

  # ------------------------------------------------------------------------------ metrics
  def examiner_metrics(self, qs: Sequence[Question]) -> dict[str, float]:
    n = max(len(qs), 1)
    m = metrics_lib.summarize([q.reward for q in qs], "examiner/reward")
    m["examiner/valid_rate"] = sum(q.valid for q in qs) / n
    for reason in MALFORMED:
      m[f"examiner/malformed_{reason}"] = float(sum(q.out.malformed == reason for q in qs))
    for key in ("format", "think", "tool", "ans"):
      m.update(metrics_lib.summarize([q.parts[key] for q in qs], f"examiner/{key}"))
    m.update(metrics_lib.summarize([float(np.mean(q.attempts)) for q in qs if q.attempts],
                                   "examiner/student_solve_rate"))
    excess = [q.traj.num_searches - (q.hops - 1) for q in qs]
    m.update(metrics_lib.summarize(excess, "examiner/searches_minus_required"))
    m["examiner/share_exact_searches"] = sum(e == 0 for e in excess) / n
    for h in sorted({q.hops for q in qs}):
      group = [q for q in qs if q.hops == h]
      p = f"examiner/hop{h}"
      m[f"{p}/count"] = float(len(group))
      m[f"{p}/reward"] = float(np.mean([q.reward for q in group]))
      m[f"{p}/format"] = float(np.mean([q.parts["format"] for q in group]))
      m[f"{p}/valid_rate"] = float(np.mean([q.valid for q in group]))
      m[f"{p}/searches"] = float(np.mean([q.traj.num_searches for q in group]))
      m[f"{p}/required_searches"] = float(h - 1)
    return m

  def student_metrics(self, trajs, rewards, lam: float) -> dict[str, float]:
    m = metrics_lib.summarize(rewards, "student/outcome")
    m.update(metrics_lib.summarize([t.num_searches for t in trajs], "student/searches"))
    m.update(metrics_lib.summarize([len(t.response_tokens) for t in trajs], "student/length"))
    m["student/answered"] = float(np.mean([t.final("answer") is not None for t in trajs]))
    m["student/lambda"] = lam
    return m

  def _examiner_record(self, q: Question) -> dict:
    return {"phase": "examiner", "document": f"{q.doc.id} {q.doc.title}", "hops": q.hops,
            "searches": [c.queries for c in q.traj.tool_calls],
            "examiner output (QCP)": q.traj.response_text()[-1500:],
            "question": q.out.question, "answer": q.out.answer, "malformed": q.out.malformed,
            "format": {k: round(v, 3) for k, v in q.parts.items()},
            "student attempts (EM)": q.attempts, "reward": round(q.reward, 3)}

  # ------------------------------------------------------------------------------ state
  def data_file(self, it: int) -> epath.Path:
    return epath.Path(self.rt.workdir) / "data" / f"iteration_{it}.jsonl"

  def _write_dataset(self, it: int, records: list[dict]) -> str:
    """Writes an iteration's data set once (checkpoints keep only its digest); returns it."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if jax.process_index() == 0:
      path = self.data_file(it)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
    return hashlib.sha256(text.encode()).hexdigest()

  def host_state(self) -> dict:
    data = {it: {"size": len(r), "sha256": self._digests[it]} for it, r in self.datasets.items()}
    return {"data": data, "stage_seconds": self.clock.seconds, "examples": self.examples}

  def load_host_state(self, state: dict) -> None:
    self.datasets, self._digests = {}, {}
    for it, meta in state.get("data", {}).items():
      path = self.data_file(int(it))
      text = path.read_text() if path.exists() else None
      if text is None or hashlib.sha256(text.encode()).hexdigest() != meta["sha256"]:
        raise ValueError(f"The π-Play data set of iteration {it} ({path}) is missing or changed "
                         "since the checkpoint was written; restore the file, or start the run in "
                         "a new workdir.")
      self.datasets[it] = [json.loads(line) for line in text.splitlines()]
      self._digests[it] = meta["sha256"]
    self.clock.seconds = state.get("stage_seconds", {})
    self.examples = state.get("examples", [])

  def summary(self) -> str:
    lines = [self.clock.summary("phase")]
    sizes = {k: len(v) for k, v in self.datasets.items()}
    if sizes:
      lines.append(f"  data set (iteration: size): {sizes}")
    for ex in self.examples[:3]:
      lines.append(f"  [{ex['hops']} hop] {ex['question']!r} → {ex['gold']!r}; student "
                   f"{ex['student answer']!r}, teacher {ex['teacher answer']!r}")
      lines.append("    QCP: " + " ".join(ex["teacher sees"].split())[-300:])
    return "\n".join(lines)


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
