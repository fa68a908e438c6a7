"""HBM bytes per call counted in HLO text op by op (`plan.hbm`): modules written by hand with
every number computed by hand, and programs compiled for a TPU slice (compile-only devices)
whose counts must lie at or above the bytes they have to move and close to them."""

import importlib.util

import jax
import jax.numpy as jnp
import pytest

from scope_jax.plan import hbm, hlo

LAYER_SCAN = """\
HloModule scan, is_scheduled=true

%slice_layer (p0: bf16[4,256,256], p1: s32[]) -> bf16[256,256] {
  %p0 = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} parameter(0)
  %p1 = s32[]{:T(128)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %rows = bf16[4,65536]{1,0:T(8,128)(2,1)} bitcast(%p0)
  %ds = bf16[1,65536]{1,0:T(8,128)(2,1)} dynamic-slice(%rows, %p1, %zero), dynamic_slice_sizes={1,65536}
  ROOT %w_l = bf16[256,256]{1,0:T(8,128)(2,1)} bitcast(%ds)
}

%layer (x: bf16[8,256], w: bf16[4,256,256], i: s32[]) -> bf16[8,256] {
  %x = bf16[8,256]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  %w = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} parameter(1)
  %i = s32[]{:T(128)} parameter(2)
  %w_l = bf16[256,256]{1,0:T(8,128)(2,1)} fusion(%w, %i), kind=kLoop, calls=%slice_layer
  %dot = f32[8,256]{1,0:T(8,128)} convolution(%x, %w_l), dim_labels=bf_io->bf
  %t = f32[8,256]{1,0:T(8,128)} tanh(%dot)
  ROOT %y = bf16[8,256]{1,0:T(8,128)(2,1)} convert(%t)
}

%cond (p: (s32[], bf16[8,256], bf16[4,256,256])) -> pred[] {
  %p = (s32[]{:T(128)}, bf16[8,256]{1,0:T(8,128)(2,1)}, bf16[4,256,256]{2,1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %n = s32[]{:T(128)} constant(4)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%body (p: (s32[], bf16[8,256], bf16[4,256,256])) -> (s32[], bf16[8,256], bf16[4,256,256]) {
  %p = (s32[]{:T(128)}, bf16[8,256]{1,0:T(8,128)(2,1)}, bf16[4,256,256]{2,1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %x = bf16[8,256]{1,0:T(8,128)(2,1)} get-tuple-element(%p), index=1
  %w = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} get-tuple-element(%p), index=2
  %pre = (bf16[8,256]{1,0:T(8,128)(2,1)S(1)}, bf16[8,256]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%x)
  %x_s = bf16[8,256]{1,0:T(8,128)(2,1)S(1)} copy-done(%pre)
  %y = bf16[8,256]{1,0:T(8,128)(2,1)} fusion(%x_s, %w, %i), kind=kOutput, calls=%layer
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  ROOT %out = (s32[]{:T(128)}, bf16[8,256]{1,0:T(8,128)(2,1)}, bf16[4,256,256]{2,1,0:T(8,128)(2,1)}) tuple(%next, %y, %w)
}

ENTRY %main (w: bf16[4,256,256], x: bf16[8,256]) -> bf16[8,256] {
  %w = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} parameter(0)
  %x = bf16[8,256]{1,0:T(8,128)(2,1)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[]{:T(128)}, bf16[8,256]{1,0:T(8,128)(2,1)}, bf16[4,256,256]{2,1,0:T(8,128)(2,1)}) tuple(%zero, %x, %w)
  %loop = (s32[]{:T(128)}, bf16[8,256]{1,0:T(8,128)(2,1)}, bf16[4,256,256]{2,1,0:T(8,128)(2,1)}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"4"}}
  ROOT %r = bf16[8,256]{1,0:T(8,128)(2,1)} get-tuple-element(%loop), index=1
}
"""


