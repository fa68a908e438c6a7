"""Top-K distillation options (support, tail bin, renormalisation, per-token cap): hand values
on a 5-token vocabulary, K = V against the full reverse KL, the released default bit for bit,
and the options through the chunked statistics and the config."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.core import runtime
from scope_jax.rl import losses
from scope_jax.rl.train_step import LossConfig

P_S = np.array([0.4, 0.3, 0.15, 0.1, 0.05])  # student: top-2 = {0, 1}, top-3 = {0, 1, 2}
P_T = np.array([0.1, 0.2, 0.4, 0.25, 0.05])  # teacher: top-2 = {2, 3}, top-3 = {2, 3, 1}
LS, LT = (jnp.asarray(np.log(p)[None], jnp.float32) for p in (P_S, P_T))
ln = math.log


def kl(k, **options):
  return float(losses.topk_reverse_kl(LS, LT, k, **options)[0])


# Σ_{i∈S} p_S,i ln(p_S,i / p_T,i) over the union {0, 1, 2, 3}
UNION_HEAD = 0.4 * ln(4) + 0.3 * ln(1.5) + 0.15 * ln(0.375) + 0.1 * ln(0.4)

HAND = {  # (support, tail, renormalize) → the value by hand for K = 2
    ("student", True, True): 0.4 * ln(4) + 0.3 * ln(1.5) + 0.3 * ln(0.3 / 0.7),
    ("student", False, True): 4 / 7 * ln((4 / 7) / (1 / 3)) + 3 / 7 * ln((3 / 7) / (2 / 3)),
    ("student", False, False): 0.4 * ln(4) + 0.3 * ln(1.5),
    ("teacher", True, True): 0.15 * ln(0.375) + 0.1 * ln(0.4) + 0.75 * ln(0.75 / 0.35),
    ("teacher", False, True): 0.6 * ln(0.6 / (8 / 13)) + 0.4 * ln(0.4 / (5 / 13)),
    ("teacher", False, False): 0.15 * ln(0.375) + 0.1 * ln(0.4),
    ("union", True, True): UNION_HEAD + 0.05 * ln(0.05 / 0.05),  # the tail bin {4}: equal masses
    ("union", False, True): UNION_HEAD / 0.95,  # both masses over {0..3} are 0.95
    ("union", False, False): UNION_HEAD,
}


@pytest.mark.parametrize("support,tail,renormalize", sorted(HAND))
def test_each_option_by_hand(support, tail, renormalize):
  got = kl(2, support=support, tail=tail, renormalize=renormalize)
  assert got == pytest.approx(HAND[(support, tail, renormalize)], rel=1e-5, abs=1e-6)


def test_with_the_tail_renormalize_changes_nothing():
  for support in losses.DISTILL_SUPPORTS:
    assert kl(2, support=support, renormalize=False) == kl(2, support=support)


def test_union_counts_an_id_in_both_sets_once():
  """K = 3: the student's {0, 1, 2} and the teacher's {2, 3, 1} share two ids; the union is
  {0, 1, 2, 3}, each once, the same support as K = 2's union."""
  for tail, renormalize in ((True, True), (False, True), (False, False)):
    assert kl(3, support="union", tail=tail, renormalize=renormalize) == pytest.approx(
        HAND[("union", tail, renormalize)], rel=1e-5, abs=1e-6)
  # ... and a union of identical sets is that set: rows where both top-2s are {0, 1}
  same = jnp.asarray(np.log([[0.5, 0.3, 0.1, 0.06, 0.04]]), jnp.float32)
  other = jnp.asarray(np.log([[0.3, 0.4, 0.1, 0.1, 0.1]]), jnp.float32)
  for tail, renormalize in ((True, True), (False, True), (False, False)):
    u = losses.topk_reverse_kl(same, other, 2, support="union", tail=tail, renormalize=renormalize)
    s = losses.topk_reverse_kl(same, other, 2, support="student", tail=tail,
                               renormalize=renormalize)
    chex.assert_trees_all_close(u, s, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("support", losses.DISTILL_SUPPORTS)
def test_k_equal_to_v_is_the_full_reverse_kl_for_every_support(support):
  rng = np.random.default_rng(0)
  s = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 5)) * 2, jnp.float32))
  t = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(6, 5)) * 2, jnp.float32))
  full = losses.full_reverse_kl(s, t)
  for tail, renormalize in ((True, True), (False, True), (False, False)):
    for k in (5, 9):
      got = losses.topk_reverse_kl(s, t, k, support=support, tail=tail, renormalize=renormalize)
      chex.assert_trees_all_close(got, full, rtol=1e-5, atol=1e-6)


def test_per_token_cap_and_its_gradient():
  """kl_clip caps each row's value; beyond the cap the gradient is zero, below it unchanged."""
  low = jnp.asarray(np.log([[0.3, 0.25, 0.2, 0.15, 0.1]]), jnp.float32)  # close to the teacher
  logits = jnp.concatenate([LS, low])
  uncapped = losses.topk_reverse_kl(logits, jnp.concatenate([LT, LT]), 2)
  cap = 0.5 * float(uncapped[0])
  assert float(uncapped[1]) < cap < float(uncapped[0])
  capped = losses.topk_reverse_kl(logits, jnp.concatenate([LT, LT]), 2, kl_clip=cap)
  chex.assert_trees_all_close(capped, jnp.array([cap, uncapped[1]]), rtol=1e-6, atol=0)
  f = lambda clip: lambda x: losses.topk_reverse_kl(jax.nn.log_softmax(x), jnp.concatenate(
      [LT, LT]), 2, kl_clip=clip).sum()
  g_cap, g_free = jax.grad(f(cap))(logits), jax.grad(f(0.0))(logits)
  chex.assert_trees_all_equal(g_cap[0], jnp.zeros(5))
  chex.assert_trees_all_close(g_cap[1], g_free[1], rtol=1e-6, atol=0)
  assert float(jnp.abs(g_free[0]).max()) > 0


