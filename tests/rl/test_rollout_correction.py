"""Rollout correction: importance weights between the sampler and the trainer (verl's TIS / MIS),
by hand, in the train step (weights in the gradient, rejected tokens out of every normaliser,
1 vs M micro-batches), against a real bfloat16 sampler, and wired from config."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scope_jax import sharding as shd
from scope_jax.core import runtime
from scope_jax.models import init_params, tiny_config, transformer
from scope_jax.rl import losses
from scope_jax.rl.batch import make_batch
from scope_jax.rl.train_step import (LossConfig, compute_logprobs, init_train_state,
                                     make_train_step, place_batch)
from scope_jax.rollout.types import Span, Trajectory
from scope_jax.sampling import Sampler

CFG = tiny_config("qwen2", num_heads=8, num_kv_heads=4, head_dim=8)
LN = math.log


def _close(a, b, **kw):
  chex.assert_trees_all_close(np.asarray(a, np.float32), np.asarray(b, np.float32), **kw)


# ------------------------------------------------------------------------------- by hand

def test_token_weights_truncation_and_rejection_by_hand():
  """w = π_trainer/π_sampler per token; truncate: min(w, 2); mask keeps 1/2 ≤ w ≤ 2 (verl's
  closed interval); off the loss mask everything is 0, even where a log-prob is NaN."""
  sampler = np.array([[-1.0, -2.0, -3.0, -0.5, 0.0, -1.0]], np.float32)
  ratio = np.array([[3.0, 0.25, 1.5, 1.0, 1.0, 0.5]])
  trainer = (sampler + np.log(ratio)).astype(np.float32)
  trainer[0, 4] = np.nan  # off the mask: ignored
  mask = np.array([[1, 1, 1, 1, 0, 1]], np.float32)
  log_w = losses.rollout_log_weights(trainer, sampler, mask, "token")
  _close(jnp.exp(log_w) * mask, [[3.0, 0.25, 1.5, 1.0, 0.0, 0.5]], rtol=1e-6, atol=0)
  _close(losses.rollout_is_weight(log_w, "truncate", 2.0) * mask, [[2, 0.25, 1.5, 1, 0, 0.5]],
         rtol=1e-6, atol=0)
  _close(losses.rollout_is_weight(log_w, "off", 2.0), np.ones((1, 6)), rtol=0, atol=0)
  keep = losses.rollout_keep(log_w, mask, 2.0)
  # 0.5 sits on the boundary after float rounding either way; move it inside to test the rule
  assert keep[0, :5].tolist() == [0.0, 0.0, 1.0, 1.0, 0.0]
  ends = losses.rollout_keep(jnp.log(jnp.array([[2.0, 0.5, 2.0001, 0.4999]])), np.ones((1, 4)), 2.0)
  assert ends.tolist() == [[1.0, 1.0, 0.0, 0.0]]  # both ends of [1/C, C] included


def test_sequence_weights_by_hand():
  """Sequence level: W = exp(Σ_t log-ratio over the row's loss tokens) on each of its tokens."""
  sampler = np.full((3, 4), -2.0, np.float32)
  ratio = np.array([[2.0, 0.75, 1.0, 9.0],  # W = 1.5 (the 9 is off the mask)
                    [3.0, 0.5, 2.0, 1.0],  # W = 3
                    [0.25, 1.6, 1.0, 1.0]])  # W = 0.4
  mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]], np.float32)
  trainer = (sampler + np.log(ratio)).astype(np.float32)
  log_w = losses.rollout_log_weights(trainer, sampler, mask, "sequence")
  expected_w = np.array([[1.5] * 3 + [0], [3.0] * 4, [0.4] * 2 + [0, 0]])
  _close(jnp.exp(log_w) * mask, expected_w, rtol=1e-5, atol=0)
  _close(losses.rollout_is_weight(log_w, "truncate", 2.0) * mask,
         np.minimum(expected_w, 2.0), rtol=1e-5, atol=0)
  assert losses.rollout_keep(log_w, mask, 2.0).tolist() == [[1, 1, 1, 0], [0] * 4, [0] * 4]


