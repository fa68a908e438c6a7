"""The learning tables: per method, one markdown table of its `learn` runs on world seeds 3, 4
and 5, from the runs' own metrics, for the headline preset (the method as published) and each
ablation preset, each beside its controls.

    python -m tools.learning_table --runs=runs/learning            # after tools/learning_runs.py
    python -m tools.learning_table --runs=runs/learning --keep=docs/learning_runs

`--keep` copies what the tables read (each arm's evaluation and reward rows, run.json, wall
time and commit: a few kB an arm) to a directory the repository can hold, so the same command
on `--runs=docs/learning_runs` prints the same tables without the runs' checkpoints.

A run lives at `<runs>/<method>/<preset>/seed<N>/<arm>/` (what `tools/learning_runs.py` writes),
where the arm is `run`, a control (`shuffled_rewards`, `shuffled_rewards_and_teacher`) or
`start` (the start before its warm-up, scored with no update). A row gives held-out accuracy
start → end, each control's end and lowest point (flagged when it fell more than 10 points below
its start: updates are destructive at this rate), the trained and held-out entity halves' end
(start → end), the model, the updates and the wall time. A run not there yet is a dash.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import sys

from scope_jax import report

SEEDS = (3, 4, 5)  # the world seeds reported (tuning, if any, uses seeds >= 1000 only)
TUNED_SEEDS = (0, 1, 2)  # the seeds the earlier presets (now the ablations) were tuned on
METHODS = ("spell", "piplay", "asl", "scope", "opensir")
# method -> (headline preset: the method as published, its ablation presets)
PRESETS = {
    "spell": ("learn", ("learn_extractive",)),
    "piplay": ("learn", ("learn_lambda10x",)),
    "asl": ("learn", ("learn_frozen_grm",)),
    "scope": ("learn", ("learn_slow_challenger",)),
    "opensir": ("learn", ("learn_planted_guess",)),
}
# The controls each method's presets run with (the first is the reported one); π-Play's second
# also permutes its teacher's inputs.
CONTROLS = {"piplay": ("shuffled_rewards", "shuffled_rewards_and_teacher")}
DEFAULT_CONTROLS = ("shuffled_rewards",)
START = ("opensir",)  # their headline is also scored before its warm-up (the `start` arm)
ARMS = ("run", "shuffled_rewards", "shuffled_rewards_and_teacher", "start")
HALVES = ("trained_half", "heldout_half")
WALL_FILE = "wall_seconds"  # the driver's measured wall time of the whole command
COMMIT_FILE = "commit.txt"  # the commit an arm (or, at the root, a whole list) started from
_SEED_DIR = re.compile(r"^seed(\d+)$")


def find_runs(root) -> dict[tuple[str, str, int, str], pathlib.Path]:
  """(method, preset, seed, arm) → workdir, for each `<root>/<method>/<preset>/seed<N>/<arm>/`
  that holds a metrics.jsonl."""
  out = {}
  for path in sorted(pathlib.Path(root).glob("*/*/seed*/*/metrics.jsonl")):
    arm_dir = path.parent
    seed = _SEED_DIR.match(arm_dir.parent.name)
    if seed and arm_dir.name in ARMS:
      method, preset = arm_dir.parent.parent.parent.name, arm_dir.parent.parent.name
      out[method, preset, int(seed.group(1)), arm_dir.name] = arm_dir
  return out


def _main_benchmark(acc: dict) -> str | None:
  """The run's held-out benchmark: the one curve that is not an entity half's."""
  names = sorted(n for n in acc if n.rsplit("/", 1)[-1] not in HALVES)
  return names[0] if names else None


def summarise(workdir) -> dict:
  """What a table row needs from one run: held-out accuracy (start, end, lowest) of its
  benchmark, each entity half's (start, end), its model, updates and wall time (seconds: the
  driver's measure, else the steps' and evaluations' own times, which leave out loading and
  the warm-up)."""
  rows = report.read(workdir)
  acc = report.curves(rows)["accuracy"]
  name = _main_benchmark(acc)
  out = {"benchmark": name, "start": None, "end": None, "low": None, "halves": {}}
  if name:
    points = acc[name]
    out.update(start=points[0][1], end=points[-1][1], low=min(v for _, v in points),
               updates=points[-1][0])
    out["halves"] = {h: (acc[f"{name}/{h}"][0][1], acc[f"{name}/{h}"][-1][1])
                     for h in HALVES if acc.get(f"{name}/{h}")}
  config = report.record(workdir).get("config", {})
  source = str(config.get("model", {}).get("source", ""))
  out["model"] = os.path.basename(source.rstrip("/")) if source else "?"
  out["total_steps"] = config.get("total_steps")
  wall = pathlib.Path(workdir) / WALL_FILE
  if wall.exists():
    out["wall"], out["wall_measured"] = float(wall.read_text().strip()), True
  else:
    out["wall"] = sum(v for r in rows for k, v in r.items()
                      if k == "time/step" or (k.startswith("eval/") and k.endswith("/time/seconds")))
    out["wall_measured"] = False
  return out


def pct(x) -> str:
  return "—" if x is None else f"{100 * x:.1f}"


def _arrow(start, end) -> str:
  if start is None:
    return "—"
  return f"{pct(start)} → {pct(end)} ({100 * (end - start):+.1f})"


def _control(s: dict | None) -> str:
  """'end 35.0, min 25.0' with a destructive flag, or a dash."""
  if not s or s["start"] is None:
    return "—"
  text = f"{pct(s['end'])}, min {pct(s['low'])}"
  text += " (destructive)" if report.destructive(s["start"], s["low"]) else ""
  if s.get("total_steps") and s.get("updates", 0) < s["total_steps"]:  # still running, or cut
    text += f" (unfinished: {s['updates']:g} of {s['total_steps']} updates)"
  return text


def _minutes(s: dict) -> str:
  return f"{s['wall'] / 60:.1f} min" + ("" if s["wall_measured"] else "*")


def method_table(method: str, runs: dict, seeds=SEEDS, presets=None) -> str:
  """The markdown table of `method`'s runs (`find_runs` keys): a row per preset and seed, the
  headline first, then its ablations (`PRESETS`; others found under the method after them)."""
  headline, ablations = PRESETS.get(method, ("learn", ()))
  found = sorted({p for m, p, _, _ in runs if m == method} - {headline, *ablations})
  presets = list(presets) if presets else [headline, *ablations, *found]
  controls = CONTROLS.get(method, DEFAULT_CONTROLS)
  with_start = method in START or any(k[0] == method and k[3] == "start" for k in runs)
  head = (["preset", "seed"] + (["before warm-up"] if with_start else []) + ["start → end"]
          + [f"control {c}: end, min" for c in controls]
          + ["trained half", "held-out half", "model", "updates", "wall"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for preset in presets:
    for seed in seeds:
      got = {a: summarise(runs[method, preset, seed, a]) for a in ARMS
             if (method, preset, seed, a) in runs}
      run = got.get("run")
      cells = [f"{preset}{'' if preset == headline else ' (ablation)'}", str(seed)]
      if with_start:
        cells.append(pct(got["start"]["start"]) if "start" in got else "—")
      cells.append(_arrow(run["start"], run["end"]) if run else "not run")
      cells += [_control(got.get(c)) for c in controls]
      for h in HALVES:
        cells.append(_arrow(*run["halves"][h]) if run and h in run["halves"] else "—")
      cells += ([run["model"], f"{run['updates']:g} of {run['total_steps']}", _minutes(run)]
                if run and run["start"] is not None else ["—", "—", "—"])
      lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def run_commits(root, runs) -> list[str]:
  """The commits the arms started from, in first-seen order: each arm's own record
  (tools/learning_runs.py writes it when the arm starts), else the list's at the root."""
  fallback = pathlib.Path(root) / COMMIT_FILE
  out = []
  for workdir in runs.values():
    own = workdir / COMMIT_FILE
    source = own if own.exists() else fallback
    commit = source.read_text().strip() if source.exists() else ""
    if commit and commit not in out:
      out.append(commit)
  if not runs and fallback.exists():
    out.append(fallback.read_text().strip())
  return out


