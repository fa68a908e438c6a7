"""What a SCOPE step says: the Challenger's, Solver's, task set's and Judge's metrics, the sample
records of samples.log, and the run's closing summary."""

from __future__ import annotations

import dataclasses
import json
from typing import Sequence

from scope_jax import metrics as metrics_lib
from scope_jax.methods.scope import rewards as R
from scope_jax.rollout.types import Trajectory

SOLVER_PARTS = ("reward", "rubric", "length_penalty", "format", "search", "answer_tokens",
                "searches", "answered")


@dataclasses.dataclass
class GradeStats:
  """Counters over one batch of gradings (malformed Judge output is counted, never raised)."""

  no_answer: int = 0
  discarded: int = 0  # fewer than half the criteria got a parsable verdict
  verdicts: int = 0
  malformed_verdicts: int = 0


def grade_metrics(stats: GradeStats, prefix: str) -> dict[str, float]:
  m = {f"{prefix}/no_answer": float(stats.no_answer), f"{prefix}/discarded": float(stats.discarded)}
  if stats.verdicts:
    m[f"{prefix}/share_malformed_verdicts"] = stats.malformed_verdicts / stats.verdicts
  return m


def challenger_metrics(cands, stats: GradeStats, retrievable: bool) -> dict[str, float]:
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
  if retrievable:
    m["challenger/share_found_source"] = (sum(bool(c.found_source) for c in asked)
                                          / max(len(asked), 1))
  m["challenger/share_gate_malformed"] = sum(c.gate_malformed for c in asked) / max(len(asked), 1)
  gated = [c for c in cands if c.gate]
  if gated:
    m["challenger/share_rubric_malformed"] = sum(c.criteria is None for c in gated) / len(gated)
  rolls = [t for c in cands for t in c.rollouts]
  m.update(metrics_lib.summarize([t.num_searches for t in rolls], "challenger/solver_searches"))
  m.update(grade_metrics(stats, "challenger/judge"))
  return m


def solver_metrics(trajs, parts, stats: GradeStats) -> dict[str, float]:
  m: dict[str, float] = {}
  for key in SOLVER_PARTS:
    m.update(metrics_lib.summarize([p[key] for p in parts], f"solver/{key}"))
  m.update(metrics_lib.summarize([len(t.response_tokens) for t in trajs], "solver/length"))
  m.update(grade_metrics(stats, "solver/judge"))
  return m


def task_set_metrics(cands, tasks: list[dict], retrievable: bool) -> dict[str, float]:
  n = max(len(cands), 1)
  m = {"taskset/share_gate_passed": sum(c.gate for c in cands) / n,
       "taskset/share_in_window": len(tasks) / n}
  if retrievable:
    m["taskset/share_found_source"] = sum(bool(c.found_source) for c in cands) / n
  m.update(metrics_lib.summarize([c.g_bar for c in cands if c.g_bar is not None], "taskset/g_bar"))
  m.update(metrics_lib.summarize([t["g_bar"] for t in tasks], "taskset/kept_g_bar"))
  return m


def record(stage: str, c) -> dict:
  """A Challenger sample (a candidate task) with the Judge's and Solver's verdicts on it."""
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


def solver_record(task: dict, traj: Trajectory, parts: dict) -> dict:
  return {"stage": "solver", "question": task["question"],
          "rubric": "\n".join(f"[{p}] {t}" for t, p in task["criteria"]),
          "searches": [call.queries for call in traj.tool_calls],
          "solver output": traj.response_text()[-1500:],
          "reward parts": json.dumps({k: round(float(v), 3) for k, v in parts.items()})}


def summary(examples: Sequence[dict]) -> list[str]:
  lines = []
  for ex in examples[:2]:
    lines.append(f"  task [{ex.get('task type')}] {ex.get('question')!r}")
    lines.append("    rubric: " + (ex.get("rubric") or "").replace("\n", " | "))
    lines.append(f"    grades: {ex.get('grades')} (ḡ {ex.get('g_bar')})")
  return lines
