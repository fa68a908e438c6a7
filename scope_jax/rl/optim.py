"""AdamW with linear warmup then constant or cosine decay, and global-norm clipping."""

from __future__ import annotations

import optax

SCHEDULES = ("constant", "cosine")


def learning_rate_schedule(lr: float, *, warmup_steps: int = 0, total_steps: int = 0,
                           schedule: str = "constant", final_fraction: float = 0.0):
  if schedule not in SCHEDULES:
    raise ValueError(f"Unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}.")
  warm = optax.linear_schedule(0.0, lr, max(warmup_steps, 1)) if warmup_steps else None
  if schedule == "constant":
    after = optax.constant_schedule(lr)
  else:
    decay = max(total_steps - warmup_steps, 1)
    after = optax.cosine_decay_schedule(lr, decay, alpha=final_fraction)
  if warm is None:
    return after
  return optax.join_schedules([warm, after], [warmup_steps])


def make_optimizer(lr: float, *, warmup_steps: int = 0, total_steps: int = 0,
                   schedule: str = "constant", weight_decay: float = 0.0, b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-8, grad_clip: float | None = 1.0):
  """optax chain: clip by global norm (if set) → AdamW on the schedule."""
  sched = learning_rate_schedule(lr, warmup_steps=warmup_steps, total_steps=total_steps,
                                 schedule=schedule)
  parts = [optax.clip_by_global_norm(grad_clip)] if grad_clip else []
  parts.append(optax.adamw(sched, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay))
  return optax.chain(*parts)
