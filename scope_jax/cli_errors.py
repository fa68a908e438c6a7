"""One-line messages for command-line mistakes (a typo in a config field, a missing config file,
an unknown preset, a bad value) instead of a library traceback."""

from __future__ import annotations

import logging as std_logging
import re
import sys
from typing import NoReturn, Sequence

from absl import flags, logging

from scope_jax import configs_base, console

_DID_YOU_MEAN = re.compile(r"""Did you mean \\?["'](\w+)\\?["'] instead of \\?["'](\w+)\\?["']""")
_NO_FILE = re.compile(r"No such file or directory: '([^']+)'")
_PRESET = re.compile(r"Unknown preset '[^\n]*")
_NO_FIELD = re.compile(r"""^\W*'(\w+)'\W*$""")  # ml_collections' KeyError for a missing field


def _chain(exc: BaseException) -> list[BaseException]:
  out, seen = [], set()
  while exc is not None and id(exc) not in seen:
    seen.add(id(exc))
    out.append(exc)
    exc = exc.__cause__ or exc.__context__
  return out


def one_line(exc: BaseException, argv: Sequence[str] = ()) -> str:
  """What went wrong and how to fix it, in one line."""
  if isinstance(exc, ValueError) and str(exc).strip() and type(exc).__module__.startswith(
      ("builtins", "scope_jax")):  # the project's own checks say it already
    return str(exc).strip().splitlines()[0]
  text = "\n".join(str(e) for e in _chain(exc))
  for old in configs_base.MOVED:  # a setting that moved: name its new path
    if any(a.split("=")[0] == f"--config.{old}" for a in argv):
      return configs_base.moved_message(old)
  m = _DID_YOU_MEAN.search(text)
  if m:
    good, bad = m.groups()
    flag = next((a.split("=")[0] for a in argv if f".{bad}=" in a or a.endswith(f".{bad}")),
                f"--config...{bad}")
    return f"Unknown config field in {flag}: did you mean '{good}' instead of '{bad}'?"
  m = _NO_FIELD.match(str(exc)) if isinstance(exc, (AttributeError, KeyError)) else None
  if m:
    bad = m.group(1)
    flag = next((a.split("=")[0] for a in argv if f".{bad}=" in a or a.endswith(f".{bad}")), None)
    if flag:
      return (f"Unknown config field in {flag}: the config has no field {bad!r} there (check the "
              "spelling and the section; the config file lists every field).")
  m = _NO_FILE.search(text)
  if m:
    return (f"Config file {m.group(1)} does not exist: give a config file's path, or a method's "
            f"configs/<name>.py ({', '.join(sorted(p.stem for p in configs_base.PACKAGED.glob('[!_]*.py')))}).")
  m = _PRESET.search(text)
  if m:
    return m.group(0).strip()
  lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
  return lines[-1] if lines else type(exc).__name__


CHATTY = ("/orbax/", "xla_bridge.py", "faiss/loader.py")  # libraries whose INFO lines are noise


def quiet_chatty_libraries() -> None:
  """Only warnings and errors from `CHATTY` libraries reach the absl log (the entrypoints'), and
  no log line is longer than the console's limit."""
  console.clip_log_lines()
  logging.get_absl_handler().addFilter(
      lambda r: r.levelno >= std_logging.WARNING or not any(q in r.pathname for q in CHATTY))


def raised_here(exc: BaseException, within: str | None = None) -> bool:
  """Whether the project's own code raised `exc` (its message is meant for the user), not a
  library deep in a call (whose traceback is the useful part); with `within`, only when a
  function of that name was on the way (e.g. 'build': setting up, not a step's bug)."""
  tb, names = exc.__traceback__, set()
  while tb is not None and tb.tb_next is not None:
    names.add(tb.tb_frame.f_code.co_name)
    tb = tb.tb_next
  return (tb is not None and "/scope_jax/" in tb.tb_frame.f_code.co_filename
          and (within is None or within in names))


def fail(exc: BaseException) -> NoReturn:
  """Prints `exc` as one `Error:` line on stderr and exits with status 2 (a usage error)."""
  print(f"Error: {one_line(exc, sys.argv)}", file=sys.stderr)
  sys.exit(2)


def parse_flags(argv):
  """absl flag parsing (`app.run(main, flags_parser=parse_flags)`) with one-line errors: typos,
  missing files, unknown presets. `--config=configs/<name>.py` names the packaged file when the
  current directory has no such file (`configs_base.config_path`)."""
  argv = configs_base.resolve_config_flag(argv)
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # noqa: BLE001 — every command-line mistake ends the same way
    print(f"Error: {one_line(e, argv)}", file=sys.stderr)
    sys.exit(2)
