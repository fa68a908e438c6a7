"""Multi-process runs: one process per host, started by `launch/` (or by a cluster) with the same
command on every host.

`initialize` reads the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and
`JAX_PROCESS_ID` (set by `launch/local.py`, `launch/slurm.sbatch` and the GKE manifest) are passed
to `jax.distributed.initialize` as they are; `SCOPE_JAX_DISTRIBUTED=auto` (set by
`launch/tpu_pod.py`), or a TPU slice whose `TPU_WORKER_HOSTNAMES` lists several workers, lets JAX
find them itself (TPU VM metadata, GKE, Slurm). Anything else is a single-process run.

Every host runs the same Python on the same host data, so host-side decisions (documents, tasks,
memories, pools) agree without communication; `check_agree` verifies that cheaply, so a host
that drifted fails loudly instead of training on a different batch.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import jax
import numpy as np
from absl import logging

ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_MODE = "SCOPE_JAX_DISTRIBUTED"  # 'auto': JAX detects the cluster; 'off' or unset: explicit only


def init_args(environ: Mapping[str, str]) -> dict[str, Any] | None:
  """Keyword arguments for `jax.distributed.initialize` from the environment, or None for a
  single-process run. An incomplete or inconsistent setting is an error that names the variable."""
  names = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)
  given = {k: environ[k] for k in names if environ.get(k, "").strip()}
  if given:
    missing = [k for k in names if k not in given]
    if missing:
      raise ValueError(f"Multi-process run: {', '.join(sorted(given))} set but "
                       f"{', '.join(missing)} missing; set all three (launch/local.py, "
                       "launch/slurm.sbatch and launch/gke/ set them for you).")
    try:
      num, pid = int(given[ENV_NUM_PROCESSES]), int(given[ENV_PROCESS_ID])
    except ValueError:
      raise ValueError(f"{ENV_NUM_PROCESSES}={given[ENV_NUM_PROCESSES]!r} and {ENV_PROCESS_ID}="
                       f"{given[ENV_PROCESS_ID]!r} must be integers.") from None
    if num < 1 or not 0 <= pid < num:
      raise ValueError(f"{ENV_PROCESS_ID}={pid} must be in [0, {ENV_NUM_PROCESSES}={num}).")
    if num == 1:
      return None
    return {"coordinator_address": given[ENV_COORDINATOR], "num_processes": num,
            "process_id": pid}
  mode = environ.get(ENV_MODE, "").strip().lower()
  if mode not in ("", "auto", "off"):
    raise ValueError(f"{ENV_MODE}={environ[ENV_MODE]!r}: use 'auto' (JAX finds the cluster: TPU VM "
                     "pods, GKE, Slurm) or 'off'.")
  if mode == "auto":
    return {}
  if mode != "off" and len([h for h in environ.get("TPU_WORKER_HOSTNAMES", "").split(",")
                            if h.strip()]) > 1:
    return {}  # a multi-host TPU slice: JAX reads the workers and this one's id itself
  return None


def initialize(environ: Mapping[str, str]) -> bool:
  """Starts JAX's distributed runtime when the environment asks for it; True if it did."""
  args = init_args(environ)
  if args is None:
    return False
  jax.distributed.initialize(**args)
  logging.info("Process %d of %d; %d local of %d devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return True


def is_primary() -> bool:
  """Process 0 writes what a run writes once: metrics, samples, TensorBoard, run.json."""
  return jax.process_index() == 0


def digest(value: Any) -> str:
  """A short digest of a JSON-able value (sorted keys; numpy arrays by their bytes), for
  comparing host state across hosts."""
  def other(x):
    if isinstance(x, np.ndarray):
      return f"{x.dtype}{x.shape}:{hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()}"
    return repr(x)
  blob = json.dumps(value, sort_keys=True, default=other).encode()
  return hashlib.sha256(blob).hexdigest()[:32]


def check_agree(what: str, value: Any) -> None:
  """Fails on every process when the hosts hold different `value`s (a JSON-able value, compared
  by digest: one small all-gather). Nothing to do in a single-process run."""
  if jax.process_count() == 1:
    return
  from jax.experimental import multihost_utils
  mine = np.frombuffer(bytes.fromhex(digest(value)), np.uint8)
  every = np.asarray(multihost_utils.process_allgather(mine))  # [processes, 16]
  differ = [p for p in range(every.shape[0]) if not np.array_equal(every[p], every[0])]
  if differ:
    raise RuntimeError(f"Hosts diverged: {what} on processes {differ} differs from process 0's. "
                       "Every host must take the same host-side decisions (same seed, same data "
                       "files, same code and config on every host).")


def broadcast_int(value: int) -> int:
  """Process 0's `value` on every process: a decision read from a shared file system (which
  another host may see a moment later) or from the clock, taken once for all."""
  if jax.process_count() == 1:
    return int(value)
  from jax.experimental import multihost_utils
  return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int32)))


def on_every_host(flag: bool) -> bool:
  """True when `flag` holds on every process (a file each host keeps on its own disk, say)."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(np.all(multihost_utils.process_allgather(np.asarray(flag, np.int32))))


def barrier(name: str) -> None:
  """Waits until every process reaches `name` (a no-op in a single-process run)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def wait_all(name: str, timeout_s: float) -> None:
  """Waits until every process reaches `name`, for up to `timeout_s` (hours, if need be): a
  barrier of the coordination service, not a device collective, so one host may work long
  (embedding its share, merging) while the others wait. A no-op in a single-process run."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed as jax_distributed
  client = jax_distributed.global_state.client
  if client is None:  # started without jax.distributed (a cluster runtime): a device barrier
    barrier(name)
    return
  client.wait_at_barrier(name, int(timeout_s * 1000))