def test_mismatch_statistics_by_hand():
  """k3 = r − log r − 1 per token (verl's k3_kl); verl's ppl_ratio per row exp(mean log π_s −
  mean log π_t); the shares above C and below 1/C per token or per row."""
  sampler = np.full((2, 3), -1.0, np.float32)
  ratio = np.array([[3.0, 0.25, 1.0], [1.5, 1.0, 1.0]])
  mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)
  trainer = (sampler + np.log(ratio)).astype(np.float32)
  k3 = lambda r: r - math.log(r) - 1
  for level in ("token", "sequence"):
    log_w = losses.rollout_log_weights(trainer, sampler, mask, level)
    weight = losses.rollout_is_weight(log_w, "truncate", 2.0)
    s = losses.rollout_stats_rows(trainer, sampler, mask, weight, level=level, threshold=2.0)
    _close(s["rc_k3"], [k3(3) + k3(0.25), k3(1.5)], rtol=1e-5, atol=1e-7)
    _close(s["rc_ppl_ratio"], [math.exp(-LN(0.75) / 3), math.exp(-LN(1.5) / 2)], rtol=1e-5)
    _close(s["rc_tokens"], [3, 2], rtol=0, atol=0)
    _close(s["rc_rows"], [1, 1], rtol=0, atol=0)
    if level == "token":
      _close(s["rc_high"], [1, 0], rtol=0, atol=0)
      _close(s["rc_low"], [1, 0], rtol=0, atol=0)
      _close(s["rc_weight"], [2 + 0.25 + 1, 1.5 + 1], rtol=1e-5)
    else:  # row 0: W = 0.75, row 1: W = 1.5: both inside [1/2, 2]
      _close(s["rc_high"], [0, 0], rtol=0, atol=0)
      _close(s["rc_low"], [0, 0], rtol=0, atol=0)
      _close(s["rc_weight"], [3 * 0.75, 2 * 1.5], rtol=1e-5)


# ------------------------------------------------------------------------ in the train step

TOKEN_RATIOS = (3.0, 0.25, 1.5, 1.0, 0.6, 1.9, 0.4, 1.2)  # none within 1e-3 of 2 or 1/2
ROW_RATIOS = (3.0, 0.25, 1.5, 1.0, 0.6, 1.9, 0.4, 1.2)


def _trajectories(n=8, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    p, r = int(rng.integers(3, 9)), int(rng.integers(4, 12))
    toks = rng.integers(0, CFG.vocab_size, p + r).astype(np.int32)
    lm = np.concatenate([np.zeros(p), (rng.random(r) < 0.8)]).astype(np.int32)
    lm[p] = 1  # every row has a loss token at its first response column
    lp = np.zeros(p + r, np.float32)
    out.append(Trajectory(toks, lm, lp, p, [Span(0, p, "prompt")], [], None, None, "eos"))
  return out


def _mismatched_batch(params, level):
  """A batch whose sampler log-probs are the trainer's divided by known ratios: per token
  (cycling TOKEN_RATIOS over the loss tokens) or per row (ROW_RATIOS on its first loss token)."""
  trajs = _trajectories()
  advs = np.random.default_rng(1).normal(size=len(trajs)).astype(np.float32)
  batch = place_batch(make_batch(trajs, advs), None)
  trainer = np.asarray(compute_logprobs(CFG, params, batch))
  m = np.asarray(batch.loss_mask)
  ratio = np.ones_like(m)
  if level == "token":
    rows, cols = np.nonzero(m)
    ratio[rows, cols] = np.resize(TOKEN_RATIOS, len(rows))
  else:
    for b in range(m.shape[0]):
      ratio[b, np.flatnonzero(m[b])[0]] = ROW_RATIOS[b]
  sampler = ((trainer - np.log(ratio)) * m).astype(np.float32)
  return batch.replace(old_logp=jnp.asarray(sampler)), ratio, m


def _run(lc, micro, batch, params):
  """(raw gradient, metrics) of one step: the optimizer state holds the last gradient."""
  capture = optax.GradientTransformation(
      lambda p: jax.tree.map(jnp.zeros_like, p),
      lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))
  step = make_train_step(CFG, lc, capture, micro_batches=micro)
  state = init_train_state(jax.tree.map(jnp.copy, params), capture)
  new, metrics = step(state, batch)
  return jax.tree.map(np.asarray, new.opt_state), {k: np.asarray(v) for k, v in metrics.items()}


def _assert_grads_equal(a, b):
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(a))
  assert scale > 1e-6
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    chex.assert_trees_all_close(x, y, rtol=0, atol=1e-5 * scale)


