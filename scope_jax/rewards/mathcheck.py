"""Math answers (ALGORITHMS §0.5): `\\boxed{}` extraction, then math-verify's parse and verify,
each under a timeout, in a worker process.

Model text is untrusted: it is never `eval`ed and never handed to sympy in this process. Only
size is screened here (very long or deeply nested text, and numbers written as powers or
factorials of literals with more than 10,000 digits, which no signal could interrupt); everything
else, symbolic powers of powers included, goes to `math_worker.py`, where math-verify's own timeouts bound each
call and an address-space limit bounds memory. A reply later than `timeout + grace` seconds (a
big-integer power that no signal interrupts) kills the worker; the answer counts as unchecked
(`counters['timeouts']`) and the next call starts a fresh worker. So a pathological expression
costs a bounded time, and the run goes on. Answers in words (`even`, `\\text{Monday}`, `true`)
are not math: they compare as normalised text. Gold answers are never screened.

    checker = MathChecker()
    checker.canonical("\\frac{1}{2}") == checker.canonical("0.5") == "1/2"
    checker.equivalent("1/2", "\\frac{1}{2}")    # True
    checker.equivalent("\\text{Even}", "even")  # True (text)
"""

from __future__ import annotations

import atexit
import collections
import json
import math
import re
import select
import subprocess
import sys
import time

from scope_jax.rewards import match

MAX_ANSWER_CHARS = 200  # a boxed answer longer than this is not a final answer
MAX_DEPTH = 8  # bracket nesting
MAX_LITERAL_DIGITS = 10_000  # a number written as a power of literals with more digits is no answer
_POWER_CHAIN = re.compile(r"\d+(?:\.\d+)?(?:\s*(?:\^|\*\*)\s*[{(\s]*-?\s*\d+(?:\.\d+)?)+")
_FACTORIAL_OF_FACTORIAL = re.compile(r"(\d+)\s*!\s*[)}\]]\s*!")  # (10!)! has 22 million digits
_BIG_FACTORIAL = re.compile(r"\d{5,}\s*!")
_SIZING = re.compile(r"\\(?:left|right|bigg?|Bigg?)\b")  # \left( … \right): brackets all the same
# `\text{...}`-like wrappers around an answer in words.
_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}$")
_WORDS = re.compile(r"^[A-Za-z']+(?:[ -]+[A-Za-z']+)*$")
PLACEHOLDERS = {"answer", "none", "nan", "null", "undefined", "n/a", "your answer"}


def boxed_answer(text: str) -> str | None:
  """The content of the last `\\boxed{...}` in `text` (linear time), or None."""
  return match.last_boxed(text)


# math-verify's anchored LaTeX (its `lazy_latex_regex`), in its priority order, each bounded:
# "final answer … is: $7$" (50), "answer: … $7$" (100), "answer … $7$" (200); the math is in
# $$…$$, $…$, \(…\) or \[…\].
_LATEX_ENV = r"(?:\$\$(.{1,200}?)\$\$|\$(.{1,200}?)\$|\\\((.{1,200}?)\\\)|\\\[(.{1,200}?)\\\])"
_ANCHORED = tuple(re.compile(anchor + _LATEX_ENV, re.IGNORECASE | re.DOTALL) for anchor in (
    r"final answer.{0,100}?\s+is:?\s*", r"answer:.{0,50}?", r"answer.{0,50}?"))


def final_answer(text: str) -> str | None:
  """The answer a response states: its last `\\boxed{...}`, else the LaTeX after the last
  "final answer … is" ("So the final answer is $7$."), else after the last "answer:" ("**Answer:**
  $12$"), else after the last "answer" ("The answer is $7$"), within 50 characters, as
  math-verify's anchored extraction reads it (OpenSIR's released parse: boxed first, no
  unanchored LaTeX)."""
  boxed = boxed_answer(text)
  if boxed is not None:
    return boxed
  text = str(text)[-match.MAX_TEXT:]
  for anchored in _ANCHORED:
    found = None
    for found in anchored.finditer(text):
      pass
    if found is not None:
      return next(g for g in found.groups() if g is not None).strip() or None
  return None


def screen(answer: str) -> str | None:
  """Why a predicted `answer` is not parsed at all (None: it may be). Only size counts here,
  in linear time: what an answer says, however costly, is bounded by the worker's timeout."""
  if len(answer) > MAX_ANSWER_CHARS:
    return "too_long"
  depth = peak = 0
  for ch in answer:
    depth += (ch in "{([") - (ch in "})]")
    peak = max(peak, depth)
  if peak > MAX_DEPTH:
    return "too_deep"
  plain = _SIZING.sub("", answer)
  if (any(math.factorial(min(int(m.group(1)), 7)) >= 5040  # (7!)! = 5040! has 16,000 digits
          for m in _FACTORIAL_OF_FACTORIAL.finditer(plain)) or _BIG_FACTORIAL.search(plain)
      or any(_digits_of_power(m.group()) > MAX_LITERAL_DIGITS
             for m in _POWER_CHAIN.finditer(plain))):
    return "too_large"  # a number no signal could stop the worker computing
  return None


