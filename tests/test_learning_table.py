"""`tools/learning_table.py` on synthetic runs (hand values), and `tools/learning_runs.py`'s
list: every headline and ablation preset on seeds 3, 4 and 5 with its controls, headlines first."""

import json

import chex
import pytest

from tools import learning_runs, learning_table


def _curve(bench, points, halves=None):
  """Evaluation rows: `points` of the benchmark, and each half's (same updates)."""
  rows = []
  for i, (updates, value) in enumerate(points):
    row = {"step": updates, "eval/updates": float(updates), f"eval/{bench}/pass@1": value,
           f"eval/{bench}/time/seconds": 30.0}
    for half, values in (halves or {}).items():
      row[f"eval/{bench}/{half}/pass@1"] = values[i]
    rows.append(row)
    if i + 1 < len(points):
      rows.append({"step": updates, "time/step": 6.0, "policy/reward/mean": 0.5})
  return rows


def _write(root, method, preset, seed, arm, rows, total_steps=20, model="hf:/x/reader_model",
           wall=None):
  path = root / method / preset / f"seed{seed}" / arm
  path.mkdir(parents=True)
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  (path / "run.json").write_text(json.dumps({"method": method, "preset": preset, "config": {
      "total_steps": total_steps, "model": {"source": model}, "world": {"seed": seed}}}))
  if wall is not None:
    (path / learning_table.WALL_FILE).write_text(f"{wall}\n")
  return path


def test_a_table_from_synthetic_runs_by_hand(tmp_path):
  halves = {"trained_half": (0.3, 0.5, 0.7), "heldout_half": (0.2, 0.3, 0.4)}
  _write(tmp_path, "spell", "learn", 3, "run",
         _curve("attr", [(0, 0.25), (10, 0.4), (20, 0.55)], halves), wall=480.0)
  _write(tmp_path, "spell", "learn", 3, "shuffled_rewards",
         _curve("attr", [(0, 0.25), (10, 0.1), (20, 0.2)]))
  _write(tmp_path, "spell", "learn_extractive", 4, "run", _curve("attr", [(0, 0.3), (20, 0.3)]))
  runs = learning_table.find_runs(tmp_path)
  assert set(runs) == {("spell", "learn", 3, "run"), ("spell", "learn", 3, "shuffled_rewards"),
                       ("spell", "learn_extractive", 4, "run")}
  s = learning_table.summarise(runs["spell", "learn", 3, "run"])
  chex.assert_trees_all_close((s["start"], s["end"], s["low"], s["updates"]), (0.25, 0.55, 0.25, 20))
  assert s["halves"] == {"trained_half": (0.3, 0.7), "heldout_half": (0.2, 0.4)}
  assert (s["model"], s["total_steps"], s["wall"], s["wall_measured"]) == (
      "reader_model", 20, 480.0, True)
  c = learning_table.summarise(runs["spell", "learn", 3, "shuffled_rewards"])
  assert (c["wall"], c["wall_measured"]) == (6.0 * 2 + 30.0 * 3, False)  # steps and evaluations
  lines = learning_table.method_table("spell", runs).splitlines()
  chex.assert_equal(lines[0], "| preset | seed | start → end | control shuffled_rewards: end, "
                    "min | trained half | held-out half | model | updates | wall |")
  chex.assert_equal(lines[2], "| learn | 3 | 25.0 → 55.0 (+30.0) | 20.0, min 10.0 (destructive) | "
                    "30.0 → 70.0 (+40.0) | 20.0 → 40.0 (+20.0) | reader_model | 20 of 20 | "
                    "8.0 min |")
  chex.assert_equal(lines[3], "| learn | 4 | not run | — | — | — | — | — | — |")
  chex.assert_equal(lines[5], "| learn_extractive (ablation) | 3 | not run | — | — | — | — | — | "
                    "— |")
  chex.assert_equal(lines[6], "| learn_extractive (ablation) | 4 | 30.0 → 30.0 (+0.0) | — | — | — "
                    "| reader_model | 20 of 20 | 1.1 min* |")
  assert len(lines) == 2 + 2 * 3