def test_a_scan_over_stacked_weights_reads_each_layer_once():
  """4 layers of a stacked bf16[4, 256, 256] weight, a bf16[8, 256] activation. Per layer: the
  prefetch reads the activation from HBM (4,096 B; its copy lives on chip, S(1), and the matmul
  reads it there for nothing), the matmul fusion reads its layer's slice through the nested
  fusion's view and slice (256·256·2 = 131,072 B, not the whole 524,288) and the counter (4) and writes
  the activation (4,096); the counter's add reads 4 + 4 and writes 4. The condition (4 + 4 read,
  1 written) runs 5 times. So: the weights once, the activations per layer, the counter."""
  t = hbm.traffic(hlo.parse(LAYER_SCAN))
  weights, activations = 4 * 256 * 256 * 2, 4 * 2 * 8 * 256 * 2
  counter = 4 * (4 + 12) + 5 * 9
  assert t.call == weights + activations + counter == 557_165
  assert t.once == (weights + activations) / 4 + 4 + 12 + 9 and t.outside == 0
  assert t.call < 4 * 256 * 256 * 2 * 2  # a whole stacked weight per layer would be 4x


DECODE_LOOP = """\
HloModule decode, is_scheduled=true

%write_slot (p0: bf16[8,1024,128], p1: s32[], p2: bf16[8,128]) -> bf16[8,1024,128] {
  %p0 = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %p1 = s32[]{:T(128)} parameter(1)
  %p2 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(2)
  %new = bf16[8,1,128]{2,0,1:T(8,128)(2,1)} bitcast(%p2)
  %zero = s32[]{:T(128)} constant(0)
  %dus = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} dynamic-update-slice(%p0, %new, %zero, %p1, %zero)
  ROOT %out = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} bitcast(%dus)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%scores (p0: bf16[8,1024,128], p1: bf16[8,128]) -> f32[8] {
  %p0 = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %p1 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(1)
  %k = f32[8,1024,128]{2,0,1:T(8,128)} convert(%p0)
  %q = f32[8,128]{1,0:T(8,128)} convert(%p1)
  %qb = f32[8,1024,128]{2,0,1:T(8,128)} broadcast(%q), dimensions={0,2}
  %m = f32[8,1024,128]{2,0,1:T(8,128)} multiply(%k, %qb)
  %zero = f32[]{:T(128)} constant(0)
  ROOT %s = f32[8]{0:T(128)} reduce(%m, %zero), dimensions={1,2}, to_apply=%add
}

%next_q (p0: bf16[8,128], p1: f32[8]) -> bf16[8,128] {
  %p0 = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = f32[8]{0:T(128)} parameter(1)
  %q = f32[8,128]{1,0:T(8,128)} convert(%p0)
  %s = f32[8,128]{1,0:T(8,128)} broadcast(%p1), dimensions={0}
  %a = f32[8,128]{1,0:T(8,128)} add(%q, %s)
  %t = f32[8,128]{1,0:T(8,128)} tanh(%a)
  ROOT %o = bf16[8,128]{1,0:T(8,128)(2,1)} convert(%t)
}

%cond (p: (s32[], bf16[8,1024,128], bf16[8,128])) -> pred[] {
  %p = (s32[]{:T(128)}, bf16[8,1024,128]{2,0,1:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %n = s32[]{:T(128)} constant(6)
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%body (p: (s32[], bf16[8,1024,128], bf16[8,128])) -> (s32[], bf16[8,1024,128], bf16[8,128]) {
  %p = (s32[]{:T(128)}, bf16[8,1024,128]{2,0,1:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %cache = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} get-tuple-element(%p), index=1
  %q = bf16[8,128]{1,0:T(8,128)(2,1)} get-tuple-element(%p), index=2
  %written = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} fusion(%cache, %i, %q), kind=kLoop, calls=%write_slot
  %s = f32[8]{0:T(128)} fusion(%written, %q), kind=kLoop, calls=%scores
  %q2 = bf16[8,128]{1,0:T(8,128)(2,1)} fusion(%q, %s), kind=kLoop, calls=%next_q
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  ROOT %out = (s32[]{:T(128)}, bf16[8,1024,128]{2,0,1:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) tuple(%next, %written, %q2)
}

ENTRY %main (cache: bf16[8,1024,128], q: bf16[8,128]) -> bf16[8,1024,128] {
  %cache = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} parameter(0)
  %q = bf16[8,128]{1,0:T(8,128)(2,1)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[]{:T(128)}, bf16[8,1024,128]{2,0,1:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) tuple(%zero, %cache, %q)
  %loop = (s32[]{:T(128)}, bf16[8,1024,128]{2,0,1:T(8,128)(2,1)}, bf16[8,128]{1,0:T(8,128)(2,1)}) while(%init), condition=%cond, body=%body
  ROOT %r = bf16[8,1024,128]{2,0,1:T(8,128)(2,1)} get-tuple-element(%loop), index=1
}
"""


