"""The learner: the Dr.GRPO normaliser through a real update, skipped non-finite updates, and the
compiled-step cache keyed on the whole loss configuration."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import tiny_config, transformer
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import optim, train_step
from tests.helpers import compiled_steps
from tests.rollout.fakes import random_trajectory

CFG = tiny_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
                  head_dim=16)


def _traj(rng, prompt_len, response_len):
  return random_trajectory(rng, CFG.vocab_size, prompt_len, response_len)


def _learner(mesh, **kw):
  opt = optim.make_optimizer(1e-3, grad_clip=None)
  return learner_lib.Learner(CFG, opt, mesh, micro_batch_rows=2, **kw)


def _policy(learner, mesh, loss):
  params = transformer.init_sharded_params(CFG, jax.random.key(0), mesh)
  return learner.init_policy("p", params, loss)


def test_dr_grpo_normaliser_through_an_update():
  """Σ L·m / (real rows × norm_length): with π_old recomputed (ρ = 1) each token's loss is −A, so
  pg_loss = −(3·1 − 5·0.5 + 2·2) / (3 × 100) whatever the padding (13 padded rows on 8 devices)
  and whatever the batch's width (prompt columns included)."""
  mesh = shd.make_mesh((1, -1, 1))
  rng = np.random.default_rng(0)
  trajs = [_traj(rng, 7, 3), _traj(rng, 4, 5), _traj(rng, 9, 2)]
  loss = train_step.LossConfig(agg_mode="seq-mean-token-sum-norm", norm_length=100)
  learner = _learner(mesh, recompute_old_logp=True)
  policy = _policy(learner, mesh, loss)
  out = learner.train(policy, trajs, [1.0, -0.5, 2.0])
  chex.assert_trees_all_close(out["pg_loss"], -4.5 / 300, rtol=1e-5, atol=0)
  assert out["logprob_gap_mean"] > 0  # the sampler's log-probs, reported beside ρ = 1


def test_a_skipped_update_does_not_advance_the_step():
  mesh = shd.make_mesh((1, -1, 1))
  rng = np.random.default_rng(1)
  learner = _learner(mesh)
  policy = _policy(learner, mesh, train_step.LossConfig())
  before = jax.tree.map(np.asarray, policy.state.params)
  huge = [3e38, 3e38]  # finite advantages whose loss sum overflows: a non-finite update
  out = learner.train(policy, [_traj(rng, 4, 3), _traj(rng, 5, 2)], huge)
  assert out["applied"] == 0.0 and out["skipped"] == 1.0
  assert int(policy.state.step) == 0 and int(policy.state.skipped) == 1
  assert learner.counters["skipped_updates"] == 1
  chex.assert_trees_all_equal(before, jax.tree.map(np.asarray, policy.state.params))
  out = learner.train(policy, [_traj(rng, 4, 3), _traj(rng, 5, 2)], [-1.0, 1.0])
  assert out["applied"] == 1.0 and int(policy.state.step) == 1 and int(policy.state.skipped) == 1


def test_compiled_step_is_keyed_on_the_whole_loss_config():
  """A changed temperature (or β, λ, ...) gets its own compiled step instead of being ignored."""
  mesh = shd.make_mesh((1, -1, 1))
  rng = np.random.default_rng(2)
  trajs = [_traj(rng, 4, 3), _traj(rng, 5, 2)]
  learner = _learner(mesh)
  loss = train_step.LossConfig(temperature=1.0)
  policy = _policy(learner, mesh, loss)
  hot = dataclasses.replace(loss, temperature=0.25)
  a = learner.train(policy, trajs, [1.0, -1.0])
  learner.train(policy, trajs, [1.0, -1.0])
  assert compiled_steps(learner) == 1
  b = learner.train(policy, trajs, [1.0, -1.0], loss=hot)
  assert compiled_steps(learner) == 2
  with pytest.raises(AssertionError):  # the new temperature took effect (np.isclose's tolerances)
    chex.assert_trees_all_close(a["logp_mean"], b["logp_mean"], rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("rows,expected", [(1, 1), (3, 2), (5, 4), (9, 8), (17, 16), (33, 24)])
def test_micro_batch_buckets(rows, expected):
  assert learner_lib.micro_batch_count(rows, 2) == expected


def test_a_nan_reward_drops_its_rows_not_the_update():
  """One group's NaN reward makes its advantages NaN: those rows add no gradient and are counted;
  the rest of the batch still trains (before, the whole update was skipped)."""
  mesh = shd.make_mesh((1, -1, 1))
  rng = np.random.default_rng(3)
  learner = _learner(mesh)
  policy = _policy(learner, mesh, train_step.LossConfig())
  trajs = [_traj(rng, 4, 3), _traj(rng, 5, 2), _traj(rng, 3, 4)]
  out = learner.train(policy, trajs, [np.nan, np.nan, 1.0])
  assert out["applied"] == 1.0 and out["nonfinite_advantage_rows"] == 2.0
  assert int(policy.state.step) == 1
  chex.assert_tree_all_finite(out["loss"])
