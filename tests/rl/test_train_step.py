"""The train step: micro-batch invariance, sharded equality, the non-finite guard, KL and teacher."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params, tiny_config, transformer
from scope_jax.rl import learner as learner_lib
from scope_jax.rl.batch import make_batch
from scope_jax.rl.train_step import (LossConfig, compute_logprobs, init_train_state,
                                     make_train_step, place_batch, sequence_stats)
from scope_jax.rollout.types import Span, Trajectory

CFG = tiny_config("qwen2", num_heads=8, num_kv_heads=4, head_dim=8)


def _trajectories(n=8, seed=0):
  rng = np.random.default_rng(seed)
  out = []
  for i in range(n):
    p, r = int(rng.integers(3, 9)), int(rng.integers(4, 12))
    toks = rng.integers(0, CFG.vocab_size, p + r).astype(np.int32)
    lm = np.concatenate([np.zeros(p), (rng.random(r) < 0.8)]).astype(np.int32)
    lp = np.where(lm > 0, rng.normal(-5.5, 0.3, p + r), 0).astype(np.float32)
    out.append(Trajectory(toks, lm, lp, p, [Span(0, p, "prompt")], [], None, None, "eos"))
  return out


def _batch(n=8, teacher=False):
  trajs = _trajectories(n)
  advs = np.random.default_rng(1).normal(size=n).astype(np.float32)
  tp = [list(range(1, 3 + i)) for i in range(n)] if teacher else None
  return make_batch(trajs, advs, teacher_prompts=tp)


def capture_grads():
  """An optimizer whose state is the last raw gradient (updates are zero): exact gradients."""
  return optax.GradientTransformation(
      lambda params: jax.tree.map(jnp.zeros_like, params),
      lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads))


def _grads(lc, micro, batch, params, ref=None, teacher=None, mesh=None, cfg=CFG):
  step = make_train_step(cfg, lc, capture_grads(), micro_batches=micro, mesh=mesh)
  params = jax.tree.map(jnp.copy, params)
  if mesh is not None:
    params = transformer.shard_params(params, cfg, mesh)
  new, metrics = step(init_train_state(params, capture_grads()), place_batch(batch, mesh), ref,
                      teacher)
  return jax.tree.map(np.asarray, new.opt_state), metrics


def _updates(lc, micro, batch, params, ref=None, teacher=None, mesh=None):
  step = make_train_step(CFG, lc, optax.sgd(1.0), micro_batches=micro, mesh=mesh)
  before = jax.tree.map(np.asarray, params)
  params = jax.tree.map(jnp.copy, params)  # the step donates its state
  if mesh is not None:
    params = transformer.shard_params(params, CFG, mesh)
  state = init_train_state(params, optax.sgd(1.0))
  new, metrics = step(state, place_batch(batch, mesh), ref, teacher)
  return jax.tree.map(lambda a, b: np.asarray(a) - b, new.params, before), metrics


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batches_give_same_gradients(mode):
  params = init_params(CFG, jax.random.key(0))
  ref = init_params(CFG, jax.random.key(1))
  lc = LossConfig(agg_mode=mode, kl_beta=0.1, kl_kind="k3", distill_coef=0.5, distill_topk=16,
                  chunk=8)
  batch = _batch(teacher=True)
  one, m1 = _grads(lc, 1, batch, params, ref, ref)
  four, m4 = _grads(lc, 4, batch, params, ref, ref)
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
    chex.assert_trees_all_close(a, b, rtol=0, atol=1e-6 * np.abs(a).max())
  chex.assert_trees_all_close(m1["loss"], m4["loss"], rtol=1e-6, atol=0)
  assert float(m1["kl_loss"]) > 0 and float(m1["distill_loss"]) > 0


def test_padding_micro_batches_are_skipped_and_change_nothing():
  """5 rows in 4 micro-batches of 2: the learner puts the 3 padding rows last, so the 4th
  micro-batch is padding only and is skipped (NaN advantages planted in it would poison the update
  if it were computed); gradients equal one micro-batch of the 5 real rows."""
  params = init_params(CFG, jax.random.key(0))
  lc = LossConfig(agg_mode="seq-mean-token-mean", chunk=8)
  real = _batch(5)
  padded = learner_lib.fill_micro_batches(learner_lib.pad_rows(real, 8), 5, 4)
  order = [int(np.flatnonzero((padded.tokens == t).all(1))[0]) for t in real.tokens]
  assert sorted(p % 4 for p in order) == [0, 0, 1, 1, 2]  # micro-batches 0-2 hold the real rows
  last = (np.arange(8) % 4 == 3)[:, None]  # the rows of micro-batch 3 (rows j, j + 4, …)
  assert not padded.mask[last[:, 0]].any()
  poisoned = padded.replace(advantages=np.where(last, np.nan, padded.advantages
                                                ).astype(np.float32))
  one, m1 = _grads(lc, 1, real, params)
  four, m4 = _grads(lc, 4, poisoned, params)
  assert bool(m4["finite"])
  for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(four)):
    chex.assert_trees_all_close(a, b, rtol=0, atol=1e-6 * np.abs(a).max())
  chex.assert_trees_all_close(m1["loss"], m4["loss"], rtol=1e-6, atol=0)


def test_sharded_step_equals_single_device():
  params = init_params(CFG, jax.random.key(0))
  lc = LossConfig(kl_beta=0.0, chunk=8)
  batch = _batch()
  single, ms = _grads(lc, 2, batch, params)
  sharded, mm = _grads(lc, 2, batch, params, mesh=shd.make_mesh((1, 2, 4)))
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
    chex.assert_trees_all_close(a, b, rtol=1e-7, atol=1e-6 * np.abs(a).max())
  chex.assert_trees_all_close(ms["grad_norm"], mm["grad_norm"], rtol=1e-5, atol=0)


def test_a_vocabulary_tensor_cannot_divide_splits_positions_and_equals_single_device():
  """258 tokens over tensor 4: the loss splits each chunk's positions over tensor against a
  whole unembedding instead (`losses.token_stats`); gradients equal one device's."""
  cfg = CFG.replace(vocab_size=258)
  params = init_params(cfg, jax.random.key(0))
  lc = LossConfig(kl_beta=0.0, chunk=8)
  single, ms = _grads(lc, 2, _batch(), params, cfg=cfg)
  mesh = shd.make_mesh((1, 2, 4))
  sharded, mm = _grads(lc, 2, _batch(), params, mesh=mesh, cfg=cfg)
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
    chex.assert_trees_all_close(a, b, rtol=1e-7, atol=1e-6 * np.abs(a).max())
  chex.assert_trees_all_close(ms["loss"], mm["loss"], rtol=1e-6, atol=0)
  with shd.activation_sharding(mesh):
    assert not shd.splits("activation_vocab", 258) and shd.splits("activation_vocab", 256)


