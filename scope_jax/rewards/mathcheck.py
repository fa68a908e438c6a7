"""Math answers (ALGORITHMS §0.5): `\\boxed{}` extraction, then math-verify's parse and verify,
each under a timeout, in a worker process.

Model text is untrusted: it is never `eval`ed and never handed to sympy in this process. A cheap
screen rejects what no answer needs (very long, deeply nested, power towers, factorial chains,
huge literals); the rest goes to `math_worker.py`, where math-verify's own timeouts bound each
call and an address-space limit bounds memory. A reply later than `timeout + grace` seconds (a
big-integer power that no signal interrupts) kills the worker; the answer counts as invalid and
the next call starts a fresh worker. So a pathological expression costs a bounded time, and the
run goes on.

    checker = MathChecker()
    checker.canonical("\\frac{1}{2}") == checker.canonical("0.5") == "1/2"
    checker.equivalent("1/2", "\\frac{1}{2}")    # True
"""

from __future__ import annotations

import atexit
import collections
import json
import re
import select
import subprocess
import sys
import time

from scope_jax.rewards import match

MAX_ANSWER_CHARS = 200  # a boxed answer longer than this is not a final answer
MAX_DEPTH = 8  # bracket nesting
MAX_POWERS = 2  # `^` or `**` operators (and no power of a power)
MAX_DIGITS = 40  # digits in one literal
MAX_EXPONENT_DIGITS = 6  # digits of a literal exponent
_DIGITS = re.compile(r"\d{%d,}" % (MAX_DIGITS + 1))
_POWER = re.compile(r"\^|\*\*")
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*\d{%d,}" % (MAX_EXPONENT_DIGITS + 1))
_TOWER = re.compile(r"(?:\^|\*\*)\s*(?:\{[^{}]*(?:\^|\*\*)|\([^()]*(?:\^|\*\*)|[\w.]+\s*(?:\^|\*\*))")
_WORD = re.compile(r"^[A-Za-z ]{4,}$")  # a word, not a variable or a number


def boxed_answer(text: str) -> str | None:
  """The content of the last `\\boxed{...}` in `text` (linear time), or None."""
  return match.last_boxed(text)


def screen(answer: str) -> str | None:
  """Why `answer` is rejected without parsing (None: it may be parsed). Linear time."""
  if len(answer) > MAX_ANSWER_CHARS:
    return "too_long"
  depth = peak = 0
  for ch in answer:
    depth += (ch in "{([") - (ch in "})]")
    peak = max(peak, depth)
  if peak > MAX_DEPTH:
    return "too_deep"
  if _WORD.match(answer):
    return "not_math"
  if (len(_POWER.findall(answer)) > MAX_POWERS or "!!" in answer or _DIGITS.search(answer)
      or _BIG_EXPONENT.search(answer) or _TOWER.search(answer)):
    return "too_large"
  return None


class MathChecker:
  """Canonical forms and equivalence of math answers, computed in a worker process.

  `timeout` (whole seconds) bounds each parse and each comparison inside the worker; `grace`
  more seconds and the worker is killed. Results are cached by answer text. Counters:
  `timeouts` (worker kills), `rejected` (screened out), `calls` (answers sent to the worker).
  """

  def __init__(self, timeout: int = 1, grace: float = 2.0, memory_gib: float = 4.0,
               startup_timeout: float = 120.0, cache_size: int = 65536):
    if timeout < 1:
      raise ValueError(f"timeout={timeout} must be a whole number of seconds, at least 1.")
    self.timeout, self.grace, self.memory_gib = int(timeout), grace, memory_gib
    self.startup_timeout = startup_timeout
    self._proc: subprocess.Popen | None = None
    self._cache: collections.OrderedDict = collections.OrderedDict()
    self._cache_size = cache_size
    self.counters = collections.Counter()

  # ------------------------------------------------------------------------------ answers
  def canonical(self, answer: str | None) -> str | None:
    """math-verify's canonical string of `answer` (e.g. '1/2' for 0.5), or None if it is not a
    math answer, cannot be parsed in time, or fails the screen."""
    if answer is None:
      return None
    answer = str(answer).strip()
    if not answer:
      return None
    key = ("canonical", answer)
    if key in self._cache:
      self._cache.move_to_end(key)
      return self._cache[key]
    reason = screen(answer)
    if reason is not None:
      self.counters[f"rejected_{reason}"] += 1
      value = None
    else:
      value = self._call({"op": "canonical", "text": answer})
      value = value if isinstance(value, str) else None
    self._remember(key, value)
    return value

  def equivalent(self, a: str | None, b: str | None) -> bool:
    """Whether two answers are mathematically equal (math-verify's `verify`, under the timeout);
    False when either is invalid."""
    if self.canonical(a) is None or self.canonical(b) is None:
      return False
    a, b = str(a).strip(), str(b).strip()
    if self.canonical(a) == self.canonical(b):
      return True
    key = ("equal", a, b)
    if key not in self._cache:
      self._remember(key, self._call({"op": "equal", "a": a, "b": b}) is True)
    return self._cache[key]

  def boxed(self, text: str) -> str | None:
    """The canonical form of the last boxed answer in a response."""
    return self.canonical(boxed_answer(text))

  def _remember(self, key, value) -> None:
    self._cache[key] = value
    if len(self._cache) > self._cache_size:
      self._cache.popitem(last=False)

  # ------------------------------------------------------------------------------ the worker
  def _start(self) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "scope_jax.rewards.math_worker", str(self.timeout),
         str(self.memory_gib)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        bufsize=1)
    if self._read(proc, self.startup_timeout) is None:
      self._kill(proc)
      raise RuntimeError("The math-verify worker did not start; is math-verify installed "
                         "(pip install math-verify)?")
    return proc

  def _read(self, proc: subprocess.Popen, seconds: float):
    """One JSON reply line, or None after `seconds` or if the worker died."""
    deadline = time.monotonic() + seconds
    while True:
      left = deadline - time.monotonic()
      if left <= 0:
        return None
      ready, _, _ = select.select([proc.stdout], [], [], left)
      if ready:
        line = proc.stdout.readline()
        if not line:
          return None
        try:
          return json.loads(line)
        except ValueError:
          return None

  def _call(self, request: dict):
    if self._proc is None or self._proc.poll() is not None:
      self._proc = self._start()
    self.counters["calls"] += 1
    try:
      self._proc.stdin.write(json.dumps(request) + "\n")
      self._proc.stdin.flush()
    except (BrokenPipeError, OSError):
      self._kill(self._proc)
      self._proc = None
      self.counters["worker_errors"] += 1
      return None
    # A comparison may parse two answers, then verify: three timed calls at most.
    calls = 3 if request["op"] == "equal" else 1
    reply = self._read(self._proc, calls * self.timeout + self.grace)
    if reply is None:
      self._kill(self._proc)
      self._proc = None
      self.counters["timeouts"] += 1
      return None
    if reply.get("error"):
      self.counters["worker_errors"] += 1
    return reply.get("value")

  @staticmethod
  def _kill(proc: subprocess.Popen) -> None:
    try:
      proc.kill()
      proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
      pass

  def close(self) -> None:
    if self._proc is not None:
      self._kill(self._proc)
      self._proc = None


_DEFAULT: MathChecker | None = None


def default_checker() -> MathChecker:
  """One shared checker per process (its worker is killed at exit)."""
  global _DEFAULT
  if _DEFAULT is None:
    _DEFAULT = MathChecker()
    atexit.register(_DEFAULT.close)
  return _DEFAULT
