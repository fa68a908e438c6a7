"""What a compiled program costs on its target, from the compiler: per-chip memory
(`memory_analysis`), FLOPs and bytes (`cost_analysis`), and the collectives in its HLO.

The compiler's cost analysis counts a loop body once (a scan over 28 layers costs one layer). Its
HLO knows each loop's trip count: the matmuls (dots, convolutions) are counted there per
computation from their shapes, times the trips of the loops around them (`hlo.flops`), and so are
the Pallas kernels' calls, whose FLOPs come from their cost estimates or, where they have none,
from their grids in the jaxpr (`call_flops`); the compiler's remaining FLOPs (elementwise) are
scaled by the HLO's elementwise count with and without trips. HBM bytes are counted in the HLO
op by op with the same trip counts (`hbm.traffic`: what each op reads and writes, a slice's
window of a stacked weight, an in-place update's rows), and so are the collectives."""

from __future__ import annotations

import dataclasses
import math
import re
import time

from jax.extend import core as jcore

from scope_jax.models import ops
from scope_jax.plan import hbm
from scope_jax.plan import hlo as hlo_lib
from scope_jax.plan.hlo import (KINDS, Collective, array_bytes, collective_traffic,  # noqa: F401
                                group_size)
from scope_jax.plan.programs import Program

_DTYPE_BYTES = hlo_lib._DTYPE_BYTES


@dataclasses.dataclass
class Compiled:
  """One program compiled for one target: per-chip bytes and the compiler's cost counts."""
  program: Program
  seconds: float
  argument: int
  output: int
  alias: int
  temp: int
  code: int
  argument_logical: int  # the arguments' shard shapes, without the on-chip tile padding
  argument_tiled: int  # the same padded to their tiles (what `argument` counts)
  flops: float  # per chip and call, a loop body counted once (the compiler's convention)
  bytes_accessed: float  # likewise
  loop_factor: float  # per-call over loop-bodies-once matmul FLOPs (from the jaxpr)
  model_matmul_flops: float  # the program's matmul FLOPs per call, all chips (from the jaxpr)
  collectives: dict[str, Collective]
  loop_gathers: list[tuple[str, int]]  # all-gathers inside a while loop: (shape, bytes)
  hlo_bytes: float | None = None  # per chip and call: HBM bytes counted in the HLO, loop trips
  hlo_outside_bytes: float = 0.0  # of `hlo_bytes`, those of the ops outside every loop
  kernel_flops: float = 0.0  # per chip and call: Pallas kernels, loop trips included
  error: str = ""  # the compiler refused: its temporaries alone exceed the chip's HBM (`temp`)
  hlo_flops: float | None = None  # per chip and call, every loop's trips (`hlo_call_flops`)
  matmul_flops: float = 0.0  # of `hlo_flops`, the HLO's dots and convolutions

  @property
  def call_flops(self) -> float:
    """Per-chip FLOPs of one call: counted in the HLO with every loop's trips (a decode call's
    step loop included); without an HLO (the compiler refused), the compiler's count times the
    jaxpr's `loop_factor` plus the kernels (a while loop's body, a decode step, once)."""
    if self.hlo_flops is not None:
      return self.hlo_flops
    return self.flops * self.loop_factor + self.kernel_flops

  @property
  def call_bytes(self) -> float:
    """Per-chip HBM bytes of one call, every loop's trips included (`hbm.traffic`); without an
    HLO (the compiler refused), the compiler's count (a loop body once)."""
    return self.hlo_bytes if self.hlo_bytes is not None else self.bytes_accessed

  @property
  def bytes_factor(self) -> float:
    """Per-call bytes over the compiler's count with loop bodies once."""
    return self.call_bytes / self.bytes_accessed if self.bytes_accessed else 1.0

  @property
  def outside_bytes(self) -> float:
    """Of `call_bytes`, those outside every loop: paid once per call (a decode call's copies)."""
    return self.hlo_outside_bytes if self.hlo_bytes is not None else self.bytes_accessed

  @property
  def ici_bytes(self) -> float:
    """Interconnect bytes each chip receives in one call (traffic factors, loop trips)."""
    return sum(c.traffic for c in self.collectives.values())

  @property
  def peak(self) -> int:
    """Bytes live while it runs: its arguments, its outputs that do not reuse an argument's
    buffer, and its temporaries (arguments unknown where the compiler refused)."""
    return self.argument + self.output - self.alias + self.temp

  def extra(self) -> int:
    """Bytes it needs beyond the run's resident arrays (its inputs that are resident anyway)."""
    return self.temp if self.error else self.peak - self.program.resident_inputs


