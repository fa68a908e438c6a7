"""A guard around parsers of model output: an unexpected exception on one sample is logged with
the sample, counted, and the sample scored as malformed output; it never ends a run."""

from __future__ import annotations

from typing import Any, Callable

from absl import logging


class ParseGuard:
  """Calls `fn(text, *args)`; on an exception returns `malformed` and counts it in `errors`."""

  def __init__(self):
    self.errors = 0

  def __call__(self, fn: Callable[..., Any], text: str, *args, malformed: Any) -> Any:
    try:
      return fn(text, *args)
    except Exception as e:  # noqa: BLE001 — model output must never end the run
      self.errors += 1
      logging.warning("%s raised %s: %s on a sample, scored as malformed output; sample "
                      "(last 500 characters): %r", getattr(fn, "__name__", fn), type(e).__name__,
                      str(e)[:200], str(text)[-500:])
      return malformed

  def take(self) -> int:
    """Errors since the last call (for per-step metrics)."""
    n, self.errors = self.errors, 0
    return n
