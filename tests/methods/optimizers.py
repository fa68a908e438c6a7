"""Probes of a policy's optimizer, shared by the methods whose policies train with their own."""

import jax
import jax.numpy as jnp
import numpy as np


def adam_first_update(policy):
  """Adam's first update of a unit gradient: −lr on every entry (the moments normalise it), so
  it reads the rate the schedule gives step 0. Applied eagerly to one-device copies of the
  policy's state: eager ops on arrays sharded over the test mesh run a collective per op, which
  the suite's two busy workers have seen abort."""
  local = lambda tree: jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), tree)
  params, opt_state = local(policy.state.params), local(policy.state.opt_state)
  ones = jax.tree.map(jnp.ones_like, params)
  updates, state = policy.optimizer.update(ones, opt_state, params)
  return np.concatenate([np.asarray(u).ravel() for u in jax.tree.leaves(updates)]), state