def _row_weights(ratio, m, level):
  """The hand weight w of each loss token: its own ratio, or its row's product."""
  if level == "token":
    return ratio * m
  return np.prod(np.where(m > 0, ratio, 1.0), axis=1, keepdims=True) * m


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_truncate_weights_the_policy_gradient(level):
  """TIS with π_old from the trainer: the step's gradient is the uncorrected step's with each
  token's advantage multiplied by min(w, C), and pg_loss is the hand token-mean."""
  params = init_params(CFG, jax.random.key(0))
  batch, ratio, m = _mismatched_batch(params, level)
  w = _row_weights(ratio, m, level)
  lc = LossConfig(chunk=8, old_logp_from_trainer=True)
  tis, mt = _run(LossConfig(chunk=8, old_logp_from_trainer=True, rollout_corr_mode="truncate",
                            rollout_corr_level=level), 1, batch, params)
  scaled = batch.replace(advantages=batch.advantages * jnp.asarray(np.minimum(w, 2.0)))
  plain, _ = _run(lc, 1, scaled, params)
  _assert_grads_equal(tis, plain)
  adv = np.asarray(batch.advantages)
  _close(mt["pg_loss"], (-adv * np.minimum(w, 2.0) * m).sum() / m.sum(), rtol=1e-5, atol=1e-7)
  units = m.sum() if level == "token" else m.shape[0]
  high = (w > 2.0) & (m > 0) if level == "token" else (w.max(1) > 2.0)
  _close(mt["rollout_corr/truncated_frac"], high.sum() / units, rtol=1e-6, atol=0)
  _close(mt["rollout_corr/weight_mean"], (np.minimum(w, 2.0) * m).sum() / m.sum(), rtol=1e-5)
  assert float(mt["rollout_corr/truncated_frac"]) > 0 and float(mt["rollout_corr/k3_kl"]) > 0


@pytest.mark.parametrize("level,agg", [("token", "token-mean"), ("token", "seq-mean-token-mean"),
                                       ("sequence", "token-mean"),
                                       ("sequence", "seq-mean-token-sum-norm")])
def test_mask_drops_tokens_from_the_loss_and_its_normaliser(level, agg):
  """MIS: tokens (rows) with w outside [1/2, 2] leave the loss and every count it is divided
  by. 1 and 4 micro-batches give the same update, equal to an uncorrected step on the hand-made
  kept mask with each kept token's advantage multiplied by w."""
  params = init_params(CFG, jax.random.key(0))
  batch, ratio, m = _mismatched_batch(params, level)
  w = _row_weights(ratio, m, level)
  keep = ((w >= 0.5) & (w <= 2.0) & (m > 0)).astype(np.float32)
  assert 0 < keep.sum() < m.sum()
  lc = LossConfig(chunk=8, agg_mode=agg, old_logp_from_trainer=True, rollout_corr_mode="mask",
                  rollout_corr_level=level)
  one, m1 = _run(lc, 1, batch, params)
  four, m4 = _run(lc, 4, batch, params)
  hand = batch.replace(loss_mask=jnp.asarray(m * keep),
                       advantages=batch.advantages * jnp.asarray(w * keep))
  plain, mp = _run(LossConfig(chunk=8, agg_mode=agg, old_logp_from_trainer=True), 1, hand, params)
  _assert_grads_equal(one, four)
  _assert_grads_equal(one, plain)
  _close(m1["loss"], m4["loss"], rtol=1e-6, atol=1e-8)
  # the hand weights are float64 ratios, the step's exp of float32 log-prob differences
  _close(m1["loss"], mp["loss"], rtol=1e-5, atol=1e-8)
  if agg == "token-mean":
    adv = np.asarray(batch.advantages)
    _close(m1["pg_loss"], (-adv * w * keep).sum() / keep.sum(), rtol=1e-5, atol=1e-7)
  units = m.sum() if level == "token" else m.shape[0]
  dropped = (m - m * keep).sum() if level == "token" else (keep.max(1) == 0).sum()
  for metrics in (m1, m4):  # measured over every loss token, before the rejection
    _close(metrics["rollout_corr/masked_frac"], dropped / units, rtol=1e-6, atol=0)
    _close(metrics["rollout_corr/weight_mean"], (w * keep).sum() / m.sum(), rtol=1e-5)
  for k in ("rollout_corr/k3_kl", "rollout_corr/ppl_ratio", "num_tokens"):
    _close(m1[k], m4[k], rtol=1e-6, atol=0)
  assert float(m1["num_tokens"]) == keep.sum()


