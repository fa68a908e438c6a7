"""Does a method make the model better? Each `learn` preset, run as a user runs it, must raise
held-out accuracy (greedy, 300 gold questions training never reads) by at least 10 points on
each world seed it is measured on (the bar asks two), while its shuffled-rewards control gains
less than 3 (docs/learning.md).

Slow: each run is 3-12 minutes on a 2-core CPU (SCOPE's the longest), and SPELL's first one per
seed another 4 to fit its warm-up.
"""

import os
import subprocess
import sys

import pytest

from scope_jax import report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Every method's `learn` preset, and the world seeds it meets the bar on (docs/learning.md).
LEARNERS = [("spell", 0), ("spell", 1), ("spell", 2), ("piplay", 0), ("piplay", 1), ("asl", 0),
            ("asl", 1), ("scope", 0), ("scope", 1), ("opensir", 0), ("opensir", 1),
            ("opensir", 2)]


def _learn(method: str, seed: int, workdir, *flags) -> tuple[float, float]:
  """(held-out accuracy before training, after it) of one `learn` run on one CPU device."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # the README's command
  subprocess.run([sys.executable, "-m", "scope_jax.main", f"--config=configs/{method}.py:learn",
                  f"--workdir={workdir}", f"--config.world.seed={seed}", *flags],
                 cwd=ROOT, env=dict(env, PYTHONPATH=ROOT), check=True, timeout=45 * 60)
  (start, end), = report.held_out(report.curves(report.read(workdir))).values()
  return start, end


@pytest.mark.slow
@pytest.mark.parametrize("method,seed", LEARNERS)
def test_self_play_raises_held_out_accuracy_and_its_control_does_not(method, seed, tmp_path):
  start, end = _learn(method, seed, tmp_path / "run")
  assert end - start >= 0.10, (method, seed, start, end)
  c_start, c_end = _learn(method, seed, tmp_path / "control", "--config.control=shuffled_rewards")
  assert c_start == start  # the same warmed model, asked the same questions
  assert c_end - c_start < 0.03, (method, seed, c_start, c_end)
