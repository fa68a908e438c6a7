"""Helpers for tests that run an entrypoint in a subprocess."""

import signal
import time


def kill_once_exists(proc, path, timeout: float) -> None:
  """SIGKILLs `proc` as soon as `path` exists (or after `timeout` seconds), and reaps it."""
  deadline = time.time() + timeout
  while not path.exists() and time.time() < deadline:
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
