"""The TPU decode-attention kernel equals `ops.attend_kv` for one query token per row (run in
Pallas's interpreter on the CPU): grouped-query heads, soft cap, a sliding window, rows with
holes, different lengths and no key at all, windows that do or do not fill the last key block;
it is chosen only for a TPU target; and compiled for a TPU slice, the engine's decode chunk
reads about the minimum bytes with no whole-cache copy where XLA's attention relayouts keys."""

import importlib.util

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import decode_attention as da
from scope_jax.models import kv_cache as kvc
from scope_jax.models import ops

pytest.importorskip("jax.experimental.pallas.tpu")

K, G, H = 2, 3, 128


def _case(seed, capacity, w, dtype, kv=K, g=G, h=H):
  """4 rows over a `capacity`-slot buffer read to `w` slots: full, holes, left padding, empty."""
  rng = np.random.default_rng(seed)
  b = 4
  q = rng.normal(size=(b, kv * g, h))
  keys, values = rng.normal(size=(2, b, capacity, kv, h))
  cols = np.arange(w)
  lengths = np.array([w, w * 2 // 3, w // 3, 0])
  valid = cols[None] < lengths[:, None]
  valid[1] &= rng.random(w) > 0.3  # holes
  valid[2] &= cols >= w // 8  # left padding
  slot = np.maximum(lengths - 1, 0)
  valid[np.arange(3), slot[:3]] = True  # a query's own slot holds its key
  pos = np.maximum(np.cumsum(valid, axis=1) - 1, 0).astype(np.int32)
  cast = lambda x: jnp.asarray(x, dtype)
  return (cast(q), cast(keys), cast(values), jnp.asarray(valid), jnp.asarray(slot, jnp.int32),
          jnp.asarray(pos))


def _both(q, keys, values, valid, slot, pos, *, window, cap, scale=0.09):
  w = valid.shape[1]
  q_pos = pos[jnp.arange(pos.shape[0]), slot]
  mask = da.decode_mask(slot, valid, q_pos, pos, window)
  ours = da.attend(q, keys, values, mask, scale=scale, cap=cap, interpret=True)
  kw = dict(q_pos_BT=q_pos[:, None], k_pos_BS=pos, window=window) if window is not None else {}
  theirs = ops.attend_kv(q[:, None], keys[:, :w], values[:, :w], slot[:, None], valid,
                         scale=scale, cap=cap, kv_specs=kvc.attention_specs(kvc.SLOTS), **kw)
  return ours, theirs[:, 0]


@pytest.mark.parametrize("capacity,w", [(384, 300), (768, 768)])  # a ragged last block; 3 whole
@pytest.mark.parametrize("window,cap", [(None, 0.0), (48, 0.0), (0, 5.0), (48, 5.0)])
def test_kernel_equals_attend_kv_in_float32(capacity, w, window, cap):
  case = _case(0, capacity, w, jnp.float32)
  ours, theirs = _both(*case, window=None if window is None else jnp.int32(window), cap=cap)
  chex.assert_trees_all_close(ours, theirs, atol=1e-5, rtol=1e-5)


# Head dim 256 (Gemma-2: 4 kv heads of 2 queries, scores capped at 50, windows of 4,096 on
# every other layer; here 48 keys): the slot view's rows are (tile of heads, piece of 128 dims,
# head), so 2 kv heads (one tile), 8 (one tile of 8) and 16 (two tiles) order them differently.
@pytest.mark.parametrize("kv,g", [(4, 2), (2, 3), (8, 1), (16, 2)])
@pytest.mark.parametrize("window,cap", [(None, 0.0), (48, 50.0), (0, 5.0), (48, 5.0)])
def test_kernel_equals_attend_kv_at_head_dim_256(kv, g, window, cap):
  case = _case(5, 384, 300, jnp.float32, kv=kv, g=g, h=256)
  ours, theirs = _both(*case, window=None if window is None else jnp.int32(window), cap=cap)
  chex.assert_trees_all_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_head_dim_256_over_whole_blocks_in_bfloat16():
  """3 whole blocks of 256 slots, bf16, Gemma-2's cap and a window: as the bf16 test below."""
  case = _case(6, 768, 768, jnp.bfloat16, kv=4, g=2, h=256)
  ours, theirs = _both(*case, window=jnp.int32(200), cap=50.0)
  chex.assert_trees_all_close(ours.astype(jnp.float32), theirs.astype(jnp.float32),
                              atol=2 ** -7, rtol=2 ** -7)


def test_the_slot_view_orders_rows_as_the_tiles_hold_them():
  """Row (s, t, p, i) of the [B, C·R, 128] view holds dims p·128 … of kv head t·T + i of slot s:
  at 16 kv heads of 256 dims (T = 8, R = 32) slot 1's row 32 + 8 + 3 is head 3, dims 128-255."""
  x = jnp.arange(2 * 3 * 16 * 256, dtype=jnp.float32).reshape(2, 3, 16, 256)
  view = da.slot_view(x)
  assert view.shape == (2, 3 * 32, 128)
  chex.assert_trees_all_equal(view[1, 32 + 11], x[1, 1, 3, 128:])
  chex.assert_trees_all_equal(view[0, 16 + 5], x[0, 0, 13, :128])
  assert [da.tile_rows(k, h) for k, h in [(4, 256), (2, 256), (8, 256), (16, 512), (6, 256),
                                          (12, 256), (6, 128), (4, 64)]] == [4, 2, 8, 8, 0, 0, 6, 0]


def test_a_window_shorter_than_one_block():
  ours, theirs = _both(*_case(4, 384, 64, jnp.float32), window=jnp.int32(16), cap=0.0)
  chex.assert_trees_all_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_key_blocks_cover_the_window_inside_the_buffer():
  got = [da.block_size(w, c) for w, c in [(64, 4096), (300, 384), (768, 768), (3000, 4096),
                                          (20480, 20480), (190, 200)]]
  assert got == [128, 128, 256, 512, 512, 0], got
  # At most 8,192 rows of the slot view a block: 16 kv heads of 256 dims hold 32 rows a slot.
  assert [da.block_size(4096, 4096, r) for r in (8, 16, 32, 64, 128)] == [512, 512, 256, 128, 0]


@pytest.mark.parametrize("window,cap", [(None, 0.0), (48, 5.0)])
def test_kernel_equals_attend_kv_in_bfloat16(window, cap):
  """bf16 inputs, float32 softmax: the two round the probabilities (theirs normalised, ours not)
  and the output to bf16, so they agree to about one bf16 step at the outputs' scale (1, step 2^-7)."""
  case = _case(1, 384, 300, jnp.bfloat16)
  ours, theirs = _both(*case, window=None if window is None else jnp.int32(window), cap=cap)
  assert ours.dtype == jnp.bfloat16
  chex.assert_trees_all_close(ours.astype(jnp.float32), theirs.astype(jnp.float32),
                              atol=2 ** -7, rtol=2 ** -7)


def test_grouped_query_shapes_agree_and_masks_matter():
  q, keys, values, valid, slot, pos = _case(2, 384, 256, jnp.float32)
  mask = da.decode_mask(slot, valid)
  flat = da.attend(q, keys, values, mask, interpret=True)
  grouped = da.attend(q.reshape(4, K, G, H), keys, values, mask, interpret=True)
  chex.assert_trees_all_close(flat, grouped, atol=0, rtol=0)
  # The comparison can fail: dropping the mask changes every row but the full one.
  loose = da.attend(q, keys, values, jnp.ones_like(mask), interpret=True)
  diff = np.abs(np.asarray(loose - flat)).max(axis=(1, 2))
  assert (diff[1:] > 1e-3).all(), diff


def test_bad_inputs_say_what_to_fix():
  q, keys, values, valid, slot, _ = _case(3, 384, 300, jnp.float32)
  with pytest.raises(ValueError, match="boolean mask"):
    da.attend(q, keys, values, valid.astype(jnp.float32), interpret=True)
  with pytest.raises(ValueError, match="no key block"):
    da.attend(q, keys[:, :200], values[:, :200], jnp.ones((4, 190), bool), interpret=True)
  with pytest.raises(ValueError, match="sliding window"):
    da.decode_mask(slot, valid, window=8)


def test_kernel_applies_only_to_one_token_over_slots_on_a_tpu(monkeypatch):
  args = (1, kvc.SLOTS, 4096, 4096, 128)
  assert not da.applies(*args)  # this host's CPU
  with ops.compiling_for("tpu", 1):
    assert da.applies(*args) and da.applies(1, kvc.SLOTS, 300, 384, 128)
    assert not da.applies(2, kvc.SLOTS, 4096, 4096, 128)  # a prefill block
    assert not da.applies(1, kvc.HEADS, 4096, 4096, 128)
    assert not da.applies(1, kvc.SLOTS, 4096, 4096, 64)
    assert da.applies(1, kvc.SLOTS, 4096, 4096, 256, 4)  # Gemma-2: the slot view is a bitcast
    assert not da.applies(1, kvc.SLOTS, 4096, 4096, 256, 6)  # (6, 128) tiles: no bitcast view
    assert not da.applies(1, kvc.SLOTS, 190, 200, 128)  # no key block fits the buffer
    monkeypatch.setenv(da.ENV, "off")
    assert not da.applies(*args)
    monkeypatch.setenv(da.ENV, "on")
    with pytest.raises(ValueError, match=da.ENV):
      da.applies(*args)
  monkeypatch.delenv(da.ENV)
  with ops.compiling_for("tpu", 4):  # several devices but no activation sharding: no kernel
    assert not da.applies(*args)


@pytest.fixture
def _no_persistent_cache():
  """Programs compiled for compile-only TPU devices cannot be read back from the cache."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  yield
  jax.config.update("jax_enable_compilation_cache", before)
  jax.clear_caches()  # no trace made with the switch off outlives the test


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_decode_chunk_reads_the_window_once(monkeypatch, _no_persistent_cache):
  """v5p-8, 16 rows × 16,384 slots, 2 layers of 7B-like attention (4 query heads over 2 kv
  heads of 128 dims): with the kernel the chunk's bytes are within 1.2x a step's minimum and no
  whole-cache copy, and its bytes counted in the HLO per step (`plan.hbm`) lie between the
  minimum and 1.2x it (1.02x as compiled): a count below the minimum would be an undercount;
  XLA's attention (the switch off) relayouts the keys and reads more."""
  from scope_jax import sharding as shd
  from scope_jax.models.config import ModelConfig
  from scope_jax.plan import topology
  config = ModelConfig("qwen2", 1024, 256, 512, 2, 4, 2, 128, rope_theta=1e6, qkv_bias=True,
                       max_position_embeddings=16384)
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5p-8")))
  kw = dict(slots=16, capacity=16384, chunk=4, layout=kvc.SLOTS, in_place=True)
  _kernel_within_its_minimum_and_ahead_of_xla(config, mesh, kw, monkeypatch)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_gemma2_decode_at_head_dim_256_reads_the_window_once(monkeypatch,
                                                                  _no_persistent_cache):
  """v5p-8, 16 rows × 16,384 slots, Gemma-2 cut to 2 layers (a sliding and a full one, scores
  capped at 50; 8 query heads over 4 kv heads of 256 dims; small hidden and vocabulary, so the
  cache dominates a step): the kernel runs on the cache's slot view, a bitcast, so the chunk
  has no whole-cache copy and reads within 1.2x a step's minimum (1.09x as compiled; counted in
  the HLO per step, at least the minimum and 1.01x it); XLA's attention (the switch off)
  relayouts the keys and reads more (1.16x)."""
  from bench import decode_hlo
  from scope_jax import sharding as shd
  from scope_jax.models import config as config_lib
  from scope_jax.plan import topology
  config = config_lib.get_preset("gemma2-2b").replace(
      vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
      layer_types=("sliding_attention", "full_attention"))
  assert config.head_dim == 256 and config.attn_softcap and config.sliding_window
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5p-8")))
  kw = dict(slots=16, capacity=16384, chunk=4, layout=kvc.SLOTS, in_place=True)
  traced, _, _ = decode_hlo.decode_program(config, mesh, **kw)
  text = traced.lower().compile().as_text()
  assert text.count('custom_call_target="tpu_custom_call"') == 2  # one kernel per layer
  _kernel_within_its_minimum_and_ahead_of_xla(config, mesh, kw, monkeypatch)


def _kernel_within_its_minimum_and_ahead_of_xla(config, mesh, kw, monkeypatch):
  """The kernel's decode program copies no whole cache and reads within 1.2x a step's minimum
  bytes (never under it); the XLA attention, switched on for comparison, copies and reads more."""
  from bench import decode_hlo
  got = decode_hlo.measure(config, mesh, **kw)
  assert not got["copies"], got["copies"]
  assert got["bytes"] <= 1.2 * got["minimum"], (got["bytes"], got["minimum"])
  assert got["minimum"] <= got["step"] <= 1.2 * got["minimum"], (got["step"], got["minimum"])
  monkeypatch.setenv(da.ENV, "off")
  jax.clear_caches()  # the switch is read when the program is traced
  xla = decode_hlo.measure(config, mesh, **kw)
  assert xla["copies"] and xla["bytes"] > got["bytes"], (xla["copies"], xla["bytes"])
  assert xla["step"] > got["step"], (xla["step"], got["step"])
