"""The process that parses and compares math answers for `rewards/mathcheck.py`.

It reads one JSON request per line on stdin and writes one JSON reply per line on stdout:
    {"op": "canonical", "text": "\\frac{1}{2}"}   -> {"value": "1/2"}   (null: not a math answer)
    {"op": "equal", "a": "1/2", "b": "0.5"}       -> {"value": true}
math-verify's own timeouts bound each parse and comparison here, and an address-space limit
bounds memory; the parent kills this process when a reply is later than that (a computation
that a signal cannot interrupt), so no input can stall a run. Model text is only ever parsed by
math-verify's LaTeX grammar, never evaluated as Python.
"""

from __future__ import annotations

import json
import re
import sys

_WORD = re.compile(r"^[A-Za-z ]{4,}$")  # an English word, not a variable or a number
_PLACEHOLDERS = {"ANSWER", "answer", "None", "nan", "zoo"}


def _limit_memory(gib: float) -> None:
  try:
    import resource  # POSIX only
    limit = int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
  except (ImportError, ValueError, OSError):
    pass


def main() -> None:
  timeout = int(sys.argv[1]) if len(sys.argv) > 1 else 1
  _limit_memory(float(sys.argv[2]) if len(sys.argv) > 2 else 4.0)
  import math_verify
  import sympy
  from math_verify import ExprExtractionConfig, LatexExtractionConfig
  configs = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
  cache: dict[str, object] = {}

  def parsed(text: str):
    if text not in cache:
      if len(cache) > 4096:
        cache.clear()
      out = math_verify.parse(f"${text}$", configs, extraction_mode="first_match",
                              parsing_timeout=timeout)
      cache[text] = out[0] if out else None
    return cache[text]

  def canonical(text: str):
    value = parsed(text)
    if value is None:
      return None
    if isinstance(value, sympy.Float) and value.is_finite:  # 12.0 → 12, 0.25 → 1/4: one vote
      value = sympy.nsimplify(value, rational=True)
    s = str(value).strip()
    if not s or s in _PLACEHOLDERS or _WORD.match(s):
      return None
    return s

  def equal(a: str, b: str) -> bool:
    x, y = parsed(a), parsed(b)
    if x is None or y is None:
      return False
    return bool(math_verify.verify(x, y, timeout_seconds=timeout))

  sys.stdout.write('{"ready": true}\n')
  sys.stdout.flush()
  for line in sys.stdin:
    try:
      req = json.loads(line)
      if req["op"] == "canonical":
        value = canonical(str(req["text"]))
      elif req["op"] == "equal":
        value = equal(str(req["a"]), str(req["b"]))
      else:
        raise ValueError(f"unknown op {req['op']!r}")
      reply = {"value": value}
    except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001 — the answer is invalid
      reply = {"value": None, "error": f"{type(e).__name__}"}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
  main()