def hlo_collectives(hlo: str) -> tuple[dict[str, Collective], list[tuple[str, int]]]:
  """Collectives of an HLO module's text by kind, loop trips included (see `hlo.collectives`),
  and the all-gathers inside a loop."""
  return hlo_lib.collectives(hlo_lib.parse(hlo))


def _sub_jaxprs(value):
  if isinstance(value, jcore.ClosedJaxpr):
    return [value.jaxpr]
  if isinstance(value, jcore.Jaxpr):
    return [value]
  if isinstance(value, (tuple, list)):
    return [j for v in value for j in _sub_jaxprs(v)]
  return []


def _walk(jaxpr, cost, trips: bool) -> float:
  """Sum of `cost(eqn)` (None: look inside its nested jaxprs) over a jaxpr: a scan's body times
  its length (`trips`; else once, as the compiler counts), the costlier branch of a cond, a
  while body once (its trip count is data)."""
  total = 0.0
  for eqn in jaxpr.eqns:
    own = cost(eqn)
    if own is not None:
      total += own
      continue
    costs = [_walk(j, cost, trips) for v in eqn.params.values() for j in _sub_jaxprs(v)]
    if not costs:
      continue
    if eqn.primitive.name == "cond":
      total += max(costs)
    elif eqn.primitive.name == "scan" and trips:
      total += eqn.params["length"] * sum(costs)
    else:
      total += sum(costs)
  return total


def _dot_flops(eqn) -> float | None:
  """A `dot_general`'s or `ragged_dot`'s FLOPs (a ragged row meets only its own group's
  weights); 0 for a Pallas call (see `kernel_flops`); None for anything else."""
  name = eqn.primitive.name
  if name == "pallas_call":  # a kernel's body is per grid step
    return 0.0
  if name == "dot_general":
    numbers = eqn.params["dimension_numbers"]
  elif name == "ragged_dot_general":
    numbers = eqn.params["ragged_dot_dimension_numbers"].dot_dimension_numbers
  else:
    return None
  (contract, _), _ = numbers
  lhs = eqn.invars[0].aval.shape
  return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)


def matmul_flops(jaxpr, trips: bool = True) -> float:
  """FLOPs of every `dot_general` and `ragged_dot` in a jaxpr (2 per multiply-add, global
  shapes), through every nested jaxpr with their trip counts (`_walk`)."""
  return _walk(jaxpr, _dot_flops, trips)


def _causal_blocks(blocks: int) -> int:
  """Blocks of a square [blocks × blocks] score grid that a causal mask leaves visible."""
  return blocks * (blocks + 1) // 2


def _pallas_flops(eqn) -> float:
  """One Pallas call's FLOPs from its grid: the body's matmul FLOPs (one grid step) times the
  steps it runs. Splash attention skips the score blocks its mask hides: its grid is (heads,
  query blocks, key blocks) forward, (key blocks, heads, query blocks) for the key/value
  gradients, after any vmapped rows, and its mask is counted as causal (the larger of the two a
  layer chooses between at run time; a sliding window's band visits fewer blocks)."""
  grid = [int(g) for g in eqn.params["grid_mapping"].grid]
  body = matmul_flops(eqn.params["jaxpr"])
  name = str(eqn.params.get("name", ""))
  if name.startswith("splash_") and len(grid) >= 3:
    q_axis, k_axis = (-1, -3) if "_dkv" in name else (-2, -1)
    if grid[q_axis] == grid[k_axis]:
      steps = math.prod(grid) // (grid[q_axis] * grid[k_axis]) * _causal_blocks(grid[q_axis])
      return body * steps
  return body * math.prod(grid)