def test_a_decode_loop_updates_one_slot_in_place_and_reads_the_cache_once_a_step():
  """6 steps (the condition's bound) over a bf16[8, 1024, 128] cache (2,097,152 B). Per step:
  the slot write reads its update (8·128·2 = 2,048) and the step (4) and writes the update
  (2,048), the rest of the buffer untouched; the scores read the whole cache and the query
  (2,048) and write f32[8] (32); the next query reads 2,048 + 32 and writes 2,048; the counter
  12. The condition (9) runs 7 times."""
  t = hbm.traffic(hlo.parse(DECODE_LOOP))
  cache, slot = 8 * 1024 * 128 * 2, 8 * 128 * 2
  step = (slot + 4 + slot) + (cache + slot + 32) + (slot + 32 + slot) + 12
  assert t.call == 6 * step + 7 * 9
  minimum = cache + slot  # the cache read once and one slot written, per step
  assert minimum <= step <= 1.01 * minimum


MISC = """\
HloModule misc, is_scheduled=true

%rows (table: bf16[1000,64], ids: s32[4]) -> bf16[4,64] {
  %table = bf16[1000,64]{1,0:T(8,128)(2,1)} parameter(0)
  %ids = s32[4]{0:T(128)} parameter(1)
  ROOT %g = bf16[4,64]{1,0:T(8,128)(2,1)} gather(%table, %ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
}

%replace (old: f32[], new: f32[]) -> f32[] {
  %old = f32[] parameter(0)
  ROOT %new = f32[] parameter(1)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%put (buf: f32[100,16], idx: s32[2,1], upd: f32[2,16]) -> f32[100,16] {
  %buf = f32[100,16]{1,0} parameter(0)
  %idx = s32[2,1]{1,0} parameter(1)
  %upd = f32[2,16]{1,0} parameter(2)
  ROOT %sc = f32[100,16]{1,0} scatter(%buf, %idx, %upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%replace
}

%accumulate (buf: f32[100,16], idx: s32[2,1], upd: f32[2,16]) -> f32[100,16] {
  %buf = f32[100,16]{1,0} parameter(0)
  %idx = s32[2,1]{1,0} parameter(1)
  %upd = f32[2,16]{1,0} parameter(2)
  ROOT %sc = f32[100,16]{1,0} scatter(%buf, %idx, %upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%sum
}

%double (x: f32[64]) -> f32[64] {
  %x = f32[64]{0} parameter(0)
  ROOT %y = f32[64]{0} add(%x, %x)
}

%small (p: f32[64]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  ROOT %n = f32[64]{0} negate(%p)
}

%large (p: f32[64]) -> f32[64] {
  %p = f32[64]{0} parameter(0)
  %a = f32[64]{0} fusion(%p), kind=kLoop, calls=%double
  ROOT %b = f32[64]{0} fusion(%a), kind=kLoop, calls=%double
}

%as_matrix (p: f32[64]) -> f32[8,8] {
  %p = f32[64]{0} parameter(0)
  ROOT %m = f32[8,8]{1,0} bitcast(%p)
}

%negate_matrix (p: f32[64]) -> f32[8,8] {
  %p = f32[64]{0} parameter(0)
  %m = f32[8,8]{1,0} fusion(%p), kind=kLoop, calls=%as_matrix
  ROOT %n = f32[8,8]{1,0} negate(%m)
}

%pass_through (p0: f32[64], p1: f32[100,16]) -> (f32[64], f32[100,16]) {
  %p0 = f32[64]{0} parameter(0)
  %p1 = f32[100,16]{1,0} parameter(1)
  %n = f32[64]{0} negate(%p0)
  ROOT %t = (f32[64]{0}, f32[100,16]{1,0}) tuple(%n, %p1)
}

ENTRY %main (table: bf16[1000,64], ids: s32[4], buf: f32[100,16], idx: s32[2,1], upd: f32[2,16], v: f32[64], k: bf16[16,1024], pr: pred[]) -> f32[64] {
  %table = bf16[1000,64]{1,0:T(8,128)(2,1)} parameter(0)
  %ids = s32[4]{0:T(128)} parameter(1)
  %buf = f32[100,16]{1,0} parameter(2)
  %idx = s32[2,1]{1,0} parameter(3)
  %upd = f32[2,16]{1,0} parameter(4)
  %v = f32[64]{0} parameter(5)
  %k = bf16[16,1024]{1,0} parameter(6)
  %pr = pred[] parameter(7)
  %looked_up = bf16[4,64]{1,0:T(8,128)(2,1)} fusion(%table, %ids), kind=kCustom, calls=%rows
  %put_rows = f32[100,16]{1,0} fusion(%buf, %idx, %upd), kind=kLoop, calls=%put
  %added_rows = f32[100,16]{1,0} fusion(%put_rows, %idx, %upd), kind=kLoop, calls=%accumulate
  %twice_a = f32[64]{0} fusion(%v), kind=kLoop, calls=%double
  %twice_b = f32[64]{0} fusion(%v), kind=kLoop, calls=%double
  %kernel = bf16[16,128]{1,0} custom-call(%k), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"cost_estimate":{"flops":"10","transcendentals":"0","bytes_accessed":"1000","remote_bytes_transferred":"0"}}}
  %plain = bf16[16,128]{1,0} custom-call(%k), custom_call_target="tpu_custom_call"
  %evict = (f32[64]{0}, f32[64]{0:S(1)}, u32[]{:S(2)}) copy-start(%on_chip)
  %on_chip = f32[64]{0:S(1)} negate(%v)
  %slot = f32[1,16]{1,0} dynamic-slice(%buf, %i0, %i0), dynamic_slice_sizes={1,16}
  %i0 = s32[] constant(0)
  %row = f32[1,16]{1,0} constant({...})
  %in_place = f32[100,16]{1,0} dynamic-update-slice(%buf, %row, %i0, %i0)
  %rows_start = ((f32[100,16]{1,0}), f32[10,16]{1,0:S(1)}, s32[]{:S(2)}) slice-start(%buf), slice={[0:10], [0:16]}
  %rows_done = f32[10,16]{1,0:S(1)} slice-done(%rows_start)
  %gathered = (f32[64]{0}, f32[256]{0}) all-gather-start(%v), dimensions={0}, replica_groups={}
  %gathered_done = f32[256]{0} all-gather-done(%gathered)
  %negated = f32[8,8]{1,0} fusion(%v), kind=kLoop, calls=%negate_matrix
  %passed = (f32[64]{0}, f32[100,16]{1,0}) fusion(%v, %buf), kind=kLoop, calls=%pass_through, output_to_operand_aliasing={{1}: (1, {})}
  ROOT %branch = f32[64]{0} conditional(%pr, %v, %v), true_computation=%small, false_computation=%large
}
"""


