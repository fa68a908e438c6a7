"""TPU slices as users name them (`v5p-8`, `v5litepod-16`, `v6e-64`), their chips' public specs,
and compile-only devices for them from libtpu: nothing here needs a TPU.

A name's number counts TensorCores on v4 and v5p (two per chip, one megacore device: `v5p-8` is
4 chips) and chips on v5e and v6e. Chip figures are the public peak numbers (bfloat16 FLOP/s, HBM
bytes and bandwidth, interconnect links); every time derived from them is a roofline estimate,
never a measurement.

Sources (Cloud TPU system architecture pages, cloud.google.com/tpu/docs/v4, v5p, v5e, v6e):

| chip | bf16 peak | HBM | HBM bandwidth | ICI per chip | one link, one way |
|---|---|---|---|---|---|
| v4 | 275 TFLOP/s | 32 GiB | 1,200 GB/s | 6 ports | ~45 GB/s |
| v5p | 459 TFLOP/s | 95 GiB | 2,765 GB/s | 1,200 GB/s bidirectional, 6 ports | 100 GB/s |
| v5e | 197 TFLOP/s | 16 GiB | 819 GB/s | 400 GB/s bidirectional, 4 ports | 50 GB/s |
| v6e | 918 TFLOP/s | 32 GiB | 1,640 GB/s | 800 GB/s bidirectional, 4 ports | 100 GB/s |

Assumption for the interconnect (`Slice.ici_ingress`): a chip receives from each distinct
neighbour in its slice's grid over one link at the one-way rate: a dimension of 2 chips gives
one neighbour (no wrap-around link below a full torus), a longer one two; at most its ports.
A v5p-8 (2x2x1) chip thus takes in 200 GB/s. Traffic between slices (DCN) is counted at this
rate too, which flatters multi-slice runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
  generation: str  # libtpu's name: v4 | v5p | v5e | v6e
  hbm_bytes: int
  hbm_bandwidth: float  # bytes/s
  bf16_flops: float  # peak FLOP/s
  cores_per_chip: int  # TensorCores a slice name counts per chip
  dims: int  # torus dimensions (3 for v4/v5p, 2 for the lite chips)
  ici_link: float = 0.0  # bytes/s one way over one interconnect link
  ici_ports: int = 0  # links per chip


CHIPS = {
    "v4": Chip("v4", 32 * GIB, 1.2e12, 275e12, 2, 3, ici_link=45e9, ici_ports=6),
    "v5p": Chip("v5p", 95 * GIB, 2.765e12, 459e12, 2, 3, ici_link=100e9, ici_ports=6),
    "v5e": Chip("v5e", 16 * GIB, 8.19e11, 197e12, 1, 2, ici_link=50e9, ici_ports=4),
    "v6e": Chip("v6e", 32 * GIB, 1.64e12, 918e12, 1, 2, ici_link=100e9, ici_ports=4),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6litepod": "v6e", "v5": "v5p"}
_NAME = re.compile(r"^(?:(\d+)x)?([a-z0-9]+)-(\d+)$")


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str  # as the user wrote it
  chip: Chip
  chips: int  # per slice
  slices: int = 1

  @property
  def total_chips(self) -> int:
    return self.chips * self.slices

  @property
  def shape(self) -> tuple[int, ...]:
    return torus_shape(self.chips, self.chip.dims)

  @property
  def ici_ingress(self) -> float:
    """Bytes/s one chip can receive over the interconnect (the assumption above)."""
    neighbours = sum(0 if d == 1 else 1 if d == 2 else 2 for d in self.shape)
    return self.chip.ici_link * min(neighbours, self.chip.ici_ports)

  @property
  def topology_name(self) -> str:
    return f"{self.chip.generation}:" + "x".join(str(d) for d in self.shape)


def torus_shape(chips: int, dims: int) -> tuple[int, ...]:
  """The chip grid of a slice: 2x2(x1) for 4 chips, then the smallest axis doubles (the last
  such axis first), as Cloud TPU lays slices out: 2x2x2, 2x2x4, 2x4x4, 4x4x4 …; 2x4, 4x4, 4x8 …"""
  if chips == 1:
    return (1,) * dims
  if chips < 4 or chips & (chips - 1):
    raise ValueError(f"A slice of {chips} chips is not a TPU slice shape; use 1, 4, 8, 16, … "
                     "chips (a power of two from 4).")
  shape = [2, 2] + [1] * (dims - 2)
  while math.prod(shape) < chips:
    i = max(j for j, d in enumerate(shape) if d == min(shape))
    shape[i] *= 2
  return tuple(shape)


def parse(name: str) -> Slice:
  """'v5p-8', 'v5litepod-16', 'v6e-64', or 'Nx<slice>' for N slices (multi-slice)."""
  m = _NAME.match(name.strip().lower())
  gen = m and ALIASES.get(m.group(2), m.group(2))
  if not m or gen not in CHIPS:
    raise ValueError(f"Unknown TPU topology {name!r}; write it as Cloud TPU names slices: "
                     f"{', '.join(('v4-8', 'v5p-8', 'v5litepod-16', 'v5e-16', 'v6e-64'))}, "
                     "or '2xv5p-8' for two slices.")
  chip, count = CHIPS[gen], int(m.group(3))
  if m.group(1) is not None and int(m.group(1)) < 1:
    raise ValueError(f"{name}: a run spans at least one slice; write '{gen}-{count}' or "
                     f"'2x{gen}-{count}'.")
  if count % chip.cores_per_chip:
    raise ValueError(f"{name}: {gen} slices count TensorCores ({chip.cores_per_chip} per chip); "
                     f"use a multiple of {chip.cores_per_chip}.")
  s = Slice(name, chip, count // chip.cores_per_chip, int(m.group(1) or 1))
  s.shape  # noqa: B018  (validates the chip count)
  return s


def quiet_libtpu() -> None:
  """libtpu, loaded for compilation only, looks for a TPU VM's metadata; say there is none."""
  os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling needs no exclusive TPU
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TPU_WORKER_ID", "0")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def devices(s: Slice):
  """Compile-only devices of `s` (every chip of every slice), from libtpu."""
  if importlib.util.find_spec("libtpu") is None:
    raise RuntimeError("Compiling for TPUs needs libtpu: pip install -e '.[tpu]' (the version "
                       "that matches the installed jax).")
  quiet_libtpu()
  from jax.experimental import topologies
  kwargs = dict(chips_per_host_bounds=(1, 1, 1) if s.chips == 1 else (2, 2, 1))
  if s.chip.cores_per_chip == 2:
    kwargs["chip_config_name"] = "megacore"
  if s.slices > 1:
    kwargs["num_slices"] = s.slices
  desc = topologies.get_topology_desc(platform="tpu", topology_name=s.topology_name, **kwargs)
  return list(desc.devices)
