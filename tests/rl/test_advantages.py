"""Advantage estimators and the EMA update, against hand-computed values."""

import math

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.rl import advantages as adv
from scope_jax.rl.ema import ema_update


class AdvantagesTest(chex.TestCase):
  """The estimators are host numpy that group rewards by key in Python, so they have no jit
  variants; the device variants check they give the same values for rewards on the device (as a
  jitted reward would give them) and on the host."""

  @chex.variants(with_device=True, without_device=True)
  def test_group_zscore_population_and_unbiased(self):
    r = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    a = self.variant(lambda x: adv.group_zscore(x, eps=0.0 + 1e-12))(r)
    chex.assert_trees_all_close(a[0], np.array([1, -1, -1, 1]), rtol=1e-6, atol=0)  # std .5
    chex.assert_trees_all_close(a[1], np.array([0, 0, 0, 0]), rtol=1e-7, atol=0)  # zero variance
    chex.assert_trees_all_close((a[0] ** 2).sum(), 4.0, rtol=1e-6, atol=0)  # Σ A² = G (App. D)
    u = self.variant(lambda x: adv.group_zscore(x, std="unbiased", eps=1e-4))(r)
    chex.assert_trees_all_close(u[0],
                                np.array([0.5, -0.5, -0.5, 0.5]) / (math.sqrt(1 / 3) + 1e-4),
                                rtol=1e-6, atol=0)


  @chex.variants(with_device=True, without_device=True)
  def test_group_centring_alone_keeps_small_differences_small(self):
    # SCOPE's Solver rewards by hand: three wrong well-formed answers (0.5·1 + 0.1·1/3) and one
    # malformed call (0.5·1/6); then one right answer among three wrong ones.
    wrong, broken, right = 0.5 + 0.1 / 3, 0.5 / 6, 1.5 + 0.1 / 3
    r = np.array([[wrong, wrong, wrong, broken], [right, wrong, wrong, wrong]])
    a = self.variant(lambda x: adv.group_zscore(x, std="none"))(r)
    chex.assert_trees_all_close(a[0], np.array([0.1125, 0.1125, 0.1125, -0.3375]), rtol=1e-5,
                                atol=0)  # mean 0.42083…: (0.53333 − 0.42083), (0.08333 − 0.42083)
    chex.assert_trees_all_close(a[1], np.array([0.75, -0.25, -0.25, -0.25]), rtol=1e-5, atol=0)
    z = self.variant(lambda x: adv.group_zscore(x, std="unbiased"))(r)
    chex.assert_trees_all_close(z, np.array([[0.5, 0.5, 0.5, -1.5], [1.5, -0.5, -0.5, -0.5]]),
                                rtol=1e-4, atol=0)  # the z-score gives both groups the same scale
  @chex.variants(with_device=True, without_device=True)
  def test_batch_zscore_per_key_and_singletons(self):
    a = self.variant(lambda r: adv.batch_zscore(r, keys=["qa", "qa", "mc", "math"], eps=0.0))(
        np.array([2.0, 4.0, 10.0, 7.0]))
    chex.assert_trees_all_close(a, np.array([-1.0, 1.0, 0.0, 0.0]), rtol=1e-7, atol=0)
    b = self.variant(lambda r: adv.batch_zscore(r, eps=0.0))(np.array([1.0, 2.0, 3.0]))
    chex.assert_trees_all_close(b, np.array([-1, 0, 1]) / math.sqrt(2 / 3), rtol=1e-6, atol=0)

  @chex.variants(with_device=True, without_device=True)
  def test_keyed_zscore_hops(self):
    a = self.variant(lambda r: adv.keyed_zscore(r, keys=[1, 1, 2, 2], delta=1e-6))(
        np.array([1.0, 0.0, 0.5, 0.5]))
    chex.assert_trees_all_close(a, np.array([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0, 0]),
                                rtol=1e-6, atol=0)


def test_bad_inputs():
  with pytest.raises(ValueError, match="3 rewards but 2 keys"):
    adv.batch_zscore([1, 2, 3], keys=[0, 1])
  with pytest.raises(ValueError, match="Unknown std kind"):
    adv.batch_zscore([1, 2], std="sample")


def test_ema_update_hand_values():
  teacher = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([0.0])}
  student = {"w": jnp.array([3.0, 2.0]), "b": jnp.array([10.0])}
  out = ema_update(teacher, student, 0.05)
  chex.assert_trees_all_close(out, {"w": np.array([1.1, 2.0]), "b": np.array([0.5])}, rtol=1e-6,
                              atol=0)