def test_rows_updates_shared_operands_kernels_copies_and_branches_by_hand():
  """Each op of MISC by hand:
  - a gather of 4 rows of a 1000 × 64 bf16 table: the rows (512) and ids (16) read, 512 written;
  - a scatter of 2 rows of 16 f32 (128 B) whose combiner keeps the new value: 128 + 8 (indices)
    read, 128 written; the same summing into the old rows also reads those rows: 128 more;
  - two fusions reading the same f32[64] (256): each reads it, each writes 256;
  - a Pallas kernel with a cost estimate: its 1,000 bytes; one without: its operand
    (16·1024·2 = 32,768) and result (4,096);
  - an eviction from on-chip memory: nothing read from HBM, 256 written; the on-chip negate
    reads 256 and writes nothing to HBM;
  - a dynamic-slice of a row of 16 f32: 64 read + the indices 8, 64 written; a top-level
    dynamic-update-slice: the row read and written (64 + 64) and the indices (8); an async
    slice of 10 rows into on-chip memory: 640 read, nothing written to HBM;
  - an async all-gather of f32[64] into f32[256]: 256 read, 1,024 written;
  - a fusion reading f32[64] through a nested fusion that only views it: 256 read, 256 written;
  - a fusion passing its f32[100, 16] operand through to its result (the same buffer): that
    operand neither read nor written, its other result 256 + 256;
  - a conditional: its costlier branch, two fusions of 256 + 256 (1,024)."""
  t = hbm.traffic(hlo.parse(MISC))
  gather = 512 + 16 + 512
  scatters = (128 + 8 + 128) + (128 + 128 + 8 + 128)
  shared = 2 * (256 + 256)
  kernels = 1000 + 32768 + 4096
  copies = 256 + 256
  slices = (64 + 8 + 64) + (64 + 64 + 8) + 640
  views = (256 + 256) + (256 + 256)
  assert t.call == gather + scatters + shared + kernels + copies + slices + 256 + 1024 + views + 1024
  assert t.call == t.once == t.outside


