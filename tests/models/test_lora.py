"""LoRA adapters: the base model's function at init (full forward and cached decode), exact
gradients (finite differences), the adapter forward equals the merged weights, a sharded LoRA
train step equals an unsharded one, and a refresh moves only the adapters."""

import gc

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params, lora, tiny_config, transformer
from scope_jax.models import kv_cache as kvc
from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step, place_batch
from scope_jax.sampling import Engine, Sampler
from scope_jax.sampling import sampler as sampler_lib
from tests.rl.test_train_step import _batch, capture_grads

CFG = tiny_config("qwen2", num_heads=8, num_kv_heads=4, head_dim=8)
LC = lora.LoraConfig(rank=4, alpha=8.0)  # scale 2: a missing or doubled scale shows


def _base(cfg=CFG, seed=0):
  return init_params(cfg, jax.random.key(seed))


def _trained(adapters, seed=3, std=0.05):
  """Adapters with random non-zero b (and a moved), as after some updates."""
  leaves, tree = jax.tree.flatten(adapters)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + std * jax.random.normal(k, x.shape)
                                   for x, k in zip(leaves, keys)])


def _tokens(b=2, t=9, seed=2):
  return jax.random.randint(jax.random.key(seed), (b, t), 0, CFG.vocab_size)


def test_shapes_and_axes_follow_the_base_weights():
  shapes, axes = lora.adapter_shapes(CFG, LC), lora.adapter_axes(CFG, LC)
  L, D, N, K, H, F = 2, CFG.hidden_size, 8, 4, 8, CFG.intermediate_size
  assert shapes["q"] == {"a": (L, D, 4), "b": (L, 4, N, H)}
  assert shapes["k"] == {"a": (L, D, 4), "b": (L, 4, K, H)}
  assert shapes["o"] == {"a": (L, N, H, 4), "b": (L, 4, D)}
  assert shapes["down"] == {"a": (L, F, 4), "b": (L, 4, D)}
  assert axes["o"] == {"a": ("layers", "heads", "head_dim", None), "b": ("layers", None, "embed")}
  assert LC.scale == 2.0 and lora.LoraConfig(rank=8).scale == 1.0


@pytest.mark.parametrize("family", ["qwen2", "gemma2", "qwen3"])
def test_at_init_the_logits_are_the_base_models_exactly(family):
  cfg = tiny_config(family)
  base = _base(cfg)
  adapters = lora.init_adapters(cfg, LC, jax.random.key(1))
  assert all(float(jnp.abs(w["a"]).max()) > 0 for w in adapters.weights.values())
  tokens = _tokens()
  want = transformer.forward_jit(cfg, base, tokens)
  got = transformer.forward_jit(cfg, lora.view(base, adapters), tokens)
  chex.assert_trees_all_equal(got, want)


def _cached(cfg, params, tokens):
  """Prefill all but the last token into a cache, then one decode step: both steps' logits."""
  @jax.jit
  def run(params, tokens):
    cache = kvc.init_cache(cfg, tokens.shape[0], 32)
    first, cache = transformer.forward(cfg, params, tokens[:, :-1], cache=cache)
    layers = transformer.layer_params(cfg, params)
    last, _ = transformer.forward(cfg, params, tokens[:, -1:], cache=cache, layers=layers)
    return first, last
  return run(params, tokens)


def test_at_init_the_cached_decode_and_the_sampler_match_the_base_exactly():
  base = _base()
  adapters = lora.init_adapters(CFG, LC, jax.random.key(1))
  tokens = _tokens()
  chex.assert_trees_all_equal(_cached(CFG, lora.view(base, adapters), tokens),
                              _cached(CFG, base, tokens))
  prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
  for player in (Sampler, Engine):
    want = player(CFG, base).generate(prompts, max_new_tokens=6, temperature=1.0, seed=4)
    got = player(CFG, lora.view(base, adapters)).generate(prompts, max_new_tokens=6,
                                                          temperature=1.0, seed=4)
    chex.assert_trees_all_equal([(r.tokens, r.logprobs) for r in got],
                                [(r.tokens, r.logprobs) for r in want])


def test_trained_adapters_change_the_logits_and_equal_the_merged_weights():
  base = _base()
  adapters = _trained(lora.init_adapters(CFG, LC, jax.random.key(1)))
  tokens = _tokens()
  viewed = transformer.forward_jit(CFG, lora.view(base, adapters), tokens)
  merged = transformer.forward_jit(CFG, lora.merge(lora.view(base, adapters)), tokens)
  plain = transformer.forward_jit(CFG, base, tokens)
  assert float(jnp.abs(viewed - plain).max()) > 0.1  # the adapters do something
  chex.assert_trees_all_close(viewed, merged, atol=2e-5, rtol=0)
  chex.assert_trees_all_close(_cached(CFG, lora.view(base, adapters), tokens),
                              _cached(CFG, lora.merge(lora.view(base, adapters)), tokens),
                              atol=2e-5, rtol=0)