def _digits_of_power(chain: str) -> float:
  """About how many digits the literal power chain '9^{9^{9}}' (right-associative) has; inf
  when even its exponent is beyond counting."""
  *bases, top = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", chain)]  # signs dropped:
  exponent = top  # 10^{-10^{10}} has as many digits after the point as 10^{10^{10}} before it
  for base in reversed(bases[1:]):  # the tower's exponent, from the top down
    if base <= 1:
      exponent = 1.0
    elif exponent * math.log10(base) > 308:
      return math.inf
    else:
      exponent = base ** exponent
  return exponent * abs(math.log10(bases[0])) if bases[0] > 0 else 0.0  # 0.5^n: n·0.3 digits


def text_answer(answer: str) -> str | None:
  """The text of an answer in words ('Even.', '\\text{Monday}', 'New York'), lower-cased with
  its spaces collapsed, or None for anything else: digits or operators make it math, and so do
  words of one letter ('x', 'a b c', 'x-y-z' are variables) and lone two-letter words ('ab')."""
  s = answer.strip().rstrip(".").strip()
  while (m := _TEXT_WRAPPER.match(s)):
    s = m.group(1).strip().rstrip(".").strip()
  words = re.split(r"[ -]+", s)
  if (not _WORDS.match(s) or any(sum(c.isalpha() for c in w) < 2 for w in words)
      or max(sum(c.isalpha() for c in w) for w in words) < 3):
    return None
  return " ".join(s.lower().split())


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
    self._failed = False  # whether the last worker call timed out or failed

  # ------------------------------------------------------------------------------ answers
  def canonical(self, answer: str | None, *, gold: bool = False) -> str | None:
    """The form two equal answers share: math-verify's canonical string (e.g. '1/2' for 0.5),
    or the normalised text of an answer in words; None if it is no answer, or could not be
    checked (too large for the screen, or not parsed in time: counted in `counters`). A `gold`
    answer is never screened."""
    if answer is None:
      return None
    answer = str(answer).strip()
    if not answer:
      return None
    text = text_answer(answer)
    if text is not None:  # a placeholder ('None', 'answer') is no answer, except as a gold
      return None if text in PLACEHOLDERS and not gold else text
    reason = None if gold else screen(answer)
    if reason is not None:
      if ("unchecked", answer) not in self._cache:  # counted once per answer, as a timeout is
        self.counters[f"rejected_{reason}"] += 1
        self._remember(("unchecked", answer), True)
      return None
    key = ("canonical", answer)
    if key in self._cache:
      self._cache.move_to_end(key)
      return self._cache[key]
    value = self._call({"op": "canonical", "text": answer})
    if self._failed:  # out of time, or the worker failed: unchecked, not 'not math'
      self._remember(("unchecked", answer), True)
    value = value if isinstance(value, str) else None
    self._remember(key, value)
    return value

  def is_unchecked(self, answer: str | None) -> bool:
    """Whether `answer` could not be checked (too large for the screen, out of time, or a worker
    error) the last time it was: it scores 0, and an evaluation counts it."""
    if answer is None:
      return False
    return ("unchecked", str(answer).strip()) in self._cache

  def equivalent(self, a: str | None, gold: str | None) -> bool:
    """Whether an answer equals a gold answer: the same canonical form, or math-verify's
    `verify` (under the timeout); False when the answer is invalid or the gold cannot be read."""
    if a is None or gold is None or not str(a).strip():
      return False
    ta, tg = text_answer(str(a)), text_answer(str(gold))
    if ta is not None or tg is not None:  # words equal only as text ('none' = gold 'None')
      return ta == tg
    ca, cg = self.canonical(a), self.canonical(gold, gold=True)
    if ca is None or cg is None:
      return False
    if ca == cg:
      return True
    a, gold = str(a).strip(), str(gold).strip()
    key = ("equal", a, gold)
    if key not in self._cache:
      self._remember(key, self._call({"op": "equal", "a": a, "b": gold}) is True)
    return self._cache[key]

  def unchecked(self) -> int:
    """Answers so far that could not be checked: screened out, timed out, or a worker error."""
    return sum(v for k, v in self.counters.items()
               if k.startswith("rejected_") or k in ("timeouts", "worker_errors"))

  def boxed(self, text: str) -> str | None:
    """The canonical form of the last boxed answer in a response."""
    return self.canonical(boxed_answer(text))

  def final(self, text: str) -> str | None:
    """The canonical form of the answer a response states (`final_answer`)."""
    return self.canonical(final_answer(text))

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
    self._failed = True
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
      return None
    self._failed = False
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
