"""Losses vs hand-computed values and independent numpy references."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

from scope_jax.rl import losses


def np_policy_loss(logp, old, adv, el, eh, c=None):
  ratio = np.exp(np.clip(logp - old, -20, 20))
  out = np.maximum(-ratio * adv, -np.clip(ratio, 1 - el, 1 + eh) * adv)
  if c is not None:
    out = np.where(adv < 0, np.minimum(out, -c * adv), out)
  return out


class HandValuesTest(chex.TestCase):
  """Hand-computed values of the per-token losses, eagerly and under jit with the configuration
  arguments (clip ranges, aggregation mode, estimator, K) static, as the train step uses them."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_policy_loss(self):
    policy_loss = self.variant(losses.policy_loss,
                               static_argnames=("eps_low", "eps_high", "dual_clip"))
    logp = jnp.log(jnp.array([1.5, 1.5, 5.0, 1.0]))
    old = jnp.zeros(4)
    adv = jnp.array([1.0, -1.0, -1.0, 2.0])
    loss, clipped = policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.2)
    chex.assert_trees_all_close(loss, np.array([-1.2, 1.5, 5.0, -2.0]), rtol=1e-6, atol=0)
    chex.assert_trees_all_equal(clipped, np.array([1.0, 0.0, 0.0, 0.0], np.float32))
    loss, _ = policy_loss(logp, old, adv, eps_low=0.2, eps_high=0.28, dual_clip=3.0)
    chex.assert_trees_all_close(loss, np.array([-1.28, 1.5, 3.0, -2.0]), rtol=1e-6, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.named_parameters(
      ("token_mean", "token-mean", (7.0, 3.0)),
      ("seq_mean_token_mean", "seq-mean-token-mean", (5.5, 2.0)),
      ("seq_mean_token_sum", "seq-mean-token-sum", (7.0, 2.0)),
      ("seq_mean_token_sum_norm", "seq-mean-token-sum-norm", (7.0, 6.0)))
  def test_aggregation(self, mode, expected):
    aggregate = self.variant(losses.aggregate, static_argnames=("mode", "norm_length"))
    loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    s, c = aggregate(loss, mask, mode)
    chex.assert_trees_all_close((float(s), float(c)), expected, rtol=1e-7, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dr_grpo_divides_by_real_rows_times_a_constant_length(self):
    """Dr.GRPO: Σ L·m / (rows with loss tokens × norm_length); the padded row (no loss tokens)
    and the array's width do not count: (1+2+4) / (2 × 100)."""
    aggregate = self.variant(losses.aggregate, static_argnames=("mode", "norm_length"))
    loss = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    s, c = aggregate(loss, mask, "seq-mean-token-sum-norm", norm_length=100)
    chex.assert_trees_all_close((float(s), float(c)), (7.0, 200.0), rtol=1e-7, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_estimators(self):
    kl_penalty = self.variant(losses.kl_penalty, static_argnames=("kind",))
    logp, ref = jnp.array([-1.0, -2.0]), jnp.array([-2.0, -2.0])
    chex.assert_trees_all_close(kl_penalty(logp, ref, "k1"), np.array([1.0, 0.0]), rtol=1e-7,
                                atol=0)
    chex.assert_trees_all_close(kl_penalty(logp, ref, "k2"), np.array([0.5, 0.0]), rtol=1e-7,
                                atol=0)
    chex.assert_trees_all_close(kl_penalty(logp, ref, "k3"), np.array([math.exp(-1.0), 0.0]),
                                rtol=1e-6, atol=0)
    # clamps: d = ref − logp = 30 → clipped to 20 → exp(20) − 21 → clipped to 10
    chex.assert_trees_all_close(kl_penalty(jnp.array([-40.0]), jnp.array([-10.0]), "k3"),
                                np.array([10.0]), rtol=1e-7, atol=0)
    with pytest.raises(ValueError, match="Unknown KL estimator 'k4'"):
      kl_penalty(logp, ref, "k4")

  @chex.variants(with_jit=True, without_jit=True)
  def test_k3_plus_has_k3_value_and_k2_gradient(self):
    kl_penalty = self.variant(losses.kl_penalty, static_argnames=("kind",))
    logp = jnp.array([-1.0, -0.3, -2.5])
    ref = jnp.array([-2.0, -0.1, -2.5])
    chex.assert_trees_all_close(kl_penalty(logp, ref, "k3+"), kl_penalty(logp, ref, "k3"),
                                rtol=1e-7, atol=0)
    g_plus = jax.grad(lambda x: kl_penalty(x, ref, "k3+").sum())(logp)
    g_k2 = jax.grad(lambda x: kl_penalty(x, ref, "k2").sum())(logp)
    g_k3 = jax.grad(lambda x: kl_penalty(x, ref, "k3").sum())(logp)
    chex.assert_trees_all_close(g_plus, g_k2, rtol=1e-7, atol=0)
    chex.assert_trees_all_close(g_k2, logp - ref, rtol=1e-6, atol=0)
    with pytest.raises(AssertionError):  # k3's own gradient differs (np.allclose's tolerances)
      chex.assert_trees_all_close(g_plus, g_k3, rtol=1e-5, atol=1e-8)

  @chex.variants(with_jit=True, without_jit=True)
  def test_topk_distillation(self):
    topk_reverse_kl = self.variant(losses.topk_reverse_kl, static_argnames=("k", "tail"))
    ps, pt = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.4, 0.2])
    s, t = jnp.log(jnp.asarray(ps))[None], jnp.log(jnp.asarray(pt))[None]
    k1 = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.6)  # head on id 0 + tail (0.5 vs 0.6)
    k2 = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.2)
    renorm2 = 0.625 * math.log(0.625 / 0.5) + 0.375 * math.log(0.375 / 0.5)
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 1), np.array([k1]), rtol=1e-5, atol=0)
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 2), np.array([k2]), rtol=1e-5, atol=1e-7)
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 2, tail=False), np.array([renorm2]),
                                rtol=1e-5, atol=0)
    full = float((ps * np.log(ps / pt)).sum())
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 3), np.array([full]), rtol=1e-5,
                                atol=0)  # float32 vs exact
    # K comes from the student: here its top-1 is id 0 and its top-2 {0, 2}, the teacher's are
    # id 1 and {1, 2}; the teacher's choice would give 0.1·log(0.1/0.7) + 0.9·log(0.9/0.3) = 0.794.
    ps, pt = np.array([0.6, 0.1, 0.3]), np.array([0.1, 0.7, 0.2])
    s, t = jnp.log(jnp.asarray(ps))[None], jnp.log(jnp.asarray(pt))[None]
    k1 = 0.6 * math.log(0.6 / 0.1) + 0.4 * math.log(0.4 / 0.9)
    k2 = 0.6 * math.log(0.6 / 0.1) + 0.3 * math.log(0.3 / 0.2) + 0.1 * math.log(0.1 / 0.7)
    renorm2 = (2 / 3) * math.log((2 / 3) / (1 / 3)) + (1 / 3) * math.log((1 / 3) / (2 / 3))
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 1), np.array([k1]), rtol=1e-5, atol=0)
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 2), np.array([k2]), rtol=1e-5, atol=0)
    chex.assert_trees_all_close(topk_reverse_kl(s, t, 2, tail=False), np.array([renorm2]),
                                rtol=1e-5, atol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  def test_entropy(self):
    entropy = self.variant(losses.entropy)
    chex.assert_trees_all_close(entropy(jnp.log(jnp.full((1, 4), 0.25))), np.array([math.log(4)]),
                                rtol=1e-6, atol=0)


def test_policy_loss_matches_numpy_reference():
  rng = np.random.default_rng(0)
  logp, old = rng.normal(-2, 1, (4, 9)), rng.normal(-2, 1, (4, 9))
  adv = rng.normal(0, 1, (4, 9))
  for c in (None, 3.0):
    got, _ = losses.policy_loss(jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
                                jnp.asarray(adv, jnp.float32), eps_low=0.2, eps_high=0.28,
                                dual_clip=c)
    chex.assert_trees_all_close(got, np_policy_loss(logp, old, adv, 0.2, 0.28, c), rtol=1e-5,
                                atol=1e-6)


def test_aggregation_is_additive_over_row_splits():
  rng = np.random.default_rng(1)
  loss = jnp.asarray(rng.normal(size=(8, 5)), jnp.float32)
  mask = jnp.asarray(rng.integers(0, 2, (8, 5)))
  for mode in losses.AGG_MODES:
    s, c = losses.aggregate(loss, mask, mode)
    parts = [losses.aggregate(loss[i::4], mask[i::4], mode, norm_length=5) for i in range(4)]
    chex.assert_trees_all_close(float(s) / float(c),
                                sum(float(p[0]) for p in parts) / sum(float(p[1]) for p in parts),
                                rtol=1e-6, atol=0)



def test_aggregate_rows_are_the_rows_terms_of_the_sum():
  loss = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 6.0, 0.0]])
  mask = jnp.asarray([[1, 1, 0], [0, 0, 0], [1, 1, 1]])
  expected = {"token-mean": ([3.0, 0.0, 11.0], 5.0),  # rows' Σ L·m; Σ m
              "seq-mean-token-mean": ([1.5, 0.0, 11.0 / 3], 2.0),  # rows' mean; non-empty rows
              "seq-mean-token-sum": ([3.0, 0.0, 11.0], 2.0),
              "seq-mean-token-sum-norm": ([3.0, 0.0, 11.0], 2.0 * 4)}
  for mode, (rows, count) in expected.items():
    got_rows, got_count = losses.aggregate_rows(loss, mask, mode, norm_length=4)
    chex.assert_trees_all_close((got_rows, got_count), (jnp.asarray(rows), jnp.float32(count)),
                                rtol=1e-6)
    chex.assert_trees_all_close(losses.aggregate(loss, mask, mode, norm_length=4),
                                (got_rows.sum(), got_count), rtol=1e-6)

