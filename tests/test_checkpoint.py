"""The checkpointer: relative paths, keep-N, resume of the newest step, corrupt-step fallback."""

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.checkpoint import Checkpointer, absolute


def test_relative_path_keep_n_and_corrupt_fallback(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  ck = Checkpointer("runs/x/checkpoints", keep=2)  # a relative workdir, as in the README
  state = {"w": jnp.arange(4.0)}
  for step in range(3):
    ck.save(step, {"w": state["w"] + step}, {"step": step, "memory": {"c": [1, 2]}})
  ck.wait()
  assert ck.steps() == [1, 2]
  step, restored, host = ck.restore_latest(state)
  assert step == 2 and host == {"step": 2, "memory": {"c": [1, 2]}}
  chex.assert_trees_all_equal(restored["w"], np.arange(4.0) + 2)
  # Corrupt the newest step: restore falls back to the previous one.
  for f in (tmp_path / "runs/x/checkpoints/2/state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"garbage")
  ck.close()
  again = Checkpointer("runs/x/checkpoints", keep=2)
  step, restored, host = again.restore_latest(state)
  assert step == 1 and host["step"] == 1
  chex.assert_trees_all_equal(restored["w"], np.arange(4.0) + 1)
  # The corrupt step was moved aside, so the re-run step 2 saves and the next start resumes it.
  assert again.steps() == [1]
  assert [p.name.split("-")[0] for p in (tmp_path / "runs/x/checkpoints_quarantine").iterdir()] == ["2"]
  again.save(2, {"w": state["w"] + 20}, {"step": 2})
  again.close()
  step, restored, _ = Checkpointer("runs/x/checkpoints", keep=2).restore_latest(state)
  assert step == 2
  chex.assert_trees_all_equal(restored["w"], np.arange(4.0) + 20)


def test_a_declined_save_is_an_error(tmp_path):
  ck = Checkpointer(tmp_path / "c", keep=3, async_save=False)
  ck.save(3, {"w": jnp.zeros(2)}, {})
  with pytest.raises(RuntimeError, match="declined to save step 2"):
    ck.save(2, {"w": jnp.zeros(2)}, {})
  ck.close()


def test_absolute_paths(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert absolute("gs://bucket/run") == "gs://bucket/run"
  assert absolute("runs/x") == str(tmp_path / "runs/x")
