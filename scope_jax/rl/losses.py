"""RL losses as small pure functions (float32), chosen by name from config.

Per-token functions take [B, T] arrays; `aggregate` turns a per-token loss into (sum, count) so
micro-batches and hosts combine exactly: loss = Σ sums / Σ counts. Log-probs, entropy and top-K
distillation are computed from hidden states in chunks over T (`token_stats`), so [B, T, V]
logits never exist at once.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import sharding as shd

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
KL_KINDS = ("k1", "k2", "k3", "k3+")
LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0


# --------------------------------------------------------------------------- policy gradient

def policy_loss(logp, old_logp, advantages, *, eps_low: float = 0.2, eps_high: float = 0.2,
                dual_clip: float | None = None):
  """PPO/GRPO clipped surrogate per token.

  ρ = exp(clip(logp − logp_old, −20, 20));  L = −min(ρ·A, clip(ρ, 1 − ε_low, 1 + ε_high)·A);
  with dual clip c (for A < 0): L = min(L, −c·A).
  Returns (loss [B, T], clipped [B, T] float: 1 where the clipped branch was taken).
  """
  log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  unclipped = -ratio * advantages
  clipped = -jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * advantages
  loss = jnp.maximum(unclipped, clipped)
  was_clipped = (clipped > unclipped).astype(jnp.float32)
  if dual_clip is not None:
    bound = -dual_clip * advantages
    loss = jnp.where(advantages < 0, jnp.minimum(loss, bound), loss)
  return loss, was_clipped


def aggregate(per_token, mask, mode: str, norm_length: int | None = None):
  """Reduces a [B, T] per-token value to (sum, count); the loss is Σ sum / Σ count.

  token-mean:              Σ_bt L·m                     / Σ_bt m
  seq-mean-token-mean:     Σ_b [n_b>0] Σ_t L·m / n_b    / #{b: n_b > 0}
  seq-mean-token-sum:      Σ_b Σ_t L·m                  / #{b: n_b > 0}
  seq-mean-token-sum-norm: Σ_bt L·m                     / (#{b: n_b > 0} · norm_length)   (Dr.GRPO)

  Dr.GRPO divides by a constant length, not by the padded width: rows without loss tokens
  (padding) do not count, and `norm_length` is the run's fixed response budget (it defaults to
  the array's width only for direct calls on unpadded data).
  """
  sum_B, count = aggregate_rows(per_token, mask, mode, norm_length)
  return sum_B.sum(), count


def aggregate_rows(per_token, mask, mode: str, norm_length: int | None = None):
  """`aggregate` with its sum left per row: ([B] terms that add up to the sum, count).

  The train step keeps loss terms and metrics per row inside its micro-batch loop and sums them
  after it, so no cross-device reduction there runs beside the backward pass.
  """
  mask = mask.astype(jnp.float32)
  per_token = per_token.astype(jnp.float32)
  tokens_B = mask.sum(-1)
  sums_B = (per_token * mask).sum(-1)
  nonempty = (tokens_B > 0).astype(jnp.float32)
  if mode == "token-mean":
    return sums_B, tokens_B.sum()
  if mode == "seq-mean-token-mean":
    return sums_B / jnp.maximum(tokens_B, 1.0), nonempty.sum()
  if mode == "seq-mean-token-sum":
    return sums_B, nonempty.sum()
  if mode == "seq-mean-token-sum-norm":
    length = per_token.shape[-1] if norm_length is None else norm_length
    return sums_B, nonempty.sum() * jnp.float32(length)
  raise ValueError(f"Unknown aggregation mode {mode!r}; valid: {', '.join(AGG_MODES)}.")


# ----------------------------------------------------------------------------------------- KL

def kl_penalty(logp, ref_logp, kind: str):
  """Per-token KL estimate of π vs π_ref from sampled-token log-probs.

  k1 = logp − logp_ref;  k2 = ½(logp − logp_ref)²;
  k3 = exp(d) − d − 1 with d = clip(logp_ref − logp, ±20), clipped to [−10, 10] (low variance);
  k3+ = k3's value with k2's gradient (straight-through: unbiased gradient of the KL).
  """
  diff = logp - ref_logp
  if kind == "k1":
    return diff
  if kind == "k2":
    return 0.5 * jnp.square(diff)
  d = jnp.clip(-diff, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  k3 = jnp.clip(jnp.exp(d) - d - 1.0, -KL_CLAMP, KL_CLAMP)
  if kind == "k3":
    return k3
  if kind == "k3+":
    k2 = 0.5 * jnp.square(diff)
    return k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(k3)
  raise ValueError(f"Unknown KL estimator {kind!r}; valid: {', '.join(KL_KINDS)}.")


# --------------------------------------------------------------------- rollout correction
# Importance sampling between the sampler (KV-cache decode, often bfloat16) and the trainer,
# following verl's rollout correction (verl/trainer/ppo/mismatch_helper.py, `rollout_is_mode`
# truncate | mask, `rollout_is_level` token | sequence; the same rules in
# verl/trainer/ppo/rollout_corr_helper.py): w = exp(clip(log π_trainer − log π_sampler, ±20)),
# per token, or per sequence as exp of the masked sum of the token log-ratios on every token.

RC_MODES = ("off", "truncate", "mask")
RC_LEVELS = ("token", "sequence")


def rollout_log_weights(trainer_logp, sampler_logp, mask, level: str):
  """log w [B, T]: the token log-ratio log π_trainer − log π_sampler, or (level 'sequence') the
  row's masked sum of them on every token; clipped to ±20 (verl's SAFETY_BOUND), 0 off the mask
  (where either log-prob may be anything, even NaN)."""
  on = mask > 0
  log_ratio = jnp.where(on, trainer_logp - sampler_logp, 0.0).astype(jnp.float32)
  if level == "sequence":
    log_ratio = jnp.broadcast_to(log_ratio.sum(-1, keepdims=True), log_ratio.shape)
  elif level != "token":
    raise ValueError(f"Unknown rollout correction level {level!r}; valid: {', '.join(RC_LEVELS)}.")
  return jnp.where(on, jnp.clip(log_ratio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), 0.0)


def rollout_keep(log_w, mask, threshold: float):
  """Masked IS's rejection (verl's rule): a token (or, with sequence weights, its whole row) is
  kept when 1/C ≤ w ≤ C, both ends included; 1 kept, 0 rejected, 0 off the mask."""
  w = jnp.exp(log_w)
  return ((w >= 1.0 / threshold) & (w <= threshold) & (mask > 0)).astype(jnp.float32)


def rollout_is_weight(log_w, mode: str, threshold: float):
  """The weight on each token's policy loss: truncate (TIS) min(w, C); mask (MIS) w itself, kept
  tokens being within [1/C, C] (the rejection is in the loss mask, `rollout_keep`); off 1."""
  if mode == "truncate":
    return jnp.minimum(jnp.exp(log_w), threshold)
  if mode == "mask":
    return jnp.exp(log_w)
  if mode == "off":
    return jnp.ones_like(log_w)
  raise ValueError(f"Unknown rollout correction mode {mode!r}; valid: {', '.join(RC_MODES)}.")


def rollout_stats_rows(trainer_logp, sampler_logp, mask, weight, *, level: str,
                       threshold: float):
  """Per-row sums of the sampler–trainer mismatch metrics (verl's names), for sum/count means.

  k3: Σ_t k3 with r = π_trainer/π_sampler, k3 = r − log r − 1 (verl's k3_kl, an estimate of
  KL(π_sampler ‖ π_trainer)); ppl_ratio: verl's per-sequence exp(mean_t log π_sampler −
  mean_t log π_trainer) (= trainer PPL / sampler PPL), counted once per non-empty row;
  high / low: loss tokens (level token) or rows (level sequence) with w > C / w < 1/C;
  weight: Σ_t of `weight` [B, T], the weight applied to each token's policy loss (0 where it
  is rejected); tokens, rows: the counts (all over `mask`).
  """
  m = (mask > 0).astype(jnp.float32)
  log_w = rollout_log_weights(trainer_logp, sampler_logp, mask, level)
  w = jnp.exp(log_w)
  lr = jnp.where(m > 0, jnp.clip(trainer_logp - sampler_logp, -LOG_RATIO_CLAMP,
                                 LOG_RATIO_CLAMP), 0.0)
  tokens_B = m.sum(-1)
  row_B = (tokens_B > 0).astype(jnp.float32)
  high_BT, low_BT = (w > threshold) & (m > 0), (w < 1.0 / threshold) & (m > 0)
  if level == "sequence":  # one decision per row
    high_B, low_B = high_BT.any(-1) * row_B, low_BT.any(-1) * row_B
  else:
    high_B, low_B = high_BT.sum(-1), low_BT.sum(-1)
  return {"rc_k3": ((jnp.exp(lr) - lr - 1.0) * m).sum(-1),
          "rc_ppl_ratio": row_B * jnp.exp(-lr.sum(-1) / jnp.maximum(tokens_B, 1.0)),
          "rc_high": high_B.astype(jnp.float32), "rc_low": low_B.astype(jnp.float32),
          "rc_weight": (weight * m).sum(-1), "rc_tokens": tokens_B, "rc_rows": row_B}


# ------------------------------------------------------------------------- distillation

def _log_one_minus_exp(log_mass):
  """log(1 − exp(x)) for x ≤ 0, stable (the log of a tail mass)."""
  x = jnp.minimum(log_mass, -1e-7)
  return jnp.where(x > -0.693, jnp.log(-jnp.expm1(x)), jnp.log1p(-jnp.exp(x)))


DISTILL_SUPPORTS = ("student", "teacher", "union")


def topk_reverse_kl(student_logp_NV, teacher_logp_NV, k: int, *, tail: bool = True,
                    support: str = "student", renormalize: bool = True, kl_clip: float = 0.0):
  """Top-K reverse KL(π_S ‖ π_T) per row over a support S of token ids.

  S: the K most likely ids under the student ('student', the default), the teacher
  ('teacher'), or the union of both sets ('union', up to 2K ids, a duplicate counted once).
  tail=True: Σ_{i∈S} p_S,i (log p_S,i − log p_T,i) + m_S (log m_S − log m_T),
             m_X = 1 − Σ_{i∈S} p_X,i (the rest of the vocabulary as one extra bin).
  tail=False, renormalize=True: both distributions renormalised over S (Tunix/MaxText).
  tail=False, renormalize=False: the plain partial sum Σ_{i∈S} p_S,i (log p_S,i − log p_T,i).
  (With the tail, `renormalize` changes nothing: the K + 1 bins already sum to 1.)
  kl_clip > 0: each row's value is capped at kl_clip, with no gradient beyond it.
  K = V gives the exact full reverse KL for every support. The teacher should arrive under
  stop_gradient; the support is chosen without gradient.
  """
  if support not in DISTILL_SUPPORTS:
    raise ValueError(f"Unknown distillation support {support!r}; valid: "
                     f"{', '.join(DISTILL_SUPPORTS)}.")
  v = student_logp_NV.shape[-1]
  k = min(k, v)
  if support == "union" and k < v:
    kl = _union_reverse_kl(student_logp_NV, teacher_logp_NV, k, tail, renormalize)
  else:  # K = V: every support is the whole vocabulary (the student's order, as released)
    chooser = teacher_logp_NV if support == "teacher" and k < v else student_logp_NV
    _, idx = jax.lax.top_k(jax.lax.stop_gradient(chooser), k)
    s_top = jnp.take_along_axis(student_logp_NV, idx, axis=-1)
    t_top = jnp.take_along_axis(teacher_logp_NV, idx, axis=-1)
    if not tail and renormalize:
      s_norm = jax.nn.log_softmax(s_top, axis=-1)
      t_norm = jax.nn.log_softmax(t_top, axis=-1)
      kl = jnp.sum(jnp.exp(s_norm) * (s_norm - t_norm), axis=-1)
    else:
      kl = jnp.sum(jnp.exp(s_top) * (s_top - t_top), axis=-1)
      if tail and k < v:
        log_ms = _log_one_minus_exp(jax.nn.logsumexp(s_top, axis=-1))
        log_mt = _log_one_minus_exp(jax.nn.logsumexp(t_top, axis=-1))
        kl = kl + jnp.exp(log_ms) * (log_ms - log_mt)
  if kl_clip > 0:  # the cap is a constant: no gradient where it binds
    kl = jnp.where(kl > kl_clip, jnp.float32(kl_clip), kl)
  return kl


def _union_reverse_kl(student_logp_NV, teacher_logp_NV, k: int, tail: bool, renormalize: bool):
  """`topk_reverse_kl` over the union of both top-K sets: a [N, V] support mask built by
  scattering both index sets (a shared id is set twice, counted once), then masked sums."""
  n = student_logp_NV.shape[0]
  _, idx_s = jax.lax.top_k(jax.lax.stop_gradient(student_logp_NV), k)
  _, idx_t = jax.lax.top_k(jax.lax.stop_gradient(teacher_logp_NV), k)
  rows = jnp.arange(n)[:, None]
  in_NV = jnp.zeros(student_logp_NV.shape, bool).at[rows, idx_s].set(True).at[rows, idx_t].set(True)
  neg = jnp.float32(-jnp.inf)
  s_in = jnp.where(in_NV, student_logp_NV, neg)
  t_in = jnp.where(in_NV, teacher_logp_NV, neg)
  if not tail and renormalize:
    s_norm = s_in - jax.nn.logsumexp(s_in, axis=-1, keepdims=True)
    t_norm = t_in - jax.nn.logsumexp(t_in, axis=-1, keepdims=True)
    return jnp.sum(jnp.where(in_NV, jnp.exp(s_norm) * (s_norm - t_norm), 0.0), axis=-1)
  kl = jnp.sum(jnp.where(in_NV, jnp.exp(student_logp_NV) * (student_logp_NV - teacher_logp_NV),
                         0.0), axis=-1)
  if tail:
    log_ms = _log_one_minus_exp(jax.nn.logsumexp(s_in, axis=-1))
    log_mt = _log_one_minus_exp(jax.nn.logsumexp(t_in, axis=-1))
    kl = kl + jnp.exp(log_ms) * (log_ms - log_mt)
  return kl


def full_reverse_kl(student_logp_NV, teacher_logp_NV):
  """Σ_v p_S,v (log p_S,v − log p_T,v) per row (the naive reference)."""
  return jnp.sum(jnp.exp(student_logp_NV) * (student_logp_NV - teacher_logp_NV), axis=-1)


def entropy(logp_NV):
  """−Σ_v p_v log p_v per row."""
  return -jnp.sum(jnp.exp(logp_NV) * logp_NV, axis=-1)


# ---------------------------------------------------------------- chunked per-token statistics

def _softcap(logits, cap: float):
  """The model's final logit soft-cap (Gemma-2), before the temperature; identity when 0."""
  return logits if not cap else cap * jnp.tanh(logits / cap)