def test_topk_with_k_equal_v_is_full_kl_value_and_gradient():
  rng = np.random.default_rng(2)
  s_logits = jnp.asarray(rng.normal(0, 2, (6, 50)), jnp.float32)
  t_logp = jax.nn.log_softmax(jnp.asarray(rng.normal(0, 2, (6, 50)), jnp.float32))
  f_top = lambda x: losses.topk_reverse_kl(jax.nn.log_softmax(x), t_logp, 50).sum()
  f_full = lambda x: losses.full_reverse_kl(jax.nn.log_softmax(x), t_logp).sum()
  chex.assert_trees_all_close(f_top(s_logits), f_full(s_logits), atol=1e-6, rtol=1e-6)
  chex.assert_trees_all_close(jax.grad(f_top)(s_logits), jax.grad(f_full)(s_logits), atol=1e-6,
                              rtol=1e-7)
  # K < V: the tail makes it an upper-bound-free approximation that is exact when the tails agree
  approx = losses.topk_reverse_kl(jax.nn.log_softmax(s_logits), t_logp, 10)
  chex.assert_tree_all_finite(approx)
  assert np.all(np.asarray(approx) >= -1e-6)


def _naive_stats(h, w, y, th, tw, k, temperature):
  logp = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", h, w) / temperature)
  tl = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", th, tw) / temperature)
  return {"logp": jnp.take_along_axis(logp, y[..., None], -1)[..., 0],
          "entropy": losses.entropy(logp),
          "distill": losses.topk_reverse_kl(logp.reshape(-1, logp.shape[-1]),
                                            tl.reshape(-1, tl.shape[-1]), k).reshape(y.shape),
          "teacher_logp": jnp.take_along_axis(tl, y[..., None], -1)[..., 0]}


