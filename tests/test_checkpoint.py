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


def test_the_host_state_is_the_one_at_save_time(tmp_path, monkeypatch):
  """orbax serialises the host state's JSON in its background commit, after save() returns,
  while the method changes its live state; with a slow commit (as on gs://, simulated by a 1 s
  delay) the checkpoint held the next step's state. It must hold the state at save()."""
  import asyncio
  from orbax.checkpoint._src.handlers import json_checkpoint_handler as handler
  write = handler.JsonCheckpointHandler._save_fn

  async def slow_write(self, x, directory):
    await asyncio.sleep(1.0)
    await write(self, x, directory)

  monkeypatch.setattr(handler.JsonCheckpointHandler, "_save_fn", slow_write)
  ck = Checkpointer(tmp_path / "c", keep=3)
  host = {"step": 1, "pool": [{"q": "a"}], "history": {"phase": [0]}}
  ck.save(1, {"w": jnp.zeros(2)}, host)
  host["step"] = 2  # the method's next step, while the commit is still running
  host["pool"].append({"q": "b"})
  host["history"]["phase"].append(1)
  ck.wait()
  _, _, saved = ck.restore_latest({"w": jnp.zeros(2)})
  assert saved == {"step": 1, "pool": [{"q": "a"}], "history": {"phase": [0]}}
  ck.close()
