"""The decoder's Flax NNX modules: the functional API is the module, the params layout and the
logical axes come from the modules' metadata, and a wrong layout fails with a clear message."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import modules, transformer
from scope_jax.models.config import tiny_config

CONFIGS = {
    "qwen2": tiny_config("qwen2"),  # q/k/v biases, untied
    "qwen3": tiny_config("qwen3"),  # q/k norms
    "llama_tied": tiny_config("llama", tie_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_module_and_functional_forward_agree(name):
  config = CONFIGS[name]
  model = modules.Decoder(config, rngs=nnx.Rngs(params=jax.random.key(0)))
  params = transformer.params_of(model)
  chex.assert_trees_all_equal_shapes(params, jax.tree.map(
      jnp.zeros, transformer.param_shapes(config), is_leaf=lambda x: isinstance(x, tuple)))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, config.vocab_size)
  direct, _ = model(tokens)
  functional = transformer.forward_jit(config, params, tokens)
  chex.assert_shape(direct, (2, 7, config.vocab_size))
  chex.assert_trees_all_close(direct, functional, rtol=1e-6, atol=1e-6)
  again = transformer.params_of(transformer.as_module(config, params))
  chex.assert_trees_all_equal(again, params)


def test_decoding_through_the_module_with_a_cache_matches_a_full_forward():
  config = CONFIGS["qwen3"]
  model = modules.Decoder(config, rngs=nnx.Rngs(params=jax.random.key(2)))
  tokens = jax.random.randint(jax.random.key(3), (2, 6), 0, config.vocab_size)
  full, _ = model(tokens)
  cache = kvc.init_cache(config, 2, 8)
  prefill, cache = model(tokens[:, :4], cache=cache)
  step, cache = model(tokens[:, 4:], cache=cache)
  chex.assert_trees_all_close(jnp.concatenate([prefill, step], axis=1), full,
                              rtol=1e-5, atol=1e-5)


def test_logical_axes_are_the_params_metadata():
  config = CONFIGS["qwen2"]
  model = nnx.eval_shape(lambda: modules.Decoder(config, rngs=nnx.Rngs(0)))
  specs = nnx.get_partition_spec(nnx.state(model))
  assert tuple(specs["layers"]["attn"]["q"].value) == ("layers", "embed", "heads", "head_dim")
  assert tuple(specs["embedder"]["embed"].value) == ("vocab", "embed")
  axes = transformer.param_logical_axes(config)
  assert axes["layers"]["q"] == ("layers", "embed", "heads", "head_dim")
  assert axes["layers"]["down"] == ("layers", "mlp", "embed")
  assert axes["final_norm"] == ("norm",) and axes["lm_head"] == ("vocab", "embed")


def test_init_is_deterministic_and_distinct_per_layer():
  config = CONFIGS["qwen2"]
  a = transformer.init_params(config, jax.random.key(0))
  b = transformer.init_params(config, jax.random.key(0))
  chex.assert_trees_all_equal(a, b)
  chex.assert_tree_all_finite(a)
  q = np.asarray(a["layers"]["q"])
  with pytest.raises(AssertionError):  # each stacked layer has its own draw
    chex.assert_trees_all_equal(q[0], q[1])
  assert abs(float(np.std(q)) - 0.02) < 0.005


def test_sharded_init_follows_the_rules_on_an_8_device_mesh():
  config = tiny_config("qwen2", hidden_size=64, intermediate_size=128)
  mesh = shd.make_mesh((1, 8, 1))
  params = transformer.init_sharded_params(config, jax.random.key(0), mesh)
  assert tuple(params["layers"]["gate"].sharding.spec) == (None, "fsdp", None)
  rules = {**shd.TRAIN_RULES, "embed": None, "mlp": "fsdp"}
  moved = transformer.shard_params(params, config, mesh, rules)
  assert tuple(moved["layers"]["gate"].sharding.spec) == (None, None, "fsdp")
  chex.assert_trees_all_equal(jax.device_get(moved), jax.device_get(params))


def test_a_params_tree_of_another_layout_is_refused_with_its_keys():
  config = CONFIGS["qwen2"]
  params = transformer.init_params(config, jax.random.key(0))
  nested = {**params, "layers": {"attn": {"q": params["layers"].pop("q")}, **params["layers"]}}
  with pytest.raises(ValueError, match=r"missing \['layers/q'\], unexpected \['layers/attn/q'\]"):
    transformer.forward(config, nested, jnp.zeros((1, 2), jnp.int32))