def test_a_control_still_running_is_marked_unfinished(tmp_path):
  _write(tmp_path, "spell", "learn", 3, "run", _curve("attr", [(0, 0.25), (20, 0.55)]))
  _write(tmp_path, "spell", "learn", 3, "shuffled_rewards", _curve("attr", [(0, 0.25), (10, 0.2)]))
  lines = learning_table.method_table("spell", learning_table.find_runs(tmp_path)).splitlines()
  assert "| 20.0, min 20.0 (unfinished: 10 of 20 updates) |" in lines[2], lines[2]


def test_the_wide_control_and_the_start_before_warm_up_get_columns(tmp_path):
  _write(tmp_path, "piplay", "learn", 5, "run", _curve("attr_search", [(0, 0.5), (32, 0.6)]))
  _write(tmp_path, "piplay", "learn", 5, "shuffled_rewards_and_teacher",
         _curve("attr_search", [(0, 0.5), (32, 0.45)]))
  _write(tmp_path, "opensir", "learn", 3, "start", _curve("arith", [(0, 0.42)]), total_steps=0)
  runs = learning_table.find_runs(tmp_path)
  head = learning_table.method_table("piplay", runs).splitlines()[0]
  assert "control shuffled_rewards_and_teacher: end, min" in head
  row = learning_table.method_table("piplay", runs, seeds=(5,)).splitlines()[2]
  assert "| 45.0, min 45.0 |" in row  # 5 points down: not flagged
  sir = learning_table.method_table("opensir", runs, seeds=(3,)).splitlines()
  assert "before warm-up" in sir[0] and sir[2].startswith("| learn | 3 | 42.0 | not run |")


