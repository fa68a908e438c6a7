"""Reading a compiled HLO module's text: its computations, how often each runs per call (while
loops' trip counts), its collectives with the interconnect (ICI) bytes each moves per chip, and
its FLOPs (HBM bytes: `hbm`).

Traffic factors, per chip, for a collective over a replica group of n chips (ring algorithms):
all-gather (n−1)/n·output, reduce-scatter (n−1)/n·input, all-reduce 2(n−1)/n·size, all-to-all
(n−1)/n·size, collective-permute size. The TPU compiler writes most reduce-scatters as an
all-reduce inside an `all-reduce-scatter` fusion (emitter `SingleInputAllReduceScatterFusion`)
that keeps one slice of the result: that all-reduce counts as a reduce-scatter of its input."""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import numpy as np

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "f8e4m3fn": 1,
                "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_OP = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z\-]+)\(")
_CALLS = re.compile(r"(?:body|condition|calls|to_apply)=%?([\w.\-]+)|branch_computations=\{([^}]*)\}")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = ")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OPCODES = {"ragged-all-to-all": "all-to-all"}
_SCATTER_FUSION = re.compile(r"reduce-scatter")  # `all-reduce-scatter.3.clone.1` and the like
_EXPLICIT = re.compile(r"replica_groups=\{(\{[0-9,]*\})")
_IOTA = re.compile(r"replica_groups=\[([0-9,]+)\]<=")
_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_PARTITIONS = re.compile(r"\b(num_partitions|replica_count)=(\d+)")
_OPERANDS = re.compile(r"%([\w.\-]+)")


def _prod(dims: str) -> int:
  return math.prod(int(d) for d in dims.split(",") if d)


def arrays(text: str) -> list[int]:
  """Bytes of each array in an HLO type (`bf16[8,128]{1,0}`, or every member of a tuple)."""
  return [_DTYPE_BYTES.get(d, 4) * _prod(dims) for d, dims in _ARRAY.findall(text)]


def array_bytes(text: str) -> int:
  """Bytes of an HLO result type: an array, or the sum of a tuple's members."""
  return sum(arrays(text))


@dataclasses.dataclass
class Module:
  """An HLO module's computations (name → instruction lines), its entry, and each reachable
  computation's runs per call of the entry (`weight`: the product of the trip counts of the
  while loops around it; `looped`: the computations inside some loop)."""
  computations: dict[str, list[str]]
  entry: str
  weight: dict[str, int]
  looped: set[str]
  devices: int  # chips in the program (`num_partitions` × `replica_count`)


