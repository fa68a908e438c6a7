"""What a run prints: one short line per step (each role's reward, the method's phase or stage,
the step's time) and per evaluation, progress bars only on a terminal, and no log line longer
than `MAX_LINE` characters. Every metric goes to metrics.jsonl and TensorBoard, not the console.
"""

from __future__ import annotations

import logging as std_logging
import re
import sys
from typing import Mapping

from absl import logging

MAX_LINE = 400  # characters per console line, the log prefix included
_PREFIX = 60  # room for absl's prefix ("I1128 23:50:18.527160 139798388042624 runner.py:221] ")
_REWARD = re.compile(r"^(.+)/(?:reward|outcome)/mean$")  # a role may report an outcome instead
_SCHEDULE = ("iteration", "phase", "stage")  # a method's place in its schedule, when it has one
_EVAL_KEYS = ("pass@1", "accuracy", "em", "answered")


def clip(text: str, limit: int = MAX_LINE - _PREFIX) -> str:
  """Each line of `text` cut to `limit` characters (the cut marked with '…')."""
  return "\n".join(ln if len(ln) <= limit else ln[:limit - 1] + "…" for ln in text.split("\n"))


def step_line(step: int, total: int, metrics: Mapping[str, float]) -> str:
  """'step 3 (4/80): questioner -0.5, responder 1; phase 1; 71.5 s' from a step's metrics (steps
  count from 0, as metrics.jsonl and the warnings do)."""
  rewards = [f"{m.group(1)} {v:.3g}" for k, v in sorted(metrics.items())
             if (m := _REWARD.match(k)) and not k.startswith(("eval/", "time/"))]
  where = [f"{k} {metrics[k]:g}" for k in _SCHEDULE if k in metrics]
  parts = [", ".join(rewards) or "no rollout reward", "; ".join(where)]
  if "time/step" in metrics:
    parts.append(f"{metrics['time/step']:.1f} s")
  return clip(f"step {step} ({step + 1}/{total}): " + "; ".join(p for p in parts if p))


def eval_line(updates: int, name: str, metrics: Mapping[str, float], count: int | None = None
              ) -> str:
  """'eval after 10 updates: hop1 pass@1 0.25 (300 questions)' from a benchmark's metrics."""
  shown = [f"{k} {metrics[k]:.3g}" for k in _EVAL_KEYS if k in metrics]
  if not shown:  # a benchmark type with other scores: its first few
    shown = [f"{k} {v:.3g}" for k, v in sorted(metrics.items()) if not k.startswith("time/")][:4]
  tail = f" ({count} questions)" if count is not None else ""
  return clip(f"eval after {updates} updates: {name} " + ", ".join(shown) + tail)


def progress_on(wanted: bool = True, stream=None) -> bool:
  """Progress bars only on a terminal: in a log file their cursor moves are noise."""
  stream = sys.stderr if stream is None else stream
  try:
    return bool(wanted) and stream.isatty()
  except (AttributeError, ValueError):  # a closed or replaced stream
    return False


class ClipLines(std_logging.Filter):
  """A log filter that cuts every line of a record to `MAX_LINE` characters with the prefix."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    try:
      text = record.getMessage()
    except Exception:  # noqa: BLE001 — a malformed record is the handler's to report
      return True
    short = clip(text)
    if short != text:
      record.msg, record.args = short, ()
    return True


def clip_log_lines() -> None:
  """Installs `ClipLines` on absl's handler (once)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, ClipLines) for f in handler.filters):
    handler.addFilter(ClipLines())
