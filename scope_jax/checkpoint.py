"""orbax checkpoints of a self-play run: device state (params of every trained role, optimizer
states, counters, RNG) plus the method's host state (JSON: history memories, pools, counters;
its top-level numpy arrays, such as a pool's embeddings, are stored as arrays beside it).

Saves are asynchronous and keep the newest N; a restart resumes from the newest complete step.
In a multi-process run every process calls save and restore with its global arrays: orbax writes
each array's shards from the process that holds them and the host state from process 0, as one
checkpoint, and every process restores its own shards. orbax only lists steps whose save
committed, so an interrupted save is never picked; a committed step that fails to restore
(corrupt or partial files) is moved aside to `<dir>_quarantine/` (with a log line naming it) in
favour of the previous one, so the re-run step saves again. A save that orbax declines is an
error, never silence. Paths may be local or gs:// (etils.epath).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from scope_jax import distributed


ARRAYS = "__arrays__"  # the host state's array entries: shape and dtype (the arrays: host_arrays)


class Checkpointer:
  def __init__(self, directory, *, keep: int = 3, async_save: bool = True):
    self.directory = epath.Path(absolute(directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=keep,
                                           enable_async_checkpointing=async_save, create=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, state: Any, host_state: dict, *, force: bool = False) -> None:
    """Starts an (async) save of `state` (a pytree of arrays) and `host_state` (JSON-able).

    The host state is snapshotted here: orbax serialises it in the background commit, after
    this returns, while the method goes on changing its live lists and dicts (on a gs:// workdir
    the commit can take seconds, and the checkpoint would hold the next step's state)."""
    arrays = {k: np.array(v) for k, v in host_state.items() if isinstance(v, np.ndarray)}
    snapshot = json.loads(json.dumps({k: v for k, v in host_state.items() if k not in arrays}))
    snapshot[ARRAYS] = {k: [list(v.shape), v.dtype.str] for k, v in arrays.items()}
    items = dict(state=ocp.args.StandardSave(state), host=ocp.args.JsonSave(snapshot))
    stored = {k: v for k, v in arrays.items() if v.size}  # orbax refuses empty arrays
    if stored:
      items["host_arrays"] = ocp.args.StandardSave(stored)
    args = ocp.args.Composite(**items)
    if not self._manager.save(step, args=args, force=force):
      raise RuntimeError(f"orbax declined to save step {step} in {self.directory} (steps on disk: "
                         f"{self.steps()}); a step is saved only when it is newer than the latest.")

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  @staticmethod
  def list_steps(directory) -> list[int]:
    """Step directories present (committed or not), without opening a manager."""
    path = epath.Path(absolute(directory))
    if not path.exists():
      return []
    return sorted(int(p.name) for p in path.iterdir() if p.name.isdigit())

  def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """(step, state, host_state) of the newest step that restores, or None for a fresh run.

    `abstract_state` is a pytree of jax.ShapeDtypeStruct (with shardings) or arrays of the same
    structure; restored arrays take those shardings.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    for step in reversed(self.steps()):
      try:
        out = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()))
        host = dict(out["host"])
        shapes = host.pop(ARRAYS, {})
        if any(math.prod(shape) for shape, _ in shapes.values()):
          stored = self._manager.restore(step, args=ocp.args.Composite(
              host_arrays=ocp.args.StandardRestore()))["host_arrays"]
        for key, (shape, dtype) in shapes.items():
          host[key] = (np.asarray(stored[key]) if math.prod(shape)
                       else np.zeros(shape, np.dtype(dtype)))
        logging.info("Resuming from checkpoint step %d in %s", step, self.directory)
        return step, out["state"], host
      except Exception as e:  # noqa: BLE001 — any unreadable checkpoint falls back
        moved = self.quarantine(step)
        logging.warning("Checkpoint step %d in %s could not be restored (%s: %s); moved it to %s "
                        "and falling back to the previous checkpoint.", step, self.directory,
                        type(e).__name__, str(e)[:300], moved)
    return None

  def quarantine(self, step: int) -> epath.Path:
    """Moves a step that failed to restore out of the checkpoint directory (kept for a look)."""
    stamp = int(distributed.broadcast_int(int(time.time())))  # one name on every host
    target = epath.Path(f"{self.directory}_quarantine") / f"{step}-{stamp}"
    if distributed.is_primary():  # one process moves it; the others wait, then look again
      target.parent.mkdir(parents=True, exist_ok=True)
      (self.directory / str(step)).rename(target)
    distributed.barrier(f"quarantine_{step}")
    self._manager.reload()
    return target

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def absolute(path) -> str:
  """Local paths made absolute (orbax requires it); URLs such as gs://… unchanged."""
  path = os.fspath(path)
  return path if "://" in path else os.path.abspath(os.path.expanduser(path))
