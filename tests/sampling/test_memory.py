"""What a player holds on the devices: a weight refresh never holds two sampling copies, and
engines never hold more KV caches at once than `engine.max_live_caches()` says."""

import chex
import jax
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params, tiny_config, transformer
from scope_jax.sampling import Engine, Request, Sampler
from scope_jax.sampling import engine as engine_lib


def _live_bytes() -> int:
  """Bytes of the arrays that hold device memory (a deleted array still referenced is listed)."""
  return sum(x.nbytes for x in jax.live_arrays() if not x.is_deleted())


@pytest.mark.parametrize("player", [Sampler, Engine])
def test_refresh_deletes_the_old_sampling_copies_before_building_new_ones(player, monkeypatch):
  cfg = tiny_config("qwen2")
  mesh = shd.make_mesh((1, 8, 1))
  trained = transformer.shard_params(init_params(cfg, jax.random.key(0)), cfg, mesh)
  sampler = player(cfg, trained, mesh=mesh)
  old = list(sampler._copies)
  shared = [x for x in jax.tree.leaves(sampler.params) if all(x is not c for c in old)]
  assert old and shared  # the layout moves the weights and keeps the norms
  seen = []
  build = transformer.sampling_params

  def spy(*args, **kw):
    seen.append([x.is_deleted() for x in old])
    return build(*args, **kw)
  monkeypatch.setattr(transformer, "sampling_params", spy)
  new = transformer.shard_params(init_params(cfg, jax.random.key(1)), cfg, mesh)
  before = _live_bytes()
  sampler.update_params(new)
  assert _live_bytes() == before  # the new copies took the old ones' place
  assert seen == [[True] * len(old)]  # all gone before the new copies were made
  assert not any(x.is_deleted() for x in shared)  # the trained params' own arrays stay
  assert not any(x.is_deleted() for x in jax.tree.leaves((trained, new)))
  made = sum(x.nbytes for x in sampler._copies)
  assert made == sum(x.nbytes for x in old)
  again = sampler.update_params(new) or sampler._copies  # refreshing with the same weights
  assert all(not x.is_deleted() for x in jax.tree.leaves(sampler.params))
  assert len(again) == len(old)


def test_an_engine_frees_idle_engines_with_parked_slots_before_allocating():
  cfg = tiny_config("qwen2", eos_token_id=2)
  params = init_params(cfg, jax.random.key(0))
  engine_lib.free_caches()
  first = Engine(cfg, params, num_slots=2, chunk=4, max_context=128)
  first.add(Request("turn", [3, 4, 5], 3))
  while first.busy():
    first.step()
  assert first.slots[0].owner == "turn"  # parked for its next turn
  second = Engine(cfg, params, num_slots=2, chunk=4, max_context=128)
  second.generate([[7, 8]], max_new_tokens=2)
  assert first.cache is None and second.cache is not None
  assert engine_lib.live_caches() == 1 == engine_lib.max_live_caches()
  # the parked key's next turn prefills its whole context again: the same tokens
  ref = Sampler(cfg, params).generate([[3, 4, 5]], max_new_tokens=6, eos_ids=())[0].tokens
  first.add(Request("turn", [3, 4, 5] + ref[:3].tolist(), 3))
  out = []
  while first.busy():
    out += first.step()
  chex.assert_trees_all_equal(np.asarray(out[0].tokens), np.asarray(ref[3:6]))
