"""What a SPELL step says: the questioner's, responder's, verifier's and update's metrics, the
sample records of samples.log, and the run's closing summary."""

from __future__ import annotations

import numpy as np

from scope_jax import metrics as metrics_lib


def step_metrics(questions, counts: dict, rounds: int, memory) -> dict[str, float]:
  n = max(len(questions), 1)
  m: dict[str, float] = dict(counts)
  m["rounds"] = rounds
  m["questioner/proposals"] = len(questions)
  m["questioner/parsed"] = sum(q.proposal is not None for q in questions)
  m["questioner/grounded"] = sum(q.status in ("ok", "zero_variance") for q in questions)
  m.update(metrics_lib.summarize([q.reward for q in questions], "questioner/reward"))
  for status in ("bad_format", "ungrounded", "zero_variance"):
    m[f"questioner/share_{status}"] = sum(q.status == status for q in questions) / n
  answered = [q for q in questions if q.res_rewards]
  m["responder/groups"] = len(answered)
  m.update(metrics_lib.summarize([1 - np.mean(q.res_rewards) for q in answered],
                                 "questioner/difficulty"))
  m.update(metrics_lib.summarize([r for q in answered for r in q.res_rewards], "responder/reward"))
  m.update(metrics_lib.summarize([r for q in answered for r in q.rule], "responder/rule"))
  ver = [r for q in answered for rows in q.ver_rewards for r in rows]
  m["verifier/votes"] = sum(bool(r) for q in answered for r in q.ver_rewards)
  m["verifier/skipped_unanswered"] = sum(not r for q in answered for r in q.ver_rewards)
  m.update(metrics_lib.summarize(ver, "verifier/reward"))
  if ver:
    m["verifier/agreement"] = float(np.mean([r == 1.0 for r in ver]))
    m["verifier/share_invalid"] = float(np.mean([r < 0 for r in ver]))
    m["verifier/share_yes_votes"] = float(np.mean([v for q in answered
                                                   for v, r in zip(q.votes, q.ver_rewards) if r]))
  m["memory/clusters_with_history"] = len(memory.to_json())
  return m


def sample_records(questions, k: int = 2) -> list[dict]:
  out = []
  for q in questions[:k]:
    rec = {"task": q.task, "status": q.status, "questioner reward": f"{q.reward:.3f}",
           "questioner output": q.traj.response_text()[-1500:]}
    if q.responses:
      rec["responses (reward)"] = "\n---\n".join(
          f"({r:.2f}) {t.response_text()[-400:]}" for t, r in zip(q.responses[:3], q.res_rewards))
      rec["verdicts"] = "\n---\n".join(t.response_text()[-200:] for t in
                                        next((v for v in q.verdicts if v), [])[:3])
    out.append(rec)
  return out


def summary(memory) -> str:
  return f"  history memory: {len(memory.to_json())} clusters with solvable questions"
