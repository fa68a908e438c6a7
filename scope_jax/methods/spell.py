"""SPELL (Yang et al.): one policy plays questioner, responder and verifier over document clusters.

Per step, following Algorithm 1 (ALGORITHMS §1):
  sample clusters and task types → questioner proposes (q, a) from m new documents plus the
  cluster's history memory → format check (−1) → grounding filter without documents (−0.5) →
  G responder rollouts over the whole cluster → G verifier judgments per response (majority vote)
  → rewards → push solvable questions to the history memory → role-specific dynamic sampling →
  per-role advantages → one unified policy update.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from scope_jax import metrics as metrics_lib
from scope_jax import prompts
from scope_jax.data import clusters as clusters_lib
from scope_jax.methods.common import Method, Runtime
from scope_jax.rewards import match
from scope_jax.rewards import spell as R
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
  def __init__(self, rt: Runtime):
    super().__init__(rt)
    self.cfg = rt.config.spell
    self.policy = rt.add_policy("policy")
    self.passages, self.clusters = build_clusters(rt.config)
    self.by_id = {p.id: p for p in self.passages}
    self.tasks_of = [clusters_lib.cluster_tasks([self.passages[i] for i in c], self.cfg.tasks)
                     for c in self.clusters]
    self.memory = clusters_lib.HistoryMemory(self.cfg.history_size)
    self.rng = np.random.default_rng(rt.config.seed)

  # ------------------------------------------------------------------------------ prompts
  def _context(self, doc_ids) -> str:
    limit = self.cfg.max_doc_chars
    docs = [self.by_id[d] for d in doc_ids]
    return "\n\n".join(f"{p.title}\n{p.text[:limit]}" for p in docs)

  def questioner_prompt(self, cluster: int, task: str, new_ids: list[str]) -> tuple[str, list[str]]:
    history = self.memory.get(str(cluster))
    fields: dict[str, Any] = {}
    if history:
      doc_ids = self.memory.context_doc_ids(str(cluster), new_ids)
      name = f"questioner_{task}_history"
      fields["examples"] = "\n".join(
          f"### Example {i}:\nQuestion: {e.question}\nAnswer: {e.answer}"
          for i, e in enumerate(history, 1))
    else:
      doc_ids, name = list(new_ids), f"questioner_{task}"
    if task == "doc_mc":
      fields["correct_letter"] = "ABCD"[int(self.rng.integers(4))]
    text = prompts.render(prompts.load("spell", name), context=self._context(doc_ids), **fields)
    return text, doc_ids

  def responder_prompt(self, task: str, proposal: R.Proposal, context: str) -> str:
    fields = {"context": context, "question": proposal.question}
    if task == "doc_mc":
      fields.update({f"choice_{k}": v for k, v in proposal.options.items()})
    return prompts.render(prompts.load("spell", f"responder_{task}"), **fields)

  def verifier_prompt(self, proposal: R.Proposal, response: Trajectory) -> str:
    text = response.response_text()
    answer = match.extract_final_answer(text) or text[-300:]
    return prompts.render(prompts.load("spell", "verifier"), problem=proposal.display(),
                          answer_1=proposal.answer, answer_2=answer)

  # ------------------------------------------------------------------------------- rollouts
  def _generate(self, texts, role: str, num_samples: int, seed: int) -> list[Trajectory]:
    rt = self.rt
    convs = [[{"role": "user", "content": t}] for t in texts]
    return rt.rollout(self.policy.sampler, rt.chat_prompts(convs), self.cfg.roles[role],
                      num_samples=num_samples, seed=seed)

  def propose(self, step: int, round_: int, n: int) -> list[Question]:
    picks = []
    for _ in range(n):
      c = int(self.rng.integers(len(self.clusters)))
      task = self.tasks_of[c][int(self.rng.integers(len(self.tasks_of[c])))]
      members = self.clusters[c]
      m = min(self.cfg.docs_per_question, len(members))
      new_ids = [self.passages[i].id for i in self.rng.choice(members, m, replace=False)]
      text, _ = self.questioner_prompt(c, task, new_ids)
      picks.append((c, task, new_ids, text))
    trajs = self._generate([p[3] for p in picks], "questioner", 1, _seed(step, round_, 0))
    out = []
    for (c, task, new_ids, _), traj in zip(picks, trajs):
      q = Question(c, task, new_ids, traj)
      q.proposal = R.parse_proposal(traj.response_text(), task)
      if q.proposal is None:
        q.status, q.reward = "bad_format", R.BAD_FORMAT
      out.append(q)
    return out

  def grounding_filter(self, questions: list[Question], seed: int) -> None:
    live = [q for q in questions if q.status == "ok"]
    if not live:
      return
    texts = [self.responder_prompt(q.task, q.proposal, "Empty") for q in live]
    for q, t in zip(live, self._generate(texts, "responder", 1, seed)):
      if R.rule_score(t.response_text(), q.proposal.answer, q.task) >= 1.0:
        q.status, q.reward = "ungrounded", R.UNGROUNDED

  def respond_and_verify(self, questions: list[Question], seed: int) -> None:
    live = [q for q in questions if q.status == "ok"]
    if not live:
      return
    g = self.cfg.group_size
    texts = [self.responder_prompt(q.task, q.proposal,
                                   self._context([self.passages[i].id for i in self.clusters[q.cluster]]))
             for q in live]
    responses = self._generate(texts, "responder", g, seed)
    for k, q in enumerate(live):
      q.responses = responses[k * g:(k + 1) * g]
      q.rule = [R.rule_score(t.response_text(), q.proposal.answer, q.task) for t in q.responses]
    ver_texts = [self.verifier_prompt(q.proposal, t) for q in live for t in q.responses]
    verdicts = self._generate(ver_texts, "verifier", g, seed + 1)
    for k, q in enumerate(live):
      for i in range(g):
        row = verdicts[(k * g + i) * g:(k * g + i + 1) * g]
        judged = [R.parse_verdict(t.response_text()) for t in row]
        vote = R.majority(judged)
        q.verdicts.append(row)
        q.votes.append(vote)
        q.ver_rewards.append(R.verifier_rewards(judged, vote))
      q.res_rewards = [R.responder_reward(r, v) for r, v in zip(q.rule, q.votes)]
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
    while sum(q.status in ("ok", "zero_variance") for q in questions) < cfg.questions_per_step \
        and rounds < cfg.max_generation_rounds:
      batch = self.propose(step, rounds, cfg.questions_per_step)
      self.grounding_filter(batch, _seed(step, rounds, 1))
      self.respond_and_verify(batch, _seed(step, rounds, 2))
      questions += batch
      rounds += 1
    trajs, advs, counts = self.select_and_advantage(questions)
    self.rt.metrics.samples(step, self.sample_records(questions))  # before the update
    metrics = self.step_metrics(questions, counts, rounds)
    train_metrics = self.rt.train(self.policy, trajs, advs)
    metrics.update({f"train/{k}": v for k, v in train_metrics.items()})
    return metrics

  def select_and_advantage(self, questions: list[Question]):
    """Role-specific dynamic sampling (§4.3) and per-role advantages for one unified update."""
    cfg = self.cfg
    trajs: list[Trajectory] = []
    advs: list[float] = []
    # Responder: groups with non-zero reward variance, z-scored within the group.
    kept = [q for q in questions if q.responses and np.std(q.res_rewards) > 0]
    for q in kept:
      trajs += q.responses
      advs += list(adv_lib.group_zscore([q.res_rewards], eps=cfg.adv_eps)[0])
    # Questioner: the kept questions are positives; an equal number of negatives (r_que ≤ 0).
    negatives = [q for q in questions if q.reward <= 0]
    n_neg = min(len(negatives), int(round(cfg.questioner_negative_ratio * len(kept))))
    picked = list(kept) + [negatives[i] for i in
                           self.rng.choice(len(negatives), n_neg, replace=False)] if n_neg else list(kept)
    if picked:
      rewards = [q.reward for q in picked]
      a = adv_lib.batch_zscore(rewards, keys=[q.task for q in picked], eps=cfg.adv_eps)
      trajs += [q.traj for q in picked]
      advs += list(a)
    # Verifier: groups whose agreement is in [lo, hi]; consistent with the rule check first,
    # conflicting ones subsampled to the number of questions.
    consistent, conflicting = [], []
    lo, hi = cfg.verifier_agreement
    for q in questions:
      for i, rewards in enumerate(q.ver_rewards):
        agree = float(np.mean([r == 1.0 for r in rewards]))
        if lo <= agree <= hi:
          (consistent if q.votes[i] == int(q.rule[i] >= 1.0) else conflicting).append((q, i))
    if len(conflicting) > len(questions):
      conflicting = [conflicting[j] for j in self.rng.choice(len(conflicting), len(questions),
                                                              replace=False)]
    for q, i in consistent + conflicting:
      trajs += q.verdicts[i]
      advs += list(adv_lib.group_zscore([q.ver_rewards[i]], eps=cfg.adv_eps)[0])
    counts = {"train/responder_groups": len(kept), "train/questioner_samples": len(picked),
              "train/verifier_groups": len(consistent) + len(conflicting)}
    return trajs, advs, counts

  # ----------------------------------------------------------------------- metrics and state
  def step_metrics(self, questions, counts, rounds) -> dict[str, float]:
    n = max(len(questions), 1)
    m: dict[str, float] = dict(counts)
    m["rounds"] = rounds
    m.update(metrics_lib.summarize([q.reward for q in questions], "questioner/reward"))
    for status in ("bad_format", "ungrounded", "zero_variance"):
      m[f"questioner/share_{status}"] = sum(q.status == status for q in questions) / n
    answered = [q for q in questions if q.res_rewards]
    m.update(metrics_lib.summarize([1 - np.mean(q.res_rewards) for q in answered],
                                   "questioner/difficulty"))
    m.update(metrics_lib.summarize([r for q in answered for r in q.res_rewards], "responder/reward"))
    m.update(metrics_lib.summarize([len(t.response_tokens) for q in answered for t in q.responses],
                                   "responder/length"))
    m.update(metrics_lib.summarize([len(q.traj.response_tokens) for q in questions],
                                   "questioner/length"))
    ver = [r for q in answered for rows in q.ver_rewards for r in rows]
    m.update(metrics_lib.summarize(ver, "verifier/reward"))
    if ver:
      m["verifier/agreement"] = float(np.mean([r == 1.0 for r in ver]))
      m["verifier/share_invalid"] = float(np.mean([r < 0 for r in ver]))
    secs = self.rt.counters.get("rollout_seconds", 0.0)
    if secs:
      m["rollout/tokens_per_s"] = self.rt.counters["rollout_tokens"] / secs
    m["memory/clusters_with_history"] = len(self.memory.to_json())
    return m

  def sample_records(self, questions, k: int = 2) -> list[dict]:
    out = []
    for q in questions[:k]:
      rec = {"task": q.task, "status": q.status, "questioner reward": f"{q.reward:.3f}",
             "questioner output": q.traj.response_text()[-1500:]}
      if q.responses:
        rec["responses (reward)"] = "\n---\n".join(
            f"({r:.2f}) {t.response_text()[-400:]}" for t, r in zip(q.responses[:3], q.res_rewards))
        rec["verdicts"] = "\n---\n".join(t.response_text()[-200:] for t in q.verdicts[0][:3])
      out.append(rec)
    return out

  def host_state(self) -> dict:
    return {"memory": self.memory.to_json(), "rng": self.rng.bit_generator.state}

  def load_host_state(self, state: dict) -> None:
    self.memory = clusters_lib.HistoryMemory.from_json(self.cfg.history_size, state["memory"])
    self.rng.bit_generator.state = state["rng"]

  def summary(self) -> str:
    return f"  history memory: {len(self.memory.to_json())} clusters with solvable questions"


def _seed(step: int, round_: int, phase: int) -> int:
  return (step * 1009 + round_ * 101 + phase * 7) % (2**31)


def build_clusters(config):
  """The corpus (bundled demo corpus by default) and its document clusters."""
  from scope_jax.data import demo
  from scope_jax.retrieval import load_corpus, load_encoder
  data = config.data
  passages = demo.demo_passages() if data.corpus == "demo" else load_corpus(data.corpus)
  if data.max_passages:
    passages = passages[:data.max_passages]
  if len(passages) < data.num_clusters * data.min_cluster_size:
    raise ValueError(f"The corpus has {len(passages)} passages, too few for {data.num_clusters} "
                     f"clusters of at least {data.min_cluster_size}.")
  vectors = None
  if data.corpus == "demo" and data.encoder == "minilm":
    vectors = demo.bundled_vectors()[:len(passages)]  # shipped with the corpus: no encoder needed
  if vectors is None:
    vectors = load_encoder(data.encoder).encode([f"{p.title}. {p.text}" for p in passages])
  groups = clusters_lib.kmeans_clusters(vectors, data.num_clusters, seed=config.seed,
                                        min_size=data.min_cluster_size)
  cap = data.max_cluster_size
  return passages, [g[:cap] for g in groups]


def validate_config(c) -> None:
  """SPELL-specific choices, checked before anything is loaded."""
  from scope_jax.methods.common import check_choice
  from scope_jax.rewards.difficulty import MAPPINGS
  for t in c.spell.tasks:
    check_choice("spell.tasks", t, R.TASKS)
  check_choice("spell.reward_mapping", c.spell.reward_mapping, MAPPINGS)
  for name in ("questioner", "responder", "verifier"):
    if name not in c.spell.roles:
      raise ValueError(f"spell.roles needs a '{name}' entry (sampling settings).")


def make_method(rt: Runtime) -> Spell:
  return Spell(rt)
