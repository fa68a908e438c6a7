"""One-line messages for command-line mistakes (a typo in a config field, a missing config file,
an unknown preset, a bad value) instead of a library traceback."""

from __future__ import annotations

import re
from typing import Sequence

_DID_YOU_MEAN = re.compile(r"""Did you mean \\?["'](\w+)\\?["'] instead of \\?["'](\w+)\\?["']""")
_NO_FILE = re.compile(r"No such file or directory: '([^']+)'")
_PRESET = re.compile(r"Unknown preset '[^\n]*")


def _chain(exc: BaseException) -> list[BaseException]:
  out, seen = [], set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    out.append(exc)
    exc = exc.__cause__ or exc.__context__
  return out


def one_line(exc: BaseException, argv: Sequence[str] = ()) -> str:
  """What went wrong and how to fix it, in one line."""
  if type(exc) is ValueError and str(exc).strip():  # the project's own checks say it already
    return str(exc).strip().splitlines()[0]
  text = "\n".join(str(e) for e in _chain(exc))
  m = _DID_YOU_MEAN.search(text)
  if m:
    good, bad = m.groups()
    flag = next((a.split("=")[0] for a in argv if f".{bad}=" in a or a.endswith(f".{bad}")),
                f"--config...{bad}")
    return f"Unknown config field in {flag}: did you mean '{good}' instead of '{bad}'?"
  m = _NO_FILE.search(text)
  if m:
    return (f"Config file {m.group(1)} does not exist: give the path of a file in configs/ "
            "(e.g. --config=configs/spell.py), relative to the current directory.")
  m = _PRESET.search(text)
  if m:
    return m.group(0).strip()
  lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
  return lines[-1] if lines else type(exc).__name__