def tables(root, seeds=SEEDS, methods=METHODS) -> str:
  """Every method's table, under a heading each, with the notes that read them."""
  runs = find_runs(root)
  commits = run_commits(root, runs)
  out = [f"Runs from commit {', '.join(commits)}; world seeds "
         f"{', '.join(map(str, seeds))} (the ablation presets were tuned on world seeds "
         f"{', '.join(map(str, TUNED_SEEDS))}).", ""] if commits else []
  for method in methods:
    out += [f"### {method}", "", method_table(method, runs, seeds), ""]
  out.append("Accuracy is greedy held-out pass@1 (%) on 300 gold questions, start → end (gain). "
             "A control's min is its lowest evaluation; (destructive): it fell more than "
             f"{100 * report.DESTRUCTIVE_DROP:.0f} points below its start, so "
             f"{report.DESTRUCTIVE}. The halves are the questions about the world's trained and "
             "held-out entities (`world.heldout_entities`). * wall time from the steps' and "
             "evaluations' own times (no loading, no warm-up).")
  return "\n".join(out)


def keep(root, dest) -> int:
  """Copies what `tables` reads of every run under `root` into `dest`, in the same layout: the
  metrics rows that hold an evaluation or a role's reward (those keys alone), run.json, the
  wall time and commit files. Returns the number of arms kept."""
  runs = find_runs(root)
  for workdir in runs.values():
    out = pathlib.Path(dest) / workdir.relative_to(root)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in report.read(workdir):
      kept = {k: v for k, v in r.items()
              if k.startswith("eval/") or report.REWARD.match(k) or k in ("step", "time/step")}
      if any(k.startswith("eval/") or report.REWARD.match(k) for k in kept):
        rows.append(kept)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("run.json", WALL_FILE, COMMIT_FILE):
      if (workdir / name).exists():
        (out / name).write_text((workdir / name).read_text())
  return len(runs)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--runs", required=True, help="the directory tools/learning_runs.py wrote")
  p.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="world seeds, comma-separated")
  p.add_argument("--methods", default=",".join(METHODS), help="methods, comma-separated")
  p.add_argument("--keep", default="", help="also copy what the tables read to this directory")
  args = p.parse_args(argv)
  if not pathlib.Path(args.runs).is_dir():
    p.error(f"--runs={args.runs}: no such directory; give the one tools/learning_runs.py wrote.")
  try:
    seeds = tuple(int(s) for s in args.seeds.split(","))
  except ValueError:
    p.error(f"--seeds={args.seeds}: give world seeds as integers, e.g. 3,4,5.")
  methods = tuple(m for m in args.methods.split(",") if m)
  if unknown := sorted(set(methods) - set(METHODS)):
    p.error(f"--methods: unknown {unknown}; choose from {', '.join(METHODS)}.")
  try:
    print(tables(args.runs, seeds, methods))
    if args.keep:
      print(f"Kept {keep(args.runs, args.keep)} arms in {args.keep}.", file=sys.stderr)
  except (OSError, ValueError) as e:
    print(f"Error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
