"""π-Play's distillation term through the train step on multi-turn rows: the student's own
rollout (two generated turns around a tool observation) against a teacher that reads a longer,
privileged prompt, checked against a direct numpy computation from the two models' full logits."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scope_jax.models import init_params, tiny_config, transformer
from scope_jax.rl.batch import make_batch
from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step
from scope_jax.rollout.types import Span, Trajectory

CFG = tiny_config("qwen2", vocab_size=48, num_heads=4, num_kv_heads=2, head_dim=8)
V = CFG.vocab_size


def multi_turn(rng, prompt_len, pieces):
  """prompt, then (kind, length) pieces: 'generated' tokens (mask 1) or a tool 'observation'."""
  toks = list(rng.integers(1, V, prompt_len))
  mask, spans = [0] * prompt_len, [Span(0, prompt_len, "prompt")]
  for kind, n in pieces:
    spans.append(Span(len(toks), len(toks) + n, kind))
    toks += list(rng.integers(1, V, n))
    mask += [int(kind == "generated")] * n
  lp = np.where(np.asarray(mask) > 0, -3.0, 0.0).astype(np.float32)
  return Trajectory(np.asarray(toks, np.int32), np.asarray(mask, np.int32), lp, prompt_len, spans,
                    [], "answer", "x", "final")


def log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def numpy_distill(s_logp, t_logp, k):
  """Reverse KL over the student's top-K tokens plus the tail's collapsed mass (App. C)."""
  p_s, p_t = np.exp(s_logp), np.exp(t_logp)
  top = np.argsort(-s_logp)[:k]
  kl = float(np.sum(p_s[top] * (s_logp[top] - t_logp[top])))
  tail_s, tail_t = 1.0 - p_s[top].sum(), 1.0 - p_t[top].sum()
  if k < len(s_logp) and tail_s > 0:
    kl += tail_s * np.log(tail_s / tail_t)
  return kl


def test_topk_distillation_on_multi_turn_rows_equals_numpy_and_full_kl_at_k_equal_v():
  rng = np.random.default_rng(0)
  trajs = [multi_turn(rng, 5, [("generated", 4), ("observation", 6), ("generated", 3)]),
           multi_turn(rng, 7, [("generated", 2), ("observation", 5), ("generated", 5),
                               ("observation", 3), ("generated", 2)])]
  teacher_prompts = [list(rng.integers(1, V, 11)), list(rng.integers(1, V, 9))]  # the QCP
  batch = make_batch(trajs, [0.0, 0.0], teacher_prompts=teacher_prompts)  # no policy gradient
  key_s, key_t = jax.random.split(jax.random.key(0))
  student, teacher = init_params(CFG, key_s), init_params(CFG, key_t)
  fwd = lambda p, toks, mask: np.asarray(transformer.forward(
      CFG, p, jnp.asarray(toks), attention_mask=jnp.asarray(mask))[0], np.float64)
  s_logp = log_softmax(fwd(student, batch.tokens, batch.mask))
  t_logp = log_softmax(fwd(teacher, batch.teacher_tokens, batch.teacher_mask))
  # both rows hold the same response at the same columns; the prompts differ
  chex.assert_trees_all_equal(batch.tokens * batch.loss_mask.astype(np.int32),
                              batch.teacher_tokens * batch.loss_mask.astype(np.int32))
  for k in (5, V):
    per_seq, gaps = [], []
    for b in range(2):
      cols = np.flatnonzero(batch.loss_mask[b])  # generated tokens only: tool output is masked
      kls = [numpy_distill(s_logp[b, c - 1], t_logp[b, c - 1], k) for c in cols]
      per_seq.append(np.mean(kls))
      y = batch.tokens[b, cols]
      gaps += list(t_logp[b, cols - 1, y] - s_logp[b, cols - 1, y])
    expected = np.mean(per_seq)  # (1/|y|) Σ_t KL_t, averaged over the rows
    lc = LossConfig(distill_coef=1.0, distill_topk=k, chunk=8)
    step = make_train_step(CFG, lc, optax.sgd(0.0))
    _, metrics = step(init_train_state(jax.tree.map(jnp.copy, student), optax.sgd(0.0)),
                      jax.tree.map(jnp.asarray, batch), None, teacher)
    chex.assert_trees_all_close(float(metrics["distill_loss"]), expected, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(float(metrics["teacher_logprob_gap"]), np.mean(gaps), atol=1e-5,
                                rtol=1e-5)
    if k == V:  # the exact reverse KL over the whole vocabulary
      full = np.mean([np.mean([np.sum(np.exp(s_logp[b, c - 1]) *
                                      (s_logp[b, c - 1] - t_logp[b, c - 1]))
                               for c in np.flatnonzero(batch.loss_mask[b])]) for b in range(2)])
      chex.assert_trees_all_close(float(metrics["distill_loss"]), full, atol=1e-5, rtol=1e-5)
    else:
      assert float(metrics["distill_loss"]) != pytest.approx(float(np.mean(
          [numpy_distill(s_logp[0, c - 1], t_logp[0, c - 1], V)
           for c in np.flatnonzero(batch.loss_mask[0])])), rel=1e-6)