def _uncounted_kernel_flops(eqn) -> float | None:
  if eqn.primitive.name != "pallas_call":
    return None
  return _pallas_flops(eqn) if eqn.params.get("cost_estimate") is None else 0.0


def kernel_flops(jaxpr, trips: bool = True) -> float:
  """FLOPs of the Pallas kernels in a jaxpr that carry no cost estimate (the compiler counts a
  custom call's estimate, as megablox gives one, and nothing for the others: splash attention),
  through nested jaxprs with their trip counts (`_walk`). Inside `shard_map` the shapes are a
  chip's, so these are per-chip FLOPs."""
  return _walk(jaxpr, _uncounted_kernel_flops, trips)


def _kernel_name(name: str) -> str:
  return re.sub(r"[^\w\-]", "_", name).split(".")[0]


def _kernel_key(eqn) -> tuple[str, tuple[tuple[int, ...], ...]]:
  """A Pallas call's name and its results' shapes: how its HLO custom call is recognised."""
  info = eqn.params.get("name_and_src_info")
  name = str(eqn.params.get("name") or getattr(info, "name", "") or "")
  return _kernel_name(name), tuple(tuple(int(d) for d in v.aval.shape) for v in eqn.outvars)


def _grid_kernels(jaxpr) -> dict:
  """The Pallas calls without a cost estimate in a jaxpr: key (`_kernel_key`) → FLOPs of one
  call (from its grid) and, for any the HLO does not show, FLOPs per call with scan trips."""
  found = {}

  def note(eqn):
    if eqn.primitive.name != "pallas_call":
      return None
    if eqn.params.get("cost_estimate") is None:
      found.setdefault(_kernel_key(eqn), _pallas_flops(eqn))
    return 0.0

  _walk(jaxpr, note, trips=False)
  totals = {k: _walk(jaxpr, lambda e, k=k: None if e.primitive.name != "pallas_call" else (
      f if _kernel_key(e) == k and e.params.get("cost_estimate") is None else 0.0), trips=True)
            for k, f in found.items()}
  return {k: (f, totals[k]) for k, f in found.items()}


def kernel_cost(grid: dict):
  """FLOPs of one run of an HLO Pallas call (`hlo.KernelCall`): its cost estimate, else its
  grid's (`_grid_kernels`, matched by name and result shapes, or by shapes alone where one
  kernel has them); 0 for a kernel the jaxpr does not show."""
  by_shape: dict = {}
  for (name, shapes), v in grid.items():
    by_shape.setdefault(shapes, []).append(v)

  def cost(k: hlo_lib.KernelCall) -> float:
    if k.estimate is not None:
      return k.estimate
    key = (_kernel_name(k.name), k.results)
    if key in grid:
      return grid[key][0]
    same = by_shape.get(k.results, [])
    return same[0][0] if len(same) == 1 else 0.0
  return cost


def hlo_call_flops(flops_once: float, counted: hlo_lib.Flops, jaxpr) -> tuple[float, float]:
  """(FLOPs, of which Pallas kernels' FLOPs) per chip and call, every loop's trips included:
  the HLO's matmuls; each kernel call times its runs, at its cost estimate (what the compiler
  counts) or its grid's FLOPs (`kernel_cost`; a kernel the HLO does not show is counted with
  its scans' trips in the jaxpr); and the rest of the compiler's count `flops_once` (loop
  bodies once: elementwise work) times the HLO's elementwise ratio of per call to loop bodies
  once."""
  grid = _grid_kernels(jaxpr)
  cost = kernel_cost(grid)
  kernels = estimated_once = 0.0
  seen = set()
  for k in counted.kernels:
    kernels += k.weight * cost(k)
    if k.estimate is not None:
      estimated_once += k.once * k.estimate
    elif cost(k):
      seen.update(g for g in grid if g[1] == k.results and (
          g[0] == _kernel_name(k.name) or (_kernel_name(k.name), k.results) not in grid))
  kernels += sum(total for key, (_, total) in grid.items() if key not in seen)
  rest = max(flops_once - counted.matmul_once - estimated_once, 0.0)
  return counted.matmul_call + kernels + rest * counted.elementwise_factor, kernels