CHAIN = """\
HloModule chain, is_scheduled=true, num_partitions=4

%piece_a (shard: f32[16], out: f32[64]) -> (f32[16], f32[64], f32[64]) {
  %shard = f32[16]{0} parameter(0)
  %out = f32[64]{0} parameter(1)
  %ag = f32[64]{0} all-gather(%shard), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t = (f32[16]{0}, f32[64]{0}, f32[64]{0}) tuple(%shard, %out, %ag)
}

%piece_b (shard: f32[16], out: f32[64]) -> (f32[16], f32[64], f32[64]) {
  %shard = f32[16]{0} parameter(0)
  %out = f32[64]{0} parameter(1)
  %ag = f32[64]{0} all-gather(%shard), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t = (f32[16]{0}, f32[64]{0}, f32[64]{0}) tuple(%shard, %out, %ag)
}

%piece_c (shard: f32[16], out: f32[64]) -> (f32[16], f32[64], f32[64]) {
  %shard = f32[16]{0} parameter(0)
  %out = f32[64]{0} parameter(1)
  %ag = f32[64]{0} all-gather(%shard), channel_id=7, replica_groups={{0,1,2,3}}, dimensions={0}
  ROOT %t = (f32[16]{0}, f32[64]{0}, f32[64]{0}) tuple(%shard, %out, %ag)
}

%cond (p: (s32[], f32[16], f32[64])) -> pred[] {
  %p = (s32[]{:T(128)S(2)}, f32[16]{0}, f32[64]{0}) parameter(0)
  %i = s32[]{:T(128)S(2)} get-tuple-element(%p), index=0
  %n = s32[]{:T(128)S(2)} constant(3)
  ROOT %lt = pred[]{:T(512)S(2)} compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[16], f32[64])) -> (s32[], f32[16], f32[64]) {
  %p = (s32[]{:T(128)S(2)}, f32[16]{0}, f32[64]{0}) parameter(0)
  %i = s32[]{:T(128)S(2)} get-tuple-element(%p), index=0
  %shard = f32[16]{0} get-tuple-element(%p), index=1
  %out = f32[64]{0} get-tuple-element(%p), index=2
  %a = (f32[16]{0}, f32[64]{0}, f32[64]{0}) fusion(%shard, %out), kind=kOutput, calls=%piece_a, output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (1, {})}
  %a0 = f32[16]{0} get-tuple-element(%a), index=0
  %a2 = f32[64]{0} get-tuple-element(%a), index=2
  %b = (f32[16]{0}, f32[64]{0}, f32[64]{0}) fusion(%a0, %a2), kind=kOutput, calls=%piece_b, output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (1, {})}
  %b0 = f32[16]{0} get-tuple-element(%b), index=0
  %b2 = f32[64]{0} get-tuple-element(%b), index=2
  %one = s32[]{:T(128)S(2)} constant(1)
  %next = s32[]{:T(128)S(2)} add(%i, %one)
  ROOT %t = (s32[]{:T(128)S(2)}, f32[16]{0}, f32[64]{0}) tuple(%next, %b0, %b2)
}

ENTRY %main (shard: f32[16], out: f32[64]) -> f32[64] {
  %shard = f32[16]{0} parameter(0)
  %out = f32[64]{0} parameter(1)
  %zero = s32[]{:T(128)S(2)} constant(0)
  %init = (s32[]{:T(128)S(2)}, f32[16]{0}, f32[64]{0}) tuple(%zero, %shard, %out)
  %loop = (s32[]{:T(128)S(2)}, f32[16]{0}, f32[64]{0}) while(%init), condition=%cond, body=%body
  %s = f32[16]{0} get-tuple-element(%loop), index=1
  %o = f32[64]{0} get-tuple-element(%loop), index=2
  %c = (f32[16]{0}, f32[64]{0}, f32[64]{0}) fusion(%s, %o), kind=kOutput, calls=%piece_c, output_to_operand_aliasing={{0}: (0, {}), {1}: (1, {}), {2}: (1, {})}
  ROOT %r = f32[64]{0} get-tuple-element(%c), index=2
}
"""