def test_merge_is_w_plus_scale_a_b_by_hand():
  base = _base()
  adapters = _trained(lora.init_adapters(CFG, LC, jax.random.key(1)))
  merged = lora.merge(lora.view(base, adapters))
  a, b = (np.asarray(adapters.weights["o"][k], np.float64) for k in "ab")
  l, n, h = 1, 3, 5
  want = np.asarray(base["layers"]["o"])[l, n, h] + 2.0 * a[l, n, h] @ b[l]
  chex.assert_trees_all_close(np.asarray(merged["layers"]["o"])[l, n, h], want, atol=1e-6,
                              rtol=0)
  assert lora.merge(base) is base


def test_gradients_equal_central_differences():
  base = _base()
  adapters = _trained(lora.init_adapters(CFG, LC, jax.random.key(1)), std=0.2)
  tokens = _tokens(t=6)
  weights = jax.random.normal(jax.random.key(5), (2, 6, CFG.vocab_size))

  def f(ad):
    logits, _ = transformer.forward(CFG, lora.view(base, ad), tokens)
    return jnp.sum(weights * logits)

  grads = jax.jit(jax.grad(f))(adapters)
  f_jit, eps = jax.jit(f), 1e-2
  rng = np.random.default_rng(0)
  checked = 0
  for target in ("q", "o", "down", "v"):
    for part in ("a", "b"):
      x = adapters.weights[target][part]
      for _ in range(2):
        idx = tuple(int(rng.integers(s)) for s in x.shape)

        def moved(d):
          w = {t: dict(v) for t, v in adapters.weights.items()}
          w[target][part] = x.at[idx].add(d)
          return lora.Adapters(w, adapters.scale)
        fd = (float(f_jit(moved(eps))) - float(f_jit(moved(-eps)))) / (2 * eps)
        got = float(grads.weights[target][part][idx])
        assert abs(got - fd) <= 2e-2 * max(abs(fd), 1.0), (target, part, idx, got, fd)
        checked += abs(fd) > 1e-2
  assert checked >= 8  # the entries checked carry gradient


def test_moe_models_adapt_attention_only():
  cfg = tiny_config("qwen3_moe")
  assert set(lora.adapter_shapes(cfg, LC)) == {"q", "k", "v", "o"}
  base = _base(cfg)
  adapters = lora.init_adapters(cfg, LC, jax.random.key(1))
  tokens = _tokens()
  chex.assert_trees_all_equal(transformer.forward_jit(cfg, lora.view(base, adapters), tokens),
                              transformer.forward_jit(cfg, base, tokens))


def test_moe_models_with_mlp_targets_only_are_refused():
  with pytest.raises(ValueError, match="adapts nothing in this mixture-of-experts model"):
    lora.adapter_shapes(tiny_config("qwen3_moe"), lora.LoraConfig(rank=2, targets=("up",)))


def test_targets_choose_the_projections():
  only = lora.LoraConfig(rank=2, targets=("q", "v"))
  adapters = lora.init_adapters(CFG, only, jax.random.key(1))
  assert set(adapters.weights) == {"q", "v"}
  base, tokens = _base(), _tokens()
  trained = _trained(adapters)
  chex.assert_trees_all_close(
      transformer.forward_jit(CFG, lora.view(base, trained), tokens),
      transformer.forward_jit(CFG, lora.merge(lora.view(base, trained)), tokens), atol=2e-5)


@pytest.mark.parametrize("section,message", [
    ({"rank": 4, "dropout": 0.1}, "lora.dropout=0.1 is not supported; set it to 0."),
    ({"rank": 4, "targets": "q,proj"}, "names unknown modules ['proj']"),
    ({"rank": -1}, "lora.rank must be 0 (off) or positive"),
])
def test_bad_settings_are_one_line_errors(section, message):
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                     .replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
    lora.from_config(section)
  assert lora.from_config({"rank": 4, "targets": "q, v"}).targets == ("q", "v")


def _lora_grads(mesh, micro=2):
  """Adapter gradients of one LoRA train step (the capture optimizer keeps the raw gradient)."""
  base = _base()
  adapters = _trained(lora.init_adapters(CFG, LC, jax.random.key(1)))
  if mesh is not None:
    base = transformer.shard_params(base, CFG, mesh)
    adapters = lora.place(adapters, CFG, mesh, shd.TRAIN_RULES)
  step = make_train_step(CFG, LossConfig(chunk=8), capture_grads(), micro_batches=micro,
                         mesh=mesh)
  before = jax.tree.map(np.asarray, base)
  new, metrics = step(init_train_state(adapters, capture_grads()), place_batch(_batch(), mesh),
                      None, None, base)
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, base), before)  # not donated, unchanged
  return jax.tree.map(np.asarray, new.opt_state), metrics


