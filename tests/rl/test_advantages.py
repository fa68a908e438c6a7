"""Advantage estimators and the EMA update, against hand-computed values."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.rl import advantages as adv
from scope_jax.rl.ema import ema_update


def test_group_zscore_population_and_unbiased():
  r = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
  a = adv.group_zscore(r, eps=0.0 + 1e-12)
  np.testing.assert_allclose(a[0], [1, -1, -1, 1], rtol=1e-6)  # mean .5, population std .5
  np.testing.assert_allclose(a[1], [0, 0, 0, 0])  # zero variance → 0
  np.testing.assert_allclose((a[0] ** 2).sum(), 4.0, rtol=1e-6)  # Σ A² = G (SCOPE App. D)
  u = adv.group_zscore(r, std="unbiased", eps=1e-4)
  np.testing.assert_allclose(u[0], np.array([0.5, -0.5, -0.5, 0.5]) / (math.sqrt(1 / 3) + 1e-4),
                             rtol=1e-6)


def test_batch_zscore_per_key_and_singletons():
  a = adv.batch_zscore([2.0, 4.0, 10.0, 7.0], keys=["qa", "qa", "mc", "math"], eps=0.0)
  np.testing.assert_allclose(a, [-1.0, 1.0, 0.0, 0.0])
  b = adv.batch_zscore([1.0, 2.0, 3.0], eps=0.0)
  np.testing.assert_allclose(b, np.array([-1, 0, 1]) / math.sqrt(2 / 3), rtol=1e-6)


def test_keyed_zscore_hops():
  a = adv.keyed_zscore([1.0, 0.0, 0.5, 0.5], keys=[1, 1, 2, 2], delta=1e-6)
  np.testing.assert_allclose(a, [0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0, 0], rtol=1e-6)


def test_dynamic_sampling_filter():
  keep = adv.nonzero_variance_groups([[1, 1, 1], [0, 0, 0], [0, 1, 0]])
  np.testing.assert_array_equal(keep, [False, False, True])


def test_bad_inputs():
  with pytest.raises(ValueError, match="3 rewards but 2 keys"):
    adv.batch_zscore([1, 2, 3], keys=[0, 1])
  with pytest.raises(ValueError, match="Unknown std kind"):
    adv.batch_zscore([1, 2], std="sample")


def test_ema_update_hand_values():
  teacher = {"w": jnp.array([1.0, 2.0]), "b": jnp.array([0.0])}
  student = {"w": jnp.array([3.0, 2.0]), "b": jnp.array([10.0])}
  out = ema_update(teacher, student, 0.05)
  np.testing.assert_allclose(out["w"], [1.1, 2.0], rtol=1e-6)
  np.testing.assert_allclose(out["b"], [0.5], rtol=1e-6)
