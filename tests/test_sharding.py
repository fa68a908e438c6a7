"""Sharded forward on the 8-device CPU mesh equals the unsharded forward; specs follow the rules."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from scope_jax import sharding as shd
from scope_jax.models import forward, init_params, tiny_config, transformer
from scope_jax.models import kv_cache as kvc
from tests.hf_reference import padded_batch


def test_eight_devices():
  assert jax.device_count() == 8


def test_make_mesh_fills_minus_one_and_rejects_bad_shapes():
  mesh = shd.make_mesh((2, -1, 2))
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
  assert dict(shd.make_mesh({"tensor": 8}).shape) == {"data": 1, "fsdp": 1, "tensor": 8,
                                                       "expert": 1}
  assert dict(shd.make_mesh((1, 2, 1, -1)).shape) == {"data": 1, "fsdp": 2, "tensor": 1,
                                                       "expert": 4}
  with pytest.raises(ValueError, match="needs 6 devices"):
    shd.make_mesh((1, 2, 3))
  with pytest.raises(ValueError, match="Unknown mesh axes"):
    shd.make_mesh({"model": 8})


@pytest.mark.parametrize("mesh_shape", [(1, 2, 4), (2, 4, 1)])
def test_sharded_forward_equals_unsharded(mesh_shape):
  cfg = tiny_config("qwen3", num_heads=8, num_kv_heads=4, head_dim=8, intermediate_size=128)
  params = init_params(cfg, jax.random.key(0))
  tokens, mask = padded_batch(cfg.vocab_size, [8, 5, 3, 8, 1, 6, 7, 2], 8)
  ref, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))

  mesh = shd.make_mesh(mesh_shape)
  sharded = transformer.shard_params(params, cfg, mesh)
  batch = shd.shard_batch({"tokens": tokens, "mask": mask}, mesh)
  fwd = jax.jit(lambda p, t, m: forward(cfg, p, t, attention_mask=m)[0])
  out = fwd(sharded, batch["tokens"], batch["mask"])
  chex.assert_trees_all_close(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mesh_shape", [(1, 1, 1, 8), (1, 2, 1, 4), (2, 1, 2, 2)])
def test_sharded_moe_forward_equals_unsharded(mesh_shape):
  """Qwen3-MoE with its 8 experts split over the `expert` mesh axis (and fsdp / tensor / data)
  gives the unsharded logits and router loads."""
  cfg = tiny_config("qwen3_moe", num_heads=8, num_kv_heads=4, head_dim=8)
  params = init_params(cfg, jax.random.key(0))
  tokens, mask = padded_batch(cfg.vocab_size, [8, 5, 3, 8, 1, 6, 7, 2], 8)
  ref, _, ref_router = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask),
                               return_router=True)
  mesh = shd.make_mesh(mesh_shape)
  sharded = transformer.shard_params(params, cfg, mesh)
  spec = sharded["layers"]["expert_gate"].sharding.spec
  assert spec[1] == "expert" and sharded["layers"]["router"].sharding.spec[2] is None
  batch = shd.shard_batch({"tokens": tokens, "mask": mask}, mesh)
  fwd = jax.jit(lambda p, t, m: forward(cfg, p, t, attention_mask=m, return_router=True))
  out, _, router = fwd(sharded, batch["tokens"], batch["mask"])
  chex.assert_trees_all_close(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_equal(np.asarray(router["load"]), np.asarray(ref_router["load"]))


def test_param_specs_follow_rules_table():
  cfg = tiny_config("qwen2", num_heads=8, num_kv_heads=2, head_dim=8)
  mesh = shd.make_mesh((1, 2, 4))
  params = transformer.init_sharded_params(cfg, jax.random.key(0), mesh)
  layers = params["layers"]
  assert params["embed"].sharding.spec == P("tensor", "fsdp")  # (vocab, embed)
  assert layers["q"].sharding.spec == P(None, "fsdp", "tensor", None)  # (layers, embed, heads, hd)
  assert layers["o"].sharding.spec == P(None, "tensor", None, "fsdp")
  assert layers["gate"].sharding.spec == P(None, "fsdp", "tensor")
  assert layers["down"].sharding.spec == P(None, "tensor", "fsdp")
  assert layers["q_bias"].sharding.spec == P(None, "tensor", None)
  # 2 kv heads cannot be split 4 ways: replicated along that dim, still fsdp on embed.
  assert layers["k"].sharding.spec == P(None, "fsdp", None, None)
  assert layers["attn_norm"].sharding.spec == P(None, None)
  # Each device holds exactly its shard.
  shard = layers["gate"].addressable_shards[0].data
  chex.assert_shape(shard, (cfg.num_layers, cfg.hidden_size // 2, cfg.intermediate_size // 4))


def test_sampling_rules_drop_fsdp():
  cfg = tiny_config("llama", num_heads=8, num_kv_heads=4, head_dim=8)
  mesh = shd.make_mesh((1, 2, 4))
  specs = transformer.param_shardings(cfg, mesh, shd.SAMPLING_RULES)
  assert specs["layers"]["q"].spec == P(None, None, "tensor", None)
  assert specs["layers"]["k"].spec == P(None, None, "tensor", None)
  assert specs["embed"].spec == P("tensor", None)


def test_load_hf_into_mesh_places_shards(tmp_path):
  from scope_jax.models import load_hf, save_hf
  cfg = tiny_config("qwen2", num_heads=8, num_kv_heads=4, head_dim=8)
  params = init_params(cfg, jax.random.key(5))
  save_hf(cfg, params, tmp_path)
  mesh = shd.make_mesh((2, 2, 2))
  _, loaded = load_hf(tmp_path, mesh=mesh)
  expected = transformer.param_shardings(cfg, mesh)
  for a, b, s in zip(jax.tree.leaves(params), jax.tree.leaves(loaded), jax.tree.leaves(expected)):
    assert b.sharding.is_equivalent_to(s, b.ndim)
    chex.assert_trees_all_equal(np.asarray(a), np.asarray(b))


def test_rules_from_an_older_config_get_the_activation_defaults():
  """A config written before activations had rules validates: the activation rules default, and
  rows go where that config's batch rule sends them."""
  old = {k: v for k, v in shd.rules_to_config(shd.TRAIN_RULES).items()
         if not k.startswith("activation_")}
  rules = shd.rules_from_config(old)
  assert {k: rules[k] for k in shd.ACTIVATION_RULES} == dict(shd.ACTIVATION_RULES)
  rules = shd.rules_from_config({**old, "batch": "data"})
  assert rules["activation_batch"] == "data"
  assert shd.rules_from_config(shd.rules_to_config(shd.TRAIN_RULES)) == dict(shd.TRAIN_RULES)
  with pytest.raises(ValueError, match="activation_embed"):
    shd.rules_from_config({**old, "activation_embed": "model"})


