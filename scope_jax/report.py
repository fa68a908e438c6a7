"""`python -m scope_jax.report --run=<workdir>`: a run's learning curves as `learning.png` — the
reward of each role and the held-out accuracy (`eval/<benchmark>/pass@1`) against updates, with a
control run's curves dashed — and the held-out numbers, start → end, printed. Runs may be local
or on gs://; a run with held-out evaluation (`config.eval.every`) draws it when it finishes.

    python -m scope_jax.report --run=runs/spell_learn --control=runs/spell_learn_control
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from typing import Sequence

from absl import app, flags
from etils import epath

from scope_jax import cli_errors

REWARD = re.compile(r"^(?:(.+)/)?(?:reward|outcome)(?:/mean)?$")  # π-Play's student: outcome
ACCURACY = re.compile(r"^eval/(.+)/pass@1$")


def curves(rows: Sequence[dict]) -> dict[str, dict[str, list[tuple[float, float]]]]:
  """{'reward': {role: [(step, value)]}, 'accuracy': {benchmark: [(updates, value)]}} from a
  run's metrics rows (training rows by step, evaluation rows by `eval/updates`)."""
  out: dict[str, dict[str, list[tuple[float, float]]]] = {"reward": {}, "accuracy": {}}
  for r in rows:
    if "eval/updates" in r:
      for k, v in r.items():
        if m := ACCURACY.match(k):
          out["accuracy"].setdefault(m.group(1), []).append((r["eval/updates"], v))
      continue
    for k, v in r.items():
      if (m := REWARD.match(k)) and not k.startswith("eval/"):
        out["reward"].setdefault(m.group(1) or "policy", []).append((r["step"], v))
  return out


