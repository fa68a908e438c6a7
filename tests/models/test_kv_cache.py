"""Incremental decoding through the KV cache must reproduce the full-sequence logits."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import forward, init_cache, init_params, tiny_config
from scope_jax.models import kv_cache as kvc
from scope_jax.models.transformer import forward_jit
from tests.hf_reference import padded_batch


def _reference_logits(cfg, params, seqs):
  """Logits of each unpadded sequence, from one right-padded batched forward (no cache)."""
  width = max(len(s) for s in seqs)
  tokens = np.zeros((len(seqs), width), np.int32)
  mask = np.zeros_like(tokens)
  for i, s in enumerate(seqs):
    tokens[i, :len(s)], mask[i, :len(s)] = s, 1
  out = np.asarray(forward_jit(cfg, params, jnp.asarray(tokens), jnp.asarray(mask)))
  return [out[i, :len(s)] for i, s in enumerate(seqs)]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3", "gemma2", "olmo3", "qwen3_moe"])
@pytest.mark.parametrize("left", [True, False])
def test_prefill_then_decode_matches_full_forward(model_type, left):
  """Gemma-2 / OLMo-3 (windows of 4 positions): prompts of up to 9 tokens and 5 decode steps
  cross the window boundary both inside the prefill and during decoding."""
  cfg = tiny_config(model_type)
  params = init_params(cfg, jax.random.key(0))
  lengths, prompt_len, new = [9, 4, 6], 9, 5
  prompt, pmask = padded_batch(cfg.vocab_size, lengths, prompt_len, left=left, seed=1)
  cont = np.random.default_rng(2).integers(0, cfg.vocab_size, (3, new)).astype(np.int32)

  cache = init_cache(cfg, 3, 32)
  logits, cache = jax.jit(lambda p, t, m, c: forward(cfg, p, t, attention_mask=m, cache=c))(
      params, jnp.asarray(prompt), jnp.asarray(pmask), cache)
  step_logits = [np.asarray(logits)]
  step = jax.jit(lambda p, t, c: forward(cfg, p, t, cache=c))
  for i in range(new):
    out, cache = step(params, jnp.asarray(cont[:, i:i + 1]), cache)
    step_logits.append(np.asarray(out))
  got = np.concatenate(step_logits, axis=1)  # [B, prompt_len + new, V]

  # Reference: each row's real tokens followed by the continuation, without a cache.
  seqs = [np.concatenate([prompt[b][pmask[b].astype(bool)], cont[b]]) for b in range(3)]
  refs = _reference_logits(cfg, params, seqs)
  for b, ref in enumerate(refs):
    ours = np.concatenate([got[b, :prompt_len][pmask[b].astype(bool)], got[b, prompt_len:]])
    chex.assert_trees_all_close(ours, ref, atol=1e-5, rtol=0)
  # Left padding leaves holes, right padding is overwritten: the row's end is just after its last token.
  expected_end = np.array([prompt_len] * 3) if left else np.array(lengths)
  chex.assert_trees_all_equal(np.asarray(cache.end), expected_end + new)
  chex.assert_trees_all_equal(np.asarray(cache.next_pos), np.array(lengths) + new)


def test_multi_token_blocks_and_fork():
  """A right-padded appended block (a tool observation) and a G-way fork keep exact logits."""
  cfg = tiny_config("qwen2")
  params = init_params(cfg, jax.random.key(3))
  prompt, pmask = padded_batch(cfg.vocab_size, [5, 3], 5, left=True, seed=4)
  step = jax.jit(lambda p, t, m, c: forward(cfg, p, t, attention_mask=m, cache=c))
  cache = init_cache(cfg, 2, 40)
  _, cache = step(params, jnp.asarray(prompt), jnp.asarray(pmask), cache)
  cache = kvc.fork(cache, 3)  # rows: p0, p0, p0, p1, p1, p1
  block, bmask = padded_batch(cfg.vocab_size, [4, 2, 1, 3, 4, 2], 4, left=False, seed=5)
  logits, cache = step(params, jnp.asarray(block), jnp.asarray(bmask), cache)
  nxt = np.arange(6, dtype=np.int32)[:, None] + 7
  last, _ = step(params, jnp.asarray(nxt), jnp.ones((6, 1), jnp.int32), cache)
  seqs = [np.concatenate([prompt[r // 3][pmask[r // 3] > 0], block[r][bmask[r] > 0], nxt[r]])
          for r in range(6)]
  for r, ref in enumerate(_reference_logits(cfg, params, seqs)):
    nb = int(bmask[r].sum())
    chex.assert_trees_all_close(np.asarray(logits)[r, :nb], ref[-1 - nb:-1], atol=1e-5, rtol=0)
    chex.assert_trees_all_close(np.asarray(last)[r, 0], ref[-1], atol=1e-5, rtol=0)


def test_positions_default_count_real_tokens():
  mask = jnp.array([[0, 0, 1, 1], [1, 1, 1, 0]])
  chex.assert_trees_all_equal(kvc.positions_for_block(None, mask),
                              np.array([[0, 0, 0, 1], [0, 1, 2, 2]]))


@pytest.mark.parametrize("model_type", ["qwen2", "gemma2", "qwen3_moe"])
def test_presliced_layers_match_stacked(model_type):
  """`layers=layer_params(...)` (what decode loops pass, sliced once per call) gives the same
  logits and cache as slicing the stacked weights inside the forward."""
  from scope_jax.models import transformer
  cfg = tiny_config(model_type)
  params = init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 5)), jnp.int32)
  run = jax.jit(lambda p, t, c, sliced: forward(
      cfg, p, t, cache=c, layers=transformer.layer_params(cfg, p) if sliced else None),
      static_argnums=3)
  want = run(params, tokens, init_cache(cfg, 2, 16), False)
  got = run(params, tokens, init_cache(cfg, 2, 16), True)
  chex.assert_trees_all_equal(got, want)
  assert len(transformer.layer_params(cfg, params)) == cfg.num_layers
  with pytest.raises(ValueError, match="without a cache"):
    forward(cfg, params, tokens, layers=transformer.layer_params(cfg, params))


def test_cache_writes_stay_on_the_rows_shard():
  """A cache sharded over its rows is written where each row lives: writing a block compiles to
  no collective (indexing rows by an index array gathered every step's keys to every device)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  rows = NamedSharding(mesh, P("data"))
  cfg = tiny_config("qwen2")
  cache = jax.device_put(init_cache(cfg, 16, 32), rows)
  slots_BT = jax.device_put(jnp.tile(jnp.arange(3, 5, dtype=jnp.int32), (16, 1)), rows)
  new_BTKH = jax.device_put(jnp.ones((16, 2, cfg.num_kv_heads, cfg.head_dim)), rows)
  mask_BT = jax.device_put(jnp.ones((16, 2), bool), rows)

  def write(cache, slots_BT, new_BTKH, mask_BT):
    return (kvc.write_keys(cache.k[0], slots_BT, new_BTKH),
            kvc.write_values(cache.v[0], slots_BT, new_BTKH),
            kvc.written_valid(cache, slots_BT, mask_BT),
            kvc.written_pos(cache, slots_BT, slots_BT))

  compiled = jax.jit(write).lower(cache, slots_BT, new_BTKH, mask_BT).compile().as_text()
  assert not any(op in compiled for op in ("all-gather", "all-reduce", "all-to-all",
                                           "collective-permute"))
  k, v, valid, pos = jax.jit(write)(cache, slots_BT, new_BTKH, mask_BT)
  chex.assert_trees_all_equal(np.asarray(k)[:, :, :, 3:5], np.ones((16, 2, cfg.head_dim, 2)))
  chex.assert_trees_all_equal(np.asarray(v)[:, :, 3:5], np.ones((16, 2, 2, cfg.head_dim)))
  assert np.asarray(valid)[:, 3:5].all() and not np.asarray(valid)[:, 5:].any()
  chex.assert_trees_all_equal(np.asarray(pos)[:, 3:5], np.tile([3, 4], (16, 1)))
