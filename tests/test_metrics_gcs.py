"""Metrics on a gs:// workdir, against a local GCS emulator: every step's line, sample and
TensorBoard scalar survives (gcsfs has no append mode), and a resume sees each step once."""

import pytest

gcsfs = pytest.importorskip("gcsfs")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from etils import epath  # noqa: E402

from scope_jax import metrics as metrics_lib  # noqa: E402
from tests.gcs import BUCKET, fake_gcs  # noqa: E402


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """A fresh local GCS server; epath reaches it through gcsfs (not TensorFlow's client)."""
  with fake_gcs(tmp_path_factory.mktemp("gcs") / "root"):
    yield f"gs://{BUCKET}"


def _run(workdir, steps, resume=None):
  w = metrics_lib.MetricsWriter(workdir)
  w.start(resume)
  for step in steps:
    w.samples(step, [{"output": f"sample of step {step}"}])
    w.write(step, {"reward/mean": float(step)})
  w.close()


def _tensorboard_steps(workdir, local):
  """Copies the events files down and reads them the way TensorBoard does."""
  local.mkdir()
  for f in (epath.Path(workdir) / "tb").iterdir():
    (local / f.name).write_bytes(f.read_bytes())
  acc = event_accumulator.EventAccumulator(str(local))
  acc.Reload()
  return [e.step for e in acc.Scalars("reward/mean")]


def test_the_emulator_loses_appends_as_gcs_does(gcs):
  path = epath.Path(gcs) / "append" / "log.txt"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("step 0\n")
  with pytest.warns(UserWarning, match="Append mode"), path.open("a") as f:
    f.write("step 1\n")
  assert path.read_text() == "step 1\n"  # why metrics are never appended


def test_n_steps_leave_n_lines_samples_and_scalars(gcs, tmp_path):
  workdir = f"{gcs}/fresh"
  _run(workdir, range(4))
  records = metrics_lib.read_jsonl(epath.Path(workdir) / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1, 2, 3]
  samples = (epath.Path(workdir) / "samples.log").read_text()
  assert [samples.count(f"sample of step {s}\n") for s in range(4)] == [1] * 4
  assert _tensorboard_steps(workdir, tmp_path / "tb") == [0, 1, 2, 3]


def test_resume_on_gcs_sees_each_step_once(gcs, tmp_path):
  workdir = f"{gcs}/resumed"
  _run(workdir, range(5))  # the last checkpoint was step 2; steps 3 and 4 run again
  _run(workdir, range(3, 7), resume=2)
  records = metrics_lib.read_jsonl(epath.Path(workdir) / "metrics.jsonl")
  assert [r["step"] for r in records] == list(range(7))
  samples = (epath.Path(workdir) / "samples.log").read_text()
  assert [samples.count(f"sample of step {s}\n") for s in range(7)] == [1] * 7
  assert _tensorboard_steps(workdir, tmp_path / "tb") == list(range(7))
