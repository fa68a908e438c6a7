"""What an ASL step says: each phase's metrics, the stores' sizes, the sample records of
samples.log, and the run's closing summary."""

from __future__ import annotations

import json

import numpy as np

from scope_jax import metrics as metrics_lib
from scope_jax.methods.asl import rewards as R

MAX_SAMPLE_CHARS = 1500


def step_counts(counts: dict) -> dict[str, float]:
  """The GRM's verdicts this step (malformed ones too), unanswered PM rollouts, format bonus."""
  return {"grm/verdicts": float(counts.get("grm_verdicts", 0)),
          "grm/malformed": float(counts.get("grm_malformed", 0)),
          "pm/no_answer": float(counts.get("pm_no_answer", 0)),
          "format_bonus/mean": float(counts.get("format_bonus_sum", 0.0)
                                     / max(counts.get("format_bonus_n", 0), 1))}


def pg_metrics(props, metas: list[dict], counts: dict) -> dict[str, float]:
  n = len(props)
  formed = [p for p in props if p.task is not None]
  valid = [p for p in formed if p.valid]
  m = metrics_lib.summarize([p.reward for p in props], "pg/reward")
  m.update({"pg/proposals": float(n), "pg/well_formed": len(formed) / n,
            "pg/validity_rate": len(valid) / max(len(formed), 1),
            "pg/valid": float(len(valid)), "pg/new_pairs": float(sum(p.new for p in props)),
            "pg/meta_topic": float(sum("topic" in x for x in metas)),
            "pg/meta_harder": float(sum(x.get("flag") == R.HARDER for x in metas)),
            "pg/meta_easier": float(sum(x.get("flag") == R.EASIER for x in metas))})
  for err in R.PG_ERRORS + ("parse_error",):
    m[f"pg/malformed/{err}"] = float(sum(p.error == err for p in props))
  m.update(metrics_lib.summarize([R.mean_score(p.validity) for p in formed], "pg/validity_s"))
  m.update(metrics_lib.summarize([R.mean_score(p.scores) for p in props if p.scores],
                                 "pg/pm_accuracy"))
  edges = np.linspace(0.0, np.log(2.0) + 1e-9, 5)
  hist, _ = np.histogram([p.reward for p in props if p.scores], bins=edges)
  for i, count in enumerate(hist):
    m[f"pg/reward_hist/bin{i}"] = float(count)
  m["pg/dropped_pm"] = float(counts.get("dropped_pm", 0))
  return m


def grm_metrics(items: list[dict], trajs, rewards: np.ndarray) -> dict[str, float]:
  m = metrics_lib.summarize(rewards, "grm/reward")  # agreement: what the phase's end reads
  m["grm/agreement"] = float(rewards.mean())
  for label in (0, 1):
    rows = [r for t, r in zip(trajs, rewards) if items[t.prompt_index]["score"] == label]
    if rows:
      m[f"grm/agreement_on_{label}"] = float(np.mean(rows))
  real = [r for t, r in zip(trajs, rewards) if items[t.prompt_index].get("real")]
  if real:
    m["grm/agreement_real"] = float(np.mean(real))
  m["grm/items"] = float(len(items))
  return m


def pm_metrics(rewards: np.ndarray, flags: list[str]) -> dict[str, float]:
  m = metrics_lib.summarize(rewards.reshape(-1), "pm/reward")
  m["pm/accuracy"] = float(rewards.mean())  # as judged by the GRM
  m["pm/flags_harder"] = float(flags.count(R.HARDER))
  m["pm/flags_easier"] = float(flags.count(R.EASIER))
  return m


def store_metrics(asl) -> dict[str, float]:
  return {"store/d_pg": float(len(asl.d_pg)), "store/d_pg_next": float(len(asl.d_pg_next)),
          "store/d_pm": float(len(asl.d_pm)), "store/d_grm": float(len(asl.d_grm)),
          "store/pm_target": float(asl.pm_target())}


def shown(props, k: int = 3) -> list:
  """A few samples for samples.log: valid ones first, then well-formed, then the rest."""
  return sorted(props, key=lambda p: (not p.valid, p.task is None))[:k]


def pg_record(p) -> dict:
  rec = {"phase": "pg", "meta prompt": json.dumps(p.meta, ensure_ascii=False),
         "searches": [c.queries for c in p.traj.tool_calls],
         "PG output": p.traj.response_text()[-MAX_SAMPLE_CHARS:]}
  if p.task is None:
    rec["malformed"] = p.error
  else:
    rec.update({"question": p.task.question, "answer": p.task.answer,
                "validity judgments": str(p.validity), "valid": p.valid})
    if p.scores:
      rec["PM answers (GRM score)"] = "; ".join(f"{a} ({s})" for a, s in zip(p.answers, p.scores))
  rec["reward"] = f"{p.reward:.3f}"
  return rec


def pg_records(props, examples: list[dict]) -> list[dict]:
  """The shown proposals' records; valid ones join `examples` (at most 6) for the summary."""
  out = []
  for p in shown(props):
    out.append(pg_record(p))
    if p.valid and len(examples) < 6:
      examples.append({k: out[-1][k] for k in ("question", "answer", "reward")})
  return out


def grm_records(items, trajs, preds) -> list[dict]:
  return [{"phase": "grm", "question": items[t.prompt_index]["question"],
           "answer judged": items[t.prompt_index]["response"],
           "stored score": items[t.prompt_index]["score"],
           "GRM output": t.response_text()[-MAX_SAMPLE_CHARS:], "GRM score": str(p)}
          for t, p in list(zip(trajs, preds))[:2]]


def pm_records(items, trajs, scored, flags) -> list[dict]:
  return [{"phase": "pm", "question": items[t.prompt_index]["question"],
           "reference answer": items[t.prompt_index]["answer"],
           "PM output": t.response_text()[-MAX_SAMPLE_CHARS:], "PM answer": str(a),
           "GRM score": str(s), "flag": flags[t.prompt_index]}
          for t, (a, s) in list(zip(trajs, scored))[:2]]


def summary(asl) -> str:
  phases = ", ".join(f"{h['iteration']}:{h['phase']}×{h['steps']}" for h in asl.history)
  lines = [f"  phases (iteration:phase×steps): {phases or 'none finished'}; now iteration "
           f"{asl.iteration} {asl.phase} after {len(asl.rewards)} steps",
           f"  stores: D_PG {len(asl.d_pg)} (+{len(asl.d_pg_next)} next), D_PM "
           f"{len(asl.d_pm)}, D_GRM {len(asl.d_grm)}"]
  for ex in asl.examples[:3]:
    lines.append(f"  question {ex['question']!r} → {ex['answer']!r} (r_PG {ex['reward']})")
  return "\n".join(lines)


def load_verification(path: str) -> list[dict]:
  """Real verification data (JSONL: question, response, score 0/1 or label correct/wrong)."""
  out = []
  with open(path, encoding="utf-8") as f:
    for i, line in enumerate(f):
      if not line.strip():
        continue
      row = json.loads(line)
      label = row.get("score", row.get("label"))
      score = {"correct": 1, "wrong": 0, "1": 1, "0": 0, 1: 1, 0: 0, True: 1, False: 0}.get(
          label.lower() if isinstance(label, str) else label)
      if score is None or "question" not in row or "response" not in row:
        raise ValueError(f"{path}:{i + 1}: each line needs 'question', 'response' and 'score' "
                         "(0/1) or 'label' (correct/wrong).")
      out.append({"question": str(row["question"]), "response": str(row["response"]),
                  "score": score})
  if not out:
    raise ValueError(f"{path} holds no verification examples.")
  return out