def read(run) -> list[dict]:
  """A run's metrics rows; a damaged line (not a JSON object of finite numbers, as a run writes
  them) is a one-line error that names it."""
  path = epath.Path(run) / "metrics.jsonl"
  if not path.exists():
    raise FileNotFoundError(f"No metrics.jsonl in {run}: is it a run's --workdir?")
  rows = []
  for i, line in enumerate(path.read_text().splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as e:
      raise ValueError(f"{path} line {i} is not JSON ({e}): the file is damaged; restore it or "
                       "delete that line.") from None
    bad = (["the line"] if not isinstance(row, dict) else
           [k for k, v in row.items() if isinstance(v, bool) or not isinstance(v, (int, float))
            or not math.isfinite(v)])
    if bad:
      raise ValueError(f"{path} line {i}: {', '.join(bad[:3])} is not a finite number, as a run "
                       "writes them: the file is damaged; restore it or delete that line.")
    rows.append(row)
  return rows


def record(run) -> dict:
  """The run's run.json (method, preset, config), or {} when it has none."""
  path = epath.Path(run) / "run.json"
  if not path.exists():
    return {}
  try:
    return json.loads(path.read_text())
  except ValueError as e:
    raise ValueError(f"{path} is not JSON ({e}): the file is damaged.") from None


def _compared(rec: dict) -> dict:
  """What a run and its control must share: method, preset, world and held-out questions."""
  c = rec.get("config", {})
  e = c.get("eval", {})
  return {"method": rec.get("method"), "preset": rec.get("preset"),
          "world.seed": c.get("world", {}).get("seed"), "eval.benchmarks": e.get("benchmarks"),
          "eval.limit": e.get("limit"), "eval.role": e.get("role"),
          "total_steps": c.get("total_steps")}


def check_control(run, control) -> None:
  """A control is another run of the same method, preset and world, scored on the same held-out
  questions; anything else is refused in one line."""
  if os.path.realpath(os.fspath(run)) == os.path.realpath(os.fspath(control)):
    raise ValueError(f"--control={control} is the run itself; give the control run's workdir.")
  mine, theirs = record(run), record(control)
  for name, rec in (("--run", mine), ("--control", theirs)):
    if not rec:
      raise ValueError(f"{name}: no run.json in {run if name == '--run' else control}, so the "
                       "two runs cannot be checked to be comparable; give run workdirs.")
  a, b = _compared(mine), _compared(theirs)
  diff = [f"{k} {a[k]!r} vs {b[k]!r}" for k in a if a[k] != b[k]]
  if diff:
    raise ValueError(f"--control={control} is not a control of {run}: {'; '.join(diff)}. A "
                     "control is the same method, preset and world, scored on the same questions.")


def last_evaluation(run, rows) -> str:
  """A note when the curve ends before the run's last update (the final evaluation is missing:
  run the same command again to score it), else ''."""
  c = record(run).get("config", {})
  total, every = c.get("total_steps"), c.get("eval", {}).get("every")
  updates = [r["eval/updates"] for r in rows if "eval/updates" in r]
  if not (total and every and updates) or max(updates) >= total:
    return ""
  return (f"the last evaluation is after {max(updates):g} of {total} updates (the final one is "
          "missing: run the same command again to score it)")


def held_out(run_curves: dict) -> dict[str, tuple[float, float]]:
  """Benchmark → (accuracy before training, after the last update)."""
  return {name: (points[0][1], points[-1][1])
          for name, points in run_curves["accuracy"].items() if points}


DESTRUCTIVE_DROP = 0.10  # a control whose lowest point is more than this below its start
DESTRUCTIVE = "updates are destructive at this rate"


def lowest(run_curves: dict) -> dict[str, float]:
  """Benchmark → the lowest held-out accuracy of the curve (start and end included)."""
  return {name: min(v for _, v in points)
          for name, points in run_curves["accuracy"].items() if points}


def destructive(start: float, low: float) -> bool:
  """Whether a control fell more than `DESTRUCTIVE_DROP` below its start: a shuffled update
  that wrecks the model makes "the control gains nothing" easy and says little (1e-9 absorbs
  float error: 40% → 30% is exactly 10 points, not more)."""
  return start - low > DESTRUCTIVE_DROP + 1e-9


def control_text(start: float, end: float, low: float) -> str:
  """'control 30.0 → 25.0, min 18.0; updates are destructive at this rate' (percent)."""
  text = f"control {100 * start:.1f} → {100 * end:.1f}, min {100 * low:.1f}"
  return text + (f"; {DESTRUCTIVE}" if destructive(start, low) else "")


def plot(run, control=None, out=None) -> epath.Path:
  """Draws `run`'s curves (and `control`'s, dashed) into `out` (default `<run>/learning.png`)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  runs = [("", curves(read(run)))] + ([(" (control)", curves(read(control)))] if control else [])
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
  for suffix, c in runs:
    style = "--" if suffix else "-"
    for role, pts in sorted(c["reward"].items()):
      left.plot(*zip(*pts), style, label=role + suffix)
    for name, pts in sorted(c["accuracy"].items()):
      right.plot(*zip(*pts), style, marker="o", label=name + suffix)
  left.set(title="reward per role", xlabel="step", ylabel="mean reward")
  right.set(title="held-out accuracy (pass@1)", xlabel="updates", ylabel="accuracy", ylim=(0, 1))
  for ax in (left, right):
    if ax.lines:
      ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  fig.suptitle(str(run))
  fig.tight_layout()
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=100)
  plt.close(fig)
  path = out_path(run, out)
  path.write_bytes(buf.getvalue())
  return path


def out_path(run, out=None) -> epath.Path:
  """Where the picture goes: `out` (a .png file) or `<run>/learning.png`."""
  path = epath.Path(out) if out else epath.Path(run) / "learning.png"
  if path.suffix.lower() != ".png" or path.is_dir():
    raise ValueError(f"--out={out}: give a file name ending in .png (the picture is a PNG).")
  if not path.parent.exists():
    raise ValueError(f"--out={out}: the directory {path.parent} does not exist.")
  return path


def top_share(rows: Sequence[dict], name: str) -> float | None:
  """The last evaluation's share of samples that gave `name`'s most common answer."""
  shares = [r[f"eval/{name}/answers/top_share"] for r in rows
            if f"eval/{name}/answers/top_share" in r]
  return shares[-1] if shares else None


def summary(run, control=None) -> str:
  """A line per benchmark: held-out accuracy before and after (the control's beside it: its end,
  its lowest point, and a flag when it fell more than 10 points), and how alike the final
  answers are (a gain from one answer given to everything is not reading)."""
  lines, rows = [], read(run)
  c_curves = curves(read(control)) if control else None
  for name, (start, end) in sorted(held_out(curves(rows)).items()):
    line = f"{name}: {100 * start:.1f} → {100 * end:.1f}"
    if c_curves and (c := held_out(c_curves).get(name)):
      line += f" ({control_text(*c, lowest(c_curves)[name])})"
    if (share := top_share(rows, name)) is not None:
      line += f"; most common final answer: {100 * share:.0f}% of samples"
    lines.append(line)
  if lines and (note := last_evaluation(run, rows)):
    lines.append(f"Note: {note}.")
  return "\n".join(lines)


_RUN = flags.DEFINE_string("run", None, "The run's workdir (local or gs://).")
_CONTROL = flags.DEFINE_string("control", None, "A control run's workdir, drawn dashed.")
_OUT = flags.DEFINE_string("out", None, "Where to write the picture (default <run>/learning.png).")


def main(argv):
  del argv
  if not _RUN.value:
    raise app.UsageError("--run=<workdir> is required.")
  try:  # a wrong path, a damaged file, a control of another run: one line
    out_path(_RUN.value, _OUT.value)
    if _CONTROL.value:
      check_control(_RUN.value, _CONTROL.value)
    path = plot(_RUN.value, _CONTROL.value, _OUT.value)
    text = summary(_RUN.value, _CONTROL.value)
  except (OSError, ValueError) as e:
    cli_errors.fail(e)
  print(f"Wrote {path}" + (f"\nheld-out accuracy (%), start → end:\n{text}" if text else ""))


if __name__ == "__main__":
  app.run(main, flags_parser=cli_errors.parse_flags)
