"""HBM bytes of one call of a compiled program, counted in its HLO instruction by instruction,
each loop body times its trip count: what every op (a fusion as one op) reads from and writes
to HBM, so a count below the bytes a program must move cannot come out of it.

Per op: its operands read and its results written, each array where it lives: an array whose
layout names a memory space other than HBM (`S(1)`: the on-chip memory a prefetch copies into)
costs nothing to read or write there, and the prefetch that fills it (`copy-start`) reads its
source from HBM. Inside a fusion, a parameter costs what the fused code reads of it: the window
of a (dynamic-)slice or the rows of a gather, through views (bitcast, reshape, transpose, copy,
convert) and nested fusions; the buffer of a dynamic-update-slice or scatter at a fusion's root
is updated in place (the update read and written, the rest untouched), and a parameter a fusion
passes through to its result is neither read nor written (the result is the operand's buffer).
Everything else reads its whole operand: a parameter several fusions read is read by each, a
matmul reads its whole weight. A collective the TPU compiler splits over a chain of fusions
(copies of it with one `channel_id`) moves its bytes once per completion of the chain. A Pallas
kernel (`tpu_custom_call`) costs the bytes of its cost estimate where it has one (a decode
kernel reads its window, not the whole cache), else its operands and results. A conditional
costs its costliest branch; a loop's condition runs trips + 1 times."""

from __future__ import annotations

import dataclasses
import math
import re

from scope_jax.plan import hlo as hlo_lib

_MEMBER = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([^{}]*)\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_BYTES = re.compile(r'"cost_estimate":\s*\{[^}]*"bytes_accessed":\s*"?(\d+)')
_PARAM = re.compile(r"parameter\((\d+)\)")
_CALLEE = re.compile(r"calls=%?([\w.\-]+)")
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
         "partition-id", "replica-id", "opt-barrier", "while", "conditional", "call",
         "add-dependency", "domain", "async-start", "async-update", "async-done"}
_VIEWS = {"bitcast", "reshape", "transpose", "copy", "convert", "bitcast-convert"}
_WINDOWS = {"slice", "dynamic-slice", "gather"}  # read only the result's elements of operand 0
_COLLECTIVES = {"all-gather", "all-reduce", "reduce-scatter", "all-to-all", "ragged-all-to-all",
                "collective-permute"}
_CHANNEL = re.compile(r"channel_id=(\d+)")


def members(type_text: str) -> list[tuple[int, int]]:
  """(bytes, memory space) of each array in an HLO type (a tuple's members in order)."""
  out = []
  for dtype, dims, layout in _MEMBER.findall(type_text):
    space = _SPACE.search(layout or "")
    item = 0 if dtype == "token" else hlo_lib._DTYPE_BYTES.get(dtype, 4)
    size = item * math.prod(int(d) for d in dims.split(",") if d)
    out.append((size, int(space.group(1)) if space else 0))
  return out


def in_hbm(type_text: str) -> int:
  """Bytes of an HLO type's arrays that live in HBM (memory space 0)."""
  return sum(b for b, s in members(type_text) if s == 0)


@dataclasses.dataclass(frozen=True)
class Op:
  name: str
  type: str
  opcode: str
  operands: tuple[str, ...]
  line: str
  root: bool


def _ops(lines: list[str]) -> list[Op]:
  out = []
  for line in lines:
    m = hlo_lib._OP.match(line)
    if not m:
      continue
    name, type_text, opcode = m.groups()
    args = hlo_lib._OPERANDS.findall(line.split(opcode + "(", 1)[1].split(")", 1)[0])
    out.append(Op(name, type_text, opcode, tuple(args), line, line.lstrip().startswith("ROOT")))
  return out


def _update_operands(op: Op) -> tuple[int, list[int]] | None:
  """(buffer operand, update operands) of an in-place update: a dynamic-update-slice's update,
  a scatter's updates (its first half of operands are buffers, then indices, then updates)."""
  if op.opcode == "dynamic-update-slice" and len(op.operands) > 1:
    return 0, [1]
  if op.opcode == "scatter" and len(op.operands) >= 3:
    n = (len(op.operands) - 1) // 2
    return 0, list(range(n + 1, 2 * n + 1))
  return None