def test_mask_mode_on_a_sharded_mesh_equals_one_device():
  """The rejection's forward runs per micro-batch on each device's own rows and its log-probs
  come back in row order: an FSDP mesh gives the single-device update."""
  params = init_params(CFG, jax.random.key(0))
  batch, _, _ = _mismatched_batch(params, "sequence")
  lc = LossConfig(chunk=8, old_logp_from_trainer=True, rollout_corr_mode="mask",
                  rollout_corr_level="sequence")
  single, ms = _run(lc, 2, batch, params)
  mesh = shd.make_mesh((1, 2, 4))
  capture = optax.GradientTransformation(
      lambda p: jax.tree.map(jnp.zeros_like, p),
      lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))
  step = make_train_step(CFG, lc, capture, micro_batches=2, mesh=mesh)
  sharded_params = transformer.shard_params(jax.tree.map(jnp.copy, params), CFG, mesh)
  new, mm = step(init_train_state(sharded_params, capture),
                 place_batch(jax.tree.map(np.asarray, batch), mesh))
  _assert_grads_equal(single, jax.tree.map(np.asarray, new.opt_state))
  for k in ("loss", "num_tokens", "rollout_corr/masked_frac", "rollout_corr/k3_kl"):
    _close(ms[k], mm[k], rtol=1e-5, atol=0)


def test_with_the_samplers_old_logp_only_rejection_acts():
  """π_old from the sampler: the PPO ratio is already taken against the sampler (verl's bypass
  mode), so truncate leaves the update as it is; the metrics still report the mismatch."""
  params = init_params(CFG, jax.random.key(0))
  batch, _, _ = _mismatched_batch(params, "token")
  off, mo = _run(LossConfig(chunk=8), 1, batch, params)
  tis, mt = _run(LossConfig(chunk=8, rollout_corr_mode="truncate"), 1, batch, params)
  _assert_grads_equal(off, tis)
  _close(mo["rollout_corr/k3_kl"], mt["rollout_corr/k3_kl"], rtol=1e-6, atol=0)
  assert float(mo["rollout_corr/k3_kl"]) > 0.1
  _close(mt["rollout_corr/weight_mean"], 1.0, rtol=1e-6, atol=0)


# ---------------------------------------------------------------- a real bfloat16 sampler

TINY = tiny_config("qwen2", vocab_size=64, num_layers=2, eos_token_id=None)


def _sampled_batch(params, dtype):
  sampler = Sampler(TINY, params, dtype=dtype)
  prompts = [[1, 5, 9], [1, 7], [1, 3, 4, 2]]
  results = sampler.generate(prompts, max_new_tokens=12, temperature=1.0, num_samples=4, seed=3)
  trajs = []
  for r in results:
    p = np.asarray(prompts[r.prompt_index], np.int32)
    toks = np.concatenate([p, r.tokens]).astype(np.int32)
    lm = np.concatenate([np.zeros(len(p)), np.ones(len(r.tokens))]).astype(np.int32)
    lp = np.concatenate([np.zeros(len(p)), r.logprobs]).astype(np.float32)
    trajs.append(Trajectory(toks, lm, lp, len(p), [Span(0, len(p), "prompt")], [], None, None,
                            r.finish_reason))
  advs = np.random.default_rng(0).normal(size=len(trajs)).astype(np.float32)
  return place_batch(make_batch(trajs, advs), None)


def test_a_bfloat16_sampler_against_a_float32_trainer():
  """Rollouts decoded in bfloat16 (KV cache), trained in float32: the mismatch metrics are far
  above a float32 sampler's, the applied weights stay within C, and with a tight C some tokens
  are truncated (or masked) while the update stays finite."""
  params = jax.tree.map(lambda x: x * 4.0, init_params(TINY, jax.random.key(0)))  # peaked logits
  b16, f32 = _sampled_batch(params, jnp.bfloat16), _sampled_batch(params, jnp.float32)
  trainer = compute_logprobs(TINY, params, b16)
  m = b16.loss_mask
  log_w = losses.rollout_log_weights(trainer, b16.old_logp, m, "token")
  gap = float((jnp.abs(log_w) * m).sum() / m.sum())
  f32_gap = float((jnp.abs(compute_logprobs(TINY, params, f32) - f32.old_logp) * f32.loss_mask
                   ).sum() / f32.loss_mask.sum())
  print(f"mean |log w|: bfloat16 sampler {gap:.2e}, float32 sampler {f32_gap:.2e}")
  assert gap > 100 * f32_gap and gap > 1e-3
  c = float(jnp.exp(jnp.quantile(jnp.abs(log_w)[m > 0], 0.5)))  # a C half the tokens exceed
  for mode in ("truncate", "mask"):
    lc = LossConfig(chunk=8, old_logp_from_trainer=True, rollout_corr_mode=mode,
                    rollout_corr_threshold=c)
    step = make_train_step(TINY, lc, optax.sgd(1e-3))
    _, metrics = step(init_train_state(jax.tree.map(jnp.copy, params), optax.sgd(1e-3)), b16)
    assert bool(metrics["finite"])
    assert float(metrics["rollout_corr/k3_kl"]) > 0 and float(metrics["rollout_corr/ppl_ratio"]) != 1
    assert 0 < float(metrics["rollout_corr/truncated_frac"]) < 1
    applied = losses.rollout_is_weight(log_w, mode, c)
    if mode == "mask":
      applied = applied * losses.rollout_keep(log_w, m, c)
    assert float(jnp.where(m > 0, applied, 0).max()) <= c * (1 + 1e-6)
    print(mode, {k: round(float(v), 5) for k, v in metrics.items() if k.startswith("rollout")})


