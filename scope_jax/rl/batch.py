"""Trajectories → a padded `TrainBatch` (host numpy; the train step places it on the mesh).

Layout: every row is [left padding | prompt | response | right padding], with all prompts ending
at the same column P. A teacher row carries a different (privileged) prompt but the same response
at the same columns, so student and teacher statistics line up token for token. RoPE positions
come from the attention mask, so padding never shifts a position.
"""

from __future__ import annotations

from typing import Sequence

import flax.struct
import jax
import numpy as np

from scope_jax.rollout.types import Trajectory
from scope_jax.shapes import length_bucket


@flax.struct.dataclass
class TrainBatch:
  tokens: jax.Array  # [B, T] int32
  mask: jax.Array  # [B, T] int32 attention mask (1 = real token)
  loss_mask: jax.Array  # [B, T] float32: 1 on tokens the policy generated
  advantages: jax.Array  # [B, T] float32, broadcast over each row's generated tokens
  old_logp: jax.Array  # [B, T] float32 sampler log-probs (0 off the loss mask)
  ref_logp: jax.Array | None = None  # [B, T] optional precomputed reference log-probs
  teacher_tokens: jax.Array | None = None  # [B, T] teacher context + the same response
  teacher_mask: jax.Array | None = None  # [B, T]
  prompt_cols: int = flax.struct.field(pytree_node=False, default=0)  # P: responses start here

  @property
  def num_rows(self) -> int:
    return self.tokens.shape[0]


def make_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float] | Sequence[np.ndarray],
               *, teacher_prompts: Sequence[Sequence[int]] | None = None, pad_id: int = 0,
               row_multiple: int = 1, min_bucket: int = 16) -> TrainBatch:
  """Packs trajectories (one advantage per trajectory, or one per token) into a TrainBatch."""
  if len(trajectories) != len(advantages):
    raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantages.")
  if not trajectories:
    raise ValueError("make_batch needs at least one trajectory.")
  prompts = [t.tokens[:t.prompt_len] for t in trajectories]
  responses = [t.tokens[t.prompt_len:] for t in trajectories]
  prompt_lens = [len(p) for p in prompts]
  if teacher_prompts is not None:
    if len(teacher_prompts) != len(trajectories):
      raise ValueError("teacher_prompts must have one entry per trajectory.")
    prompt_lens += [len(p) for p in teacher_prompts]
  p_cols = length_bucket(max(prompt_lens), min_bucket)
  t_cols = p_cols + length_bucket(max(len(r) for r in responses), min_bucket)  # bounded shapes
  rows = -(-len(trajectories) // row_multiple) * row_multiple

  def alloc(dtype, fill=0):
    return np.full((rows, t_cols), fill, dtype)

  tokens, mask = alloc(np.int32, pad_id), alloc(np.int32)
  loss_mask, adv, old = alloc(np.float32), alloc(np.float32), alloc(np.float32)
  t_tokens = alloc(np.int32, pad_id) if teacher_prompts is not None else None
  t_mask = alloc(np.int32) if teacher_prompts is not None else None
  for i, (traj, prompt, resp) in enumerate(zip(trajectories, prompts, responses)):
    end = p_cols + len(resp)
    tokens[i, p_cols - len(prompt):p_cols], tokens[i, p_cols:end] = prompt, resp
    mask[i, p_cols - len(prompt):end] = 1
    lm = traj.loss_mask[traj.prompt_len:].astype(np.float32)
    loss_mask[i, p_cols:end] = lm
    a = np.asarray(advantages[i], np.float32)
    adv[i, p_cols:end] = (a * lm) if a.ndim == 0 else a * lm
    old[i, p_cols:end] = traj.logprobs[traj.prompt_len:] * lm
    if teacher_prompts is not None:
      tp = np.asarray(teacher_prompts[i], np.int32)
      t_tokens[i, p_cols - len(tp):p_cols], t_tokens[i, p_cols:end] = tp, resp
      t_mask[i, p_cols - len(tp):end] = 1
  return TrainBatch(tokens=tokens, mask=mask, loss_mask=loss_mask, advantages=adv, old_logp=old,
                    teacher_tokens=t_tokens, teacher_mask=t_mask, prompt_cols=p_cols)