def test_adam_moments_are_sharded_like_their_params():
  """Each moment leaf has its param's sharding (left to the compiler a zeroed moment was
  replicated: every chip of an FSDP mesh held both moments whole); counts are replicated."""
  mesh = shd.make_mesh((1, -1, 1))
  params = transformer.shard_params(init_params(CFG, jax.random.key(0)), CFG, mesh)
  state = init_train_state(params, optax.adamw(1e-3))
  adam = state.opt_state[0]
  for moments in (adam.mu, adam.nu):
    for m, p in zip(jax.tree.leaves(moments), jax.tree.leaves(params)):
      assert m.sharding == p.sharding, (m.shape, m.sharding, p.sharding)
  assert any(not p.sharding.is_fully_replicated for p in jax.tree.leaves(params))
  assert adam.count.sharding.is_fully_replicated and state.step.sharding.is_fully_replicated


def test_non_finite_step_is_skipped_and_counted():
  params = init_params(CFG, jax.random.key(0))
  batch = _batch()
  batch = batch.replace(advantages=batch.advantages.copy())
  batch.advantages[0, -1] = np.nan
  batch.loss_mask[0, -1] = 1.0
  delta, metrics = _updates(LossConfig(chunk=8), 1, batch, params)
  assert int(metrics["skipped"]) == 1 and not bool(metrics["finite"])
  chex.assert_trees_all_equal(delta, jax.tree.map(np.zeros_like, delta))


def test_on_policy_ratio_is_one_and_gap_is_reported():
  """With old log-probs from the trainer itself, the gap is ~0 and nothing is clipped."""
  params = init_params(CFG, jax.random.key(0))
  batch = place_batch(_batch(), None)
  logp = compute_logprobs(CFG, params, batch)
  batch = batch.replace(old_logp=logp * batch.loss_mask)
  _, metrics = _updates(LossConfig(chunk=8), 1, batch, params)
  assert float(metrics["logprob_gap_max"]) < 1e-5 and float(metrics["clip_frac"]) == 0.0
  assert float(metrics["entropy"]) > 0


def test_bad_micro_batch_count():
  params = init_params(CFG, jax.random.key(0))
  with pytest.raises(ValueError, match="does not split into 3 micro-batches"):
    _updates(LossConfig(chunk=8), 3, _batch(), params)


