"""`model` sections → (config, params): tied embeddings on request, one-line errors otherwise."""

import ml_collections
import pytest

from scope_jax import sharding as shd
from scope_jax.configs_base import DEMO_TINY_MODEL
from scope_jax.models import load

MESH = shd.make_mesh((1, -1, 1))


def _section(**kw):
  return ml_collections.ConfigDict(dict(source="tiny", tiny=dict(DEMO_TINY_MODEL, tie_embeddings=False),
                                        param_dtype="float32", tie_embeddings="auto") | kw)


def test_tie_embeddings_yes_ties_a_random_architecture():
  untied, params = load.load_model(_section(), MESH, 0)
  assert not untied.tie_embeddings and "lm_head" in params
  tied, params = load.load_model(_section(tie_embeddings="yes"), MESH, 0)
  assert tied.tie_embeddings and "lm_head" not in params
  assert tied.num_params() == untied.num_params() - untied.vocab_size * untied.hidden_size


def test_an_unknown_tie_choice_is_one_line():
  with pytest.raises(ValueError, match=r"model.tie_embeddings='maybe'; use 'auto'"):
    load.load_model(_section(tie_embeddings="maybe"), MESH, 0)


@pytest.mark.parametrize("model_type", ["qwen2", "gemma2"])
def test_the_sampling_copy_in_the_compute_dtype_gives_the_same_logits(model_type):
  """A float32 master copy sampled in bfloat16: the leaves the sampling layout moves are copied
  in bfloat16 (the forward casts them to it before use), norm scales (and Gemma's scaled
  embedding) stay float32, unmoved leaves are shared; the logits are bit for bit the same."""
  import chex
  import jax
  import jax.numpy as jnp
  from scope_jax.models import init_params, tiny_config, transformer
  overrides = dict(query_pre_attn_scalar=16.0) if model_type == "gemma2" else {}
  cfg = tiny_config(model_type, hidden_size=64, intermediate_size=128, num_heads=4,
                    num_kv_heads=2, head_dim=16, vocab_size=256, **overrides)
  params = transformer.shard_params(init_params(cfg, jax.random.key(0)), cfg, MESH)
  copy = transformer.sampling_params(params, cfg, MESH, shd.SAMPLING_RULES, jnp.bfloat16)
  flat = dict(jax.tree_util.tree_flatten_with_path(copy)[0])
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    name, got = str(path[-1].key), flat[path]
    moved = not x.sharding.is_equivalent_to(got.sharding, x.ndim)
    keep = "norm" in name or (name == "embed" and model_type == "gemma2")
    assert got.dtype == (jnp.float32 if keep or not moved else jnp.bfloat16), (name, got.dtype)
    if not moved:
      assert got is x, name
  assert any(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(copy))
  tokens = jax.random.randint(jax.random.key(1), (8, 12), 0, 256)
  same_layout = transformer.shard_params(params, cfg, MESH, shd.SAMPLING_RULES)
  chex.assert_trees_all_equal(transformer.forward_jit(cfg, copy, tokens, dtype=jnp.bfloat16),
                              transformer.forward_jit(cfg, same_layout, tokens,
                                                      dtype=jnp.bfloat16))
