"""Interconnect traffic read from HLO text written by hand (every number below is computed by hand),
the analytic minimums, and the step times they give on a slice's chips."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import pytest

from scope_jax.models.config import ModelConfig
from scope_jax.plan import analysis, estimates as est, hlo, programs, topology

HLO = """\
HloModule m, is_scheduled=true, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%all-reduce-scatter.1.clone (input: bf16[64,32]) -> bf16[16,32] {
  %input = bf16[64,32]{1,0:T(8,128)(2,1)} parameter(0)
  %ar.1 = bf16[64,32]{1,0:T(8,128)(2,1)} all-reduce(%input), channel_id=3, replica_groups={{0,1,2,3},{4,5,6,7}}, use_global_device_ids=true, to_apply=%add
  %o = s32[] constant(0)
  ROOT %ds = bf16[16,32]{1,0:T(8,128)(2,1)} dynamic-slice(%ar.1, %o, %o), dynamic_slice_sizes={16,32}
}

%cond (p: (s32[], bf16[64,32])) -> pred[] {
  %p = (s32[], bf16[64,32]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], bf16[64,32])) -> (s32[], bf16[64,32]) {
  %p = (s32[], bf16[64,32]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = bf16[64,32] get-tuple-element(%p), index=1
  %rs = bf16[16,32]{1,0:T(8,128)(2,1)} fusion(%x), kind=kCustom, calls=%all-reduce-scatter.1.clone, backend_config={"collective_algorithm_config":{"emitter":"SingleInputAllReduceScatterFusion"}}
  %ag = bf16[64,32]{1,0:T(8,128)(2,1)} all-gather(%rs), channel_id=4, replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, dimensions={0}, use_global_device_ids=true
  ROOT %t = (s32[], bf16[64,32]) tuple(%i, %ag)
}

ENTRY %main (a: f32[4,8], b: bf16[16], c: f32[8,16], d: f32[2,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = bf16[16]{0} parameter(1)
  %c = f32[8,16]{1,0} parameter(2)
  %d = f32[2,8]{1,0} parameter(3)
  %tup = (f32[4,8]{1,0:T(8,128)}, bf16[16]{0:T(256)(2,1)}) all-reduce(%a, %b), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, use_global_device_ids=true, to_apply=%add
  %ag2 = f32[32,16]{1,0} all-gather(%c), channel_id=2, replica_groups=[2,4]<=[8], dimensions={0}, use_global_device_ids=true
  %rs2 = f32[2,8]{1,0} reduce-scatter(%d), channel_id=5, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={0}, to_apply=%add
  %a2a = f32[2,8]{1,0} all-to-all(%d), channel_id=6, replica_groups={{0,1}}, dimensions={0}
  %cp = (f32[24,8]{1,0:T(8,128)}, f32[24,8]{1,0:T(8,128)}, u32[]{:S(2)}, u32[]{:S(2)}) collective-permute-start(%x), channel_id=7, source_target_pairs={{0,1},{1,2}}
  %cpd = f32[24,8]{1,0:T(8,128)} collective-permute-done(%cp)
  %all = f32[]{:T(128)} all-reduce(%s), channel_id=8, replica_groups={}, to_apply=%add
  %w = (s32[], bf16[64,32]) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[4,8] get-tuple-element(%w), index=1
}
"""


def test_replica_group_sizes_in_every_form():
  assert hlo.group_size("replica_groups={{0,1,2,3},{4,5,6,7}}, x", 8) == 4
  assert hlo.group_size("replica_groups=[2,4]<=[8], dimensions={0}", 8) == 4
  assert hlo.group_size("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}", 8) == 2
  assert hlo.group_size("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, d", 8) == 4
  assert hlo.group_size("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}", 8) == 8
  assert hlo.group_size("replica_groups={}, to_apply=%add", 8) == 8


def test_collective_traffic_by_hand():
  """Per chip, one call:
  - tuple all-reduce of f32[4,8] + bf16[16] (128 + 32 = 160 B) over pairs: 2·(1/2)·160 = 160;
  - all-gather to f32[32,16] (2048 B) over groups of 4 (iota form): 3/4·2048 = 1536;
  - reduce-scatter to f32[2,8] (64 B out, 256 B in) over 4: 3/4·256 = 192;
  - the all-reduce-scatter fusion, 3 loop trips, input bf16[64,32] (4096 B) over 4: 3·3/4·4096
    = 9216, counted as a reduce-scatter (not as an all-reduce of 4096 B);
  - the looped all-gather to bf16[64,32] over mesh axis_1 (4): 3·3/4·4096 = 9216;
  - all-to-all of f32[2,8] (64 B) over pairs: 1/2·64 = 32;
  - collective-permute of f32[24,8] (768 B, the tiles' parentheses not read as a tuple): 768;
  - a scalar all-reduce over every chip (replica_groups={}, 8 partitions): 2·7/8·4 = 7."""
  out = analysis.collective_traffic(HLO)
  assert out["all-reduce"] == 160 + 7
  assert out["all-gather"] == 1536 + 9216
  assert out["reduce-scatter"] == 192 + 9216
  assert out["all-to-all"] == 32
  assert out["collective-permute"] == 768
  assert out["total"] == 167 + 10752 + 9408 + 32 + 768
  found, gathers = analysis.hlo_collectives(HLO)
  assert (found["reduce-scatter"].count, found["reduce-scatter"].bytes) == (4, 256 + 3 * 4096)
  assert (found["all-reduce"].count, found["all-reduce"].bytes) == (2, 160 + 4)
  assert found["all-gather"].in_loop == 3 and gathers == [("bf16[64,32]", 4096)]


def test_bytes_per_chip_counts_beyond_int32():
  """A 72B model's stacked MLP weight holds 1.9e10 elements: the count must not wrap."""
  whole = jax.ShapeDtypeStruct((80, 8192, 29568), jnp.float32)
  assert programs.bytes_per_chip([whole]) == 80 * 8192 * 29568 * 4 == 77_510_737_920


QWEN_72B = {"model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
            "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
            "vocab_size": 152064, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
            "rope_theta": 1e6, "tie_word_embeddings": False}


def test_a_72b_model_on_a_v5p_8_holds_its_true_bytes_per_chip():
  """Qwen2.5-72B's float32 params over fsdp 4: 72.7e9 · 4 B / 4 per chip (no compile)."""
  from scope_jax import sharding as shd
  from tests.plan.test_plan import analytic_param_bytes
  model = ModelConfig.from_hf_config(QWEN_72B)
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5p-8")))
  params = programs.param_structs(model, mesh, shd.TRAIN_RULES, jnp.float32)
  per_chip = programs.bytes_per_chip(params)
  assert per_chip == analytic_param_bytes(model, dict(mesh.shape), shd.TRAIN_RULES)
  assert 72e9 < model.num_params() < 73.5e9 and per_chip > 67 * 2 ** 30  # 3× this with Adam


TINY = ModelConfig.from_hf_config({
    "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 1e4,
    "tie_word_embeddings": False})


def test_train_minimum_by_hand():
  """fsdp 4, tensor 1: per micro-batch 3 · 3/4 · N · 2 B over the interconnect (the untied
  input embedding is looked up where it lives, never gathered); FLOPs per chip
  tokens·(6N + 6·L·heads·H·T)/chips; HBM as the module docstring counts it."""
  s = est.Shapes(TINY, {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}, "bfloat16", "float32",
                 "full", sampling_weights=0, kv_cache=0, slots=0)
  P = TINY.num_params()
  N = P - 256 * 64
  rows, cols, micro, chips = 16, 128, 2, 4
  flops, hbm, ici = est.train_minimum(s, rows, cols, micro, chips)
  hbm_full = hbm
  assert flops == rows * cols * (6 * N + 6 * 2 * 4 * 16 * cols) / chips
  assert ici == micro * 3 * 0.75 * N * 2
  tokens = rows // micro / 4 * cols
  assert hbm == micro * (3 * P * 2 + 2 * P * 4 / 4 + 2 * 2 * tokens * 64 * 2) + 7 * P * 4 / 4
  # log-probs on the last 128 − 96 columns only: the output projection (256 × 64) there alone
  flops, _, _ = est.train_minimum(s, rows, cols, micro, chips, prompt=96)
  out = 256 * 64
  assert flops == rows * (cols * (6 * (N - out) + 6 * 2 * 4 * 16 * cols) + 32 * 6 * out) / chips
  # a KL reference's forward inside the step: a third more FLOPs, one more gather of the weights
  ref_flops, ref_hbm, ref_ici = est.train_minimum(s, rows, cols, micro, chips, forwards=1)
  chex.assert_trees_all_close(ref_flops, rows * cols * (8 * N + 8 * 2 * 4 * 16 * cols) / chips)
  assert ref_ici == micro * 4 * 0.75 * N * 2
  assert ref_hbm == hbm_full + micro * P * 2


def test_a_decode_step_reads_each_weight_at_most_in_the_compute_dtype():
  """A tied table kept in float32 for its lookup (Gemma's, scaled in the weights' dtype) is read
  by the step as the bfloat16 unembedding: the minimum counts `sampling_read` (every leaf at
  most 2 bytes an element), not the 4 bytes held; `bytes_per_chip` caps by hand."""
  tied = dataclasses.replace(TINY, tie_embeddings=True)
  base = dict(model=tied, mesh={"data": 1, "fsdp": 1, "tensor": 1, "expert": 1},
              dtype="bfloat16", param_dtype="float32", remat="full", kv_cache=1000, slots=8)
  held = est.Shapes(**base, sampling_weights=4000)
  read = est.Shapes(**base, sampling_weights=4000, sampling_read=2000)
  assert est.decode_minimum(held, 8, 64, 1)[1] == 4000 + 1000
  assert est.decode_minimum(read, 8, 64, 1)[1] == 2000 + 1000
  tree = [jax.ShapeDtypeStruct((10, 3), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.bfloat16)]
  assert programs.bytes_per_chip(tree) == 10 * 3 * 4 + 4 * 2
  assert programs.bytes_per_chip(tree, 2) == 10 * 3 * 2 + 4 * 2


def test_step_times_and_mfu_from_the_three_counts():
  """overlapped = max of the three times, serial their sum, MFU the minimum FLOPs over peak ×
  overlapped; a decode program's figures are per step (a call of 4 steps)."""
  sl = topology.parse("v5p-8")
  chip = sl.chip
  s = est.Shapes(TINY, {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}, "bfloat16", "float32",
                 "full", sampling_weights=10 ** 6, kv_cache=3 * 10 ** 6, slots=8)
  prog = programs.Program("engine/decode", "decode", None, tokens=32, rows=8, columns=512, steps=4)
  coll = {k: hlo.Collective() for k in hlo.KINDS}
  coll["all-reduce"] = hlo.Collective(count=4, bytes=400, traffic=4e8)
  c = analysis.Compiled(prog, 0.0, 0, 0, 0, 0, 0, 0, 0, flops=2e9, bytes_accessed=5e6,
                        loop_factor=1.0, model_matmul_flops=0.0, collectives=coll,
                        loop_gathers=[], hlo_bytes=15e6, hlo_outside_bytes=2e6)
  e = est.estimate(c, s, sl)
  assert e.unit == "decode step" and e.steps_per_call == 4
  assert e.flops == 2e9 and e.hbm_bytes == 5e6 * 3 / 4 and e.ici_bytes_per_chip == 1e8
  times = (2e9 / chip.bf16_flops, 5e6 * 3 / 4 / chip.hbm_bandwidth, 1e8 / sl.ici_ingress)
  chex.assert_trees_all_close(e.step_seconds_overlapped, max(times))
  chex.assert_trees_all_close(e.step_seconds_serial, sum(times))
  # the weights but the untied input table (256 × 64 bf16), only its 8 / 4 rows' entries; the cache
  weights = 10 ** 6 - 256 * 64 * 2 + 2 * 64 * 2
  assert e.hbm_bytes_minimum == weights + 3 * 10 ** 6 and e.per_call_bytes == 2e6
  chex.assert_trees_all_close(e.mfu, e.flops_minimum / (chip.bf16_flops * max(times)))
  chex.assert_trees_all_close(e.step_seconds_floor, max(
      e.flops_minimum / chip.bf16_flops, (weights + 3e6) / chip.hbm_bandwidth))


@pytest.mark.parametrize("name, ingress", [("v5p-8", 200e9), ("v4-8", 90e9), ("v5e-4", 100e9),
                                           ("v6e-8", 300e9), ("v5p-32", 400e9)])
def test_ici_ingress_from_the_slice_grid(name, ingress):
  assert topology.parse(name).ici_ingress == ingress


def _resident(spec, topology_name, mesh_shape):
  import importlib
  from scope_jax import sharding as shd
  from scope_jax.core import runner
  from scope_jax.plan import report
  method, preset = spec.split(":")
  config = importlib.import_module(f"configs.{method}").get_config(preset)
  mesh = shd.make_mesh(mesh_shape, topology.devices(topology.parse(topology_name)))
  shapes = programs.RunShapes(config, programs.model_config(config.model), mesh,
                              runner.load_method(config).METHOD.players(config))
  _, states = programs.train_programs(shapes)  # abstract: nothing compiles
  return shapes, report.resident_memory(shapes, states, cache=1000)


def test_live_engine_caches_the_refresh_copy_and_opensirs_embedder_are_counted(monkeypatch):
  """SCOPE plays two policies and a frozen judge: three engines, of which as many caches live at
  once as the engine allows (`max_live_caches`); a refresh that built the new sampler copy beside
  the old one would hold one more copy for a moment, and samplers that free first hold none;
  OpenSIR's paper embedder (Linq-Embed-Mistral, float32, sharded as training shards) is
  resident."""
  from scope_jax import sharding as shd
  from scope_jax.plan import report
  from scope_jax.sampling import engine as engine_lib
  from scope_jax.sampling import sampler as sampler_lib
  from tests.plan.test_plan import analytic_param_bytes
  shapes, r = _resident("scope:paper", "v5p-16", (1, 2, 4))
  assert engine_lib.max_live_caches() == 1 and sampler_lib.REFRESH_FREES_OLD_COPY
  assert (r.engines, r.kv_caches, r.refresh) == (1, 1000, 0)
  monkeypatch.setattr(engine_lib, "max_live_caches", lambda: 8)
  monkeypatch.setattr(sampler_lib, "REFRESH_FREES_OLD_COPY", False)
  shapes, r = _resident("scope:paper", "v5p-16", (1, 2, 4))
  assert (r.engines, r.kv_caches) == (3, 3000)
  assert r.refresh == shapes.sampler_copy_bytes() > 0
  shapes, r = _resident("opensir:paper", "v5p-8", (1, 4, 1))
  (name,) = [k for k in r.items if k.startswith("embedder")]
  mistral = ModelConfig.from_hf_config(report.LINQ_EMBED_MISTRAL)
  assert "Linq-Embed-Mistral" in name and r.engines == 1
  assert r.items[name] == analytic_param_bytes(mistral, dict(shapes.mesh.shape), shd.TRAIN_RULES)
  assert 6.5 * 2 ** 30 < r.items[name] < 7 * 2 ** 30  # 7.1B float32 over 4 chips
