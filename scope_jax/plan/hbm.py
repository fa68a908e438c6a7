"""HBM bytes of one call of a compiled program, counted in its HLO instruction by instruction,
each loop body times its trip count: what every op (a fusion as one op) reads from and writes
to HBM, so a count below the bytes a program must move cannot come out of it.

Per op: its operands read and its results written, each array where it lives: an array whose
layout names a memory space other than HBM (`S(1)`: the on-chip memory a prefetch copies into)
costs nothing to read or write there, and the prefetch that fills it (`copy-start`) reads its
source from HBM. Inside a fusion, a parameter costs what the fused code reads of it: the window
of a (dynamic-)slice or the rows of a gather, through views (bitcast, reshape, transpose, copy,
convert) and nested fusions; the buffer of a dynamic-update-slice or scatter at a fusion's root
is updated in place (the update read and written, the rest untouched). Everything else reads
its whole operand: a parameter several fusions read is read by each, a matmul reads its whole
weight. A Pallas kernel (`tpu_custom_call`) costs the bytes of its cost estimate where it has
one (a decode kernel reads its window, not the whole cache), else its operands and results.
A conditional costs its costliest branch; a loop's condition runs trips + 1 times."""

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

  def __init__(self, module: hlo_lib.Module, name: str, analyses: dict):
    self.ops = _ops(module.computations.get(name, []))
    self.by_name = {op.name: op for op in self.ops}
    self.uses: dict[str, list[tuple[Op, int]]] = {}
    for op in self.ops:
      for i, a in enumerate(op.operands):
        self.uses.setdefault(a, []).append((op, i))
    self.module, self.analyses = module, analyses
    root = next((op for op in reversed(self.ops) if op.root), self.ops[-1] if self.ops else None)
    self.outputs = ([self.by_name.get(a) for a in root.operands]
                    if root is not None and root.opcode == "tuple" else [root])
    self._demand: dict[str, float] = {}
    self._reads: dict[int, float] | None = None
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

  def demand(self, name: str) -> float:
    """Bytes of `name`'s value its uses read (at most its size; its whole size at the root)."""
    if name not in self._demand:
      self._demand[name] = self._demand_of(name)
    return self._demand[name]

  def _demand_of(self, name: str) -> float:
    size = self._size(name)
    op = self.by_name.get(name)
    if op is not None and op.root or any(o is not None and o.name == name for o in self.outputs):
      return float(size)
    total = 0.0
    for user, i in self.uses.get(name, []):
      update = _update_operands(user)
      if user.opcode in _WINDOWS and i == 0:
        total += self._size(user.name)
      elif update is not None and i == update[0] and user.name in self.in_place:
        if not self._replaces(user):  # a combiner reads the rows it updates
          total += sum(self._size(user.operands[j]) for j in update[1] if j < len(user.operands))
      elif user.opcode in _VIEWS:
        own = self._size(user.name)
        total += self.demand(user.name) * size / own if own else 0.0
      elif user.opcode == "fusion" and _CALLEE.search(user.line):
        inner = fused(self.module, _CALLEE.search(user.line).group(1), self.analyses)
        own = self._size(user.name)
        share = self.demand(user.name) / own if own else 1.0
        total += inner.reads().get(i, size) * min(share, 1.0)
      else:
        return float(size)
      if total >= size:
        return float(size)
    return min(total, float(size))

  def reads(self) -> dict[int, float]:
    """Bytes read of each parameter (by its number)."""
    if self._reads is None:
      self._reads = {int(_PARAM.search(op.line).group(1)): self.demand(op.name)
                     for op in self.ops if op.opcode == "parameter"}
    return self._reads

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
      if op is not None and op.name in self.in_place:
        _, updates = _update_operands(op)
        size = sum(self._size(op.operands[j]) for j in updates if j < len(op.operands))
      total += size
    return total


def fused(module: hlo_lib.Module, name: str, analyses: dict) -> Fused:
  if name not in analyses:
    analyses[name] = Fused(module, name, analyses)
  return analyses[name]


def op_bytes(op: Op, types: dict[str, str], module: hlo_lib.Module, analyses: dict) -> float:
  """HBM bytes one run of a top-level op reads and writes (see the module docstring)."""
  if op.opcode in _FREE or op.opcode.endswith("-done"):
    return 0.0
  operand = [in_hbm(types.get(a, "")) for a in op.operands]
  result = in_hbm(op.type)
  if op.opcode == "fusion" and _CALLEE.search(op.line):
    f = fused(module, _CALLEE.search(op.line).group(1), analyses)
    reads = f.reads()
    return sum(min(b, reads.get(i, b)) for i, b in enumerate(operand)) + f.written(op.type)
  if op.opcode == "copy-start":  # (destination, source, context)
    dest = members(op.type)
    return sum(operand) + (dest[0][0] if dest and dest[0][1] == 0 else 0)
  if op.opcode.endswith("-start"):  # a collective's (operands, outputs[, contexts])
    if op.opcode == "all-reduce-start":
      return sum(operand) + result
    contexts = sum(4 for d, dims, layout in _MEMBER.findall(op.type)
                   if not dims and d in ("u32", "s32") and not _SPACE.search(layout or ""))
    return sum(operand) + max(result - contexts - sum(operand), 0)
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
  analyses: dict = {}
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
