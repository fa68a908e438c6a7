"""Helpers only the tests use: statistics and counters that no run reads."""

import jax
import jax.numpy as jnp

from scope_jax.models.config import ModelConfig


def router_metrics(config: ModelConfig, router) -> dict[str, jax.Array]:
  """Expert-load statistics of a forward's router output: each expert's share of the routed
  (token, expert) pairs over all layers, the largest share, and the share of pairs dropped
  (past a capacity; 0 when dropless)."""
  if router is None:
    return {}
  load_E = router["load"].sum(0)
  total = jnp.maximum(load_E.sum(), 1.0)
  routed = router["tokens"].sum() * config.num_experts_per_tok
  out = {f"router/load_expert_{e}": load_E[e] / total for e in range(config.num_experts)}
  out["router/max_load"] = load_E.max() / total
  out["router/dropped"] = 1.0 - router["computed"].sum() / jnp.maximum(routed, 1.0)
  return out


def compiled_steps(learner) -> int:
  """How many train steps a `Learner` has compiled (one per loss configuration, micro-batch count
  and optimizer): the compile-count tests' measure."""
  return len(learner._steps)  # pylint: disable=protected-access
