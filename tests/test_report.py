"""`scope_jax.report`: a control must be a control of the run, a damaged metrics file or a bad
--out is a one-line error, and a curve that stops before the last update says so."""

import json
import os
import subprocess
import sys

import chex
import pytest

from scope_jax import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = [{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": 0.25},
        {"step": 0, "questioner/reward/mean": 0.5},
        {"step": 1, "eval/updates": 1.0, "eval/doc/pass@1": 0.5}]


def _run(path, rows=ROWS, method="spell", seed=0, total_steps=2, control="", lines=None):
  path.mkdir(parents=True, exist_ok=True)
  text = "".join(json.dumps(r) + "\n" for r in rows) if lines is None else lines
  (path / "metrics.jsonl").write_text(text)
  config = {"total_steps": total_steps, "control": control, "world": {"seed": seed},
            "eval": {"every": 1, "benchmarks": "world:doc", "limit": 40, "role": ""}}
  (path / "run.json").write_text(json.dumps({"method": method, "preset": "learn",
                                             "config": config}))
  return path


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "scope_jax.report", *args], capture_output=True,
                        text=True, cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))


def _one_line_error(out, message):
  assert out.returncode == 2, (out.stdout, out.stderr)
  lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
  assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], out.stderr


def test_a_control_of_the_same_method_preset_and_world_is_accepted(tmp_path):
  run = _run(tmp_path / "run")
  control = _run(tmp_path / "control", control="shuffled_rewards")
  report.check_control(run, control)
  out = _cli(f"--run={run}", f"--control={control}")
  assert out.returncode == 0, out.stderr
  assert "doc: 25.0 → 50.0 (control 25.0 → 50.0, min 25.0)" in out.stdout


@pytest.mark.parametrize("kind, message", [
    ("method", "method 'spell' vs 'opensir'"),
    ("world", "world.seed 0 vs 5"),
    ("itself", "is the run itself"),
    ("no record", "no run.json"),
])
def test_a_control_of_another_run_is_refused(tmp_path, kind, message):
  run = _run(tmp_path / "run")
  control = {"method": lambda: _run(tmp_path / "c", method="opensir"),
             "world": lambda: _run(tmp_path / "c", seed=5),
             "itself": lambda: run,
             "no record": lambda: _run(tmp_path / "c")}[kind]()
  if kind == "no record":
    (control / "run.json").unlink()
  with pytest.raises(ValueError, match=message):
    report.check_control(run, control)
  _one_line_error(_cli(f"--run={run}", f"--control={control}"), message)


@pytest.mark.parametrize("lines, message", [
    ('{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": 0.25}\n{"step": 1, "eval/upd',
     "line 2 is not JSON"),
    ('{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": "high"}\n',
     "line 1: eval/doc/pass@1 is not a finite number"),
    ('{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": NaN}\n', "line 1: eval/doc/pass@1"),
    ('{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": null}\n', "line 1: eval/doc/pass@1"),
    ('[1, 2]\n', "line 1: the line is not"),
])
def test_damaged_metrics_are_one_line_errors(tmp_path, lines, message):
  run = _run(tmp_path / "run", lines=lines)
  with pytest.raises(ValueError, match=message):
    report.read(run)
  _one_line_error(_cli(f"--run={run}"), message)


@pytest.mark.parametrize("out, message", [
    ("x.pdf", "ending in .png"), ("", "ending in .png"), ("nowhere/x.png", "does not exist")])
def test_a_bad_out_is_refused_before_drawing(tmp_path, out, message):
  run = _run(tmp_path / "run")
  (tmp_path / "adir.png").mkdir()
  target = tmp_path / "adir.png" if not out else tmp_path / out
  _one_line_error(_cli(f"--run={run}", f"--out={target}"), message)
  assert not (tmp_path / "x.pdf").exists()


def test_an_empty_dir_is_a_one_line_error(tmp_path):
  _one_line_error(_cli(f"--run={tmp_path}"), "No metrics.jsonl in")


def test_a_curve_that_stops_before_the_last_update_says_so(tmp_path):
  run = _run(tmp_path / "run", total_steps=2)
  chex.assert_equal(report.summary(run), "doc: 25.0 → 50.0\nNote: the last evaluation is after 1 "
                    "of 2 updates (the final one is missing: run the same command again to score "
                    "it).")
  done = _run(tmp_path / "done", total_steps=1)
  chex.assert_equal(report.summary(done), "doc: 25.0 → 50.0")


def test_the_control_line_gives_its_end_and_its_minimum_and_flags_a_collapse(tmp_path):
  """Hand values: a control from 40% through 25% to 35% fell 15 points (flagged), one through
  30% fell exactly 10 (not more: not flagged)."""
  run = _run(tmp_path / "run")
  fell = [{"step": 0, "eval/updates": 0.0, "eval/doc/pass@1": 0.4},
          {"step": 1, "eval/updates": 1.0, "eval/doc/pass@1": 0.25},
          {"step": 2, "eval/updates": 2.0, "eval/doc/pass@1": 0.35}]
  control = _run(tmp_path / "control", rows=fell, control="shuffled_rewards")
  chex.assert_equal(report.summary(run, control).splitlines()[0],
                    "doc: 25.0 → 50.0 (control 40.0 → 35.0, min 25.0; updates are destructive "
                    "at this rate)")
  ten = [dict(r, **{"eval/doc/pass@1": v}) for r, v in zip(fell, (0.4, 0.3, 0.3))]
  control = _run(tmp_path / "ten", rows=ten, control="shuffled_rewards")
  chex.assert_equal(report.summary(run, control).splitlines()[0],
                    "doc: 25.0 → 50.0 (control 40.0 → 30.0, min 30.0)")
  assert report.destructive(0.5, 0.39) and not report.destructive(0.5, 0.41)
