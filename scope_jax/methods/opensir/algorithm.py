"""OpenSIR (Kwan et al.): one policy as teacher and student, from one seed problem, with no
external label: the students' majority answer is the pseudo-label (ALGORITHMS §3, OpenSIR.txt).

Per step, for each of `units_per_step` units:
  sample a reference problem from the pool for each of `groups_per_unit` groups → the teacher
  writes g problems per group (`<think>`, `<problem>`, `<concepts>`) → legal problems get n
  student solutions each → boxed answers parsed with math-verify → majority answer and solve
  rate → solvability, length, diversity (vs the pool and this step's problems) and format →
  train the teacher on the unit's group with the most varied c = solv + div, the student on the
  unit's problem with the highest c; group z-scores, `<concepts>` masked out of the teacher's
  loss, teacher and student sequences pooled in one token-mean update → every legal problem
  joins the pool with its embedding.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging
from etils import epath

from scope_jax.core.method import Method, Players, PolicyPlan, RolePlan
from scope_jax.core.runtime import Runtime
from scope_jax.methods.opensir import bounds as opensir_bounds
from scope_jax.methods.opensir import bootstrap
from scope_jax.methods.opensir import demos as opensir_demos
from scope_jax.methods.opensir import prompts as P
from scope_jax.methods.opensir import report
from scope_jax.methods.opensir import rewards as R
from scope_jax.methods.opensir.pool import Pool
from scope_jax.retrieval.service import load_encoder
from scope_jax.rewards import mathcheck
from scope_jax.rl import advantages as adv_lib
from scope_jax.rollout.types import Trajectory

SEED_PROBLEM = opensir_demos.SEED_PROBLEM


@dataclasses.dataclass
class Candidate:
  """One teacher sample and everything scored from it."""

  unit: int
  group: int
  reference: str
  traj: Trajectory
  problem: R.Problem | None = None
  fmt: float = 0.0
  solutions: list[Trajectory] = dataclasses.field(default_factory=list)
  answers: list[str | None] = dataclasses.field(default_factory=list)
  majority: str | None = None
  rate: float | None = None
  solv: float | None = None
  div: float | None = None
  length: float = 0.0
  reward: float = 0.0
  student_rewards: list[float] = dataclasses.field(default_factory=list)
  weights: tuple[float, float] = (1.0, 1.0)  # of solvability and diversity in c

  @property
  def c(self) -> float | None:
    return R.combined(self.solv, self.div, *self.weights)


class OpenSir(Method):
  name = "opensir"
  bounds, section_bound = opensir_bounds.RULES, opensir_bounds.SECTION  # ranges: core/bounds.py
  answering_role = "student"  # held-out evaluation scores it (config.eval)
  world_demonstrations = True  # warmup.world_seed: demonstrations from other worlds
  at_least_one = ("units_per_step", "groups_per_unit", "group_size", "num_solutions",
                  "math_timeout", "diversity_top_k")
  choices = {"loss_unit": ("step", "unit")}
  smoke = {"total_steps": 1, "opensir.units_per_step": 2, "opensir.groups_per_unit": 2,
           "opensir.group_size": 2, "opensir.num_solutions": 2,
           "opensir.initial_pool.candidates": 2, "opensir.initial_pool.max_rounds": 1}

  @classmethod
  def players(cls, c) -> Players:
    """One policy as teacher and student: per unit, a problem group and a solution group."""
    o = c.opensir
    return Players({"policy": PolicyPlan(o.units_per_step * (o.group_size + o.num_solutions))},
                   roles={"teacher": RolePlan("policy"), "student": RolePlan("policy")})

  @classmethod
  def check(cls, c) -> None:
    opensir_demos.check_warmup(c)
    o = c.opensir
    if o.num_solutions < 2:
      raise ValueError("opensir.num_solutions must be at least 2 (a majority needs a vote).")
    low, high = o.solve_rate_band
    if not 0.0 <= low < high <= 1.0:
      raise ValueError(f"opensir.solve_rate_band={tuple(o.solve_rate_band)} must be (low, high) "
                       "with 0 <= low < high <= 1, e.g. (0.5, 0.9).")
    if not o.seed_problem.strip():
      raise ValueError("opensir.seed_problem is empty; the pool starts from it ('What is 1+1?').")

  @classmethod
  def check_data(cls, c) -> None:
    if not c.opensir.encoder:
      raise ValueError("opensir.encoder is empty: set it to the diversity embedder's checkpoint "
                       "directory (the paper's Linq-Embed-Mistral, or an E5/BERT one) or an "
                       "asset name such as 'minilm'.")
    path = c.opensir.initial_pool.file
    if path and path != bootstrap.WORLD and not epath.Path(path).exists():
      raise ValueError(f"opensir.initial_pool.file={path!r}: no such file (a JSONL of "
                       "'problem' lines), or leave it empty to generate the starting pool.")
    bootstrap.check_pool_file(c)

  def __init__(self, rt: Runtime):
    super().__init__(rt, P.Prompts())
    cfg = self.cfg
    self.rng = np.random.default_rng(rt.config.seed)
    self.checker = rt.own(mathcheck.MathChecker(timeout=cfg.math_timeout))
    self.encoder = load_encoder(cfg.encoder, mesh=rt.mesh)
    self.pool = Pool(self.encoder.dim)
    self.pool.add([cfg.seed_problem], [[]], self.embed([cfg.seed_problem]))
    self.started = False  # the starting pool (opensir.initial_pool) is in place
    self.decode = lambda ids: rt.tokenizer.decode(list(ids), skip_special_tokens=False)

  def demonstrations(self, rng):
    return opensir_demos.demonstrations(self, rng)

  def embed(self, texts) -> np.ndarray:
    return self.encoder.encode(list(texts), kind="passage") if texts else \
        np.zeros((0, self.encoder.dim), np.float32)

  # ------------------------------------------------------------------------------ prompts
  def teacher_prompt(self, reference: str) -> list[int]:
    return self.roles["teacher"].prompt(self.prompts.teacher(reference))

  def student_prompt(self, problem: str) -> list[int]:
    return self.roles["student"].prompt(self.prompts.student(problem))

  def answer_prompt(self, question: str, kind: str):
    """A held-out math problem in the student's own prompt; None for any other type (the
    student is only ever asked problems)."""
    return self.student_prompt(question) if kind == "math" else None

  # ------------------------------------------------------------------------------ phases
  def generate_problems(self) -> list[Candidate]:
    """units × groups_per_unit groups of g problems, each group from one reference problem."""
    cfg = self.cfg
    refs = [(u, k, self.pool.problems[int(self.rng.integers(len(self.pool)))])
            for u in range(cfg.units_per_step) for k in range(cfg.groups_per_unit)]
    trajs = self.roles["teacher"].generate([self.teacher_prompt(r) for _, _, r in refs],
                                  num_samples=cfg.group_size)
    out = []
    for i, (u, k, ref) in enumerate(refs):
      for traj in trajs[i * cfg.group_size:(i + 1) * cfg.group_size]:
        text = traj.response_text()
        cand = Candidate(u, u * cfg.groups_per_unit + k, ref, traj,
                         weights=(cfg.selection_weights.solvability,
                                  cfg.selection_weights.diversity))
        cand.problem = self.guard(R.parse_problem, text, malformed=None)
        cand.fmt = self.guard(R.teacher_format, text, cand.problem, malformed=0.0)
        out.append(cand)
    return out

  def solve(self, cands: list[Candidate]) -> None:
    """n student solutions per legal problem; majority answer, solve rate and student rewards."""
    legal = [c for c in cands if c.problem is not None]
    n = self.cfg.num_solutions
    sols = self.roles["student"].generate([self.student_prompt(c.problem.text) for c in legal],
                                 num_samples=n)
    for i, c in enumerate(legal):
      c.solutions = sols[i * n:(i + 1) * n]
      texts = [t.response_text() for t in c.solutions]
      c.answers = [self.guard(self.checker.final, t, malformed=None) for t in texts]
      c.majority, c.rate = R.solve_rate(c.answers)
      c.student_rewards = [
          R.student_reward(a, c.majority, R.student_format(t), self.cfg.student_format_weight)
          for a, t in zip(c.answers, texts)]
      if c.rate is not None:
        c.solv = R.solvability(c.rate, n, *self.cfg.solve_rate_band)
        c.length = R.length_score([float(t.loss_mask.sum()) for t in c.solutions],
                                  self.cfg.length_cap, self.cfg.length_baseline)

  def score(self, cands: list[Candidate]) -> np.ndarray:
    """Diversity of every legal problem and the teacher rewards; returns the new embeddings."""
    legal = [c for c in cands if c.problem is not None]
    new_ND = self.embed([c.problem.text for c in legal])
    for c, d in zip(legal, R.diversity(new_ND, self.pool.embeddings, self.cfg.diversity_top_k)):
      c.div = float(d)
    w = self.cfg.teacher_weights
    for c in cands:
      c.reward = 0.0 if c.problem is None else R.teacher_reward(
          c.solv or 0.0, c.div or 0.0, c.length, c.fmt,
          (w.solvability, w.diversity, w.length, w.format))
    return new_ND

  def select(self, cands: list[Candidate]):
    """Per unit: the teacher group with the most varied c and the student problem with the
    highest c, with group z-score advantages; `<concepts>` masked out of the teacher rows. With
    `opensir.loss_unit='unit'` each row's advantage carries its unit's weight in TRL's loss."""
    cfg = self.cfg
    trajs: list[Trajectory] = []
    advs: list[float] = []
    picked_groups, picked_problems, units = [], [], []
    for u in range(cfg.units_per_step):
      unit = [c for c in cands if c.unit == u]
      groups = [[c for c in unit if c.group == u * cfg.groups_per_unit + k]
                for k in range(cfg.groups_per_unit)]
      g = groups[R.select_group([[c.c for c in grp] for grp in groups])]
      a = adv_lib.group_zscore([[c.reward for c in g]], std="unbiased", eps=cfg.adv_eps)[0]
      trajs += [self.mask_concepts(c.traj) for c in g]
      advs += list(a)
      picked_groups.append(g)
      best = R.select_problem([c.c for c in unit])
      if best is not None:
        p = unit[best]
        trajs += p.solutions
        advs += list(adv_lib.group_zscore([p.student_rewards], std="unbiased",
                                          eps=cfg.adv_eps)[0])
        picked_problems.append(p)
      units += [u] * (len(trajs) - len(units))
    if cfg.loss_unit == "unit":  # TRL's token-mean per micro-batch (a unit's 8 + 8 rows)
      tokens = [int(t.loss_mask[t.prompt_len:].sum()) for t in trajs]
      advs = list(np.asarray(advs) * R.unit_token_weights(tokens, units))
    return trajs, advs, picked_groups, picked_problems

  def mask_concepts(self, traj: Trajectory) -> Trajectory:
    if not self.cfg.mask_concepts:
      return traj
    p = traj.prompt_len
    mask = traj.loss_mask.copy()
    mask[p:] *= R.concepts_mask(traj.tokens[p:], self.decode)
    return dataclasses.replace(traj, loss_mask=mask)

  # ---------------------------------------------------------------------------- the step
  def start_pool(self) -> dict[str, float]:
    """The pool training starts from: the seed alone, a file's problems, or `initial_pool.size`
    problems generated and rated by the policy (the released bootstrap), before step 0."""
    init, counts, problems = self.cfg.initial_pool, {}, []
    if init.file == bootstrap.WORLD:
      problems = bootstrap.from_world(self.rt.config.world.seed, init.size or bootstrap.WORLD_SIZE,
                                      self.rt.config.world.get("heldout_entities", False))
    elif init.file:
      problems = bootstrap.load(init.file)
    elif init.size:
      problems, counts = bootstrap.generate(self, init.size)
    if problems:
      texts = [p.text for p in problems]
      self.pool = Pool(self.encoder.dim)
      self.pool.add(texts, [list(p.concepts) for p in problems], self.embed(texts))
    self.started = True
    return {"pool/initial_size": float(len(self.pool)),
            **{f"pool/bootstrap/{k}": v for k, v in counts.items()}}

  def step(self, step: int) -> dict[str, float]:
    start = self.start_pool() if not self.started else {}
    cands = self.generate_problems()
    self.solve(cands)
    new_ND = self.score(cands)
    trajs, advs, groups, problems = self.select(cands)
    self.rt.metrics.samples(step, report.sample_records(cands))
    metrics = report.step_metrics(cands, groups, problems, self.checker.counters)
    metrics.update(start)
    metrics.update(self.rt.train("policy", trajs, advs))
    legal = [c for c in cands if c.problem is not None]
    self.pool.add([c.problem.text for c in legal], [c.problem.concepts for c in legal], new_ND)
    metrics["pool/size"] = float(len(self.pool))
    metrics["pool/distinct_concepts"] = float(self.pool.distinct_concepts())
    if not legal:
      logging.info("Step %d: no legal problem; the teacher trains on format alone.", step)
    return metrics

  # ---------------------------------------------------------------------------- state
  def host_state(self) -> dict:
    return {"pool": self.pool.to_json(), "pool_embeddings": self.pool.embeddings,
            "rng": self.rng.bit_generator.state, "started": self.started}

  def load_host_state(self, state: dict) -> None:
    pool = Pool.from_json(state["pool"], state.get("pool_embeddings"))
    if pool.embeddings.shape[1] != self.encoder.dim:
      raise ValueError(f"The checkpoint's pool embeddings have dimension "
                       f"{pool.embeddings.shape[1]}, but opensir.encoder={self.cfg.encoder!r} "
                       f"gives {self.encoder.dim}; resume with the run's encoder.")
    self.pool = pool
    self.rng.bit_generator.state = state["rng"]
    self.started = bool(state.get("started", True))  # earlier checkpoints had no bootstrap

  def summary(self) -> str:
    return report.summary(self.pool)


METHOD = OpenSir


def make_method(rt: Runtime) -> OpenSir:
  return OpenSir(rt)
