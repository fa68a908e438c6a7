"""The engine's decode chunk compiled for a TPU slice (compile-only devices): it decodes on the
donated cache, with no whole-cache copy and temporaries far below one cache; and on CPU the
in-place loop (in either cache layout) gives the same tokens as the loop over a window copy."""

import importlib.util

import chex
import jax
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params
from scope_jax.models import kv_cache as kvc
from scope_jax.models import ops
from scope_jax.models.config import ModelConfig
from scope_jax.sampling import Engine, Sampler

PROMPTS = [[3, 17, 42, 9, 100, 7, 8, 11, 250], [5], [60, 61, 62, 63], [9, 9, 9, 9, 9, 9, 9]]


@pytest.fixture(autouse=True)
def _no_persistent_cache():
  """Programs compiled for compile-only TPU devices cannot be read back from the cache."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", before)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_decode_chunk_has_no_whole_cache_copy():
  from bench import decode_hlo
  from scope_jax.plan import topology
  # 2 layers, 4 query heads over 2 kv heads of 128 dims (a TPU lane's width, as 7B's)
  config = ModelConfig("qwen2", 1024, 256, 512, 2, 4, 2, 128, rope_theta=1e6, qkv_bias=True,
                       max_position_embeddings=4096)
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5p-8")))
  kw = dict(slots=16, capacity=2048, chunk=4)
  got = decode_hlo.measure(config, mesh, layout=kvc.SLOTS, in_place=True, **kw)
  assert not got["copies"], got["copies"]
  assert got["temp"] < got["cache"] / 4, (got["temp"], got["cache"])
  # Counted in the HLO per step: at least the weights once and the window read (an undercount
  # fails here), at most 1.2x that (1.08x as compiled).
  assert got["minimum"] <= got["step"] <= 1.2 * got["minimum"], (got["step"], got["minimum"])
  # The comparison that makes the test able to fail: a loop over a window copy holds one, and
  # moves it every step (2.9x the minimum as compiled).
  copy = decode_hlo.measure(config, mesh, layout=kvc.SLOTS, in_place=False, **kw)
  assert copy["temp"] >= got["cache"] * 0.9, (copy["temp"], got["cache"])
  assert copy["step"] > 1.5 * got["minimum"], (copy["step"], got["minimum"])


def test_tpu_target_picks_the_slot_major_layout_and_in_place_decode():
  with ops.compiling_for("tpu", 4):
    assert kvc.default_layout() == kvc.SLOTS
    from scope_jax.sampling import slot_ops
    assert slot_ops.in_place_decode()
  assert kvc.default_layout() == kvc.HEADS  # this CPU host


@pytest.mark.parametrize("layout", [kvc.HEADS, kvc.SLOTS])
def test_in_place_decode_matches_the_sampler(layout):
  """Greedy tokens of the engine decoding in place (windows shorter than the capacity, so the
  slice is exercised) are the sampler's, in both layouts."""
  from scope_jax.models import tiny_config
  cfg = tiny_config("qwen2", eos_token_id=2)
  params = init_params(cfg, jax.random.key(0))
  engine = Engine(cfg, params, num_slots=4, chunk=4, max_context=512, min_window=16)
  engine.layout, engine.in_place = layout, True
  engine._shardings = engine._make_shardings()
  ours = engine.generate(PROMPTS, max_new_tokens=12, num_samples=2, eos_ids=())
  assert kvc.cache_layout(engine.cache) == layout
  ref = Sampler(cfg, params).generate(PROMPTS, max_new_tokens=12, num_samples=2, eos_ids=())
  for a, b in zip(ours, ref):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