def _returns_update(module: hlo_lib.Module, name: str) -> bool:
  """Whether a scatter's combiner returns its second parameter (the update) as it is."""
  ops = {op.name: op for op in _ops(module.computations.get(name, []))}
  root = next((op for op in ops.values() if op.root), None)
  while root is not None and root.opcode == "bitcast" and root.operands:
    root = ops.get(root.operands[0])
  return root is not None and root.opcode == "parameter" and "parameter(1)" in root.line


class Fused:
  """A fused computation: the bytes it reads of each parameter and writes of each result."""

  def __init__(self, module: hlo_lib.Module, name: str, analyses: "Analyses"):
    self.ops = _ops(module.computations.get(name, []))
    self.by_name = {op.name: op for op in self.ops}
    self.uses: dict[str, list[tuple[Op, int]]] = {}
    for op in self.ops:
      for i, a in enumerate(op.operands):
        self.uses.setdefault(a, []).append((op, i))
    self.module, self.analyses, self.name = module, analyses, name
    root = next((op for op in reversed(self.ops) if op.root), self.ops[-1] if self.ops else None)
    self.outputs = ([self.by_name.get(a) for a in root.operands]
                    if root is not None and root.opcode == "tuple" else [root])
    self._demand: dict[tuple[str, bool], float] = {}
    self._reads: dict[bool, dict[int, float]] = {}
    self.in_place = {u.name for u in map(self._through_views, self.outputs)
                     if u is not None and _update_operands(u) is not None
                     and self._from_parameter(u.operands[0])}

  def _through_views(self, op: Op | None) -> Op | None:
    while op is not None and op.opcode == "bitcast" and op.operands:
      op = self.by_name.get(op.operands[0])
    return op

  def _from_parameter(self, name: str) -> bool:
    op = self._through_views(self.by_name.get(name))
    return op is not None and op.opcode == "parameter"

  def _replaces(self, op: Op) -> bool:
    """Whether an update writes its new values over the old ones without reading them: a
    dynamic-update-slice, or a scatter whose combiner returns its second parameter."""
    if op.opcode != "scatter":
      return True
    combiner = re.search(r"to_apply=%?([\w.\-]+)", op.line)
    return bool(combiner) and _returns_update(self.module, combiner.group(1))

  def _size(self, name: str) -> int:
    op = self.by_name.get(name)
    return sum(b for b, _ in members(op.type)) if op else 0

  def demand(self, name: str, top: bool = True) -> float:
    """Bytes of `name`'s value its uses read (at most its size; its whole size at the root, but
    for a parameter a top-level fusion passes through to its result: that buffer is the
    operand's, not read; inside another fusion the root is read by its caller)."""
    if (name, top) not in self._demand:
      self._demand[name, top] = self._demand_of(name, top)
    return self._demand[name, top]

  def _demand_of(self, name: str, top: bool) -> float:
    size = self._size(name)
    op = self.by_name.get(name)
    passed = top and self._from_parameter(name)
    if op is not None and op.root and op.opcode != "tuple":
      return 0.0 if passed else float(size)
    total = 0.0
    for user, i in self.uses.get(name, []):
      update = _update_operands(user)
      if user.root and user.opcode == "tuple":
        if passed:
          continue
        return float(size)
      if user.opcode in _COLLECTIVES:  # one piece of a collective split over several fusions
        total += size * self.analyses.scale(self.name, user.name)
      elif user.opcode in _WINDOWS and i == 0:
        total += self._size(user.name)
      elif update is not None and i == update[0] and user.name in self.in_place:
        if not self._replaces(user):  # a combiner reads the rows it updates
          total += sum(self._size(user.operands[j]) for j in update[1] if j < len(user.operands))
      elif user.opcode in _VIEWS:
        own = self._size(user.name)
        total += self.demand(user.name, top) * size / own if own else 0.0
      elif user.opcode == "fusion" and _CALLEE.search(user.line):
        inner = self.analyses.fused(_CALLEE.search(user.line).group(1))
        own = self._size(user.name)
        share = self.demand(user.name, top) / own if own else 1.0
        total += inner.reads(top=False).get(i, size) * min(share, 1.0)
      else:
        return float(size)
      if total >= size:
        return float(size)
    return min(total, float(size))

  def reads(self, top: bool = True) -> dict[int, float]:
    """Bytes read of each parameter (by its number), as a top-level fusion or inside one."""
    if top not in self._reads:
      self._reads[top] = {int(_PARAM.search(op.line).group(1)): self.demand(op.name, top)
                          for op in self.ops if op.opcode == "parameter"}
    return self._reads[top]

  def written(self, result_type: str) -> float:
    """HBM bytes written of the results (`result_type`: the calling op's, with its memory
    spaces): an in-place update's update only, any other result whole."""
    sizes = members(result_type)
    total = 0.0
    for k, out in enumerate(self.outputs):
      size, space = sizes[k] if k < len(sizes) else (0, 0)
      if space != 0:
        continue
      op = self._through_views(out)
      if op is None or op.opcode == "parameter":
        continue  # passed through: its buffer is the operand's, untouched
      if op.name in self.in_place:
        _, updates = _update_operands(op)
        size = sum(self._size(op.operands[j]) for j in updates if j < len(op.operands))
      elif op.opcode in _COLLECTIVES:
        size *= self.analyses.scale(self.name, op.name)
      total += size
    return total


