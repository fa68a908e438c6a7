"""The routed experts' two paths agree: megablox's grouped matmul (interpreted on the CPU) equals
`ragged_dot`, and the expert-parallel layer (route, exchange, local kernel, exchange back) on the
8-device CPU mesh equals the unsharded one, outputs and gradients."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import moe

TOL = dict(rtol=1e-5, atol=1e-5)


def _normal(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


@pytest.mark.parametrize("first,sizes,tile,others", [
    (0, [5, 0, 17, 9, 0, 3], 16, 0),  # every expert local, tiles of 16 rows shared by groups;
    # rows past the groups (34 of 48), which the kernel leaves unwritten
    (0, [5, 0, 17, 9, 0, 3], 16, 2),  # the same with 2 experts on other shards
    (6, [0, 11, 0, 20], 128, 2),  # a shard whose local experts start at global expert 6
])
def test_gmm_interpreted_equals_ragged_dot_forward_and_gradients(first, sizes, tile, others):
  rows, d, f = 48, 16, 32
  el = len(sizes)
  x_RD, w_EDF = _normal(0, (rows, d)), _normal(1, (el, d, f), 0.3)
  ct_RF = _normal(2, (rows, f))
  sizes = jnp.asarray(sizes, jnp.int32)

  def loss(kernel):
    def f_(x, w):
      return jnp.sum(moe.grouped_matmul(x, w, sizes, jnp.int32(first), first + el + others, kernel,
                                        tile) * ct_RF)
    return f_

  want = jax.lax.ragged_dot(x_RD, w_EDF, sizes)
  used = int(sizes.sum())
  got = moe.grouped_matmul(x_RD, w_EDF, sizes, jnp.int32(first), first + el + others,
                           "gmm_interpret", tile)
  chex.assert_trees_all_close(got[:used], want[:used], **TOL)
  chex.assert_trees_all_close(got[used:], jnp.zeros_like(got[used:]))  # rows past the groups
  grads = jax.grad(loss("gmm_interpret"), (0, 1))(x_RD, w_EDF)
  ref = jax.grad(loss("ragged"), (0, 1))(x_RD, w_EDF)
  chex.assert_trees_all_close(grads, ref, **TOL)
  # ... and by hand: dW of an empty group is zero, dX past the groups is zero.
  empty = np.flatnonzero(np.asarray(sizes) == 0)
  chex.assert_trees_all_close(grads[1][empty], jnp.zeros_like(grads[1][empty]))
  chex.assert_trees_all_close(grads[0][used:], jnp.zeros_like(grads[0][used:]))


def test_exchange_plan_by_hand():
  """Two shards, four experts (two each). Shard 0 sends pairs (e0:1, e1:2, e2:0, e3:3), shard 1
  sends (e0:2, e1:1, e2:4, e3:1). On shard 0, group e0 holds 1 + 2 rows, then e1 2 + 1."""
  counts = jnp.asarray([[1, 2, 0, 3], [2, 1, 4, 1]], jnp.int32)
  dispatch, combine, sizes = moe.exchange_plan(counts, jnp.int32(0))
  in_off, send, out_off, recv = map(np.asarray, dispatch)
  np.testing.assert_array_equal(in_off, [0, 1, 3, 3])  # where each expert's pairs start
  np.testing.assert_array_equal(send, [1, 2, 0, 3])
  np.testing.assert_array_equal(out_off, [0, 3, 0, 4])  # e2 on shard 1 at 0, e3 after e2's 4
  np.testing.assert_array_equal(recv, [1, 2, 2, 1])  # (sender 0: e0, e1), (sender 1: e0, e1)
  np.testing.assert_array_equal(sizes, [3, 3])
  back_in, back_send, back_out, back_recv = map(np.asarray, combine)
  np.testing.assert_array_equal(back_in, [0, 3, 1, 5])  # where (sender, expert) rows landed
  np.testing.assert_array_equal(back_send, [1, 2, 2, 1])
  np.testing.assert_array_equal(back_out, [0, 1, 0, 2])  # where the sender had them
  np.testing.assert_array_equal(back_recv, [1, 2, 0, 3])
  _, _, sizes1 = moe.exchange_plan(counts, jnp.int32(1))
  np.testing.assert_array_equal(sizes1, [4, 4])


def test_emulated_ragged_all_to_all_follows_the_documented_semantics():
  """Against a numpy reading of `jax.lax.ragged_all_to_all`'s docstring: 4 shards, 2 slices to
  each destination, random sizes packed by each sender, placed where the senders say."""
  n, per, rows, out_rows = 4, 2, 16, 20
  rng = np.random.default_rng(0)
  sizes = rng.integers(0, 3, size=(n, n * per))  # sender, slice
  in_off = np.stack([np.cumsum(s) - s for s in sizes])
  # receiver r's slices from every sender, packed sender-major after a gap of 1 row
  recv_of = lambda r: sizes[:, r * per:(r + 1) * per]  # [sender, per]
  out_off = np.zeros_like(sizes)
  for r in range(n):
    flat = recv_of(r).reshape(-1)
    out_off[:, r * per:(r + 1) * per] = (1 + np.cumsum(flat) - flat).reshape(n, per)
  recv = np.stack([recv_of(r).reshape(-1) for r in range(n)])
  data = rng.normal(size=(n, rows, 3)).astype(np.float32)
  want = np.zeros((n, out_rows, 3), np.float32)
  for s in range(n):
    for i in range(n * per):
      r = i // per
      want[r, out_off[s, i]:out_off[s, i] + sizes[s, i]] = (
          data[s, in_off[s, i]:in_off[s, i] + sizes[s, i]])
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:n]), ("expert",))
  spec = jax.sharding.PartitionSpec("expert")
  f = jax.shard_map(
      lambda x, a, b, c, d: moe.emulated_ragged_all_to_all(
          x[0], jnp.zeros((out_rows, 3)), a[0], b[0], c[0], d[0], axis_name="expert")[None],
      mesh=mesh, in_specs=(spec,) * 5, out_specs=spec)
  got = jax.jit(f)(data, *(jnp.asarray(a, jnp.int32) for a in (in_off, sizes, out_off, recv)))
  chex.assert_trees_all_close(got, jnp.asarray(want))


def _layer(seed, m, d=16, e=8, f=32, k=3):
  x = jnp.abs(_normal(seed, (m, d)))
  router = _normal(seed + 1, (d, e)) * jnp.linspace(0.2, 2.0, e)  # uneven loads
  router = router.at[:, 5].set(-10.0)  # positive tokens never pick expert 5: an empty group
  w = (_normal(seed + 2, (e, d, f), 0.3), _normal(seed + 3, (e, d, f), 0.3),
       _normal(seed + 4, (e, f, d), 0.3))
  return x, router, w, k


@pytest.mark.parametrize("mesh_shape,kernel,m,max_rows", [
    ((1, 2, 1, 4), "ragged", 64, moe.MAX_BUFFER_ROWS),
    ((1, 1, 1, 8), "ragged", 62, moe.MAX_BUFFER_ROWS),  # 62 tokens on 8 shards: 2 padding
    ((1, 1, 2, 4), "ragged", 40, moe.MAX_BUFFER_ROWS),  # F split over `tensor`: partial sums
    ((1, 2, 1, 4), "ragged", 61, 24),  # 8 tokens a shard, 8 rows each at worst: 3 chunks of 3
    ((1, 2, 1, 4), "gmm_interpret", 24, moe.MAX_BUFFER_ROWS),
])
def test_expert_parallel_equals_the_unsharded_layer(mesh_shape, kernel, m, max_rows):
  mesh = shd.make_mesh(mesh_shape)
  x, router, w, k = _layer(0, m)
  ct = _normal(9, x.shape)

  def loss(path):
    def f_(x, router, w):
      weights, ids, _ = moe.route(x, router, k, True)
      if path == "ragged":
        y = moe.ragged_experts(x, weights, ids, *w)
      else:
        y = moe.expert_parallel(x, weights, ids, *w, mesh, shd.TRAIN_RULES, kernel=kernel,
                                exchange="emulated", max_buffer_rows=max_rows)
      return jnp.sum(y * ct), y
    return jax.jit(jax.value_and_grad(f_, (0, 1, 2), has_aux=True))

  (_, y), grads = loss("parallel")(x, router, w)
  (_, y_ref), grads_ref = loss("ragged")(x, router, w)
  _, ids, _ = moe.route(x, router, k, True)
  loads = np.bincount(np.asarray(ids).ravel(), minlength=8)
  assert loads[5] == 0 and loads.max() > 2 * loads[loads > 0].min()  # uneven, one empty group
  chex.assert_trees_all_close(y, y_ref, **TOL)
  chex.assert_trees_all_close(grads, grads_ref, **TOL)


@pytest.mark.parametrize("counts,capacity,kept", [
    # Two shards of two experts. Shard 0 gets e0: 1 + 2, e1: 2 + 1 rows; shard 1 e2: 0 + 4,
    # e3: 3 + 1. At 5 rows each: level 2 (4 rows) and the spare row to the lower expert (3, 2);
    # an expert's earlier sender first.
    ([[1, 2, 0, 3], [2, 1, 4, 1]], 5, [[1, 2, 0, 2], [2, 0, 3, 0]]),
    # At 6: shard 0 fits whole; shard 1 cuts both experts to 3.
    ([[1, 2, 0, 3], [2, 1, 4, 1]], 6, [[1, 2, 0, 3], [2, 1, 3, 0]]),
    # A cold expert keeps everything, the hot one the rest (e0: 1 row, e1: 9 rows, 5 fit).
    ([[1, 5, 0, 0], [0, 4, 0, 0]], 5, [[1, 4, 0, 0], [0, 0, 0, 0]]),
    # Dropless when the whole group fits.
    ([[1, 5, 2, 0], [0, 4, 3, 3]], 16, [[1, 5, 2, 0], [0, 4, 3, 3]]),
])
def test_capacity_counts_by_hand(counts, capacity, kept):
  got = moe.capacity_counts(jnp.asarray(counts, jnp.int32), capacity)
  np.testing.assert_array_equal(got, kept)
  per_shard = np.asarray(got).sum(0).reshape(2, 2).sum(1)
  assert (per_shard <= capacity).all()


def _hand_routed_ids():
  """128 tokens on (1,4,1,2): 8 shards of 16 tokens, four expert groups of two senders, alike.
  Sender 0 routes every token to (e0, e1); sender 1 its first 8 tokens to (e0, e2), its last 8
  to (e3, e2). Shard 0 receives e0: 16 + 8, e1: 16 rows; shard 1 e2: 16, e3: 8 rows."""
  s0 = np.tile([0, 1], (16, 1))
  s1 = np.concatenate([np.tile([0, 2], (8, 1)), np.tile([3, 2], (8, 1))])
  return jnp.asarray(np.tile(np.concatenate([s0, s1]), (4, 1)), jnp.int32)


def test_the_capacity_drops_these_pairs_by_hand():
  """At half the balanced load (16 tokens × 2 pairs: 16 rows, one tile) each shard keeps 16
  rows: shard 0 cuts e0 and e1 to 8 (sender 0's first 8 tokens; none of sender 1's e0 pairs),
  shard 1 cuts e2 to 8 (sender 1's first 8 tokens) and keeps all 8 of e3."""
  mesh = shd.make_mesh((1, 4, 1, 2))
  ids = _hand_routed_ids()
  assert moe.exchange_rows(16, 2, 2, 4, 0.5) == (16, 16)
  keep = moe.capacity_keep(ids, 4, mesh, shd.TRAIN_RULES, 0.5)
  group = np.zeros((32, 2), bool)
  group[:8] = True  # sender 0: tokens 0-7 keep both; 8-15 lose both
  group[16:24, 1] = True  # sender 1: its e2 pairs of tokens 0-7; its e0 pairs all dropped
  group[24:32, 0] = True  # its e3 pairs kept, their e2 pairs dropped
  np.testing.assert_array_equal(keep, np.tile(group, (4, 1)))
  assert moe.capacity_keep(ids, 4, mesh, shd.TRAIN_RULES, 2.0).all()  # 64 rows: all fit
  assert moe.capacity_keep(ids, 4, mesh, shd.TRAIN_RULES, 0) is None  # dropless
  assert moe.capacity_keep(ids, 4, shd.make_mesh((1, 8, 1, 1)), shd.TRAIN_RULES, 0.5) is None
  # The layer's own verdict, on the emulated exchange, and the CPU path of `experts`.
  x, w = _normal(0, (128, 16)), (_normal(1, (4, 16, 32)), _normal(2, (4, 16, 32)),
                                 _normal(3, (4, 32, 16)))
  weights = jnp.full(ids.shape, 0.5)
  _, kept = moe.expert_parallel(x, weights, ids, *w, mesh, shd.TRAIN_RULES, kernel="ragged",
                                exchange="emulated", capacity_factor=0.5, return_kept=True)
  np.testing.assert_array_equal(kept, keep)
  with moe.use_mesh(mesh, shd.TRAIN_RULES):
    y, kept = moe.experts(x, weights, ids, *w, capacity_factor=0.5)
  np.testing.assert_array_equal(kept, keep)
  stats = moe.router_stats(ids, jnp.full((128, 4), 0.25), None, kept)
  assert float(stats["computed"]) == 4 * (16 + 8 + 8) and float(stats["load"].sum()) == 256
  # A token that lost both pairs gets nothing from the experts (its residual carries it).
  chex.assert_trees_all_close(y[8:16], jnp.zeros_like(y[8:16]))
  assert float(jnp.abs(y[:8]).sum()) > 0  # tokens that kept their pairs do


@pytest.mark.parametrize("mesh_shape,kernel,m,max_rows,factor", [
    ((1, 2, 1, 4), "ragged", 64, moe.MAX_BUFFER_ROWS, 1.0),
    ((1, 1, 1, 8), "ragged", 62, moe.MAX_BUFFER_ROWS, 0.5),  # 2 padding tokens
    ((1, 1, 2, 4), "ragged", 40, moe.MAX_BUFFER_ROWS, 0.75),  # F split over `tensor`
    ((1, 2, 1, 4), "ragged", 125, 24, 0.5),  # 16 tokens a shard in chunks: each its own capacity
    ((1, 2, 1, 4), "gmm_interpret", 64, moe.MAX_BUFFER_ROWS, 0.5),
])
def test_expert_parallel_under_a_capacity_equals_the_ragged_layer_with_its_drops(
    mesh_shape, kernel, m, max_rows, factor):
  """The same pairs dropped both ways (`capacity_keep` from the global ids against the layer's
  own exchange), and the same outputs and gradients; some pairs drop, most stay."""
  mesh = shd.make_mesh(mesh_shape)
  x, router, w, k = _layer(0, m)
  ct = _normal(9, x.shape)

  def loss(path):
    def f_(x, router, w):
      weights, ids, _ = moe.route(x, router, k, True)
      if path == "ragged":
        keep = moe.capacity_keep(ids, 8, mesh, shd.TRAIN_RULES, factor, max_rows)
        y = moe.ragged_experts(x, weights, ids, *w, keep)
      else:
        y, keep = moe.expert_parallel(x, weights, ids, *w, mesh, shd.TRAIN_RULES, kernel=kernel,
                                      exchange="emulated", max_buffer_rows=max_rows,
                                      capacity_factor=factor, return_kept=True)
      return jnp.sum(y * ct), (y, keep)
    return jax.jit(jax.value_and_grad(f_, (0, 1, 2), has_aux=True))

  (_, (y, keep)), grads = loss("parallel")(x, router, w)
  (_, (y_ref, keep_ref)), grads_ref = loss("ragged")(x, router, w)
  np.testing.assert_array_equal(keep, keep_ref)
  assert 0 < (~np.asarray(keep)).sum() < 0.5 * keep.size, (~np.asarray(keep)).sum()
  chex.assert_trees_all_close(y, y_ref, **TOL)
  chex.assert_trees_all_close(grads, grads_ref, **TOL)
  # ... and the drops matter: the dropless layer differs
  weights, ids, _ = moe.route(x, router, k, True)
  assert not np.allclose(moe.ragged_experts(x, weights, ids, *w), y_ref, atol=1e-3)


def test_the_module_runs_ragged_on_cpu_meshes_and_counts_padding_nowhere():
  mesh = shd.make_mesh((1, 2, 1, 4))
  assert not moe.is_tpu(mesh) and not moe.is_tpu(None)
  with moe.use_mesh(mesh, shd.TRAIN_RULES):
    assert moe.current_mesh()[0] is mesh
  assert moe.current_mesh() == (None, None)
  assert moe.token_axes(mesh, shd.TRAIN_RULES) == ("fsdp", "expert")
  assert [moe.row_tile(r) for r in (1, 2, 17, 100, 5000)] == [16, 16, 32, 128, 128]
  assert moe.buffer_rows(250, 16) == 256 and moe.buffer_rows(3, 16) == 16
  assert moe.chunking(61, 8, 4, 3, 8, 24) == (3, 3)  # the chunked case above
  assert moe.chunking(61, 8, 4, 3, 8, moe.MAX_BUFFER_ROWS) == (1, 8)
  # Qwen3-30B-A3B on (1,2,1,8): 20,480 tokens a chip, 64 rows each at worst, in 5 chunks;
  # at a capacity of 1.25x the average, 10 rows each, in one
  assert moe.chunking(16 * 20480, 16, 8, 8, 128, moe.MAX_BUFFER_ROWS) == (5, 4096)
  assert moe.chunking(16 * 20480, 16, 8, 8, 128, moe.MAX_BUFFER_ROWS, 1.25) == (1, 20480)
  assert moe.exchange_rows(20480, 8, 8, 128, 1.25) == (128, 204800)
  assert moe.exchange_rows(20480, 8, 8, 128, 0) == (128, 8 * 20480 * 8)
  ids = jnp.asarray([[0, 2], [8, 8]], jnp.int32)  # the second token is padding (id E = 8)
  _, _, counts = moe._sort_pairs(ids, 8)
  np.testing.assert_array_equal(counts, [1, 0, 1, 0, 0, 0, 0, 0])


def test_the_batch_rule_splits_rows_over_expert_and_leaves_dense_meshes_alone():
  """Attention and the KV cache divide over `expert` (rows 16-way on (1,2,1,8)-like meshes); a
  mesh whose expert axis is 1 splits rows exactly as before."""
  for rules in (shd.TRAIN_RULES, shd.SAMPLING_RULES):
    moe_mesh, dense = shd.make_mesh((1, 2, 1, 4)), shd.make_mesh((2, 2, 2))
    assert shd.batch_shards(moe_mesh, rules) == 8 and shd.batch_shards(dense, rules) == 4
    assert shd.batch_sharding(moe_mesh, (16, 5), rules).spec == jax.sharding.PartitionSpec(
        ("fsdp", "expert"), None)
    assert shd.batch_sharding(dense, (16, 5), rules).spec == jax.sharding.PartitionSpec(
        ("data", "fsdp"), None)
    # cache [B, K, H, C]: rows over fsdp and expert, kv heads on tensor as before
    assert shd.logical_to_spec(("batch", "kv_heads", None, "cache"), (8, 2, 4, 6), moe_mesh,
                               rules) == jax.sharding.PartitionSpec(("fsdp", "expert"), None,
                                                                    None, None)
  assert shd.rules_from_config(shd.rules_to_config(shd.TRAIN_RULES)) == shd.TRAIN_RULES


@pytest.mark.slow
def test_qwen3_moe_decode_for_v5p_32_gathers_no_expert_weights():
  """Qwen3-30B-A3B cut to 2 layers, one decode step of 64 slots compiled ahead of time for a
  v5p-32 on mesh (1,2,1,8): the experts run as megablox kernels between ragged all-to-alls, and
  no expert weight is all-gathered (GSPMD's ragged_dot gathers all 128 experts' every layer)."""
  pytest.importorskip("libtpu")
  import re
  from scope_jax.models import config as model_config, kv_cache as kvc, transformer
  from scope_jax.plan import topology
  from scope_jax.sampling import engine as engine_lib
  before = jax.config.jax_enable_compilation_cache  # compile-only programs cannot be cached
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    mesh = shd.make_mesh((1, 2, 1, 8), topology.devices(topology.parse("v5p-32")))
    cfg = model_config.PRESETS["qwen3-30b-a3b"].replace(num_layers=2)
    rules, slots, capacity = shd.SAMPLING_RULES, 64, 1024
    params = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=sh),
        transformer.param_shapes(cfg), transformer.param_shardings(cfg, mesh, rules),
        is_leaf=lambda x: isinstance(x, tuple))
    cache_sh, _ = engine_lib.cache_shardings(cfg, mesh, rules, capacity)
    cache = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                         jax.eval_shape(lambda: kvc.init_cache(cfg, slots, capacity,
                                                               jnp.bfloat16)), cache_sh)
    tokens = jax.ShapeDtypeStruct((slots, 1), jnp.int32,
                                  sharding=shd.batch_sharding(mesh, (slots, 1), rules))
    step = jax.jit(lambda p, c, t: transformer.forward(cfg, p, t, cache=c, dtype=jnp.bfloat16))
    # the tests' "highest" matmul precision asks bfloat16 kernels for float32 passes: Mosaic
    # refuses; runs use the default
    with moe.use_mesh(mesh, rules), jax.default_matmul_precision("default"):
      hlo = step.trace(params, cache, tokens).lower().compile().as_text()
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
  gathered = re.findall(r"= (\S+\[[0-9,]*\])\S* all-gather(?:-start)?\(", hlo)
  assert not [g for g in gathered if "2048" in g and "768" in g], gathered
  assert hlo.count("ragged-all-to-all(") == 2 * cfg.num_layers  # dispatch and combine
  assert "tpu_custom_call" in hlo
  # the KV cache's slots split 16 ways: over fsdp and expert
  assert cache_sh.k[0].spec[0] == ("fsdp", "expert")


def test_a_capacity_is_a_run_setting_of_a_mixture_of_experts_only():
  import ml_collections
  from scope_jax.models import load, tiny_config
  section = ml_collections.ConfigDict({"source": "tiny", "moe_capacity_factor": 1.25})
  assert load.run_options(tiny_config("qwen3_moe"), section).moe_capacity_factor == 1.25
  with pytest.raises(ValueError, match="only with a mixture of experts"):
    load.run_options(tiny_config("qwen2"), section)
  section.moe_capacity_factor = 0.0
  assert load.run_options(tiny_config("qwen2"), section) == tiny_config("qwen2")
  with pytest.raises(ValueError, match="moe_capacity_factor=-1.0"):
    tiny_config("qwen3_moe").replace(moe_capacity_factor=-1.0)
