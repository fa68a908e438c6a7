"""Metrics on a gs:// workdir, against a local GCS emulator: every step's line, sample and
TensorBoard scalar survives (gcsfs has no append mode), and a resume sees each step once."""

import os
import socket

import pytest

emulator = pytest.importorskip("gcp_storage_emulator.server")
gcsfs = pytest.importorskip("gcsfs")
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

from etils import epath  # noqa: E402
from etils.epath import gpath  # noqa: E402

from scope_jax import metrics as metrics_lib  # noqa: E402

BUCKET = "scope-jax-test"


@pytest.fixture(scope="module")
def gcs():
  """A fresh in-memory GCS server; epath reaches it through gcsfs (not TensorFlow's client)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  server = emulator.create_server("localhost", port, in_memory=True, default_bucket=BUCKET)
  server.start()
  saved = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "EPATH_USE_TF")}
  os.environ.update(STORAGE_EMULATOR_HOST=f"http://localhost:{port}", EPATH_USE_TF="false")
  _reset_clients()
  yield f"gs://{BUCKET}"
  server.stop()
  for k, v in saved.items():
    if v is None:
      os.environ.pop(k, None)
    else:
      os.environ[k] = v
  _reset_clients()


def _reset_clients():
  """gcsfs caches its clients and epath caches its TensorFlow check; both read the env above."""
  gcsfs.GCSFileSystem.clear_instance_cache()
  gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access


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