def _trip_count(line: str, computations: dict[str, list[str]]) -> int:
  """A while loop's trip count: the compiler's known count, else the bound its condition
  compares the counter with (a scan's `i < length`, or the unsigned counter of a loop the
  compiler wrote itself: a windowed einsum's `u32` steps) over the step the body adds to it
  (such a loop unrolled by 2 adds 2); 1 when neither is there."""
  known = _TRIP.search(line)
  if known:
    return int(known.group(1))
  cond = re.search(r"condition=%?([\w.\-]+)", line)
  cond_lines = computations.get(cond.group(1) if cond else "", [])
  bounds = [int(n) for l in cond_lines for n in _SCALAR_CONSTANT.findall(l)]
  if not bounds:
    return 1
  body = re.search(r"body=%?([\w.\-]+)", line)
  step = _counter_step(cond_lines, computations.get(body.group(1) if body else "", []))
  return max(-(-max(bounds) // step), 1)


_SCALAR_CONSTANT = re.compile(r"[su](?:32|64)\[\][^=]*constant\((\d+)\)")
_GTE_INDEX = re.compile(r"%([\w.\-]+) = [su](?:32|64)\[\][^=]*get-tuple-element\([^)]*\), index=(\d+)")


def _counter_step(cond_lines: list[str], body_lines: list[str]) -> int:
  """The constant the loop body adds to the counter its condition compares (1 if not found)."""
  compared = {}
  for l in cond_lines:
    m = _GTE_INDEX.search(l)
    if m:
      compared[m.group(1)] = m.group(2)
  indices = {i for l in cond_lines if " compare(" in l
             for name, i in compared.items() if f"%{name}" in l}
  if not indices:
    return 1
  counters = {m.group(1) for l in body_lines for m in [_GTE_INDEX.search(l)]
              if m and m.group(2) in indices}
  constants = {}
  for l in body_lines:
    m = re.match(r"\s*%([\w.\-]+) = [su](?:32|64)\[\][^=]*constant\((\d+)\)", l)
    if m:
      constants[m.group(1)] = int(m.group(2))
  root = next((l for l in body_lines if l.lstrip().startswith("ROOT") and " tuple(" in l), "")
  fed = _OPERANDS.findall(root.split(" tuple(", 1)[1]) if root else []
  nexts = {fed[int(i)] for i in indices if int(i) < len(fed)}  # the counter's next value
  for l in body_lines:
    m = re.match(r"\s*%([\w.\-]+) = [^=]* add\(%([\w.\-]+), %([\w.\-]+)\)", l)
    if m and m.group(1) in nexts and {m.group(2), m.group(3)} & counters:
      other = m.group(3) if m.group(2) in counters else m.group(2)
      if constants.get(other, 0) > 0:
        return constants[other]
  return 1


def parse(hlo: str) -> Module:
  computations: dict[str, list[str]] = {}
  entry, current = None, None
  for line in hlo.splitlines():
    m = _COMPUTATION.match(line)
    if m and "=" not in line.split("{")[0].split("(")[0]:
      current = m.group(1)
      computations[current] = []
      if line.startswith("ENTRY"):
        entry = current
      continue
    if current is None:
      continue
    body = computations[current]
    if body and line.strip() and not line.startswith("}") and not _INSTRUCTION.match(line):
      body[-1] += "\n" + line  # an instruction's attributes continued on another line
    else:
      body.append(line)
  header = hlo.split("\n", 1)[0] if hlo.startswith("HloModule") else ""
  sizes = dict(_PARTITIONS.findall(header))
  devices = int(sizes.get("num_partitions", 1)) * int(sizes.get("replica_count", 1))
  weight: dict[str, int] = collections.defaultdict(int)
  looped: set[str] = set()

  def visit(name: str, mult: int, in_loop: bool, depth: int = 0) -> None:
    if name not in computations or depth > 64:
      return
    weight[name] += mult
    if in_loop:
      looped.add(name)
    for line in computations[name]:
      callees = [c.strip().lstrip("%") for m in _CALLS.finditer(line)
                 for c in (m.group(1) or m.group(2)).split(",")]
      is_while = " while(" in line
      trips = _trip_count(line, computations) if is_while else 1
      for callee in callees:
        visit(callee, mult * trips, in_loop or is_while, depth + 1)

  entry = entry or next(iter(computations), "")
  visit(entry, 1, False)
  return Module(computations, entry, dict(weight), looped, devices)


def group_size(line: str, devices: int) -> int:
  """Chips in each replica group of a collective: explicit `{{0,1},{2,3}}`, iota
  `[groups,size]<=[N]`, or mesh axes `mesh['a'=2,'b'=4] {'b'}`; all `devices` when none."""
  m = _EXPLICIT.search(line)
  if m:
    return max(1, len([d for d in m.group(1).strip("{}").split(",") if d]))
  m = _IOTA.search(line)
  if m:
    return int(m.group(1).split(",")[-1])
  m = _MESH.search(line)
  if m:
    axes = {k.strip().strip("'\""): int(v) for k, v in re.findall(r"([^,=]+)=(\d+)", m.group(1))}
    return math.prod(axes.get(a.strip().strip("'\""), 1) for a in m.group(2).split(",") if a.strip())
  return max(devices, 1)


def _payload(kind: str, async_start: bool, type_text: str) -> int:
  """The bytes a collective's result holds (tuple members summed). An async `-start` returns
  (operands, outputs[, u32 contexts]): an all-gather's outputs are taken, else its operands
  (the same size as the outputs for all-reduce, all-to-all and collective-permute)."""
  if not async_start:
    return array_bytes(type_text)
  inner = re.sub(r"\{[^{}]*\}", "", type_text).strip()  # layouts hold parentheses: T(8,128)
  inner = inner[1:-1] if inner.startswith("(") else inner
  groups = re.findall(r"\(([^()]*)\)", inner)  # ((a, b), (A, B)): operands, outputs
  if groups:
    return array_bytes(groups[-1] if kind == "all-gather" else groups[0])
  members = [(_DTYPE_BYTES.get(d, 4) * _prod(dims), d, dims) for d, dims in _ARRAY.findall(inner)]
  members = [b for b, d, dims in members if dims or d not in ("u32", "s32")]  # not contexts
  if kind == "all-reduce":
    return sum(members)  # all-reduce-start returns its results only
  if not members:
    return 0
  return members[-1] if kind == "all-gather" else members[0]


@dataclasses.dataclass
class Collective:
  count: int = 0  # per call of the program, loop trips included
  bytes: int = 0  # what they carry: all-gather outputs, reduce-scatter inputs, the rest's size
  traffic: float = 0.0  # interconnect bytes each chip receives (the traffic factors above)
  in_loop: int = 0  # of `count`, inside a while loop


def _factor(kind: str, n: int) -> float:
  if kind == "collective-permute":
    return 1.0
  share = (n - 1) / n if n > 0 else 0.0
  return 2 * share if kind == "all-reduce" else share


def collectives(module: Module) -> tuple[dict[str, Collective], list[tuple[str, int]]]:
  """Collectives of a parsed module by kind (async `-start` ops count once, `-done` not at all),
  each weighted by the trip counts of the loops around it; and the all-gathers inside a loop
  (a weight gathered there is gathered on every trip)."""
  out = {k: Collective() for k in KINDS}
  gathers = []
  for name, lines in module.computations.items():
    scatter = bool(_SCATTER_FUSION.search(name))
    for line in lines:
      m = _OP.match(line)
      if not m or m.group(3).endswith("-done"):
        continue
      opcode = m.group(3).removesuffix("-start")
      kind = _OPCODES.get(opcode, opcode)
      if kind not in out:
        continue
      n, groups = module.weight.get(name, 0), group_size(line, module.devices)
      if not n:
        continue  # not reachable from the entry: never runs
      is_start = m.group(3).endswith("-start")
      size = _payload(kind, is_start, m.group(2))
      if kind == "reduce-scatter" and not is_start:
        size *= groups  # its result is one chip's share of the input
      if kind == "all-reduce" and scatter:
        kind = "reduce-scatter"  # the TPU's all-reduce-scatter fusion: its input is `size`
      c = out[kind]
      c.count += n
      c.bytes += n * size
      c.traffic += n * size * _factor(kind, groups)
      if name in module.looped:
        c.in_loop += n
        if kind == "all-gather":
          gathers.append((_ARRAY.search(m.group(2)).group(0), size))
  return out, gathers


def collective_traffic(hlo: str) -> dict[str, float]:
  """Interconnect bytes per chip for one call of the program in `hlo` (a compiled module's
  text): each kind's total with its traffic factor, loop trips included, and `total`."""
  found, _ = collectives(parse(hlo))
  out = {k: c.traffic for k, c in found.items()}
  out["total"] = sum(out.values())
  return out


# ------------------------------------------------------------------------------- FLOPs

_ELEMENTWISE = {"add", "subtract", "multiply", "divide", "maximum", "minimum", "compare",
                "select", "negate", "abs", "and", "or", "xor", "not", "clamp", "power",
                "remainder", "sign", "floor", "ceil", "round-nearest-even", "atan2", "convert",
                "exponential", "exponential-minus-one", "log", "log-plus-one", "logistic",
                "tanh", "sqrt", "rsqrt", "cbrt", "sine", "cosine", "tan", "erf", "is-finite",
                "shift-left", "shift-right-logical", "shift-right-arithmetic"}
_DIMS = re.compile(r"(\w+_dims)=\{([0-9,]*)\}")
_ESTIMATE = re.compile(r'"cost_estimate":\s*\{[^}]*"flops":\s*(\d+)')
_CONV_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")


def _dims(type_text: str) -> list[int]:
  """The dims of an HLO type's first array (`bf16[8,128]{1,0}` → [8, 128])."""
  m = _ARRAY.search(type_text)
  return [int(d) for d in m.group(2).split(",") if d] if m else []


def _matmul(opcode: str, line: str, out: list[int], shapes: dict[str, list[int]]) -> float:
  """A dot's or convolution's FLOPs, 2 per multiply-add: out elements times the contracted
  size (a dot's lhs contracting dims; a convolution's kernel elements per output feature)."""
  args = _OPERANDS.findall(line.split(opcode + "(", 1)[1].split(")", 1)[0])
  if len(args) < 2:
    return 0.0
  if opcode == "dot":
    lhs = shapes.get(args[0], [])
    contract = dict(_DIMS.findall(line)).get("lhs_contracting_dims", "")
    inner = math.prod(lhs[int(d)] for d in contract.split(",") if d)
  else:
    return _convolution(line, shapes.get(args[0], []), shapes.get(args[1], []), out)
  return 2.0 * math.prod(out) * inner


def _window(line: str) -> dict[str, list]:
  """A convolution's window (`window={size=4x4 stride=3x3 pad=0_0x7_7 lhs_dilate=4x4}`)."""
  m = _WINDOW.search(line)
  fields = dict(f.split("=", 1) for f in (m.group(1).split() if m else []) if "=" in f)
  return {k: [[int(n) for n in part.split("_")] if "_" in part else int(part)
              for part in v.split("x")] for k, v in fields.items()}


def _taps(out: int, size: int, length: int, stride: int, pad: int, lhs_dilate: int,
          rhs_dilate: int) -> int:
  """Kernel taps over all `out` positions of one spatial dim that land on an input element (not
  on padding or a hole an lhs dilation leaves): the TPU writes a batched matmul as such a
  convolution, its batch dims spatial, one tap per output landing on a real element."""
  if out * size > 1 << 22:
    return out * size  # a true long convolution: every tap counted
  o = np.arange(out)[:, None] * stride + np.arange(size)[None, :] * rhs_dilate - pad
  real = (o >= 0) & (o <= (length - 1) * lhs_dilate) & (o % lhs_dilate == 0)
  return int(real.sum())


def _convolution(line: str, lhs: list[int], rhs: list[int], out: list[int]) -> float:
  """A convolution's FLOPs: 2 per multiply-add of an output element, an input feature (per
  group) and a kernel tap that lands on real input (`_taps`), as XLA's cost analysis counts."""
  labels = _CONV_LABELS.search(line)
  if not labels or not lhs or not rhs:
    return 0.0
  lhs_l, rhs_l, out_l = labels.groups()
  spatial = sorted(c for c in out_l if c.isdigit())
  w = _window(line)
  n = len(spatial)
  get = lambda key, default: w.get(key, [default] * n)
  taps = 1
  for d, sizes in enumerate(zip(get("size", 1), get("stride", 1), get("pad", [0, 0]),
                                get("lhs_dilate", 1), get("rhs_dilate", 1))):
    size, stride, pad, lhs_dilate, rhs_dilate = sizes
    c = spatial[d]
    taps *= _taps(out[out_l.index(c)], size, lhs[lhs_l.index(c)], stride,
                  pad[0] if isinstance(pad, list) else pad, lhs_dilate, rhs_dilate)
  return 2.0 * out[out_l.index("b")] * out[out_l.index("f")] * rhs[rhs_l.index("i")] * taps


@dataclasses.dataclass
class KernelCall:
  """A Pallas kernel's custom call: its name (the HLO instruction's, its numeric suffix cut),
  its results' dims, and its runs per call (`weight`) and with loop bodies once (`once`)."""
  name: str
  results: tuple[tuple[int, ...], ...]
  weight: int
  once: int
  estimate: float | None  # the FLOPs of its cost estimate, which the compiler counts; or none


@dataclasses.dataclass
class Flops:
  """A module's FLOPs read from its text: matmuls (dots and convolutions, exact from their
  shapes) and elementwise arithmetic (1 per element; only its ratio `elementwise_factor` is
  used), with loop bodies once (the compiler's convention) and with the loops' trip counts
  (`call`); and the Pallas kernels' custom calls, whose FLOPs the text does not hold."""
  matmul_once: float = 0.0
  matmul_call: float = 0.0
  elementwise_once: float = 0.0
  elementwise_call: float = 0.0
  kernels: list[KernelCall] = dataclasses.field(default_factory=list)

  @property
  def elementwise_factor(self) -> float:
    return self.elementwise_call / self.elementwise_once if self.elementwise_once else 1.0


def _local_flops(lines: list[str]):
  """One computation's own matmul and elementwise FLOPs and Pallas custom calls (its callees'
  not included)."""
  matmul = elementwise = 0.0
  kernels: list[tuple[str, tuple, float | None]] = []
  shapes: dict[str, list[int]] = {}
  for line in lines:
    m = _OP.match(line)
    if not m:
      continue
    name, type_text, opcode = m.groups()
    out_dims = _dims(type_text)
    shapes[name] = out_dims
    if opcode in ("dot", "convolution"):
      matmul += _matmul(opcode, line, out_dims, shapes)
    elif opcode in _ELEMENTWISE or opcode == "reduce":
      args = _OPERANDS.findall(line.split(opcode + "(", 1)[1].split(")", 1)[0])
      dims = shapes.get(args[0], out_dims) if opcode == "reduce" and args else out_dims
      elementwise += math.prod(dims)
    elif opcode == "custom-call" and 'custom_call_target="tpu_custom_call"' in line:
      results = tuple(tuple(int(d) for d in dims.split(",") if d)
                      for _, dims in _ARRAY.findall(type_text))
      est = _ESTIMATE.search(line)
      kernels.append((name.split(".")[0], results, float(est.group(1)) if est else None))
  return matmul, elementwise, kernels


def flops(module: Module, kernel_cost=None) -> Flops:
  """Matmul and elementwise FLOPs of the computations a call runs (fused ones included), with
  loop bodies once and with their trip counts, and the Pallas custom calls (`tpu_custom_call`)
  with their runs. A conditional runs one branch: the costliest is counted (matmuls plus its
  kernels at `kernel_cost(KernelCall)` FLOPs a run, default their cost estimates), as the
  compiler's cost analysis does, where a flat sum would count a layer's causal and
  sliding-window attention kernels both."""
  cost = kernel_cost or (lambda k: k.estimate or 0.0)
  local = {name: _local_flops(lines) for name, lines in module.computations.items()}
  memo: dict[str, Flops] = {}

  def scaled(f: Flops, call: int, once: int) -> Flops:
    return Flops(f.matmul_once * once, f.matmul_call * call, f.elementwise_once * once,
                 f.elementwise_call * call,
                 [dataclasses.replace(k, weight=k.weight * call, once=k.once * once)
                  for k in f.kernels])

  def add(a: Flops, b: Flops) -> None:
    a.matmul_once += b.matmul_once
    a.matmul_call += b.matmul_call
    a.elementwise_once += b.elementwise_once
    a.elementwise_call += b.elementwise_call
    a.kernels += b.kernels

  def total(name: str, depth: int = 0) -> Flops:
    if name in memo:
      return memo[name]
    if name not in module.computations or depth > 64:
      return Flops()
    matmul, elementwise, kernels = local[name]
    out = Flops(matmul, matmul, elementwise, elementwise,
                [KernelCall(n, r, 1, 1, e) for n, r, e in kernels])
    for line in module.computations[name]:
      callees = [c.strip().lstrip("%") for m in _CALLS.finditer(line)
                 for c in (m.group(1) or m.group(2)).split(",")]
      if not callees:
        continue
      subs = [total(c, depth + 1) for c in callees]
      if " conditional(" in line:
        add(out, max(subs, key=lambda f: f.matmul_call + sum(k.weight * cost(k)
                                                              for k in f.kernels)))
        continue
      trips = _trip_count(line, module.computations) if " while(" in line else 1
      for sub in subs:
        add(out, scaled(sub, trips, 1))
    memo[name] = out
    return out

  return total(module.entry)