def loop_factor(jaxpr) -> float:
  """Per-call FLOPs over the compiler's loop-bodies-once FLOPs, from the program's matmuls."""
  once = matmul_flops(jaxpr, trips=False)
  return matmul_flops(jaxpr) / once if once else 1.0


_OUT_OF_MEMORY = re.compile(r"memory required for HLO temporaries \(([\d.]+)([KMGT]?)\)")
_UNITS = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}
_PARAM = re.compile(r"= ([a-z0-9]+)\[([0-9,]*)\](?:\{([^}]*)\})? parameter\(")


def parameter_bytes(hlo: str) -> tuple[int, int]:
  """(logical, tiled) bytes of the entry computation's parameters: each shard's shape, and the
  same padded to its on-chip tiles (`T(8,128)`: the two most minor dims rounded up to 8 and 128
  elements; a scalar to its tile), which is what the device allocates."""
  lines = hlo.splitlines()
  start = next((i for i, l in enumerate(lines) if l.startswith("ENTRY")), len(lines))
  logical = tiled = 0
  for line in lines[start + 1:]:
    if line.startswith("}"):
      break
    m = _PARAM.search(line)
    if not m:
      continue
    size = _DTYPE_BYTES.get(m.group(1), 4)
    dims = [int(d) for d in m.group(2).split(",") if d]
    logical += size * math.prod(dims)
    layout = m.group(3) or ""
    order = [int(d) for d in layout.split(":")[0].split(",") if d]
    tile = re.search(r"T\((\d+)(?:,(\d+))?\)", layout)
    padded = list(dims) or [1]
    if tile:
      sizes = [int(t) for t in tile.groups() if t]  # major to minor
      minor = order or [0]
      for axis, t in zip(minor, reversed(sizes)):
        padded[axis] = -(-padded[axis] // t) * t
    tiled += size * math.prod(padded)
  return logical, tiled


def compile_program(program: Program, platform: str = "tpu", devices: int = 0) -> Compiled:
  """Traces `program` as it is traced on `platform` with `devices` devices (the model's
  backend-dependent choices follow the target), compiles it and reads its costs."""
  start = time.perf_counter()
  with ops.compiling_for(platform, devices):
    traced = program.trace()
  jaxpr = traced.jaxpr.jaxpr
  try:
    compiled = traced.lower().compile()
  except Exception as e:  # noqa: BLE001 — the compiler's own verdict that it cannot fit
    need = _OUT_OF_MEMORY.search(str(e))
    if not need:
      raise
    return Compiled(program, time.perf_counter() - start, argument=0, output=0, alias=0,
                    temp=int(float(need.group(1)) * _UNITS[need.group(2)]), code=0,
                    argument_logical=0, argument_tiled=0, flops=0.0, bytes_accessed=0.0,
                    loop_factor=loop_factor(jaxpr), model_matmul_flops=matmul_flops(jaxpr),
                    collectives={k: Collective() for k in KINDS}, loop_gathers=[],
                    kernel_flops=kernel_flops(jaxpr), error=str(e).strip().splitlines()[-1])
  seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
  hlo = compiled.as_text()
  module = hlo_lib.parse(hlo)
  collectives, gathers = hlo_lib.collectives(module)
  traffic = hbm.traffic(module)
  logical, tiled = parameter_bytes(hlo)
  flops = float(cost.get("flops", 0.0))
  counted = hlo_lib.flops(module, kernel_cost(_grid_kernels(jaxpr)))
  per_call, kernels = hlo_call_flops(flops, counted, jaxpr)
  return Compiled(program, seconds, argument=mem.argument_size_in_bytes,
                  output=mem.output_size_in_bytes, alias=mem.alias_size_in_bytes,
                  temp=mem.temp_size_in_bytes, code=mem.generated_code_size_in_bytes,
                  flops=flops, hlo_flops=per_call, matmul_flops=counted.matmul_call,
                  bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                  loop_factor=loop_factor(jaxpr), model_matmul_flops=matmul_flops(jaxpr),
                  argument_logical=logical, argument_tiled=tiled,
                  collectives=collectives, loop_gathers=gathers,
                  hlo_bytes=traffic.call, hlo_outside_bytes=traffic.outside,
                  kernel_flops=kernels)
