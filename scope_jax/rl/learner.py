"""The learner: trajectories and advantages → one jitted, sharded update of a trained policy.

It owns what every method's update shares: packing rows into a `TrainBatch`, bucketing the
micro-batch count (1, 2, 4, 8, then multiples of 8) so few shapes compile, padding rows so each
device gets whole micro-batches, the compiled-step cache keyed on the whole `LossConfig` and the
micro-batch count (a changed β, λ or temperature compiles a new step, it is never ignored),
optionally recomputing π_old with the trainer's own forward, and the token counters.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from scope_jax import sharding as shd
from scope_jax.models import lora as lora_lib
from scope_jax.models.config import ModelConfig
from scope_jax.rl import batch as batch_lib
from scope_jax.rl import train_step
from scope_jax.rollout.types import Trajectory


@dataclasses.dataclass
class Policy:
  """A trained params pytree: its train state, its loss settings and the sampler that plays it.
  With LoRA, `state.params` are the policy's adapters and `base` the frozen base model they
  adapt (shared by every policy, never copied)."""

  name: str
  state: train_step.TrainState
  loss: train_step.LossConfig
  sampler: Any = None  # a sampling.Sampler kept in sync with state.params after each update
  optimizer: Any = None  # its optax transformation (the learner's unless the method overrides)
  base: Any = None  # LoRA: the shared frozen base params (None: state.params are the model)

  def played(self):
    """The params the policy samples with: its own, or the base plus its adapters."""
    return self.state.params if self.base is None else lora_lib.view(self.base, self.state.params)


def micro_batch_count(rows: int, rows_per_micro: int) -> int:
  """Micro-batches for `rows` rows: 1, 2, 4, 8, then multiples of 8 (few compiles, little padding)."""
  micro = max(1, -(-rows // rows_per_micro))
  return 1 << (micro - 1).bit_length() if micro <= 8 else -(-micro // 8) * 8


def pad_rows(batch: batch_lib.TrainBatch, rows: int) -> batch_lib.TrainBatch:
  """Appends all-zero rows (no tokens, no loss) until the batch has `rows` rows."""
  def pad(x):
    extra = np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)
    return np.concatenate([x, extra])
  return jax.tree.map(pad, batch)


def fill_micro_batches(batch: batch_lib.TrainBatch, real: int, micro: int
                       ) -> batch_lib.TrainBatch:
  """Rows reordered so that the `real` rows fill whole micro-batches first and the padding rows
  make up the last ones, which the step then skips. Micro-batch j holds rows j, j + M, j + 2M, …
  (`train_step._split`), so real row r goes to position (r mod R)·M + r div R."""
  b = batch.num_rows
  per = b // micro
  order = np.full(b, -1)
  for r in range(real):
    order[(r % per) * micro + r // per] = r
  order[order < 0] = np.arange(real, b)
  return jax.tree.map(lambda x: None if x is None else x[order], batch)


class Learner:
  """Updates trained policies; one instance per run, shared by every policy of the method."""

  def __init__(self, model_config: ModelConfig, optimizer, mesh, *, dtype=jnp.float32,
               remat: str = "none", micro_batch_rows: int = 8, recompute_old_logp: bool = False,
               pad_id: int = 0, rules: shd.Rules = shd.TRAIN_RULES):
    if micro_batch_rows < 1:
      raise ValueError(f"micro_batch_rows must be at least 1, got {micro_batch_rows}.")
    self.model_config, self.optimizer, self.mesh = model_config, optimizer, mesh
    self.dtype, self.remat, self.pad_id, self.rules = dtype, remat, pad_id, rules
    shards = shd.batch_shards(mesh, rules) if mesh is not None else 1
    if micro_batch_rows % shards:  # fewer rows than shards would be replicated on every shard
      rounded = -(-micro_batch_rows // shards) * shards
      logging.info("learner.micro_batch_rows=%d rounded up to %d, a multiple of the mesh's %d "
                   "batch shards: a micro-batch's rows split over them.", micro_batch_rows,
                   rounded, shards)
      micro_batch_rows = rounded
    self.micro_batch_rows, self.recompute_old_logp = micro_batch_rows, recompute_old_logp
    self._steps: dict[tuple[train_step.LossConfig, int], Any] = {}
    self.counters = {"train_tokens": 0, "train_seconds": 0.0, "skipped_updates": 0}

  def init_policy(self, name: str, params, loss: train_step.LossConfig, sampler=None,
                  optimizer=None, base=None) -> Policy:
    """A policy training `params` (with `base`: LoRA adapters of that base model)."""
    optimizer = optimizer or self.optimizer
    return Policy(name, train_step.init_train_state(params, optimizer), loss, sampler, optimizer,
                  base)

  def compiled_step(self, loss: train_step.LossConfig, micro: int, optimizer=None):
    """The jitted step for this loss configuration, micro-batch count and optimizer (cached)."""
    optimizer = optimizer or self.optimizer
    key = (loss, micro, optimizer)
    if key not in self._steps:
      self._steps[key] = train_step.make_train_step(self.model_config, loss, optimizer,
                                                    dtype=self.dtype, remat=self.remat,
                                                    micro_batches=micro, mesh=self.mesh,
                                                    rules=self.rules)
    return self._steps[key]

  def _row_multiple(self) -> int:
    """Rows an update pads to a multiple of: whole micro-batches, each split evenly over the
    batch shards (`micro_batch_rows` is a multiple of them)."""
    return self.micro_batch_rows

  def make_batch(self, trajectories: Sequence[Trajectory], advantages: Sequence,
                 teacher_prompts=None) -> tuple[batch_lib.TrainBatch, int]:
    """Host batch padded to whole micro-batches on every device, and the micro-batch count."""
    host = batch_lib.make_batch(trajectories, advantages, teacher_prompts=teacher_prompts,
                                pad_id=self.pad_id, row_multiple=self._row_multiple())
    rows, micro = self.batch_layout(len(trajectories))
    if host.num_rows < rows:
      host = pad_rows(host, rows)
    return fill_micro_batches(host, len(trajectories), micro), micro

  def batch_layout(self, trajectories: int) -> tuple[int, int]:
    """(rows, micro-batches) of an update of `trajectories` rows once padded: whole
    micro-batches on every device, the micro-batch count in few buckets."""
    multiple = self._row_multiple()
    rows = -(-trajectories // multiple) * multiple
    rows = max(rows, micro_batch_count(trajectories, self.micro_batch_rows) * self.micro_batch_rows)
    return rows, rows // self.micro_batch_rows

  def train(self, policy: Policy, trajectories: Sequence[Trajectory], advantages: Sequence, *,
            ref_params=None, teacher_params=None, teacher_prompts=None,
            loss: train_step.LossConfig | None = None) -> dict[str, float]:
    """One update of `policy` (with `loss`, default the policy's own); returns its metrics.

    With `recompute_old_logp`, π_old is the trainer's log-prob of the batch (ratio 1 at the first
    update), taken from the step's own forward, instead of the sampler's; the sampler-vs-trainer
    gap is reported either way (`logprob_gap_mean`).
    """
    if not trajectories:
      return {}
    loss = loss or policy.loss
    if self.recompute_old_logp:
      loss = dataclasses.replace(loss, old_logp_from_trainer=True)
    advantages, dropped = finite_advantages(trajectories, advantages, policy.name)
    host, micro = self.make_batch(trajectories, advantages, teacher_prompts)
    step_fn = self.compiled_step(loss, micro, policy.optimizer)
    start = time.perf_counter()
    batch = train_step.place_batch(host, self.mesh, self.rules)
    policy.state, metrics = step_fn(policy.state, batch, ref_params, teacher_params, policy.base)
    out = {k: float(v) for k, v in jax.device_get(metrics).items()}
    seconds = time.perf_counter() - start
    tokens = int(np.asarray(host.mask).sum())
    self.counters["train_tokens"] += tokens
    self.counters["train_seconds"] += seconds
    out["train_tokens_per_s"] = tokens / max(seconds, 1e-9)
    out["loss_tokens"] = float(np.asarray(host.loss_mask).sum())
    out["micro_batches"] = float(micro)
    out["nonfinite_advantage_rows"] = float(dropped)
    out["applied"] = out.pop("finite")
    if not out["applied"]:
      self.counters["skipped_updates"] += 1
      logging.warning("Policy %r: skipped a non-finite update (loss %s, grad norm %s); %d skipped "
                      "so far, %d applied.", policy.name, out["loss"], out["grad_norm"],
                      int(out["skipped"]), int(policy.state.step))
    if policy.sampler is not None:
      policy.sampler.update_params(policy.played())
    return out


def finite_advantages(trajectories: Sequence[Trajectory], advantages: Sequence, name: str = ""):
  """(advantages, dropped): rows whose advantage is NaN or inf (a non-finite reward, say) get
  advantage 0, so they add no gradient instead of turning the whole update into NaN; each is
  logged with its sample."""
  out, dropped = [], 0
  for traj, adv in zip(trajectories, advantages):
    a = np.asarray(adv, np.float32)
    if np.all(np.isfinite(a)):
      out.append(adv)
      continue
    dropped += 1
    logging.warning("Policy %r: non-finite advantage %s; the row is left out of the update. "
                    "Sample (last 300 characters): %r", name, a if a.ndim == 0 else "(per token)",
                    traj.response_text()[-300:])
    out.append(np.zeros_like(a))
  return out, dropped
