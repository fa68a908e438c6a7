"""The runs behind the learning tables, one at a time: every method's `learn` preset (the method
as published) and its ablation presets on world seeds 3, 4 and 5, each with its controls, into
`<runs>/<method>/<preset>/seed<N>/<arm>/`, then `tools/learning_table.py` reads them.

    python -m tools.learning_runs --runs=runs/learning --dry_run    # the commands, in order
    python -m tools.learning_runs --runs=runs/learning              # all of them (hours)
    python -m tools.learning_runs --runs=runs/learning --only=spell:learn
    python -m tools.learning_runs --runs=runs/learning --only=piplay:learn --seeds=5 --arms=run

The order puts every headline run and its control first, then the ablations. A finished run
(its last evaluation is after its last update) is skipped, so the same command resumes a cut
list; a run cut short resumes from its last checkpoint. Each arm's wall time is written beside
its metrics (`wall_seconds`), and the commit each arm started from beside it and, for the last
list, into `<runs>/commit.txt`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

from scope_jax import report
from tools.learning_table import ARMS, COMMIT_FILE, CONTROLS, DEFAULT_CONTROLS, PRESETS, SEEDS, START, WALL_FILE

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Minutes per arm on a 2-core CPU, from the headline runs on world seed 3 in docs/learning.md
# (a warm-up is fitted once per seed and preset and cached: SPELL's is about 4 of its first 8).
MINUTES = {"spell": 8, "piplay": 9.5, "asl": 7.2, "scope": 20.5, "opensir": 11.8}
START_MINUTES = 1.5


def arms(method: str, headline: bool = True) -> list[tuple[str, list[str]]]:
  """(arm, its flags beyond the preset's) of one preset and seed: the run, its controls, and for
  OpenSIR's headline the start before its warm-up (no warm-up, no update: the bundled model as
  it ships, asked the held-out questions)."""
  out = [("run", [])]
  out += [(c, [f"--config.control={c}"]) for c in CONTROLS.get(method, DEFAULT_CONTROLS)]
  if method in START and headline:
    out.append(("start", ["--config.warmup.steps=0", "--config.total_steps=0"]))
  return out


def plan(root, seeds=SEEDS, only=(), keep_arms=()) -> list[tuple[pathlib.Path, list[str]]]:
  """(workdir, command) of every run, headlines first; `only` keeps `method` or
  `method:preset` items, `keep_arms` those arms (`run`, a control, `start`)."""
  keep = lambda m, p: not only or m in only or f"{m}:{p}" in only
  rounds = [[(m, h) for m, (h, _) in PRESETS.items()],
            [(m, a) for m, (_, ablations) in PRESETS.items() for a in ablations]]
  out = []
  for presets in rounds:
    for seed in seeds:
      for method, preset in presets:
        if not keep(method, preset):
          continue
        for arm, flags in arms(method, preset == PRESETS[method][0]):
          if keep_arms and arm not in keep_arms:
            continue
          workdir = pathlib.Path(root) / method / preset / f"seed{seed}" / arm
          out.append((workdir, [sys.executable, "-m", "scope_jax.main",
                                f"--config=configs/{method}.py:{preset}", f"--workdir={workdir}",
                                f"--config.world.seed={seed}", *flags]))
  return out


def finished(workdir) -> bool:
  """Whether the run's last evaluation is after its last update (nothing left to run)."""
  path = pathlib.Path(workdir)
  if not (path / "metrics.jsonl").exists() or not (path / "run.json").exists():
    return False
  total = report.record(path).get("config", {}).get("total_steps")
  updates = [r["eval/updates"] for r in report.read(path) if "eval/updates" in r]
  return total is not None and bool(updates) and max(updates) >= total


def estimate_minutes(commands) -> float:
  """The list's CPU time from the measured per-run minutes (`MINUTES`, `START_MINUTES`)."""
  return sum(START_MINUTES if w.name == "start" else MINUTES[w.parts[-4]] for w, _ in commands)


def commit() -> str:
  """HEAD, with `-dirty` when tracked files differ from it (the runs import the working tree)."""
  git = lambda *a: subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()
  try:
    return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                       "--untracked-files=no") else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--runs", required=True, help="where the runs go (one workdir per arm)")
  p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="world seeds, comma-separated")
  p.add_argument("--only", default="", help="method or method:preset items, comma-separated")
  p.add_argument("--arms", default="", help="only these arms, comma-separated: run, "
                 f"{', '.join(ARMS[1:])}")
  p.add_argument("--dry_run", action="store_true", help="print the commands and the estimate")
  args = p.parse_args(argv)
  only = tuple(x for x in args.only.split(",") if x)
  valid = set(PRESETS) | {f"{m}:{x}" for m, (h, a) in PRESETS.items() for x in (h, *a)}
  if unknown := sorted(set(only) - valid):
    p.error(f"--only: unknown {unknown}; choose from {', '.join(sorted(valid))}.")
  keep_arms = tuple(x for x in args.arms.split(",") if x)
  if bad := sorted(set(keep_arms) - set(ARMS)):
    p.error(f"--arms: unknown {bad}; choose from {', '.join(ARMS)}.")
  try:
    seeds = tuple(int(s) for s in args.seeds.split(","))
  except ValueError:
    p.error(f"--seeds={args.seeds}: give world seeds as integers, e.g. 3,4,5.")
  commands = plan(args.runs, seeds, only, keep_arms)
  todo = [(w, c) for w, c in commands if not finished(w)]
  print(f"# {len(todo)} of {len(commands)} runs to go, about {estimate_minutes(todo) / 60:.1f} h "
        "on a 2-core CPU, one at a time", flush=True)
  for workdir, command in todo:
    print("python " + " ".join(command[1:]), flush=True)
  if args.dry_run:
    return 0
  pathlib.Path(args.runs).mkdir(parents=True, exist_ok=True)
  (pathlib.Path(args.runs) / COMMIT_FILE).write_text(commit() + "\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a user runs
  for workdir, command in todo:
    start = time.perf_counter()
    workdir.mkdir(parents=True, exist_ok=True)
    if not (workdir / COMMIT_FILE).exists():  # a resumed arm keeps the commit it started from
      (workdir / COMMIT_FILE).write_text(commit() + "\n")  # the code it imports now
    done = subprocess.run(command, cwd=ROOT, env=env).returncode
    if done:
      print(f"Error: {workdir} failed (exit {done}); rerun the same command to resume.",
            file=sys.stderr)
      return done
    wall = workdir / WALL_FILE  # a resumed run adds its pieces
    before = float(wall.read_text()) if wall.exists() else 0.0
    wall.write_text(f"{before + time.perf_counter() - start:.1f}\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
