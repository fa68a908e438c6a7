"""A run's console reads as a log: one short line per step, no progress bars or cursor moves
off a terminal, no line over 400 characters, and nothing from the TPU runtime on a CPU machine."""

import io
import logging as std_logging
import os
import re
import subprocess
import sys

import chex
import pytest

from scope_jax import console

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _spell_step_metrics() -> dict[str, float]:
  """A SPELL step's metrics: about 3,000 characters as `k=v` pairs."""
  m = {f"{role}/rollout/{k}": 0.123456 for role in ("questioner", "responder", "verifier")
       for k in ("rows", "searches/mean", "finish_eos", "finish_length", "tokens/mean",
                 "tokens/max", "prompt_tokens/mean", "seconds")}
  m.update({f"{role}/train/{k}": 1.5 for role in ("questioner", "responder", "verifier")
            for k in ("loss", "kl", "entropy", "grad_norm", "applied", "rows", "signal_rows")})
  m.update({"questioner/reward/mean": -0.5, "responder/reward/mean": 1.0,
            "verifier/reward/mean": 0.6875, "time/step": 71.49, "time/rollout": 52.3,
            "eval/doc/reward/mean": 0.1})
  return m


def test_step_line_is_short_and_names_each_role():
  m = _spell_step_metrics()
  assert len(", ".join(f"{k}={v:.4g}" for k, v in m.items())) > 1500  # as the log had it
  chex.assert_equal(console.step_line(0, 2, m),
                    "step 0 (1/2): questioner -0.5, responder 1, verifier 0.688; 71.5 s")
  chex.assert_equal(console.step_line(4, 9, {"student/outcome/mean": 0.25, "phase": 1.0,
                                             "iteration": 2.0}),
                    "step 4 (5/9): student 0.25; iteration 2; phase 1")
  chex.assert_equal(console.step_line(0, 1, {}), "step 0 (1/1): no rollout reward")


def test_eval_line():
  chex.assert_equal(console.eval_line(10, "hop1", {"pass@1": 0.25, "pass@4": 0.5,
                                                   "time/seconds": 3.0}, 300),
                    "eval after 10 updates: hop1 pass@1 0.25 (300 questions)")
  chex.assert_equal(console.eval_line(0, "x", {"b": 1.0, "a": 2.0}),
                    "eval after 0 updates: x a 2, b 1")


def test_clip_cuts_every_line():
  text = "a" * 1000 + "\nshort\n" + "b" * 10
  lines = console.clip(text, 50).split("\n")
  chex.assert_equal([len(x) for x in lines], [50, 5, 10])
  chex.assert_equal(lines[0], "a" * 49 + "…")


def test_log_records_are_clipped_with_a_captured_handler():
  stream = io.StringIO()
  handler = std_logging.StreamHandler(stream)
  handler.addFilter(console.ClipLines())
  log = std_logging.getLogger("scope_jax_console_test")
  log.addHandler(handler)
  log.propagate = False
  try:
    log.warning("step %d: %s", 3, "x" * 5000)
    log.warning("fine")
  finally:
    log.removeHandler(handler)
  lines = stream.getvalue().splitlines()
  chex.assert_equal(len(lines), 2)
  assert max(len(ln) for ln in lines) <= console.MAX_LINE - 60, lines
  chex.assert_equal(lines[1], "fine")


class _Stream(io.StringIO):
  def __init__(self, tty):
    super().__init__()
    self.tty = tty

  def isatty(self):
    return self.tty


def test_progress_bars_only_on_a_terminal():
  chex.assert_equal(console.progress_on(True, _Stream(True)), True)
  chex.assert_equal(console.progress_on(True, _Stream(False)), False)
  chex.assert_equal(console.progress_on(False, _Stream(True)), False)
  chex.assert_equal(console.progress_on(True, object()), False)  # no isatty at all


@pytest.mark.slow
def test_one_step_spell_demo_console():
  """The SPELL demo for one step, with no JAX_PLATFORMS on this (CPU) machine and stderr a pipe:
  no TPU runtime line, at most 60 lines, none over 400 characters, no cursor moves."""
  from scope_jax import platforms
  if platforms.tpu_attached():
    pytest.skip("this machine has a TPU")
  import tempfile
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  with tempfile.TemporaryDirectory() as workdir:
    out = subprocess.run(
        [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py",
         f"--workdir={workdir}", "--config.total_steps=1"],
        capture_output=True, text=True, cwd=ROOT, timeout=600, env=dict(env, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-3000:]
  lines = (out.stdout + out.stderr).splitlines()
  assert len(lines) <= 60, "\n".join(lines)
  assert max(len(ln) for ln in lines) <= 400, max(lines, key=len)
  assert "\x1b[" not in out.stdout + out.stderr
  assert not [ln for ln in lines if re.search(r"TPU_|host bounds|E0000|libtpu", ln)], lines
  assert [ln for ln in lines if "step 0 (1/1): questioner" in ln], lines
