"""Metrics files: whole-file writes (object stores cannot append), records after the resumed
checkpoint dropped, TensorBoard purged to match, and no silent second run in one workdir."""

import json

import pytest

from scope_jax import metrics as metrics_lib


def _run(workdir, steps, resume=None, overwrite=False):
  w = metrics_lib.MetricsWriter(workdir)
  w.start(resume, overwrite=overwrite)
  for step in steps:
    w.samples(step, [{"output": f"sample of step {step}\n=== not a header"}])
    w.write(step, {"reward/mean": float(step), "bad": float("nan")})
  w.close()


def test_resume_drops_the_steps_that_run_again(tmp_path):
  _run(tmp_path, range(5))  # steps 3 and 4 came after the last checkpoint (step 2), then a crash
  _run(tmp_path, range(3, 6), resume=2)
  records = metrics_lib.read_jsonl(tmp_path / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
  assert records[0]["metrics/nonfinite"] == 1.0 and "bad" not in records[0]
  samples = (tmp_path / "samples.log").read_text()
  assert [samples.count(f"sample of step {s}") for s in range(6)] == [1] * 6
  tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  acc = tb.EventAccumulator(str(tmp_path / "tb"))
  acc.Reload()
  assert [e.step for e in acc.Scalars("reward/mean")] == [0, 1, 2, 3, 4, 5]


def test_model_output_can_neither_forge_a_block_nor_drive_the_terminal(tmp_path):
  """A generated `=== step 0 ===` line once forged a block that a resume kept as step 0's; an
  escape sequence reached whoever `cat`s the log."""
  w = metrics_lib.MetricsWriter(tmp_path, tensorboard=False)
  w.start(None)
  w.samples(3, [{"output": "ok\n=== step 0 ===\n\x1b[2J\x1b]0;pwned\x07 cleared\u2028=== step 9 "
                          "===\nforged\x85=== step 8 ===\nagain"}])
  w.write(3, {"x": 1.0})
  w.close()
  text = (tmp_path / "samples.log").read_text()
  assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text
  assert text.count("\n=== step") == 0 and text.startswith("=== step 3 ===\n")
  w = metrics_lib.MetricsWriter(tmp_path, tensorboard=False)
  w.start(3)  # resuming reads back exactly one block, step 3's
  assert [n for n, _ in w._samples] == [3]  # pylint: disable=protected-access


def test_a_workdir_with_metrics_but_no_checkpoint_is_refused(tmp_path):
  _run(tmp_path, range(2))
  with pytest.raises(ValueError, match="no checkpoint to resume from.*--config.overwrite=true"):
    _run(tmp_path, range(2))
  _run(tmp_path, range(1), overwrite=True)
  assert [r["step"] for r in metrics_lib.read_jsonl(tmp_path / "metrics.jsonl")] == [0]
  json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])


def test_event_records_match_tensorboardx(tmp_path):
  record_writer = pytest.importorskip("tensorboardX.record_writer")
  from scope_jax import events
  payload = events.scalar_event(7, {"a/b": 1.5, "c": -2.0}, wall_time=123.0).SerializeToString()
  writer = record_writer.RecordWriter(str(tmp_path / "ref"))
  writer.write(payload)
  writer.close()
  assert events.frame(payload) == (tmp_path / "ref").read_bytes()
  assert events.masked_crc(b"") == 0xA282EAD8  # crc32c("") = 0, rotated, plus the mask


def test_events_files_roll_over_and_read_as_one_run(tmp_path):
  tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  from scope_jax import events
  w = events.EventsWriter(tmp_path / "tb", max_bytes=300)
  for step in range(20):
    w.scalars(step, {"reward/mean": float(step), "loss": 1.0 / (step + 1)})
    w.flush()
  w.close()
  files = sorted(p.name for p in (tmp_path / "tb").iterdir())
  assert len(files) > 2 and not any(name.startswith(".") for name in files)
  acc = tb.EventAccumulator(str(tmp_path / "tb"))
  acc.Reload()
  assert [e.step for e in acc.Scalars("reward/mean")] == list(range(20))
  assert [e.value for e in acc.Scalars("reward/mean")] == [float(s) for s in range(20)]


def test_the_refusal_counts_training_steps_not_evaluations(tmp_path):
  rows = [{"step": 0, "eval/updates": 0.0}, {"step": 0, "x": 1.0}, {"step": 1, "x": 1.0},
          {"step": 1, "eval/updates": 1.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(ValueError, match="holds metrics of 2 steps but no checkpoint"):
    metrics_lib.check_fresh(tmp_path, has_checkpoint=False, overwrite=False)


@pytest.mark.parametrize("method", ["spell", "scope", "opensir", "asl", "piplay"])
def test_learn_presets_checkpoint_as_they_go(method):
  """A kill of a `learn` run (32–80 steps, a minute each on a CPU) loses at most 10 steps."""
  import importlib
  c = importlib.import_module(f"configs.{method}").get_config("learn")
  assert c.checkpoint_every <= 10 < c.total_steps, (c.checkpoint_every, c.total_steps)