def token_stats(hidden_BTD, unembed_VD, targets_BT, *, temperature: float = 1.0,
                chunk: int = 256, teacher_hidden_BTD=None, teacher_unembed_VD=None,
                distill_topk: int = 0, distill_tail: bool = True, with_entropy: bool = True,
                softcap: float = 0.0, distill_support: str = "student",
                distill_renormalize: bool = True, distill_kl_clip: float = 0.0):
  """Per-token log-prob of `targets`, entropy and (optionally) top-K reverse KL to a teacher.

  Logits are formed one chunk of T at a time inside a rematerialised scan, so neither the forward
  nor the backward pass holds [B, T, V]. Log-probs use logits / temperature (the sampler's
  convention); the distillation options are `topk_reverse_kl`'s. Returns a dict of [B, T]
  float32 arrays: 'logp', 'entropy', 'distill', and
  with a teacher 'teacher_logp' (the teacher's log-prob of the same target token, for the
  teacher–student gap on sampled tokens).
  """
  b, t, _ = hidden_BTD.shape
  chunk = min(chunk, t)
  pad = -t % chunk
  n = (t + pad) // chunk

  def split(x):  # [B, T, ...] → [n, B, chunk, ...]
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.moveaxis(x.reshape((b, n, chunk) + x.shape[2:]), 1, 0)

  with_teacher = teacher_hidden_BTD is not None
  # The unembedding cast to the compute dtype and gathered once, before the chunk loop, to the
  # layout a chunk's logits want (vocab over tensor, embed whole): closed over as is, its fsdp
  # shards would be gathered again in every chunk, forward and backward. `_chunk_map` sums its
  # gradient over the chunks in float32 and rounds once.
  # A vocabulary its axes cannot divide (OLMo-3's 100,278 over tensor 4) would leave every chip
  # of those axes forming every logit of its rows: the chunk's positions take the axes instead,
  # against a whole unembedding.
  vocab_splits = shd.splits("activation_vocab", unembed_VD.shape[0])
  vocab_VD = ("activation_vocab" if vocab_splits else None, "activation_embed")
  by_position = lambda x: x if vocab_splits else shd.constrain(
      x, ("activation_batch", "activation_vocab", "activation_embed"))
  w_VD = shd.constrain(unembed_VD.astype(hidden_BTD.dtype), vocab_VD)
  tw_VD = None
  if with_teacher:
    tw_VD = shd.constrain(jax.lax.stop_gradient(teacher_unembed_VD).astype(
        teacher_hidden_BTD.dtype), vocab_VD)

  def one_chunk(w_VD, tw_VD, h_BCD, rest):
    y_BC, th_BCD = rest
    h_BCD, th_BCD = by_position(h_BCD), (by_position(th_BCD) if with_teacher else th_BCD)
    logits = _softcap(jnp.einsum("BCD,VD->BCV", h_BCD, w_VD.astype(h_BCD.dtype),
                                 preferred_element_type=jnp.float32), softcap) / temperature
    logp_BCV = jax.nn.log_softmax(logits, axis=-1)
    out = {"logp": jnp.take_along_axis(logp_BCV, y_BC[..., None], axis=-1)[..., 0]}
    out["entropy"] = entropy(logp_BCV) if with_entropy else jnp.zeros_like(out["logp"])
    if with_teacher:
      t_logits = _softcap(jnp.einsum("BCD,VD->BCV", th_BCD, tw_VD.astype(th_BCD.dtype),
                                     preferred_element_type=jnp.float32), softcap) / temperature
      t_logp = jax.lax.stop_gradient(jax.nn.log_softmax(t_logits, axis=-1))
      v = logp_BCV.shape[-1]
      out["distill"] = topk_reverse_kl(logp_BCV.reshape(-1, v), t_logp.reshape(-1, v),
                                       distill_topk or v, tail=distill_tail,
                                       support=distill_support, renormalize=distill_renormalize,
                                       kl_clip=distill_kl_clip).reshape(y_BC.shape)
      out["teacher_logp"] = jnp.take_along_axis(t_logp, y_BC[..., None], axis=-1)[..., 0]
    else:
      out["distill"] = jnp.zeros_like(out["logp"])
    return out

  th = split(teacher_hidden_BTD) if with_teacher else jnp.zeros((n, b, chunk, 1), hidden_BTD.dtype)
  outs = _chunk_map(one_chunk, w_VD, tw_VD, split(hidden_BTD), (split(targets_BT), th))
  return {k: jnp.moveaxis(v, 0, 1).reshape(b, n * chunk)[:, :t] for k, v in outs.items()}