class Analyses:
  """The fused computations of a module, each analysed once, and the share of its collective's
  bytes each piece of a collective split over several fusions moves (`scale`)."""

  def __init__(self, module: hlo_lib.Module):
    self.module = module
    self.computations: dict[str, Fused] = {}
    self.scales = _chain_scales(module)

  def fused(self, name: str) -> Fused:
    if name not in self.computations:
      self.computations[name] = Fused(self.module, name, self)
    return self.computations[name]

  def scale(self, computation: str, op_name: str) -> float:
    return self.scales.get((computation, op_name), 1.0)


_CODE = re.compile(r"(?:body|condition|true_computation|false_computation)=%?([\w.\-]+)"
                   r"|branch_computations=\{([^}]*)\}")


def _run_as_code(module: hlo_lib.Module) -> set[str]:
  """The computations that run as code (the entry, loop bodies and conditions, branches, calls,
  async ops' wrapped computations), not fused ones or reducers."""
  seen, todo = set(), [module.entry]
  while todo:
    name = todo.pop()
    if name in seen or name not in module.computations:
      continue
    seen.add(name)
    for line in module.computations[name]:
      todo += [c.strip().lstrip("%") for m in _CODE.finditer(line)
               for c in (m.group(1) or m.group(2)).split(",")]
      if " call(" in line or " async-start(" in line:
        todo += re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", line)
  return seen


def _chain_scales(module: hlo_lib.Module) -> dict[tuple[str, str], float]:
  """The TPU compiler splits a collective over a chain of fusions (`async_collective_fusion`),
  each holding a copy of it with the same `channel_id` and passing its buffer on: the chain
  moves the collective's bytes once per completion. A completion runs every piece, so there are
  as many as the least-run piece's runs; each piece's run moves completions / all pieces' runs
  of those bytes. Collectives that run as code are not pieces (scale 1)."""
  control = _run_as_code(module)
  groups: dict[str, list[tuple[tuple[str, str], int]]] = {}
  for comp, lines in module.computations.items():
    runs = module.weight.get(comp, 0)
    if comp in control or not runs:
      continue
    for op in _ops(lines):
      channel = _CHANNEL.search(op.line)
      if op.opcode in _COLLECTIVES and channel:
        groups.setdefault(channel.group(1), []).append(((comp, op.name), runs))
  scales = {}
  for pieces in groups.values():
    if len(pieces) > 1:
      total, least = sum(r for _, r in pieces), min(r for _, r in pieces)
      scales.update((key, least / total) for key, _ in pieces)
  return scales


def _async_start(op: Op, operand: list[int]) -> float:
  """An async op's start (`all-gather-start`, `slice-start`, ...): its result holds its
  operands (but an all-reduce's), then its outputs, then scalar contexts. A slice reads its
  window of the operand; the rest read their operands whole. Each writes its outputs."""
  found = [(size, space, not dims and d in ("u32", "s32"))
           for (size, space), (d, dims, _) in zip(members(op.type), _MEMBER.findall(op.type))]
  outputs = found if op.opcode == "all-reduce-start" else found[len(op.operands):]
  outputs = [(size, space) for size, space, context in outputs if not context]
  written = sum(size for size, space in outputs if space == 0)
  if op.opcode.removesuffix("-start") in _WINDOWS and operand:
    return min(operand[0], sum(size for size, _ in outputs)) + sum(operand[1:]) + written
  return sum(operand) + written