def test_bfloat16_compute_with_float32_master_weights():
  params = init_params(CFG, jax.random.key(0))
  step = make_train_step(CFG, LossConfig(chunk=8), optax.adam(1e-3), dtype=jnp.bfloat16,
                         remat="full")
  state = init_train_state(jax.tree.map(jnp.copy, params), optax.adam(1e-3))
  new, metrics = step(state, place_batch(_batch(), None))
  assert bool(metrics["finite"])
  chex.assert_tree_all_finite(metrics["grad_norm"])
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new.params))
  f32, _ = _grads(LossConfig(chunk=8), 1, _batch(), params)
  assert float(metrics["grad_norm"]) == pytest.approx(
      float(optax.global_norm(jax.tree.map(jnp.asarray, f32))), rel=0.1)


def test_statistics_of_the_response_columns_alone_equal_the_full_ones():
  """The unembedding runs over columns ≥ P only (batch.prompt_cols): the log-probs, entropy and
  distillation there are the full computation's, and every prompt column is 0."""
  batch = place_batch(_batch(teacher=True), None)
  p = batch.prompt_cols
  assert 0 < p < batch.tokens.shape[1]
  params = init_params(CFG, jax.random.key(0))
  teacher = init_params(CFG, jax.random.key(1))
  lc = LossConfig(chunk=8, distill_coef=1.0, distill_topk=5)
  stats = lambda col: sequence_stats(CFG, params, batch.tokens, batch.mask, lc=lc,
                                     dtype=jnp.float32, from_col=col,
                                     teacher=(teacher, batch.teacher_tokens, batch.teacher_mask))
  full, cut = stats(0), stats(p)
  assert set(full) == set(cut) == {"logp", "entropy", "distill", "teacher_logp"}
  for k in full:
    chex.assert_trees_all_close(cut[k][:, p:], full[k][:, p:], rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_equal(cut[k][:, :p], jnp.zeros_like(cut[k][:, :p]))
  assert float(jnp.abs(full["logp"][:, 1:p]).max()) > 0  # the full one does fill the prompt


def test_old_logp_from_the_step_equals_a_separate_trainer_forward():
  """π_old = the step's own log-probs (stop-gradient) gives the gradient of π_old recomputed by a
  separate trainer forward, while the metrics still report the gap to the sampler's log-probs."""
  params = init_params(CFG, jax.random.key(0))
  batch = place_batch(_batch(), None)
  recomputed = batch.replace(old_logp=compute_logprobs(CFG, params, batch) * batch.loss_mask)
  g_sep, m_sep = _grads(LossConfig(chunk=8), 2, recomputed, params)
  g_in, m_in = _grads(LossConfig(chunk=8, old_logp_from_trainer=True), 2, batch, params)
  chex.assert_trees_all_close(g_in, g_sep, rtol=1e-5, atol=1e-7)
  chex.assert_trees_all_close(m_in["pg_loss"], m_sep["pg_loss"], rtol=1e-6)
  assert float(m_sep["logprob_gap_mean"]) < 1e-5 and float(m_in["clip_frac"]) == 0.0
  assert float(m_in["logprob_gap_mean"]) > 0.1  # the sampler's made-up log-probs (N(−5.5, 0.3))


def test_entropy_bonus_subtracts_coef_times_the_entropy_gradient():
  """verl's entropy bonus: the gradient of pg_loss − c · token-mean entropy. With zero advantages
  the policy term has no gradient, so the step's gradient is −c times that of the masked
  token-mean entropy, computed here alone."""
  params = init_params(CFG, jax.random.key(0))
  batch = place_batch(_batch(), None)
  batch = batch.replace(advantages=jnp.zeros_like(batch.advantages))
  g0, _ = _grads(LossConfig(chunk=8), 1, batch, params)
  g1, m1 = _grads(LossConfig(chunk=8, entropy_coef=0.01), 1, batch, params)

  def mean_entropy(p):
    h = sequence_stats(CFG, p, batch.tokens, batch.mask, lc=LossConfig(chunk=8),
                       dtype=jnp.float32, from_col=batch.prompt_cols)["entropy"]
    return (h * batch.loss_mask).sum() / batch.loss_mask.sum()

  expected = jax.tree.map(lambda g: -0.01 * np.asarray(g), jax.grad(mean_entropy)(params))
  assert max(float(np.abs(x).max()) for x in jax.tree.leaves(g0)) == 0.0
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(expected))
  assert scale > 1e-6
  # float32 sums in another order: errors relative to the gradient's scale, not per element
  chex.assert_trees_all_close(g1, expected, rtol=1e-5, atol=1e-5 * scale)
  chex.assert_trees_all_close(m1["entropy_loss"], m1["entropy"], rtol=1e-5)