def test_a_collective_split_over_a_chain_of_fusions_moves_its_bytes_once_per_completion():
  """One all-gather (channel 7) split over three fusions, two in a loop of 3 trips and one after
  it, each passing the shard and the output buffer on: 7 pieces' runs, 1 completion (the piece
  after the loop runs once), so the chain reads the f32[16] shard (64 B) and writes the f32[64]
  result (256 B) once; the buffers passed through cost nothing, the counter lives on chip."""
  t = hbm.traffic(hlo.parse(CHAIN))
  assert t.call == pytest.approx(64 + 256)


def _tpu_device():
  from scope_jax.plan import topology
  topology.quiet_libtpu()
  return jax.sharding.SingleDeviceSharding(topology.devices(topology.parse("v5p-8"))[0])


def _compiled(fn, *structs, donate=()):
  return hbm.traffic(hlo.parse(jax.jit(fn, donate_argnums=donate).lower(*structs)
                               .compile().as_text()))


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_scan_over_stacked_weights_counts_the_weights_once():
  """A scan over 4 layers of a stacked bf16[4, 256, 256] weight compiled for a v5p chip: at
  least the weights once plus each layer's activation read and written, and within 10% of it
  (the compiler's copies of the activation); charging the whole stack to every layer would be
  about 4x."""
  sh = _tpu_device()
  L, D, B = 4, 256, 8

  def scan(w_LDD, x_BD):
    return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x_BD, w_LDD)[0]

  t = _compiled(scan, jax.ShapeDtypeStruct((L, D, D), jnp.bfloat16, sharding=sh),
                jax.ShapeDtypeStruct((B, D), jnp.bfloat16, sharding=sh))
  hand = L * D * D * 2 + L * 2 * B * D * 2
  assert hand <= t.call <= 1.1 * hand, (t.call, hand)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu")
def test_tpu_decode_loop_writes_one_slot_and_reads_the_cache_once_a_step():
  """6 steps over a donated bf16[8, 1024, 128] cache compiled for a v5p chip: each step writes
  one slot in place and reads the whole cache once; the loop's bytes per step are at least that
  and within 1% of it (the relayout copies around the loop are outside it)."""
  sh = _tpu_device()
  S, C, H, T = 8, 1024, 128, 6

  def decode(cache_SCH, q_SH):
    def step(t, carry):
      cache_SCH, q_SH = carry
      cache_SCH = jax.lax.dynamic_update_slice(cache_SCH, jnp.tanh(q_SH)[:, None], (0, t, 0))
      s_SC = (cache_SCH.astype(jnp.float32) * q_SH[:, None].astype(jnp.float32)).sum(-1)
      return cache_SCH, jnp.tanh(q_SH + s_SC.max(-1, keepdims=True).astype(q_SH.dtype))
    return jax.lax.fori_loop(0, T, step, (cache_SCH, q_SH))

  t = _compiled(decode, jax.ShapeDtypeStruct((S, C, H), jnp.bfloat16, sharding=sh),
                jax.ShapeDtypeStruct((S, H), jnp.bfloat16, sharding=sh), donate=(0,))
  minimum = S * C * H * 2 + S * H * 2
  step = (t.call - t.outside) / T
  assert minimum <= step <= 1.01 * minimum, (step, minimum)
