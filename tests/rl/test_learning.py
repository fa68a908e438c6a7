"""A tiny model learns a toy verifiable task with GRPO (and with EMA-teacher distillation on)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import init_params, tiny_config
from scope_jax.rl import advantages
from scope_jax.rl.batch import make_batch
from scope_jax.rl.ema import ema_update
from scope_jax.rl.optim import make_optimizer
from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step
from scope_jax.rollout.types import Span, Trajectory
from scope_jax.sampling import Sampler

CFG = tiny_config("qwen2", vocab_size=32, num_layers=1, eos_token_id=None)
DIGITS = np.arange(2, 12)  # token ids of the digits 0..9
G = 8


def _trajectory(prompt, res):
  toks = np.concatenate([prompt, res.tokens]).astype(np.int32)
  lm = np.concatenate([np.zeros(len(prompt)), np.ones(len(res.tokens))]).astype(np.int32)
  lp = np.concatenate([np.zeros(len(prompt)), res.logprobs]).astype(np.float32)
  return Trajectory(toks, lm, lp, len(prompt), [Span(0, len(prompt), "prompt")], [], None, None,
                    res.finish_reason)


def train(steps, distill_coef=0.0, seed=0):
  params = init_params(CFG, jax.random.key(seed))
  teacher = jax.tree.map(jnp.copy, params)
  opt = make_optimizer(3e-3, grad_clip=1.0)
  lc = LossConfig(distill_coef=distill_coef, distill_topk=8, chunk=8)
  step_fn = make_train_step(CFG, lc, opt)
  state = init_train_state(params, opt)
  sampler = Sampler(CFG, state.params)
  prompts = [[1, int(d)] for d in DIGITS]
  mean_rewards = []
  for it in range(steps):
    sampler.update_params(state.params)
    results = sampler.generate(prompts, max_new_tokens=1, temperature=1.0, num_samples=G,
                               seed=seed * 1000 + it)
    rewards = np.array([float(r.tokens[0] == prompts[r.prompt_index][1]) for r in results])
    mean_rewards.append(rewards.mean())
    adv = advantages.group_zscore(rewards.reshape(len(prompts), G)).reshape(-1)
    trajs = [_trajectory(np.asarray(prompts[r.prompt_index]), r) for r in results]
    # the teacher sees a privileged prompt: the digit twice
    teacher_prompts = [[1, p[1], p[1]] for p in prompts for _ in range(G)] if distill_coef else None
    batch = jax.tree.map(jnp.asarray, make_batch(trajs, adv, teacher_prompts=teacher_prompts))
    state, metrics = step_fn(state, batch, None, teacher if distill_coef else None)
    if distill_coef:
      teacher = ema_update(teacher, state.params, 0.05)
  return np.array(mean_rewards), metrics


@pytest.mark.parametrize("distill_coef", [0.0, 0.1])
def test_grpo_learns_to_repeat_the_digit(distill_coef):
  rewards, metrics = train(40, distill_coef)
  start, end = rewards[:5].mean(), rewards[-5:].mean()
  print(f"distill={distill_coef}: mean reward {start:.3f} → {end:.3f}")
  assert start < 0.15 and end > 0.5, rewards
  if distill_coef:
    chex.assert_tree_all_finite(metrics["distill_loss"])
