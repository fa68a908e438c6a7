"""One jitted, sharded train step: policy loss + β·KL + λ·distillation, accumulated over
micro-batches, AdamW, and a non-finite guard.

The loss normalisers (token or sequence counts) are computed once from the whole batch's masks, so
each micro-batch contributes sum/count and the gradients simply add: 1 or M micro-batches give the
same update. The reference forward runs only when β > 0, the teacher forward only when λ > 0,
both under stop_gradient. Rollout correction weights each token's policy loss by the
trainer/sampler probability ratio (truncated); its mask mode first drops the tokens whose ratio
is out of range from the whole batch's loss mask (one extra forward), before those counts.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from scope_jax import sharding as shd
from scope_jax.models import lora as lora_lib
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.rl import losses
from scope_jax.rl.batch import TrainBatch


@dataclasses.dataclass(frozen=True)
class LossConfig:
  agg_mode: str = "token-mean"  # see losses.AGG_MODES
  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None  # c for the dual clip on A < 0 (e.g. 3.0)
  kl_beta: float = 0.0  # β; 0 skips the reference forward entirely
  kl_kind: str = "k3"  # k1 | k2 | k3 | k3+
  distill_coef: float = 0.0  # λ; 0 skips the teacher forward entirely
  distill_topk: int = 100  # K (≥ V means the exact full reverse KL)
  distill_tail: bool = True  # the rest of the vocabulary as one extra bin
  distill_support: str = "student"  # top-K ids of: student | teacher | union (of both sets)
  distill_renormalize: bool = True  # tail off: renormalise both over the support (else plain sum)
  distill_kl_clip: float = 0.0  # cap on each token's KL, no gradient beyond it (0 = off)
  distill_agg_mode: str = "seq-mean-token-mean"  # (1/|y|) Σ_t KL_t, averaged over sequences
  temperature: float = 1.0  # logits / T, as in the sampler
  chunk: int = 256  # sequence chunk for log-probs / distillation
  norm_length: int | None = None  # Dr.GRPO's constant length (None: the batch's width, tests only)
  router_aux_coef: float = 0.0  # HF's MoE load-balancing loss coefficient (0: off; HF uses 1e-3)
  entropy_coef: float = 0.0  # verl's entropy bonus: loss −= coef · entropy (agg_mode), e.g. 1e-3
  old_logp_from_trainer: bool = False  # π_old = this step's own log-probs (ratio 1), not the sampler's
  # Rollout correction (losses.RC_*): w = π_trainer/π_sampler per token or per sequence; truncate
  # weights the policy loss by min(w, C), mask drops tokens (rows) with w outside [1/C, C].
  rollout_corr_mode: str = "off"  # off | truncate | mask
  rollout_corr_level: str = "token"  # token | sequence
  rollout_corr_threshold: float = 2.0  # C > 1

  def __post_init__(self):
    for mode in (self.agg_mode, self.distill_agg_mode):
      if mode not in losses.AGG_MODES:
        raise ValueError(f"Unknown aggregation mode {mode!r}; valid: {', '.join(losses.AGG_MODES)}.")
    if self.kl_kind not in losses.KL_KINDS:
      raise ValueError(f"Unknown KL estimator {self.kl_kind!r}; valid: {', '.join(losses.KL_KINDS)}.")
    if self.distill_support not in losses.DISTILL_SUPPORTS:
      raise ValueError(f"Unknown distill_support {self.distill_support!r}; valid: "
                       f"{', '.join(losses.DISTILL_SUPPORTS)}.")
    if not self.distill_kl_clip >= 0:
      raise ValueError(f"distill_kl_clip={self.distill_kl_clip} must be at least 0 (0 = no cap).")
    if self.rollout_corr_mode not in losses.RC_MODES:
      raise ValueError(f"Unknown rollout correction mode {self.rollout_corr_mode!r}; valid: "
                       f"{', '.join(losses.RC_MODES)}.")
    if self.rollout_corr_level not in losses.RC_LEVELS:
      raise ValueError(f"Unknown rollout correction level {self.rollout_corr_level!r}; valid: "
                       f"{', '.join(losses.RC_LEVELS)}.")
    if not 1.0 < self.rollout_corr_threshold < float("inf"):
      raise ValueError(f"rollout correction threshold={self.rollout_corr_threshold} must be above 1 "
                       "(weights are kept within [1/C, C]; e.g. 2.0).")


@flax.struct.dataclass
class TrainState:
  params: transformer.Params
  opt_state: optax.OptState
  step: jax.Array  # updates applied (a skipped update does not advance it)
  skipped: jax.Array  # updates not applied because the loss or gradient was not finite


def opt_state_shardings(optimizer, params) -> Any:
  """Shardings of `optimizer.init(params)`: every params-shaped subtree (Adam's moments) laid
  out like the params, the rest (counts) replicated. Left to the compiler, a freshly zeroed
  moment is replicated: on an FSDP mesh every chip would hold both moments whole."""
  mesh = next(x.sharding.mesh for x in jax.tree.leaves(params)
              if isinstance(x.sharding, jax.sharding.NamedSharding))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  treedef = jax.tree.structure(params)
  like = jax.tree.map(lambda x: x.sharding, params)
  is_params = lambda node: jax.tree.structure(node) == treedef
  return jax.tree.map(lambda node: like if is_params(node) else replicated,
                      jax.eval_shape(optimizer.init, params), is_leaf=is_params)


def init_train_state(params, optimizer) -> TrainState:
  """Optimizer state for `params`, its moments sharded like the params; scalars (counts, step)
  replicated on the params' mesh, so a state restored from a checkpoint lives on the same
  devices as a fresh one."""
  meshes = [x.sharding.mesh for x in jax.tree.leaves(params)
            if isinstance(x.sharding, jax.sharding.NamedSharding)]
  if not meshes or meshes[0].size == 1:
    return TrainState(params=params, opt_state=jax.jit(optimizer.init)(params),
                      step=jnp.zeros((), jnp.int32), skipped=jnp.zeros((), jnp.int32))
  replicated = jax.sharding.NamedSharding(meshes[0], jax.sharding.PartitionSpec())
  opt_state = jax.jit(optimizer.init, out_shardings=opt_state_shardings(optimizer, params))(params)
  zero = lambda: shd.global_array(np.zeros((), np.int32), replicated)
  return TrainState(params=params, opt_state=opt_state, step=zero(), skipped=zero())


def sequence_stats(config: ModelConfig, params, tokens, mask, *, lc: LossConfig, dtype,
                   remat: str = "none", teacher=None, from_col: int = 1):
  """Per-token log-probs / entropy / distillation, aligned so column t describes token t.

  Only tokens at columns ≥ `from_col` get statistics (the others are 0): the unembedding, a
  large share of a small model's FLOPs, runs over the response columns alone when the caller
  knows where every response starts. Token 0 is never predicted.
  """
  start = max(from_col, 1)
  router = None
  if config.num_experts:
    hidden, _, router = transformer.forward(config, params, tokens, attention_mask=mask,
                                            return_hidden=True, dtype=dtype, remat=remat,
                                            return_router=True)
  else:
    hidden, _ = transformer.forward(config, params, tokens, attention_mask=mask,
                                    return_hidden=True, dtype=dtype, remat=remat)
  kwargs = {}
  if teacher is not None:
    t_params, t_tokens, t_mask = teacher
    t_hidden, _ = transformer.forward(config, t_params, t_tokens, attention_mask=t_mask,
                                      return_hidden=True, dtype=dtype)
    kwargs = dict(teacher_hidden_BTD=jax.lax.stop_gradient(t_hidden[:, start - 1:-1]),
                  teacher_unembed_VD=jax.lax.stop_gradient(transformer.unembedding(config, t_params)),
                  distill_topk=lc.distill_topk, distill_tail=lc.distill_tail,
                  distill_support=lc.distill_support, distill_renormalize=lc.distill_renormalize,
                  distill_kl_clip=lc.distill_kl_clip)
  # Hidden t − 1 predicts token t: statistics about tokens start … T − 1, then left-padded.
  stats = losses.token_stats(hidden[:, start - 1:-1], transformer.unembedding(config, params),
                             tokens[:, start:], temperature=lc.temperature, chunk=lc.chunk,
                             softcap=config.final_softcap, **kwargs)
  out = {k: jnp.pad(v, ((0, 0), (start, 0))) for k, v in stats.items()}
  if router is not None:
    out["router"] = router  # per-layer expert loads and router mass (not per token)
  return out


def compute_logprobs(config: ModelConfig, params, batch: TrainBatch, *, temperature: float = 1.0,
                     chunk: int = 256, dtype=jnp.float32):
  """Per-token log-probs of a batch under `params` (e.g. a frozen reference), [B, T]."""
  lc = LossConfig(temperature=temperature, chunk=chunk)
  return sequence_stats(config, params, batch.tokens, batch.mask, lc=lc, dtype=dtype,
                        from_col=batch.prompt_cols)["logp"]


def _micro_loss(params, mb: TrainBatch, ref_params, teacher_params, counts, *, config, lc, dtype,
                remat):
  """A micro-batch's loss (a scalar, for the gradient) and, per row, its loss terms and metric sums.

  The aux values stay per row ([b], reduced over T only): the step adds them up after its
  micro-batch loop. A cross-device sum or max of a metric inside the loop depends on the forward
  pass only, so XLA:CPU may run it beside the backward pass's own collectives; with every device
  emulated on one host's thread pool, two collectives in flight per device can starve it.
  """
  teacher = None
  if lc.distill_coef > 0:
    teacher = (teacher_params, mb.teacher_tokens, mb.teacher_mask)
  stats = sequence_stats(config, params, mb.tokens, mb.mask, lc=lc, dtype=dtype, remat=remat,
                         teacher=teacher, from_col=mb.prompt_cols)
  logp, m = stats["logp"], mb.loss_mask
  # π_old from the trainer (verl, TRL): this forward's own log-probs, as the update is one
  # optimizer step on unchanged params; the ratio is exactly 1 and only its gradient remains.
  old_logp = jax.lax.stop_gradient(logp) if lc.old_logp_from_trainer else mb.old_logp
  pg, clipped = losses.policy_loss(logp, old_logp, mb.advantages, eps_low=lc.eps_low,
                                   eps_high=lc.eps_high, dual_clip=lc.dual_clip)
  rc_weight = _rollout_weight(jax.lax.stop_gradient(logp), mb.old_logp, m, lc)
  pg = pg * rc_weight
  rows = lambda per_token, mode: losses.aggregate_rows(per_token, m, mode, lc.norm_length)[0]
  parts_B = {"pg_loss": rows(pg, lc.agg_mode) / counts["agg"]}
  if lc.kl_beta > 0:
    if mb.ref_logp is not None:
      ref_logp = mb.ref_logp
    else:
      ref_logp = sequence_stats(config, ref_params, mb.tokens, mb.mask, lc=lc, dtype=dtype,
                                from_col=mb.prompt_cols)["logp"]
    kl = losses.kl_penalty(logp, jax.lax.stop_gradient(ref_logp), lc.kl_kind)
    parts_B["kl_loss"] = rows(kl, lc.agg_mode) / counts["agg"]
  sums_B = {}
  if lc.distill_coef > 0:
    parts_B["distill_loss"] = rows(stats["distill"], lc.distill_agg_mode) / counts["distill"]
    sums_B["teacher_gap"] = ((stats["teacher_logp"] - logp) * m).sum(-1)  # on sampled tokens
  gap_BT = jnp.abs(logp - mb.old_logp)  # trainer vs sampler, whichever π_old the ratio uses
  sums_B |= {"entropy": (stats["entropy"] * m).sum(-1), "clip_frac": (clipped * m).sum(-1),
             "logp": (logp * m).sum(-1), "logprob_gap": (gap_BT * m).sum(-1)}
  if lc.rollout_corr_mode != "mask":  # mask mode: measured before its rejection (`_reject`)
    sums_B |= losses.rollout_stats_rows(jax.lax.stop_gradient(logp), mb.old_logp, m, rc_weight,
                                        level=lc.rollout_corr_level,
                                        threshold=lc.rollout_corr_threshold)
  if lc.entropy_coef > 0:  # verl: pg_loss − entropy_coeff · agg(entropy), the same aggregation
    parts_B["entropy_loss"] = rows(stats["entropy"], lc.agg_mode) / counts["agg"]
  total_B = (parts_B["pg_loss"] + lc.kl_beta * parts_B.get("kl_loss", 0.0)
             + lc.distill_coef * parts_B.get("distill_loss", 0.0)
             - lc.entropy_coef * parts_B.get("entropy_loss", 0.0))
  router = {}
  if "router" in stats:  # a mixture of experts: loads for the metrics, optional balancing loss
    router = {"router_aux": transformer.router_aux_loss(config, stats["router"]) / counts["micro"],
              "router_load": stats["router"]["load"].sum(0),
              "router_computed": stats["router"]["computed"].sum(),
              "router_pairs": stats["router"]["tokens"].sum() * config.num_experts_per_tok}
  total = total_B.sum() + lc.router_aux_coef * router.get("router_aux", 0.0)
  gap_max_B = jnp.max(jnp.where(m > 0, gap_BT, 0.0), axis=-1)
  return total, (total_B, parts_B, sums_B, gap_max_B, router)


def _rollout_weight(trainer_logp, sampler_logp, mask, lc: LossConfig):
  """The rollout-correction weight on each token's policy loss (no gradient). Applied only with
  π_old from the trainer (verl's decoupled mode): with the sampler's π_old the PPO ratio is
  already taken against the sampler (verl's bypass mode) and only mask mode's rejection acts."""
  if lc.rollout_corr_mode == "off" or not lc.old_logp_from_trainer:
    return jnp.ones_like(trainer_logp)
  log_w = losses.rollout_log_weights(trainer_logp, sampler_logp, mask, lc.rollout_corr_level)
  return losses.rollout_is_weight(log_w, lc.rollout_corr_mode, lc.rollout_corr_threshold)


def _reject(config: ModelConfig, lc: LossConfig, params, batch: TrainBatch, micro: int, *,
            dtype):
  """Mask mode's rejection, before the micro-batch loop: one forward of the whole batch (no
  gradient, one micro-batch at a time) gives the trainer's log-probs; tokens (rows) whose weight
  is outside [1/C, C] leave the loss mask, so they leave every loss term and the normalisers
  computed from it, exactly as one micro-batch would see them. Returns (the batch with that mask,
  the mismatch metrics' sums over the original loss tokens)."""
  def logp(mb):
    f = lambda: sequence_stats(config, params, mb.tokens, mb.mask, lc=lc, dtype=dtype,
                               from_col=mb.prompt_cols)["logp"]
    return jax.lax.cond(mb.mask.any(), f, lambda: jnp.zeros(mb.tokens.shape, jnp.float32))
  logp_MbT = jax.lax.map(logp, _split(batch, micro))
  trainer = jax.lax.stop_gradient(jnp.swapaxes(logp_MbT, 0, 1).reshape(batch.tokens.shape))
  m = batch.loss_mask
  log_w = losses.rollout_log_weights(trainer, batch.old_logp, m, lc.rollout_corr_level)
  keep = losses.rollout_keep(log_w, m, lc.rollout_corr_threshold)
  weight = _rollout_weight(trainer, batch.old_logp, m, lc) * keep
  sums = losses.rollout_stats_rows(trainer, batch.old_logp, m, weight,
                                   level=lc.rollout_corr_level, threshold=lc.rollout_corr_threshold)
  return batch.replace(loss_mask=m * keep), {k: v.sum() for k, v in sums.items()}


def _rollout_metrics(sums, lc: LossConfig) -> dict:
  """Sampler–trainer mismatch metrics (verl's rollout_corr/…), reported in every mode: k3 KL
  and weight mean over loss tokens, perplexity ratio over rows, and the shares of tokens (rows,
  at sequence level) with w > C (what truncate caps) and w outside [1/C, C] (what mask drops)."""
  tokens, rows = jnp.maximum(sums["rc_tokens"], 1.0), jnp.maximum(sums["rc_rows"], 1.0)
  units = rows if lc.rollout_corr_level == "sequence" else tokens
  return {"rollout_corr/k3_kl": sums["rc_k3"] / tokens,
          "rollout_corr/ppl_ratio": sums["rc_ppl_ratio"] / rows,
          "rollout_corr/truncated_frac": sums["rc_high"] / units,
          "rollout_corr/masked_frac": (sums["rc_high"] + sums["rc_low"]) / units,
          "rollout_corr/weight_mean": sums["rc_weight"] / tokens}


def _split(batch: TrainBatch, micro: int) -> TrainBatch:
  """[B, ...] → [M, B/M, ...] taking every M-th row, so each device keeps its local rows."""
  def f(x):
    if x is None:
      return None
    b = x.shape[0]
    return jnp.swapaxes(x.reshape((b // micro, micro) + x.shape[1:]), 0, 1)
  return jax.tree.map(f, batch)


def make_train_step(config: ModelConfig, lc: LossConfig, optimizer, *, dtype=jnp.float32,
                    remat: str = "none", micro_batches: int = 1, mesh=None,
                    rules: shd.Rules = shd.TRAIN_RULES):
  """Returns step(state, batch, ref_params=None, teacher_params=None, base_params=None) →
  (state, metrics), jitted.

  With `base_params` (LoRA), `state.params` are a policy's adapters and the model is the frozen
  base plus them (`lora.view`): gradients, optimizer state and the update are the adapters'
  alone, and the base, shared by every policy, is an argument that is never donated.

  With a `mesh`, the step's activations are pinned under `rules` (`shd.activation_sharding`,
  entered inside the traced step, so the compiled program and jit's cache agree): rows on the
  batch axes, weights gathered per layer and gradients reduce-scattered (FSDP).
  """
  micro_loss = functools.partial(_micro_loss, config=config, lc=lc, dtype=dtype, remat=remat)
  activations = shd.activations(mesh, rules)

  def step(state: TrainState, batch: TrainBatch, ref_params=None, teacher_params=None,
           base_params=None):
    with shd.activation_sharding(activations):
      return _step(state, batch, ref_params, teacher_params, base_params)

  def _step(state: TrainState, batch: TrainBatch, ref_params, teacher_params, base_params):
    def loss(trained, *args):  # the model: the trained params, or the base plus the adapters
      return micro_loss(trained if base_params is None else lora_lib.view(base_params, trained),
                        *args)
    grad_fn = jax.value_and_grad(loss, has_aux=True)
    if batch.num_rows % micro_batches:
      raise ValueError(f"Batch of {batch.num_rows} rows does not split into {micro_batches} "
                       "micro-batches; pad rows with make_batch(row_multiple=...).")
    rc_sums = {}
    if lc.rollout_corr_mode == "mask":  # the rejected tokens leave the mask the counts come from
      model = state.params if base_params is None else lora_lib.view(base_params, state.params)
      batch, rc_sums = _reject(config, lc, model, batch, micro_batches, dtype=dtype)
    m = batch.loss_mask
    counts = {"agg": losses.aggregate(m, m, lc.agg_mode, lc.norm_length)[1],
              "distill": losses.aggregate(m, m, lc.distill_agg_mode, lc.norm_length)[1]}
    counts = jax.tree.map(lambda c: jnp.maximum(c, 1.0), counts)
    counts["micro"] = jnp.float32(micro_batches)
    mbs = _split(batch, micro_batches)
    first = jax.tree.map(lambda x: x[0], mbs)
    _, aux_shapes = jax.eval_shape(loss, state.params, first, ref_params, teacher_params, counts)
    no_aux = jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), aux_shapes)

    def compute(carry, mb):
      grads, router = carry
      (_, (total_B, parts_B, sums_B, gap_max_B, r)), gr = grad_fn(
          state.params, mb, ref_params, teacher_params, counts)
      grads = jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, gr)
      return (grads, jax.tree.map(jnp.add, router, r)), (total_B, parts_B, sums_B, gap_max_B)

    def accumulate(carry, mb):
      # A micro-batch of padding rows only (the learner puts the padding last) adds nothing:
      # it is skipped, not computed, so a batch padded to a micro-batch bucket costs its rows.
      return jax.lax.cond(mb.mask.any(), compute, lambda c, _: (c, no_aux[:4]), carry, mb)

    if micro_batches == 1:  # no float32 accumulator: one copy of the gradients fewer
      (_, (*aux, router)), grads = grad_fn(state.params, first, ref_params, teacher_params, counts)
      grads = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
      total_MB, parts_MB, sums_MB, gap_max_MB = jax.tree.map(lambda x: x[None], tuple(aux))
    else:
      init = (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params), no_aux[4])
      (grads, router), (total_MB, parts_MB, sums_MB, gap_max_MB) = jax.lax.scan(accumulate, init,
                                                                                mbs)
    parts = {k: v.sum() for k, v in parts_MB.items()}
    sums = {k: v.sum() for k, v in sums_MB.items()} | rc_sums
    total = total_MB.sum() + lc.router_aux_coef * router.get("router_aux", 0.0)
    gap_max = gap_max_MB.max()
    if "router_aux" in router:
      parts["router_aux"] = router["router_aux"]
    sums |= {k: v for k, v in router.items() if k != "router_aux"}
    grad_norm = optax.global_norm(grads)
    finite = jnp.isfinite(total) & jnp.isfinite(grad_norm)

    def apply(params, opt_state):
      updates, new_opt = optimizer.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), new_opt

    # A non-finite update is not applied: a branch, not a select between the new and the old
    # state (which holds both at once: a copy of the params and moments more at the peak).
    new_params, new_opt = jax.lax.cond(finite, apply, lambda p, o: (p, o), state.params,
                                       state.opt_state)
    new_state = TrainState(params=new_params, opt_state=new_opt,
                           step=state.step + finite.astype(jnp.int32),
                           skipped=state.skipped + (~finite).astype(jnp.int32))
    tokens = jnp.maximum(m.sum(), 1.0)
    metrics = {"loss": total, **parts, "grad_norm": grad_norm, "num_tokens": m.sum(),
               "entropy": sums["entropy"] / tokens, "clip_frac": sums["clip_frac"] / tokens,
               "logprob_gap_mean": sums["logprob_gap"] / tokens, "logprob_gap_max": gap_max,
               "logp_mean": sums["logp"] / tokens,
               "skipped": new_state.skipped, "finite": finite}
    metrics |= _rollout_metrics(sums, lc)
    if "kl_loss" in parts:
      metrics["kl"] = parts["kl_loss"]
    if "teacher_gap" in sums:  # mean log π_T(y_t) − log π_S(y_t) over the student's own tokens
      metrics["teacher_logprob_gap"] = sums["teacher_gap"] / tokens
    if "router_load" in sums:  # each expert's share of the routed pairs; those past a capacity
      load_E = sums["router_load"]
      share_E = load_E / jnp.maximum(load_E.sum(), 1.0)
      metrics.update({f"router/load_expert_{e}": share_E[e] for e in range(config.num_experts)})
      metrics["router/max_load"] = share_E.max()
      metrics["router/dropped"] = 1.0 - sums["router_computed"] / jnp.maximum(
          sums["router_pairs"], 1.0)
    return new_state, metrics

  return jax.jit(step, donate_argnames=("state",))


def place_batch(batch: TrainBatch, mesh, rules: shd.Rules = shd.TRAIN_RULES) -> TrainBatch:
  """Puts a host TrainBatch on the mesh with rows split over the `batch` rule's axes."""
  if mesh is None:
    return jax.tree.map(jnp.asarray, batch)
  return shd.shard_batch(batch, mesh, rules)
