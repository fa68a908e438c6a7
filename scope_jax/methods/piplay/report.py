"""What a π-Play step says: the examiner's, student's, teacher's and data set's metrics, the sample
records of samples.log, and the run's closing summary."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from scope_jax import metrics as metrics_lib

MALFORMED = ("no_question", "no_answer", "answer_in_question", "parse_error")


def examiner_metrics(qs) -> dict[str, float]:
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


def student_metrics(trajs, rewards, lam: float) -> dict[str, float]:
  m = metrics_lib.summarize(rewards, "student/outcome")
  m.update(metrics_lib.summarize([t.num_searches for t in trajs], "student/searches"))
  m.update(metrics_lib.summarize([len(t.response_tokens) for t in trajs], "student/length"))
  m["student/answered"] = float(np.mean([t.final("answer") is not None for t in trajs]))
  m["student/lambda"] = lam
  return m


def data_metrics(cands, records: Sequence[dict], hop_choices) -> dict[str, float]:
  m = {"data/valid_rate": sum(q.valid for q in cands) / max(len(cands), 1)}
  for h in hop_choices:
    m[f"data/hops_{h}"] = sum(r["hops"] == h for r in records)
  return m


def examiner_record(q) -> dict:
  return {"stage": "examiner", "document": f"{q.doc.id} {q.doc.title}", "hops": q.hops,
          "searches": [c.queries for c in q.traj.tool_calls],
          "examiner output (QCP)": q.traj.response_text()[-1500:],
          "question": q.out.question, "answer": q.out.answer, "malformed": q.out.malformed,
          "format": {k: round(v, 3) for k, v in q.parts.items()},
          "student attempts (EM)": q.attempts, "reward": round(q.reward, 3)}


def teacher_records(picked: Sequence[dict], trajs, answers, n: int) -> list[dict]:
  """The first two questions: the student's and the teacher's answers, what the teacher saw."""
  records = []
  for i, rec in enumerate(picked[:2]):
    s = next(t for t in trajs if t.prompt_index == i)
    records.append({"stage": "student", "question": rec["question"], "gold": rec["answer"],
                    "hops": rec["hops"], "teacher sees": rec["privileged"][-1500:],
                    "student": s.response_text()[-800:],
                    "student answer": s.final("answer"),
                    "teacher answer": answers[i * n].final("answer")})
  return records


def summary(examples: Sequence[dict]) -> list[str]:
  lines = []
  for ex in examples[:3]:
    lines.append(f"  [{ex['hops']} hop] {ex['question']!r} → {ex['gold']!r}; student "
                 f"{ex['student answer']!r}, teacher {ex['teacher answer']!r}")
    lines.append("    QCP: " + " ".join(ex["teacher sees"].split())[-300:])
  return lines