def _released(student_logp_NV, teacher_logp_NV, k, tail=True):
  """The released top-K reverse KL (before these options), verbatim: the default must be it."""
  k = min(k, student_logp_NV.shape[-1])
  _, idx = jax.lax.top_k(jax.lax.stop_gradient(student_logp_NV), k)
  s_top = jnp.take_along_axis(student_logp_NV, idx, axis=-1)
  t_top = jnp.take_along_axis(teacher_logp_NV, idx, axis=-1)
  if not tail:
    s_norm = jax.nn.log_softmax(s_top, axis=-1)
    t_norm = jax.nn.log_softmax(t_top, axis=-1)
    return jnp.sum(jnp.exp(s_norm) * (s_norm - t_norm), axis=-1)
  head = jnp.sum(jnp.exp(s_top) * (s_top - t_top), axis=-1)
  if k == student_logp_NV.shape[-1]:
    return head
  log_ms = losses._log_one_minus_exp(jax.nn.logsumexp(s_top, axis=-1))  # pylint: disable=protected-access
  log_mt = losses._log_one_minus_exp(jax.nn.logsumexp(t_top, axis=-1))  # pylint: disable=protected-access
  return head + jnp.exp(log_ms) * (log_ms - log_mt)


@pytest.mark.parametrize("k", [3, 40, 64])
@pytest.mark.parametrize("tail", [True, False])
def test_the_defaults_are_the_released_computation_bit_for_bit(k, tail):
  rng = np.random.default_rng(1)
  s = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(7, 64)) * 3, jnp.float32))
  t = jax.nn.log_softmax(jnp.asarray(rng.normal(size=(7, 64)) * 3, jnp.float32))
  new = jax.jit(lambda a, b: losses.topk_reverse_kl(a, b, k, tail=tail))(s, t)
  old = jax.jit(lambda a, b: _released(a, b, k, tail))(s, t)
  chex.assert_trees_all_equal(new, old)
  g_new = jax.jit(jax.grad(lambda a: losses.topk_reverse_kl(a, t, k, tail=tail).sum()))(s)
  g_old = jax.jit(jax.grad(lambda a: _released(a, t, k, tail).sum()))(s)
  chex.assert_trees_all_equal(g_new, g_old)


@pytest.mark.parametrize("support,tail,renormalize,capped", [
    ("union", True, True, False), ("teacher", False, False, False), ("union", False, True, True)])
def test_chunked_statistics_carry_the_options(support, tail, renormalize, capped):
  """token_stats' chunked distillation equals the per-row function on the full logits, values
  and gradients, with the options set (the cap at the median token's KL, so it binds on half)."""
  rng = np.random.default_rng(3)
  b, t, d, v, k = 2, 11, 8, 40, 6
  h, th = (jnp.asarray(rng.normal(size=(b, t, d)), jnp.float32) for _ in range(2))
  w, tw = (jnp.asarray(rng.normal(size=(v, d)), jnp.float32) for _ in range(2))
  y = jnp.asarray(rng.integers(0, v, (b, t)))
  clip = 0.0
  if capped:
    s0 = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", h, w)).reshape(-1, v)
    t0 = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", th, tw)).reshape(-1, v)
    clip = float(jnp.median(losses.topk_reverse_kl(s0, t0, k, tail=tail, support=support,
                                                   renormalize=renormalize)))
  opts = dict(tail=tail, support=support, renormalize=renormalize, kl_clip=clip)

  def chunked(h_):
    return losses.token_stats(h_, w, y, chunk=4, teacher_hidden_BTD=th, teacher_unembed_VD=tw,
                              distill_topk=k, distill_tail=tail, distill_support=support,
                              distill_renormalize=renormalize, distill_kl_clip=clip)["distill"]

  def naive(h_):
    s = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", h_, w)).reshape(-1, v)
    te = jax.nn.log_softmax(jnp.einsum("BTD,VD->BTV", th, tw)).reshape(-1, v)
    return losses.topk_reverse_kl(s, te, k, **opts).reshape(b, t)

  chex.assert_trees_all_close(chunked(h), naive(h), rtol=1e-5, atol=1e-6)
  if clip:
    assert 0 < float((naive(h) == clip).mean()) < 1  # the cap binds on some tokens only
  chex.assert_trees_all_close(jax.grad(lambda x: chunked(x).sum())(h),
                              jax.grad(lambda x: naive(x).sum())(h), rtol=1e-4, atol=2e-5)


def test_piplay_presets_keep_the_released_distillation():
  from scope_jax.configs import piplay  # pylint: disable=import-outside-toplevel
  for preset in piplay.PRESETS:
    c = piplay.get_config(preset)
    lc = runtime.loss_config(c, dict(c.piplay.student_loss))
    assert (lc.distill_topk, lc.distill_tail, lc.distill_support, lc.distill_renormalize,
            lc.distill_kl_clip) == (50, True, "student", True, 0.0), preset
  released = LossConfig()
  assert (released.distill_tail, released.distill_support, released.distill_renormalize,
          released.distill_kl_clip) == (True, "student", True, 0.0)


@pytest.mark.parametrize("field,value,match", [
    ("distill_support", "both", r"^Unknown distill_support 'both'; valid: student, teacher, union"),
    ("distill_kl_clip", -1.0, r"^distill_kl_clip=-1.0 must be at least 0"),
])
def test_bad_distillation_options_are_one_line_errors(field, value, match):
  with pytest.raises(ValueError, match=match) as e:
    LossConfig(**{field: value})
  assert "\n" not in str(e.value)
