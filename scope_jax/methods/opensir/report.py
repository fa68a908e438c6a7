"""What an OpenSIR step says: the teacher's, students' and update's metrics, the sample records of
samples.log, and the run's closing summary."""

from __future__ import annotations

import numpy as np

from scope_jax import metrics as metrics_lib
from scope_jax.methods.opensir import rewards as R


def step_metrics(cands, groups, problems, checker_counters) -> dict[str, float]:
  """The teacher's problems and rewards, the students' votes, and the rows trained on."""
  legal = [c for c in cands if c.problem is not None]
  rated = [c for c in legal if c.rate is not None]
  m: dict[str, float] = {"teacher/problems": float(len(cands)),
                         "teacher/legal_rate": len(legal) / max(len(cands), 1),
                         "student/rated_problems": float(len(rated))}
  m.update(metrics_lib.summarize([c.reward for c in cands], "teacher/reward"))
  m.update(metrics_lib.summarize([c.fmt for c in cands], "teacher/format"))
  for part in ("solv", "div", "length"):
    m.update(metrics_lib.summarize([getattr(c, part) or 0.0 for c in legal],
                                   f"teacher/{part}"))
  m.update(metrics_lib.summarize([c.rate for c in rated], "student/solve_rate"))
  edges = np.linspace(0.0, 1.0, 6)
  hist, _ = np.histogram([c.rate for c in rated], bins=edges)
  for lo, hi, count in zip(edges[:-1], edges[1:], hist):
    m[f"student/solve_rate_hist/{lo:.1f}-{hi:.1f}"] = float(count)
  rewards = [r for c in legal for r in c.student_rewards]
  m.update(metrics_lib.summarize(rewards, "student/reward"))
  agree = [a is not None and a == c.majority for c in legal for a in c.answers]
  m["student/accuracy"] = float(np.mean(agree)) if agree else 0.0  # vs the majority answer
  answers = [a for c in legal for a in c.answers]
  m["student/valid_answer_rate"] = float(np.mean([a is not None for a in answers])) \
      if answers else 0.0
  texts = [t.response_text() for c in legal for t in c.solutions]
  m["student/format"] = float(np.mean([R.student_format(t) for t in texts])) if texts else 0.0
  m["train/teacher_rows"] = float(sum(len(g) for g in groups))
  m["train/student_rows"] = float(sum(len(p.solutions) for p in problems))
  m.update(metrics_lib.summarize([c.c for g in groups for c in g if c.c is not None],
                                 "train/teacher_c"))
  m.update(metrics_lib.summarize([p.c for p in problems], "train/student_c"))
  for key, value in checker_counters.items():
    m[f"mathcheck/{key}"] = float(value)
  return m

def sample_records(cands, k: int = 4) -> list[dict]:
  legal = sorted((c for c in cands if c.problem is not None),
                 key=lambda c: -(c.rate if c.rate is not None else -1))
  out = []
  for c in (legal or cands)[:k]:
    rec = {"reference": c.reference, "teacher reward": f"{c.reward:.3f}",
           "teacher output": c.traj.response_text()[-1500:]}
    if c.problem is not None:
      rec.update({"problem": c.problem.text, "concepts": ", ".join(c.problem.concepts),
                  "majority answer": str(c.majority),
                  "solve rate": "none valid" if c.rate is None else f"{c.rate:.3f}",
                  "solv / div / length": f"{c.solv or 0:.3f} / {c.div or 0:.3f} / "
                                         f"{c.length:.3f}",
                  "solutions (answer)": "\n---\n".join(
                      f"({a}) {t.response_text()[-300:]}"
                      for t, a in zip(c.solutions[:3], c.answers))})
    out.append(rec)
  return out


def summary(pool) -> str:
  return f"  problem pool: {len(pool)} problems, {pool.distinct_concepts()} distinct concepts"
