"""A run that learns nothing says so: skipped updates, all-zero advantages and empty responses
are warned about at each step and counted in the summary (values by hand)."""

import numpy as np

from scope_jax.core import health as health_lib
from scope_jax.rollout.types import Trajectory


def traj(generated: int) -> Trajectory:
  mask = np.array([0, 0] + [1] * generated, np.int32)
  return Trajectory(tokens=np.zeros(len(mask), np.int32), loss_mask=mask,
                    logprobs=np.zeros(len(mask), np.float32), prompt_len=2, spans=[],
                    tool_calls=[], final_tag=None, answer=None, finish_reason="eos")


def test_update_stats_by_hand():
  stats = health_lib.update_stats([traj(3), traj(0), traj(1)],
                                  [0.5, 0.0, np.array([0.0, -1.0])])
  assert stats == {"rows": 3.0, "signal_rows": 2.0, "empty_rows": 1.0}


def test_a_healthy_run_has_no_warning():
  h = health_lib.Health()
  assert h.observe({"train/applied": 1.0, "train/rows": 4, "train/signal_rows": 2,
                    "train/empty_rows": 0}) == []
  assert h.summary() is None


def test_each_sign_is_warned_and_counted():
  h = health_lib.Health()
  w = h.observe({"challenger/train/applied": 0.0, "challenger/train/rows": 4,
                 "challenger/train/signal_rows": 4, "challenger/train/empty_rows": 0,
                 "solver/train/applied": 1.0, "solver/train/rows": 4,
                 "solver/train/signal_rows": 0, "solver/train/empty_rows": 4})
  assert w == ["challenger/train: the update was skipped (non-finite loss or gradient)",
               "solver/train: every advantage is zero (each group's rewards are tied)",
               "solver/train: every response is empty (no generated token)"]
  assert h.summary() == ("NOTHING WAS LEARNED: 1 of 2 updates skipped as non-finite; 1 of 2 "
                         "updates with every advantage zero; 4 of 8 trained responses empty.")
  h.observe({"train/applied": 1.0, "train/rows": 2, "train/signal_rows": 1,
             "train/empty_rows": 0})
  assert h.summary().startswith("Warning: 1 of 3 updates skipped")


def test_a_run_with_no_update_says_nothing_was_learned():
  h = health_lib.Health()
  assert h.summary() is None  # no step ran (a finished run, resumed)
  for _ in range(3):  # steps whose groups all tied: no train/ metrics at all
    assert h.observe({"questioner/reward/mean": -1.0, "time/step": 2.0}) == []
  assert h.summary() == ("NOTHING WAS LEARNED: 0 updates in 3 steps (no step had a group with "
                         "reward variance, or every rollout failed).")