@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _chunk_map(f, w, consts, h_n, rest_n):
  """`lax.map` of f(w, consts, h, rest) over the leading (chunk) axis of `h_n` and `rest_n`.

  Its backward pass recomputes each chunk (as `jax.checkpoint` would: no [B, T, V] is kept)
  and sums w's cotangent over the chunks in a float32 carry, rounded to w's dtype once: `w` is
  the unembedding gathered once in the compute dtype, whose per-chunk gradients would otherwise
  add up in that dtype. Across devices the sum is one all-reduce after the loop (XLA hoists it
  out; pinning the sum to the weight's shards here would move a reduction into every chunk).
  `consts` and `rest_n` (targets, teacher inputs) get no gradient.
  """
  return jax.lax.map(lambda xs: f(w, consts, *xs), (h_n, rest_n))


def _chunk_map_fwd(f, w, consts, h_n, rest_n):
  return _chunk_map(f, w, consts, h_n, rest_n), (w, consts, h_n, rest_n)


def _zero_cotangent(x):
  if x is None:
    return None
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros(x.shape, x.dtype)
  return np.zeros(x.shape, jax.dtypes.float0)


def _chunk_map_bwd(f, res, ct_n):
  w, consts, h_n, rest_n = res

  def body(dw_acc, xs):
    h, rest, ct = xs
    _, vjp = jax.vjp(lambda w_, h_: f(w_, consts, h_, rest), w, h)
    dw, dh = vjp(ct)
    return dw_acc + dw.astype(jnp.float32), dh

  dw, dh_n = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32), (h_n, rest_n, ct_n))
  return (dw.astype(w.dtype), jax.tree.map(_zero_cotangent, consts), dh_n,
          jax.tree.map(_zero_cotangent, rest_n))


_chunk_map.defvjp(_chunk_map_fwd, _chunk_map_bwd)