def test_constrain_pins_rows_to_the_batch_axes_only_inside_the_context():
  """Outside `activation_sharding` a constraint is the identity; inside, the embedding's output
  is laid out rows over (data, fsdp), features whole, and a one-device mesh changes nothing."""
  mesh = shd.make_mesh((2, 4, 1))
  x = jnp.ones((8, 4, 16))
  axes = ("activation_batch", "activation_length", "activation_embed")
  assert shd.constrain(x, axes) is x
  with shd.activation_sharding(shd.make_mesh((1, 1, 1), jax.devices()[:1])):
    assert shd.active() is None and shd.constrain(x, axes) is x
  with shd.activation_sharding(mesh, shd.TRAIN_RULES):
    spec = shd.activation_spec(axes, x.shape).spec
    out = jax.jit(lambda a: shd.constrain(a * 2, axes))(x)
  assert spec == P(("data", "fsdp"), None, None)
  assert out.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec), 3)
  assert shd.active() is None


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (2, 2, 2)])
def test_forward_with_pinned_activations_equals_unsharded(mesh_shape):
  """The same logits with every layer's activations pinned to the batch axes (FSDP)."""
  cfg = tiny_config("qwen3", num_heads=8, num_kv_heads=4, head_dim=8, intermediate_size=128)
  params = init_params(cfg, jax.random.key(0))
  tokens, mask = padded_batch(cfg.vocab_size, [8, 5, 3, 8, 1, 6, 7, 2], 8)
  ref, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  mesh = shd.make_mesh(mesh_shape)
  sharded = transformer.shard_params(params, cfg, mesh)
  batch = shd.shard_batch({"tokens": tokens, "mask": mask}, mesh)

  def fwd(p, t, m):
    with shd.activation_sharding(mesh, shd.TRAIN_RULES):
      return forward(cfg, p, t, attention_mask=m, remat="full")[0]
  out = jax.jit(fwd)(sharded, batch["tokens"], batch["mask"])
  chex.assert_trees_all_close(np.asarray(out), np.asarray(ref), atol=1e-5, rtol=1e-5)


def test_moe_capacity_drops_in_cache_free_forwards_only():
  """`moe_capacity_factor` applies where the forward has no KV cache (training and scoring); a
  cached forward (prefill, decode) stays dropless. 8 rows of 16 tokens on (1,2,1,4): 16 tokens
  a shard, 32 pairs, of which a shard receives 16 at half the balanced load."""
  cfg = tiny_config("qwen3_moe", num_heads=8, num_kv_heads=4, head_dim=8).replace(
      moe_capacity_factor=0.5)
  params = init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (8, 16), 0, cfg.vocab_size)
  mesh = shd.make_mesh((1, 2, 1, 4))
  sharded = transformer.shard_params(params, cfg, mesh)

  @functools.partial(jax.jit, static_argnums=0)
  def run(c, p, t, cache):
    with shd.activation_sharding(mesh, shd.TRAIN_RULES):
      return forward(c, p, t, cache=cache, return_router=True)[2]

  pairs = 8 * 16 * cfg.num_experts_per_tok
  free = run(cfg, sharded, tokens, None)
  # 8 receiving shards of 16 rows: at most half the pairs, and nearly that (every shard is full)
  assert (free["computed"] <= pairs // 2).all() and (free["computed"] > pairs // 2 - 8).all()
  cache = kvc.init_cache(cfg, 8, 16, jnp.float32)
  cached = run(cfg, sharded, tokens, cache)
  np.testing.assert_array_equal(cached["computed"], np.full(cfg.num_layers, pairs))
  dropless = run(cfg.replace(moe_capacity_factor=0.0), sharded, tokens, None)
  np.testing.assert_array_equal(dropless["computed"], np.full(cfg.num_layers, pairs))