def op_bytes(op: Op, types: dict[str, str], module: hlo_lib.Module, analyses: Analyses) -> float:
  """HBM bytes one run of a top-level op reads and writes (see the module docstring)."""
  if op.opcode in _FREE or op.opcode.endswith("-done"):
    return 0.0
  operand = [in_hbm(types.get(a, "")) for a in op.operands]
  result = in_hbm(op.type)
  if op.opcode == "fusion" and _CALLEE.search(op.line):
    f = analyses.fused(_CALLEE.search(op.line).group(1))
    reads = f.reads()
    return sum(min(b, reads.get(i, b)) for i, b in enumerate(operand)) + f.written(op.type)
  if op.opcode == "copy-start":  # (destination, source, context)
    dest = members(op.type)
    return sum(operand) + (dest[0][0] if dest and dest[0][1] == 0 else 0)
  if op.opcode.endswith("-start"):  # an async op's ((operands), outputs, contexts)
    return _async_start(op, operand)
  update = _update_operands(op)
  if update is not None:  # in place: the updates read and written, the indices read
    moved = sum(operand[j] for j in update[1])
    indices = sum(b for j, b in enumerate(operand) if j != update[0] and j not in update[1])
    return 2 * moved + indices
  if op.opcode in _WINDOWS:
    return min(operand[0], result) + sum(operand[1:]) + result
  if op.opcode == "custom-call":
    estimate = _BYTES.search(op.line)
    if estimate:
      return float(estimate.group(1))
  return sum(operand) + result


@dataclasses.dataclass
class Traffic:
  """HBM bytes of one call (`call`, every loop's trips), of the same with every loop body once
  (`once`, the compiler's convention), and of the ops outside every loop (`outside`); and each
  op's bytes per run with its runs per call (`ops`: (bytes × runs, computation, op name))."""
  call: float = 0.0
  once: float = 0.0
  outside: float = 0.0
  ops: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)

  def top(self, n: int = 20) -> list[tuple[float, str, str]]:
    """The `n` costliest ops per call: where a count comes from."""
    return sorted(self.ops, reverse=True)[:n]


_BRANCHES = re.compile(r"(?:true_computation|false_computation)=%?([\w.\-]+)"
                       r"|branch_computations=\{([^}]*)\}")
_ZERO = (0.0, 0.0, 0.0)


def traffic(module: hlo_lib.Module) -> Traffic:
  """HBM bytes of one call of the module's entry (see the module docstring)."""
  analyses = Analyses(module)
  memo: dict = {}
  own_bytes: dict[str, list[tuple[float, str]]] = {}

  def cost(name: str, depth: int = 0) -> tuple[float, float, float]:
    """(per call, loop bodies once, outside every loop) of one run of a computation."""
    if name in memo:
      return memo[name]
    if name not in module.computations or depth > 64:
      return _ZERO
    ops = _ops(module.computations[name])
    types = {op.name: op.type for op in ops}
    call = once = outside = 0.0
    own_bytes[name] = []
    for op in ops:
      own = op_bytes(op, types, module, analyses)
      if own:
        own_bytes[name].append((own, op.name))
      call, once, outside = call + own, once + own, outside + own
      if op.opcode == "while":
        trips = hlo_lib._trip_count(op.line, module.computations)
        body = re.search(r"body=%?([\w.\-]+)", op.line)
        cond = re.search(r"condition=%?([\w.\-]+)", op.line)
        b = cost(body.group(1), depth + 1) if body else _ZERO
        c = cost(cond.group(1), depth + 1) if cond else _ZERO
        call += trips * b[0] + (trips + 1) * c[0]
        once += b[1] + c[1]
      elif op.opcode == "conditional":
        names = [c.strip().lstrip("%") for m in _BRANCHES.finditer(op.line)
                 for c in (m.group(1) or m.group(2)).split(",")]
        best = max([cost(n, depth + 1) for n in names] or [_ZERO])
        call, once, outside = call + best[0], once + best[1], outside + best[2]
      elif op.opcode in ("call", "async-start"):
        for callee in re.findall(r"(?:to_apply|calls)=%?([\w.\-]+)", op.line):
          c = cost(callee, depth + 1)
          call, once, outside = call + c[0], once + c[1], outside + c[2]
    memo[name] = (call, once, outside)
    return memo[name]

  call, once, outside = cost(module.entry)
  rows = [(b * module.weight.get(comp, 1), comp, op)
          for comp, found in own_bytes.items() for b, op in found]
  return Traffic(call, once, outside, rows)