# ------------------------------------------------------------------------------- config

def _paper_config():
  from scope_jax.configs import piplay  # pylint: disable=import-outside-toplevel
  return piplay.get_config("paper")


def test_auto_is_truncate_for_a_bfloat16_sampler_and_off_for_float32():
  c = _paper_config()
  assert c.model.dtype == "bfloat16" and c.loss.rollout_correction.mode == "auto"
  lc = runtime.loss_config(c)
  assert (lc.rollout_corr_mode, lc.rollout_corr_level, lc.rollout_corr_threshold) == (
      "truncate", "token", 2.0)
  c.rollout.dtype = "float32"
  assert runtime.loss_config(c).rollout_corr_mode == "off"
  c.loss.rollout_correction.mode = "mask"
  c.loss.rollout_correction.level = "sequence"
  lc = runtime.loss_config(c, {"rollout_correction": {"threshold": 3.0}})
  assert (lc.rollout_corr_mode, lc.rollout_corr_level, lc.rollout_corr_threshold) == (
      "mask", "sequence", 3.0)


@pytest.mark.parametrize("key,value,match", [
    ("mode", "clip", r"^loss.rollout_correction.mode='clip' is not valid; use one of auto, off"),
    ("level", "geometric", r"^loss.rollout_correction.level='geometric' is not valid"),
    ("threshold", 1.0, r"^loss.rollout_correction.threshold=1.0 must be above 1"),
])
def test_bad_rollout_correction_settings_are_one_line_errors(key, value, match):
  c = _paper_config()
  c.loss.rollout_correction[key] = value
  with pytest.raises(ValueError, match=match) as e:
    runtime.loss_config(c)
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="rollout correction"):
    LossConfig(**{f"rollout_corr_{key}": value})
  with pytest.raises(ValueError, match="rollout_correction section"):
    runtime.loss_config(_paper_config(), {"rollout_corr_mode": "mask"})


def test_mask_mode_rejects_with_a_lora_policys_own_log_probs():
  """With LoRA the rejection's forward plays the base plus the adapters (what the loss trains),
  not the adapters tree alone: a LoRA step's rejection and metrics equal a plain step's on the
  merged weights, and differ from the base's (the adapters move the log-probs)."""
  from scope_jax.models import lora  # pylint: disable=import-outside-toplevel
  base = init_params(CFG, jax.random.key(0))
  cfg = lora.LoraConfig(rank=4, alpha=8.0)
  leaves, tree = jax.tree.flatten(lora.init_adapters(CFG, cfg, jax.random.key(1)))
  keys = jax.random.split(jax.random.key(3), len(leaves))
  adapters = jax.tree.unflatten(tree, [x + 0.2 * jax.random.normal(k, x.shape)
                                       for x, k in zip(leaves, keys)])
  merged = lora.merge(lora.view(base, adapters))
  batch, _, _ = _mismatched_batch(merged, "token")
  lc = LossConfig(chunk=8, old_logp_from_trainer=True, rollout_corr_mode="mask")
  capture = optax.GradientTransformation(
      lambda p: jax.tree.map(jnp.zeros_like, p),
      lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))
  step = make_train_step(CFG, lc, capture, micro_batches=2)
  _, got = step(init_train_state(jax.tree.map(jnp.copy, adapters), capture), batch, None, None,
                base)
  _, want = _run(lc, 2, batch, merged)
  _, on_base = _run(lc, 2, batch, base)
  for k in ("rollout_corr/masked_frac", "rollout_corr/k3_kl", "num_tokens"):
    _close(got[k], want[k], rtol=1e-5, atol=1e-7)
  assert float(want["rollout_corr/masked_frac"]) > 0
  assert not np.isclose(float(on_base["rollout_corr/k3_kl"]), float(want["rollout_corr/k3_kl"]))