def test_chunked_stats_equal_naive_values_and_gradients():
  rng = np.random.default_rng(3)
  b, t, d, v = 2, 13, 8, 40
  h, th = (jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32) for _ in range(2))
  w, tw = (jnp.asarray(rng.normal(size=(v, d)), jnp.float32) for _ in range(2))
  y = jnp.asarray(rng.integers(0, v, (b, t)))
  got = losses.token_stats(h, w, y, temperature=0.7, chunk=4, teacher_hidden_BTD=th,
                           teacher_unembed_VD=tw, distill_topk=7)
  ref = _naive_stats(h, w, y, th, tw, 7, 0.7)
  chex.assert_trees_all_close(got, ref, atol=1e-5, rtol=1e-5)
  f = lambda fn: lambda h_, w_: sum(v.sum() for v in fn(h_, w_).values())
  g_chunk = jax.grad(f(lambda h_, w_: losses.token_stats(
      h_, w_, y, temperature=0.7, chunk=4, teacher_hidden_BTD=th, teacher_unembed_VD=tw,
      distill_topk=7)), argnums=(0, 1))(h, w)
  g_naive = jax.grad(f(lambda h_, w_: _naive_stats(h_, w_, y, th, tw, 7, 0.7)), argnums=(0, 1))(h, w)
  chex.assert_trees_all_close(g_chunk, g_naive, atol=2e-5, rtol=1e-4)


def test_chunked_memory_is_a_fraction_of_naive():
  """V = 151,936, T = 4,096, D = 896: compiled temp memory of chunked vs naive (forward + grad)."""
  b, t, d, v, k = 1, 4096, 896, 151936, 64
  h = jax.ShapeDtypeStruct((b, t, d), jnp.float32)
  w = jax.ShapeDtypeStruct((v, d), jnp.float32)
  y = jax.ShapeDtypeStruct((b, t), jnp.int32)

  def chunked(h_, w_, y_, th_, tw_):
    s = losses.token_stats(h_, w_, y_, chunk=256, teacher_hidden_BTD=th_, teacher_unembed_VD=tw_,
                           distill_topk=k)
    return s["logp"].sum() + s["distill"].sum()

  def naive(h_, w_, y_, th_, tw_):
    s = _naive_stats(h_, w_, y_, th_, tw_, k, 1.0)
    return s["logp"].sum() + s["distill"].sum()

  mem = {}
  for name, fn in (("chunked", chunked), ("naive", naive)):
    compiled = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(h, w, y, h, w).compile()
    mem[name] = compiled.memory_analysis().temp_size_in_bytes
  print(f"temp bytes: chunked {mem['chunked'] / 2**20:.0f} MiB, naive {mem['naive'] / 2**20:.0f} MiB "
        f"({mem['chunked'] / mem['naive']:.1%})")
  assert mem["chunked"] <= 0.10 * mem["naive"]
