"""TPU slice shapes the launchers know: chips, hosts, the TPU VM runtime and the GKE labels.

Names follow `gcloud`'s accelerator types (v5e is `v5litepod-N`; `v5e-N` is accepted too). For
v5p the number counts TensorCores (two per chip); for v5e and v6e it counts chips.
"""

from __future__ import annotations

import dataclasses
import math
import re


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # gcloud's accelerator type
  chips: int
  hosts: int
  runtime: str  # TPU VM software version
  gke_accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
  topology: str  # node label cloud.google.com/gke-tpu-topology
  hbm_gib: int  # per chip

  @property
  def chips_per_host(self) -> int:
    return self.chips // self.hosts


SLICES = {s.name: s for s in (
    Slice("v5p-8", 4, 1, "v2-alpha-tpuv5", "tpu-v5p-slice", "2x2x1", 95),
    Slice("v5p-16", 8, 2, "v2-alpha-tpuv5", "tpu-v5p-slice", "2x2x2", 95),
    Slice("v5p-32", 16, 4, "v2-alpha-tpuv5", "tpu-v5p-slice", "2x2x4", 95),
    Slice("v5litepod-8", 8, 1, "v2-alpha-tpuv5-lite", "tpu-v5-lite-podslice", "2x4", 16),
    Slice("v5litepod-16", 16, 4, "v2-alpha-tpuv5-lite", "tpu-v5-lite-podslice", "4x4", 16),
    Slice("v5litepod-32", 32, 8, "v2-alpha-tpuv5-lite", "tpu-v5-lite-podslice", "4x8", 16),
    Slice("v5litepod-64", 64, 16, "v2-alpha-tpuv5-lite", "tpu-v5-lite-podslice", "8x8", 16),
    Slice("v6e-8", 8, 2, "v2-alpha-tpuv6e", "tpu-v6e-slice", "2x4", 32),
    Slice("v6e-16", 16, 4, "v2-alpha-tpuv6e", "tpu-v6e-slice", "4x4", 32),
    Slice("v6e-64", 64, 16, "v2-alpha-tpuv6e", "tpu-v6e-slice", "8x8", 32),
    Slice("v6e-256", 256, 64, "v2-alpha-tpuv6e", "tpu-v6e-slice", "16x16", 32),
)}


def get(name: str) -> Slice:
  """The slice `name` ('v5e-16' is read as gcloud's 'v5litepod-16'); unknown names list the
  known ones."""
  key = re.sub(r"^v5e-", "v5litepod-", name.strip().lower())
  if key not in SLICES:
    raise ValueError(f"Unknown accelerator {name!r}; known: {', '.join(SLICES)}.")
  return SLICES[key]


def mesh_shape_arg(args: list[str]) -> tuple[int, ...] | None:
  """The `--config.mesh.shape` of a scope_jax.main command, if it sets one."""
  for a in args:
    m = re.fullmatch(r"--config\.mesh\.shape=['\"]?\(?([-\d,\s]+)\)?['\"]?", a)
    if m:
      return tuple(int(x) for x in m.group(1).split(",") if x.strip())
  return None


def check_mesh(shape: tuple[int, ...] | None, chips: int, name: str) -> None:
  """Fails before any machine starts when `mesh.shape` cannot cover the slice's chips."""
  if shape is None:
    return
  known = math.prod(s for s in shape if s != -1)
  ok = chips % known == 0 if -1 in shape else known == chips
  if not ok or shape.count(-1) > 1:
    raise ValueError(f"--config.mesh.shape={shape} does not fit {name}'s {chips} chips; make the "
                     "product equal the chip count, or put -1 on one axis.")


def workdir_arg(args: list[str]) -> str | None:
  """The `--workdir` of a scope_jax.main command."""
  for i, a in enumerate(args):
    if a.startswith("--workdir="):
      return a.split("=", 1)[1]
    if a == "--workdir" and i + 1 < len(args):
      return args[i + 1]
  return None


def check_shared_workdir(args: list[str], hosts: int) -> None:
  """A multi-host run needs one workdir every host sees: a gs:// bucket path."""
  workdir = workdir_arg(args)
  if workdir is None:
    raise ValueError("The command has no --workdir=gs://<bucket>/<run>.")
  if hosts > 1 and not workdir.startswith("gs://"):
    raise ValueError(f"--workdir={workdir} is local to each host, but this slice has {hosts} "
                     "hosts that write one checkpoint together; use a gs://<bucket>/<run> path.")
