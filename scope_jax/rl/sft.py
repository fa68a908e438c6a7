"""Supervised fine-tuning on demonstrations: token-mean negative log-likelihood of the tokens a
demonstration marks as generated (loss mask 1), through the same chunked log-prob path and
sharded batches as the RL train step. Used for format warm-ups (cold start) of small models.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from scope_jax import sharding as shd
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.rl import batch as batch_lib
from scope_jax.rl import train_step
from scope_jax.rollout.types import Span, Trajectory


def demonstration(prompt_ids: Sequence[int], pieces: Sequence[tuple[str, str | Sequence[int]]],
                  tokenizer) -> Trajectory:
  """A Trajectory from a prompt and (kind, text or token ids) pieces, kind 'generated' (trained
  on) or 'observation' (context only). Each text piece is tokenized on its own, as the rollout
  loop does."""
  tokens, mask = list(prompt_ids), [0] * len(prompt_ids)
  spans = [Span(0, len(tokens), "prompt", "")]
  for kind, text in pieces:
    if kind not in ("generated", "observation"):
      raise ValueError(f"Unknown piece kind {kind!r}; use 'generated' or 'observation'.")
    if isinstance(text, str):
      ids = list(tokenizer.encode(text, add_special_tokens=False))
    else:
      ids, text = [int(i) for i in text], tokenizer.decode(list(text), skip_special_tokens=False)
    spans.append(Span(len(tokens), len(tokens) + len(ids), kind, text))
    tokens += ids
    mask += [int(kind == "generated")] * len(ids)
  return Trajectory(np.asarray(tokens, np.int32), np.asarray(mask, np.int32),
                    np.zeros(len(tokens), np.float32), len(prompt_ids), spans, [], None, None,
                    "final")


def cut(demos: Sequence[Trajectory], max_tokens: int) -> list[Trajectory]:
  """Each demonstration's first `max_tokens` tokens (0 = whole); one left with no trained token
  is dropped. A warm-up of formats needs a demonstration's opening (its first call), not its
  whole length, and attention memory grows with the square of it."""
  if not max_tokens:
    return list(demos)
  out = []
  for d in demos:
    if len(d.tokens) > max_tokens:
      spans = [dataclasses.replace(s, end=min(s.end, max_tokens)) for s in d.spans
               if s.start < max_tokens]
      d = dataclasses.replace(d, tokens=d.tokens[:max_tokens], loss_mask=d.loss_mask[:max_tokens],
                              logprobs=d.logprobs[:max_tokens], spans=spans,
                              prompt_len=min(d.prompt_len, max_tokens))
    if d.loss_mask.any():
      out.append(d)
  return out


def pack(demos: Sequence[Trajectory], width: int, pad_id: int = 0) -> batch_lib.TrainBatch:
  """Left-aligned rows padded on the right to `width` (SFT needs no prompt alignment)."""
  rows = len(demos)
  tokens = np.full((rows, width), pad_id, np.int32)
  mask, loss_mask = np.zeros((rows, width), np.int32), np.zeros((rows, width), np.float32)
  for i, d in enumerate(demos):
    n = min(len(d.tokens), width)
    tokens[i, :n], mask[i, :n], loss_mask[i, :n] = d.tokens[:n], 1, d.loss_mask[:n]
  zeros = np.zeros((rows, width), np.float32)
  return batch_lib.TrainBatch(tokens, mask, loss_mask, zeros, zeros)


def nll_loss(config: ModelConfig, params, batch: batch_lib.TrainBatch, *, dtype, chunk: int,
             remat: str = "none"):
  """Σ −log p(token)·mask / Σ mask over the batch, in float32. chunk = 0 computes the full
  [B, T, V] logits at once (fastest for small vocabularies); otherwise log-probs are chunked."""
  return nll_rows(config, params, batch, dtype=dtype, chunk=chunk, remat=remat).sum()


def nll_rows(config: ModelConfig, params, batch: batch_lib.TrainBatch, *, dtype, chunk: int,
             remat: str = "none"):
  """Each row's term of `nll_loss`, [B]: the step sums them outside the gradient's computation
  (see train_step._micro_loss on cross-device reductions beside the backward pass)."""
  m = batch.loss_mask
  if chunk:
    lc = train_step.LossConfig(chunk=chunk)
    logp = train_step.sequence_stats(config, params, batch.tokens, batch.mask, lc=lc, dtype=dtype,
                                     remat=remat)["logp"]
    return -(logp * m).sum(-1) / jnp.maximum(m.sum(), 1.0)
  hidden, _ = transformer.forward(config, params, batch.tokens, attention_mask=batch.mask,
                                  return_hidden=True, dtype=dtype, remat=remat)
  logits_BTV = transformer.logits_from_hidden(hidden[:, :-1], transformer.unembedding(config, params),
                                              config.final_softcap)
  logp_BTV = jax.nn.log_softmax(logits_BTV, axis=-1)
  logp_BT = jnp.take_along_axis(logp_BTV, batch.tokens[:, 1:, None], axis=-1)[..., 0]
  return -(logp_BT * m[:, 1:]).sum(-1) / jnp.maximum(m[:, 1:].sum(), 1.0)


def make_sft_step(config: ModelConfig, optimizer, *, dtype=jnp.float32, chunk: int = 0,
                  remat: str = "none", mesh=None, rules: shd.Rules = shd.TRAIN_RULES):
  """step(params, opt_state, batch) → (params, opt_state, loss), jitted with donation; with a
  `mesh`, activations pinned to the batch axes as in the RL step (`shd.activation_sharding`)."""
  def loss_and_rows(params, batch):
    loss_B = nll_rows(config, params, batch, dtype=dtype, chunk=chunk, remat=remat)
    return loss_B.sum(), loss_B

  grad_fn = jax.grad(loss_and_rows, has_aux=True)
  activations = shd.activations(mesh, rules)

  def step(params, opt_state, batch):
    with shd.activation_sharding(activations):
      grads, loss_B = grad_fn(params, batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss_B.sum()

  return jax.jit(step, donate_argnums=(0, 1))


def fit(config: ModelConfig, params, demos: Sequence[Trajectory], *, steps: int, lr: float,
        batch_rows: int, seed: int = 0, mesh=None, pad_id: int = 0, dtype=jnp.float32,
        remat: str = "none", chunk: int = 0, width_multiple: int = 256, log_every: int = 0
        ) -> tuple[object, list[float]]:
  """`steps` Adam steps (5% warmup, cosine to lr/10) over length-grouped minibatches of `batch_rows` demonstrations (similar
  lengths share a batch, so little is padding and few shapes compile; the batch order is
  reshuffled each epoch). Returns new params (the input params are donated) and the losses."""
  if not demos:
    raise ValueError("fit needs at least one demonstration.")
  schedule = optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 20, 1), max(steps, 2),
                                                end_value=lr * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule))
  step_fn = make_sft_step(config, optimizer, dtype=dtype, chunk=chunk, remat=remat, mesh=mesh)
  opt_state = jax.jit(optimizer.init)(params)
  rng = np.random.default_rng(seed)
  rows = min(batch_rows, len(demos))
  by_length = np.argsort([len(d.tokens) for d in demos], kind="stable")
  groups = [by_length[i:i + rows] for i in range(0, len(demos) - rows + 1, rows)]
  row_multiple = shd.batch_shards(mesh)
  order: list[int] = []
  losses = []
  for i in range(steps):
    if not order:
      order = list(rng.permutation(len(groups)))
    picked = [demos[j] for j in groups[order.pop()]]
    whole = -(-len(picked) // row_multiple) * row_multiple  # whole rows per device
    picked = [picked[k % len(picked)] for k in range(whole)]
    width = -(-max(len(d.tokens) for d in picked) // width_multiple) * width_multiple
    batch = train_step.place_batch(pack(picked, width, pad_id), mesh)
    params, opt_state, loss = step_fn(params, opt_state, batch)
    losses.append(float(loss))
    if log_every and (i % log_every == 0 or i == steps - 1):
      from absl import logging
      logging.info("warm-up step %d/%d: nll %.4f", i + 1, steps, losses[-1])
  return params, losses