def test_the_cli_prints_every_method_and_refuses_a_missing_directory(tmp_path, capsys):
  _write(tmp_path, "asl", "learn", 3, "run", _curve("attr_search", [(0, 0.2), (34, 0.3)]))
  (tmp_path / "commit.txt").write_text("abc123\n")
  assert learning_table.main([f"--runs={tmp_path}"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("Runs from commit abc123; world seeds 3, 4, 5 (the ablation presets were "
                        "tuned on world seeds 0, 1, 2).\n")
  assert all(f"### {m}" in out for m in learning_table.METHODS)
  assert "| learn | 3 | 20.0 → 30.0 (+10.0) |" in out
  with pytest.raises(SystemExit):
    learning_table.main([f"--runs={tmp_path / 'nowhere'}"])
  assert "no such directory" in capsys.readouterr().err


def test_each_arm_names_the_commit_it_started_from(tmp_path):
  old = _write(tmp_path, "spell", "learn", 3, "run", _curve("docs", [(0, 0.2), (20, 0.3)]))
  new = _write(tmp_path, "opensir", "learn", 3, "run", _curve("arith", [(0, 0.2), (20, 0.3)]))
  (tmp_path / learning_table.COMMIT_FILE).write_text("bbb\n")  # the last list's, at the root
  (new / learning_table.COMMIT_FILE).write_text("ccc\n")
  runs = learning_table.find_runs(tmp_path)
  assert learning_table.run_commits(tmp_path, runs) == ["ccc", "bbb"]  # opensir sorts first
  (old / learning_table.COMMIT_FILE).write_text("ccc\n")
  assert learning_table.run_commits(tmp_path, runs) == ["ccc"]
  assert learning_table.tables(tmp_path).startswith("Runs from commit ccc; world seeds 3, 4, 5")


def test_kept_runs_print_the_same_tables(tmp_path):
  runs, kept = tmp_path / "runs", tmp_path / "kept"
  halves = {"trained_half": (0.3, 0.7), "heldout_half": (0.2, 0.4)}
  rows = _curve("attr", [(0, 0.25), (20, 0.55)], halves)
  rows.insert(1, {"step": 0, "train/loss": 1.0, "policy/rollout/tokens": 99})  # not read: dropped
  path = _write(runs, "spell", "learn", 3, "run", rows, wall=480.0)
  (path / learning_table.COMMIT_FILE).write_text("abc\n")
  (path / "checkpoints").mkdir()
  _write(runs, "spell", "learn", 3, "shuffled_rewards", _curve("attr", [(0, 0.25), (20, 0.1)]))
  assert learning_table.keep(runs, kept) == 2
  assert learning_table.tables(kept) == learning_table.tables(runs)
  assert sorted(p.name for p in (kept / "spell/learn/seed3/run").iterdir()) == [
      "commit.txt", "metrics.jsonl", "run.json", "wall_seconds"]
  kept_rows = [json.loads(l) for l in (kept / "spell/learn/seed3/run/metrics.jsonl").open()]
  assert len(kept_rows) == 3 and not any("train/loss" in r for r in kept_rows)


def test_the_run_list_is_every_preset_seed_and_control_headlines_first(tmp_path):
  commands = learning_runs.plan(tmp_path)
  arms = [tuple(w.relative_to(tmp_path).parts) for w, _ in commands]
  per_seed = {"spell": 2, "piplay": 3, "asl": 2, "scope": 2, "opensir": 3}  # run + controls
  headline = sum(per_seed.values()) * 3
  assert len(arms) == len(set(arms)) == headline + (headline - 3)  # ablations: no `start` arm
  assert all(a[1] == "learn" for a in arms[:headline])
  assert all(a[1] != "learn" for a in arms[headline:])
  assert {a[2] for a in arms} == {"seed3", "seed4", "seed5"}
  assert ("piplay", "learn_lambda10x", "seed4", "shuffled_rewards_and_teacher") in arms
  workdir, command = commands[headline - 1]
  assert command[1:] == ["-m", "scope_jax.main", "--config=configs/opensir.py:learn",
                         f"--workdir={workdir}", "--config.world.seed=5",
                         "--config.warmup.steps=0", "--config.total_steps=0"]
  only = learning_runs.plan(tmp_path, only=("asl:learn_frozen_grm",))
  assert [w.parts[-2:] for w, _ in only] == [
      (f"seed{s}", a) for s in (3, 4, 5) for a in ("run", "shuffled_rewards")]
  runs_only = learning_runs.plan(tmp_path, seeds=(5,), only=("piplay",), keep_arms=("run",))
  assert [w.parts[-3:] for w, _ in runs_only] == [("learn", "seed5", "run"),
                                                  ("learn_lambda10x", "seed5", "run")]


def test_a_finished_run_is_skipped(tmp_path):
  done = _write(tmp_path, "asl", "learn", 3, "run", _curve("attr_search", [(0, 0.2), (20, 0.3)]))
  cut = _write(tmp_path, "asl", "learn", 4, "run", _curve("attr_search", [(0, 0.2), (10, 0.3)]))
  assert learning_runs.finished(done) and not learning_runs.finished(cut)
  assert not learning_runs.finished(tmp_path / "none")


def test_the_tables_cover_every_learn_preset_of_every_method():
  import importlib  # pylint: disable=import-outside-toplevel
  for method in learning_table.METHODS:
    headline, ablations = learning_table.PRESETS[method]
    presets = importlib.import_module(f"configs.{method}").PRESETS
    assert headline == "learn" and {headline, *ablations} == {p for p in presets
                                                              if p.startswith("learn")}


@pytest.mark.parametrize("tool, argv, message", [
    (learning_runs, ["--runs=x", "--only=spell:huge"], "--only: unknown ['spell:huge']"),
    (learning_runs, ["--runs=x", "--seeds=3,x"], "--seeds=3,x: give world seeds as integers"),
    (learning_runs, ["--runs=x", "--arms=run,ctrl"], "--arms: unknown ['ctrl']"),
    (learning_table, ["--runs=.", "--methods=spell,nope"], "--methods: unknown ['nope']"),
    (learning_table, ["--runs=.", "--seeds=a"], "--seeds=a: give world seeds as integers"),
])
def test_bad_arguments_are_one_line_errors(tool, argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    tool.main(argv)
  assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_dry_run_lists_the_commands_and_their_time(tmp_path, capsys):
  assert learning_runs.main([f"--runs={tmp_path}", "--dry_run", "--only=scope:learn",
                             "--seeds=3"]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == "# 2 of 2 runs to go, about 0.7 h on a 2-core CPU, one at a time"
  assert out[1] == (f"python -m scope_jax.main --config=configs/scope.py:learn "
                    f"--workdir={tmp_path}/scope/learn/seed3/run --config.world.seed=3")
  assert not (tmp_path / "commit.txt").exists()  # nothing ran
