"""SPELL (Yang et al.): one policy plays questioner, responder and verifier over document clusters.

Per step, following Algorithm 1 (ALGORITHMS §1):
  draw task types uniformly and a cluster that supports each → the questioner proposes (q, a) from
  m new documents plus the cluster's history memory → format check (−1) → grounding filter
  without documents (−0.5) → G responder rollouts over the whole cluster → G verifier judgments
  per response (majority vote) → rewards → push solvable questions to the history memory →
  role-specific dynamic sampling → per-role advantages → one unified policy update.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from scope_jax import rollout
from scope_jax.core.method import Method, Players, PolicyPlan, RolePlan
from scope_jax.core.runtime import Runtime
from scope_jax.methods.spell import bounds as spell_bounds
from scope_jax.methods.spell import clusters as clusters_lib
from scope_jax.methods.spell import demos as spell_demos
from scope_jax.methods.spell import prompts as P
from scope_jax.methods.spell import report
from scope_jax.methods.spell import rewards as R
from scope_jax.methods.spell.difficulty import MAPPINGS
from scope_jax.methods.spell.prompts import STYLES, split_document_question
from scope_jax.rewards import match
from scope_jax.rl import advantages as adv_lib
from scope_jax.rollout.types import Trajectory


@dataclasses.dataclass
class Question:
  """One questioner sample and everything that follows from it."""

  cluster: int
  task: str
  doc_ids: list[str]  # C_new
  traj: Trajectory
  proposal: R.Proposal | None = None
  reward: float = 0.0
  status: str = "ok"  # ok | bad_format | ungrounded | zero_variance
  responses: list[Trajectory] = dataclasses.field(default_factory=list)
  rule: list[float] = dataclasses.field(default_factory=list)
  votes: list[int] = dataclasses.field(default_factory=list)
  res_rewards: list[float] = dataclasses.field(default_factory=list)
  verdicts: list[list[Trajectory]] = dataclasses.field(default_factory=list)
  ver_rewards: list[list[float]] = dataclasses.field(default_factory=list)


class Spell(Method):
  name = "spell"
  bounds, section_bound = spell_bounds.RULES, spell_bounds.SECTION  # ranges: core/bounds.py
  answering_role = "responder"  # held-out evaluation scores it (config.eval)
  world_demonstrations = True  # warmup.world_seed: demonstrations from other worlds
  at_least_one = ("questions_per_step", "group_size", "docs_per_question", "max_generation_rounds")
  choices = {"tasks": R.TASKS, "reward_mapping": MAPPINGS, "prompt_style": tuple(STYLES),
             "verifier_selection": R.VERIFIER_SELECTIONS, "fill_rule": ("grounded", "variance"),
             "adv_std": adv_lib.STD_KINDS}
  # G = 4 in a smoke run: the verifier trains on groups whose agreement is in (0.5, 1), which
  # two votes never have.
  smoke = {"total_steps": 1, "spell.questions_per_step": 2, "spell.group_size": 4,
           "spell.max_generation_rounds": 1, "spell.generation_batch": 0,
           "spell.docs_per_question": 2, "data.max_cluster_size": 3}

  @classmethod
  def players(cls, c) -> Players:
    """One policy plays every role; an update holds at most N questions, N·G responses and the
    G judgments of each response."""
    s = c.spell
    return Players({"policy": PolicyPlan(s.questions_per_step * (1 + s.group_size
                                                                 + s.group_size ** 2))},
                   roles={r: RolePlan("policy") for r in ("questioner", "responder", "verifier")})

  @classmethod
  def check(cls, c) -> None:
    spell_demos.check_warmup(c)
    if not c.data.num_clusters and c.data.cluster_size < 1:
      raise ValueError("Set data.num_clusters or a positive data.cluster_size.")
    if not 0 <= c.spell.verifier_update_ratio <= 1:
      raise ValueError(f"spell.verifier_update_ratio={c.spell.verifier_update_ratio} must be in "
                       "[0, 1]: verifier rows per responder row (the released 0.125 = 1/G).")
    lo, hi = c.spell.verifier_agreement
    if not 0 < lo < hi < 1:
      raise ValueError(f"spell.verifier_agreement={tuple(c.spell.verifier_agreement)} must be "
                       "(low, high) with 0 < low < high < 1: a question is kept when the "
                       "verifiers' agreement falls between them, e.g. (0.51, 0.99).")

  def __init__(self, rt: Runtime):
    super().__init__(rt, P.Prompts(rt.config.spell.prompt_style))
    cfg = self.cfg
    self.passages, self.clusters = clusters_lib.from_config(rt.config.data, rt.config.seed,
                                                            rt.config.world.seed,
                                                            rt.config.world.corpus_seeds,
                                                            rt.config.world.get(
                                                                "heldout_entities", False))
    self.by_id = {p.id: p for p in self.passages}
    tasks_of = [clusters_lib.cluster_tasks([self.passages[i] for i in c], cfg.tasks)
                for c in self.clusters]
    self.clusters_for = {t: [c for c, ts in enumerate(tasks_of) if t in ts] for t in cfg.tasks}
    self.tasks = tuple(t for t in cfg.tasks if self.clusters_for[t])
    if not self.tasks:
      raise ValueError(f"No document cluster supports any of spell.tasks={tuple(cfg.tasks)} "
                       "(doc_math needs clusters of mostly numeric documents); add doc_qa or doc_mc.")
    self.memory = clusters_lib.HistoryMemory(cfg.history_size)
    self.rng = np.random.default_rng(rt.config.seed)

  def demonstrations(self, rng):
    return spell_demos.demonstrations(self, rng)

  def answer_prompt(self, question: str, kind: str):
    """A held-out document question ('qa', written "Document: <documents>\nQuestion: <q>" as
    the world's `doc` set writes it) in the responder's doc_qa prompt, the documents as its
    context; None for anything else (the responder is only ever asked about documents)."""
    split = split_document_question(question) if kind == "qa" else None
    if split is None:
      return None
    context, text = split
    return self.responder_prompt("doc_qa", R.Proposal(text, ""), context)

  # ------------------------------------------------------------------------------ prompts
  def context(self, doc_ids) -> str:
    return clusters_lib.render_context([self.by_id[d] for d in doc_ids], self.cfg.max_doc_chars)

  def questioner_prompt(self, cluster: int, task: str, new_ids: list[str]) -> list[int]:
    """Over the new documents, or, when the cluster has history, over the history's documents
    too with its questions as examples."""
    history = self.memory.get(str(cluster))
    doc_ids = self.memory.context_doc_ids(str(cluster), new_ids) if history else list(new_ids)
    letter = "ABCD"[int(self.rng.integers(4))] if task == "doc_mc" else None
    return self.roles["questioner"].prompt(
        self.prompts.questioner(task, self.context(doc_ids), history, letter))

  def responder_prompt(self, task: str, proposal: R.Proposal, context: str) -> list[int]:
    return self.roles["responder"].prompt(self.prompts.responder(task, proposal, context))

  def verifier_prompt(self, proposal: R.Proposal, response: Trajectory) -> list[int] | None:
    """The verifier's prompt for one response, or None when the response states no final answer
    and `spell.verify_unanswered` is off (the released trainer then skips verification and the
    response keeps its rule score); on, the verifier judges the response's last 300 characters."""
    text = rollout.plain_response(self.rt.tokenizer, response)  # the answer, never its <|im_end|>
    answer = match.extract_final_answer(text)
    if answer is None:
      if not self.cfg.verify_unanswered:
        return None
      answer = text[-300:]
    return self.roles["verifier"].prompt(
        self.prompts.verifier(proposal.display(), proposal.answer, answer))

  # ------------------------------------------------------------------------------ phases
  def propose(self, n: int) -> list[Question]:
    """n questions: task types uniform over those some cluster supports, then a cluster."""
    picks = []
    for _ in range(n):
      task = self.tasks[int(self.rng.integers(len(self.tasks)))]
      options = self.clusters_for[task]
      c = options[int(self.rng.integers(len(options)))]
      members = self.clusters[c]
      m = min(self.cfg.docs_per_question, len(members))
      new_ids = [self.passages[i].id for i in self.rng.choice(members, m, replace=False)]
      picks.append((c, task, new_ids, self.questioner_prompt(c, task, new_ids)))
    trajs = self.roles["questioner"].generate([p[3] for p in picks])
    out = []
    for (c, task, new_ids, _), traj in zip(picks, trajs):
      q = Question(c, task, new_ids, traj)
      q.proposal = self.guard(R.parse_proposal, traj.response_text(), task, malformed=None)
      if q.proposal is None:
        q.status, q.reward = "bad_format", R.BAD_FORMAT
      out.append(q)
    return out

  def grounding_filter(self, questions: list[Question]) -> None:
    """A question the responder answers without any document is not grounded (−0.5); with
    `spell.extractive_labels`, neither is a `doc_qa` answer that no document of its cluster
    states (the questioner's label must be read, not made up)."""
    for q in questions:
      if (self.cfg.get("extractive_labels", False) and q.status == "ok" and q.task == "doc_qa"
          and not any(match.contains_phrase(self.passages[i].text, q.proposal.answer)
                      for i in self.clusters[q.cluster])):
        q.status, q.reward = "ungrounded", R.UNGROUNDED
    live = [q for q in questions if q.status == "ok"]
    texts = self.roles["responder"].texts([self.responder_prompt(q.task, q.proposal, "Empty")
                                  for q in live])
    for q, text in zip(live, texts):
      if self.guard(R.rule_score, text, q.proposal.answer, q.task, malformed=0.0) >= 1.0:
        q.status, q.reward = "ungrounded", R.UNGROUNDED

  def respond_and_verify(self, questions: list[Question]) -> None:
    live = [q for q in questions if q.status == "ok"]
    if not live:
      return
    g = self.cfg.group_size
    cluster_ids = lambda q: [self.passages[i].id for i in self.clusters[q.cluster]]
    responses = self.roles["responder"].generate(
        [self.responder_prompt(q.task, q.proposal, self.context(cluster_ids(q))) for q in live],
        num_samples=g)
    for k, q in enumerate(live):
      q.responses = responses[k * g:(k + 1) * g]
      q.rule = [self.guard(R.rule_score, t.response_text(), q.proposal.answer, q.task,
                           malformed=0.0) for t in q.responses]
    prompts = [self.verifier_prompt(q.proposal, t) for q in live for t in q.responses]
    asked = [p for p in prompts if p is not None]
    generated = iter(self.roles["verifier"].generate(asked, num_samples=g) if asked else [])
    for k, q in enumerate(live):
      for i in range(g):
        if prompts[k * g + i] is None:  # no answer to judge: no vote, no verifier group
          q.verdicts.append([])
          q.votes.append(0)
          q.ver_rewards.append([])
          continue
        row = [next(generated) for _ in range(g)]
        judged = [self.guard(R.parse_verdict, t.response_text(), malformed=None) for t in row]
        vote = R.majority(judged)
        q.verdicts.append(row)
        q.votes.append(vote)
        q.ver_rewards.append(R.verifier_rewards(judged, vote))
      q.res_rewards = [R.responder_reward(r, v if self.cfg.vote_in_reward else 0)
                       for r, v in zip(q.rule, q.votes)]
      q.reward = R.questioner_reward(q.res_rewards, self.cfg.reward_mapping)
      if len(set(q.res_rewards)) == 1:
        q.status = "zero_variance"
      if q.reward > 0:
        self.memory.push(str(q.cluster), clusters_lib.HistoryEntry(
            q.doc_ids, q.proposal.display(), q.proposal.answer))

  # ---------------------------------------------------------------------------- the step
  def step(self, step: int) -> dict[str, float]:
    cfg = self.cfg
    questions: list[Question] = []
    rounds = 0
    while self.filled(questions) < cfg.questions_per_step and rounds < cfg.max_generation_rounds:
      batch = self.propose(cfg.generation_batch or cfg.questions_per_step)
      self.grounding_filter(batch)
      self.respond_and_verify(batch)
      questions += batch
      rounds += 1
    short = max(cfg.questions_per_step - self.filled(questions), 0)
    if short and cfg.fill_rule == "variance":
      logging.warning("Step %d: %d of %d responder groups with reward variance after %d rounds "
                      "of %d questions; the update is short (raise spell.max_generation_rounds "
                      "or spell.generation_batch).", step, cfg.questions_per_step - short,
                      cfg.questions_per_step, rounds, cfg.generation_batch or
                      cfg.questions_per_step)
    trajs, advs, counts = self.select_and_advantage(questions)
    self.rt.metrics.samples(step, report.sample_records(questions))  # before the update
    metrics = report.step_metrics(questions, counts, rounds, self.memory)
    metrics["fill_shortfall"] = float(short)
    metrics.update(self.rt.train("policy", trajs, advs))
    if not trajs:
      logging.info("Step %d: no group had reward variance; no update.", step)
    return metrics

  def filled(self, questions: list[Question]) -> int:
    """How far a step's batch is filled: grounded questions ('grounded', the paper's N
    questions), or responder groups with reward variance ('variance', the released trainer's
    stop rule)."""
    if self.cfg.fill_rule == "variance":
      return sum(_has_variance(q) for q in questions)
    return sum(q.status in ("ok", "zero_variance") for q in questions)

  def select_and_advantage(self, questions: list[Question]):
    """Role-specific dynamic sampling (§4.3) and per-role advantages for one unified update."""
    cfg = self.cfg
    trajs: list[Trajectory] = []
    advs: list[float] = []
    # Responder: groups with non-zero reward variance, z-scored within the group.
    kept = [q for q in questions if _has_variance(q)]
    if cfg.fill_rule == "variance":
      kept = kept[:cfg.questions_per_step]  # the released trainer cuts to exactly N × G rows
    for q in kept:
      trajs += q.responses
      advs += list(adv_lib.group_zscore([q.res_rewards], std=cfg.adv_std, eps=cfg.adv_eps)[0])
    # Questioner: the kept questions are positives; an equal number of negatives (r_que ≤ 0).
    negatives = [q for q in questions if q.reward <= 0]
    n_neg = min(len(negatives), int(round(cfg.questioner_negative_ratio * len(kept))))
    picked = list(kept) + [negatives[i] for i in
                           self.rng.choice(len(negatives), n_neg, replace=False)] if n_neg else list(kept)
    if picked:
      a = adv_lib.batch_zscore([q.reward for q in picked], keys=[q.task for q in picked],
                               std=cfg.adv_std,
                               eps=cfg.adv_eps)
      trajs += [q.traj for q in picked]
      advs += list(a)
    # Verifier: groups whose agreement is in [lo, hi] (§4.3), chosen by `verifier_selection`.
    groups = [(q, i, q.votes[i] == int(q.rule[i] >= 1.0), rewards)
              for q in questions for i, rewards in enumerate(q.ver_rewards) if rewards]
    if cfg.verifier_selection == "released":
      chosen, candidates = R.released_verifier_groups(
          [(c, r) for _, _, c, r in groups], len(kept) * cfg.group_size,
          cfg.verifier_update_ratio, cfg.group_size, cfg.verifier_agreement, self.rng)
      consistent, conflicting = [groups[j][:2] for j in chosen], []
    else:
      consistent, conflicting = [], []
      lo, hi = cfg.verifier_agreement
      for q, i, agrees_with_rule, rewards in groups:
        if lo <= float(np.mean([r == 1.0 for r in rewards])) <= hi:
          (consistent if agrees_with_rule else conflicting).append((q, i))
      candidates = len(consistent) + len(conflicting)
      if len(conflicting) > len(questions):
        conflicting = [conflicting[j] for j in self.rng.choice(len(conflicting), len(questions),
                                                                replace=False)]
    for q, i in consistent + conflicting:
      trajs += q.verdicts[i]
      advs += list(adv_lib.group_zscore([q.ver_rewards[i]], std=cfg.adv_std,
                                        eps=cfg.adv_eps)[0])
    counts = {"train/responder_groups": len(kept), "train/questioner_samples": len(picked),
              "train/verifier_groups": len(consistent) + len(conflicting),
              "train/verifier_candidates": candidates}
    return trajs, advs, counts

  # ---------------------------------------------------------------------------- state
  def host_state(self) -> dict:
    return {"memory": self.memory.to_json(), "rng": self.rng.bit_generator.state}

  def load_host_state(self, state: dict) -> None:
    self.memory = clusters_lib.HistoryMemory.from_json(self.cfg.history_size, state["memory"])
    self.rng.bit_generator.state = state["rng"]

  def summary(self) -> str:
    return report.summary(self.memory)


def _has_variance(q: Question) -> bool:
  return bool(q.responses) and float(np.std(q.res_rewards)) > 0


METHOD = Spell


def make_method(rt: Runtime) -> Spell:
  return Spell(rt)
