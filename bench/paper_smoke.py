"""Every paper preset with `--config.smoke=True` on the real Qwen2.5-Coder-0.5B-Instruct, one CPU
device: a table per preset and role (rows, parse or format rate, searches per rollout, reward,
finish reasons) and the wall time of each run. This is what a user runs before booking a pod.

    python -m bench.paper_smoke                              # all ten paper presets
    python -m bench.paper_smoke --presets scope:paper_qwen3,asl:paper --samples

Each run is `python -m scope_jax.main --config=configs/<m>.py:<preset> --config.smoke=True` in
its own process (JAX_PLATFORMS=cpu, one device: the sampling rules would keep one replica of the
weights per virtual device); workdirs stay under --out. An --out that holds earlier runs of these
presets is refused (they would resume, finished, and report the old code's table) unless
--overwrite deletes them first.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAPER_PRESETS = ("spell:paper", "spell:paper_qwen3_moe", "scope:paper", "scope:paper_qwen3",
                 "scope:paper_olmo3", "opensir:paper", "opensir:paper_gemma2", "asl:paper",
                 "piplay:paper", "piplay:paper_instruct")
ROLES = {  # role → (its reward metric, its parse or format metric)
    "spell": {"questioner": ("questioner/reward/mean", "questioner/parsed"),
              "responder": ("responder/reward/mean", "responder/rule/mean"),
              "verifier": ("verifier/reward/mean", "verifier/share_invalid")},
    "scope": {"challenger": ("challenger/reward/mean", "challenger/share_task"),
              "solver": ("solver/reward/mean", "solver/answered/mean"),
              "gate": (None, "challenger/share_gate_malformed"),
              "rubric": (None, "challenger/share_rubric_malformed"),
              "grader": (None, "challenger/judge/share_malformed_verdicts")},
    "opensir": {"teacher": ("teacher/reward/mean", "teacher/legal_rate"),
                "student": ("student/reward/mean", "student/valid_answer_rate")},
    "asl": {"pg": ("pg/reward/mean", "pg/well_formed"), "grm": ("grm/reward/mean", "grm/malformed"),
            "pm": ("pm/reward/mean", "pm/no_answer")},
    "piplay": {"examiner": ("examiner/reward/mean", "examiner/valid_rate"),
               "student": ("student/outcome/mean", "student/answered"),
               "teacher": ("teacher/em", None)},
}
FINISH = ("final", "eos", "stop", "length", "max_turns", "context")
SEARCHERS = {  # the roles that hold the search tool
    "spell": (), "opensir": (), "scope": ("challenger", "solver"), "asl": ("pg", "grm", "pm"),
    "piplay": ("examiner", "student", "teacher")}


def fresh(out: pathlib.Path, specs, overwrite: bool) -> None:
  """Readies `out` for these presets' runs: an earlier run of one of them there would resume,
  finished, and its old table would read as this code's; refused unless `overwrite`, which
  deletes them."""
  old = [out / f"{s.replace(':', '_')}{suffix}" for s in specs for suffix in ("", ".log")]
  old = [p for p in old if p.exists()]
  if old and not overwrite:
    raise ValueError(f"--out={out} holds earlier runs ({', '.join(p.name for p in old[:4])}"
                     f"{', …' if len(old) > 4 else ''}); pass --overwrite to delete them and run "
                     "again, or choose another --out.")
  for p in old:
    shutil.rmtree(p) if p.is_dir() else p.unlink()
  out.mkdir(parents=True, exist_ok=True)


def run(spec: str, out: pathlib.Path, extra=()) -> dict:
  """One smoke run; returns its wall time, exit code and metrics rows."""
  method, preset = spec.split(":")
  workdir = out / f"{method}_{preset}"
  cmd = [sys.executable, "-m", "scope_jax.main", f"--config=configs/{method}.py:{preset}",
         f"--workdir={workdir}", "--config.smoke=True", "--config.progress=False", *extra]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
  wall = time.perf_counter() - start
  (out / f"{method}_{preset}.log").write_text(proc.stdout + proc.stderr)
  metrics = workdir / "metrics.jsonl"
  rows = [json.loads(x) for x in metrics.read_text().splitlines()] if metrics.exists() else []
  return {"spec": spec, "method": method, "wall": wall, "rc": proc.returncode, "rows": rows,
          "workdir": workdir, "tail": (proc.stdout + proc.stderr)[-2000:]}


def searches(result: dict) -> dict[str, float]:
  """Searches per rollout of each searching role that rolled out (mean over steps)."""
  m = merged(result["rows"])
  out = {}
  for role in SEARCHERS[result["method"]]:
    values = m.get(f"{role}/rollout/searches/mean", [])
    if values:
      out[role] = sum(values) / len(values)
  return out


def merged(rows) -> dict[str, list]:
  out: dict[str, list] = {}
  for r in rows:
    for k, v in r.items():
      out.setdefault(k, []).append(v)
  return out


def role_rows(result: dict) -> list[list[str]]:
  """One line per role: rows, searches per rollout, finish reasons, reward, parse/format."""
  m = merged(result["rows"])
  lines = []
  mean = lambda k: sum(m[k]) / len(m[k]) if k in m and m[k] else None
  fmt = lambda x: "—" if x is None else f"{x:.3g}"
  for role, (reward, parsed) in ROLES[result["method"]].items():
    rows = sum(m.get(f"{role}/rollout/rows", []))
    if not rows:
      lines.append([result["spec"], role, "0", "—", "—", "—", "—"])
      continue
    finish = ", ".join(f"{r} {mean(f'{role}/rollout/finish_{r}'):.2f}" for r in FINISH
                       if (mean(f"{role}/rollout/finish_{r}") or 0) > 0)
    lines.append([result["spec"], role, str(int(rows)),
                  fmt(mean(f"{role}/rollout/searches/mean")), finish,
                  fmt(mean(reward) if reward else None),
                  f"{parsed.split('/', 1)[1]} {fmt(mean(parsed))}" if parsed else "—"])
  return lines


def table(results) -> str:
  head = ["preset", "role", "rows", "searches/rollout", "finish", "reward",
          "parse/format metric"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for r in results:
    for line in role_rows(r):
      lines.append("| " + " | ".join(line) + " |")
  lines.append("")
  lines.append("| preset | exit | steps | wall (s) |")
  lines.append("|---|---|---|---|")
  for r in results:
    lines.append(f"| {r['spec']} | {r['rc']} | {len(r['rows'])} | {r['wall']:.0f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--presets", default=",".join(PAPER_PRESETS))
  parser.add_argument("--out", default="/tmp/scope_jax_paper_smoke")
  parser.add_argument("--samples", action="store_true", help="print each run's samples.log")
  parser.add_argument("--overwrite", action="store_true",
                      help="delete the earlier runs of these presets under --out first")
  parser.add_argument("--smoke_warmup", type=int, default=0,
                      help="steps of the format warm-up on each preset's own call syntax "
                           "(config.smoke_warmup; 0 = none): compare searches per rollout "
                           "with and without it by running twice with two --out")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="a config setting for every run, as --config.KEY=VALUE (repeatable; "
                           "e.g. --set=lora.rank=16 for adapters on one frozen base)")
  args = parser.parse_args(argv)
  bad = [x for x in args.set if "=" not in x or x.startswith(("=", "config."))]
  if bad:
    print(f"Error: --set={bad[0]}: give KEY=VALUE with the config path, e.g. --set=lora.rank=16.",
          file=sys.stderr)
    return 2
  if args.smoke_warmup < 0:
    print(f"Error: --smoke_warmup={args.smoke_warmup}: give a number of steps (0 = none).",
          file=sys.stderr)
    return 2
  extra = tuple(f"--config.{x}" for x in args.set)
  if args.smoke_warmup:
    extra += (f"--config.smoke_warmup={args.smoke_warmup}",)
  out = pathlib.Path(args.out)
  specs = args.presets.split(",")
  try:
    fresh(out, specs, args.overwrite)
  except ValueError as e:
    print(f"Error: {e}", file=sys.stderr)
    return 2
  results = []
  for spec in specs:
    r = run(spec, out, extra)
    results.append(r)
    print(f"{spec}: exit {r['rc']}, {len(r['rows'])} steps, {r['wall']:.0f} s", flush=True)
    if r["rc"]:
      print(r["tail"])
    if args.samples and (r["workdir"] / "samples.log").exists():
      print((r["workdir"] / "samples.log").read_text()[-6000:])
  print(table(results))
  return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
  sys.exit(main())