def test_a_lora_train_step_sharded_equals_unsharded():
  single, ms = _lora_grads(None)
  sharded, mm = _lora_grads(shd.make_mesh((1, 2, 4)))
  assert isinstance(single, lora.Adapters) and set(single.weights) == set(lora.TARGETS)
  assert float(ms["grad_norm"]) > 0
  for a, b in zip(jax.tree.leaves(single), jax.tree.leaves(sharded)):
    chex.assert_trees_all_close(a, b, rtol=1e-6, atol=1e-6 * np.abs(a).max())
  chex.assert_trees_all_close(ms["grad_norm"], mm["grad_norm"], rtol=1e-5, atol=0)


def test_the_train_step_gradient_is_the_adapters_gradient_of_the_loss():
  """The step's adapter gradient equals jax.grad of the same loss over the plain forward of the
  merged weights, through the chain rule (a different program: W + s·a·b, differentiated)."""
  base = _base()
  adapters = _trained(lora.init_adapters(CFG, LC, jax.random.key(1)))
  batch = _batch()
  step = make_train_step(CFG, LossConfig(chunk=8), capture_grads())
  new, _ = step(init_train_state(jax.tree.map(jnp.copy, adapters), capture_grads()),
                place_batch(batch, None), None, None, base)  # the step donates its state
  plain = make_train_step(CFG, LossConfig(chunk=8), capture_grads())
  merged = lora.merge(lora.view(base, adapters))
  full, _ = plain(init_train_state(merged, capture_grads()), place_batch(batch, None))
  for t in adapters.weights:  # dL/da = s · G·bᵀ, dL/db = s · aᵀ·G (over the in/out dims)
    a, b = (np.asarray(adapters.weights[t][k], np.float64) for k in "ab")
    g = np.asarray(full.opt_state["layers"][t], np.float64)
    l, r = a.shape[0], a.shape[-1]
    g_LIO = g.reshape(l, -1, int(np.prod(b.shape[2:])))
    want_a = 2.0 * np.einsum("LIO,LRO->LIR", g_LIO, b.reshape(l, r, -1)).reshape(a.shape)
    want_b = 2.0 * np.einsum("LIR,LIO->LRO", a.reshape(l, -1, r), g_LIO).reshape(b.shape)
    got = new.opt_state.weights[t]
    chex.assert_trees_all_close(np.asarray(got["a"]), want_a, rtol=0,
                                atol=1e-4 * np.abs(want_a).max())
    chex.assert_trees_all_close(np.asarray(got["b"]), want_b, rtol=0,
                                atol=1e-4 * np.abs(want_b).max())


@pytest.mark.parametrize("player", [Sampler, Engine])
def test_a_refresh_moves_only_the_adapters_and_players_share_the_base(player):
  mesh = shd.make_mesh((1, 8, 1))
  base = transformer.shard_params(_base(), CFG, mesh)
  adapters = lora.init_sharded_adapters(CFG, LC, jax.random.key(1), mesh)
  sampler = player(CFG, lora.view(base, adapters), mesh=mesh)
  placed_base, _ = lora.split(sampler.params)
  assert not all(x is y for x, y in zip(jax.tree.leaves(placed_base), jax.tree.leaves(base)))
  second = player(CFG, lora.view(base, _trained(adapters, seed=8)), mesh=mesh)
  assert all(x is y for x, y in zip(jax.tree.leaves(lora.split(second.params)[0]),
                                    jax.tree.leaves(placed_base)))  # one copy for every player
  frozen = player(CFG, base, mesh=mesh)  # plain params that are a placed base: shared too
  assert all(x is y for x, y in zip(jax.tree.leaves(frozen.params),
                                    jax.tree.leaves(placed_base)))
  assert not frozen._copies
  holders = lambda: sum(e[3] for e in sampler_lib._PLACED_BASES.values())
  before = holders()
  del second
  gc.collect()
  assert holders() == before - 1  # a collected player lets go of the base
  new = _trained(adapters)
  sampler.update_params(lora.view(base, new))
  again_base, placed_adapters = lora.split(sampler.params)
  assert all(x is y for x, y in zip(jax.tree.leaves(placed_base), jax.tree.leaves(again_base)))
  assert not any(x.is_deleted() for x in jax.tree.leaves(again_base))
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, placed_adapters),
                              jax.tree.map(np.asarray, new))
  other = transformer.shard_params(_base(seed=9), CFG, mesh)  # a new base (a rebase) is placed
  sampler.update_params(lora.view(other, new))
  assert not any(x is y for x, y in zip(jax.tree.leaves(lora.split(sampler.params)[0]),
                                        jax.tree.leaves(again_base)))
  sampler.update_params(other)  # back to plain params
  assert lora.split(sampler.params)[1] is None
