"""FLOPs per call counted in the compiled HLO, each loop with its own trip count: matmuls from
their shapes, Pallas kernels from their cost estimates or grids, against values computed by hand
(compiled for a TPU slice from this CPU host, and for this CPU)."""

import importlib.util

import chex
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from scope_jax.plan import analysis, hlo, programs, topology

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="needs libtpu")

# Two loops of different trips and matmul sizes, one nested in the other, and a third after
# them (a loss's vocabulary chunks after the layers):
#   layers: 3 trips of x[64,256] · W_l[256,256];
#   inside each layer: 6 trips, unrolled by 2 (the loop body holds 2 matmuls, 3 trips), of
#     y[64,256] · V[256,256];
#   chunks: 7 trips of y[64,256] · U_c[256,128], summed.
LAYER = 2 * 64 * 256 * 256
CHUNK = 2 * 64 * 256 * 128
BY_HAND = 3 * LAYER + 3 * 6 * LAYER + 7 * CHUNK  # 205,520,896


def _nested(x, w_l, v, u_c):
  def layer(x, w):
    inner = lambda y, _: (jnp.tanh(y @ v), None)
    return jax.lax.scan(inner, x @ w, None, length=6, unroll=2)[0], None

  y = jax.lax.scan(layer, x, w_l)[0]
  chunk = lambda acc, u: (acc + (y @ u).astype(jnp.float32).sum(), None)
  return jax.lax.scan(chunk, jnp.float32(0), u_c)[0]


def _nested_program(sharding=None):
  shapes = [(64, 256), (3, 256, 256), (256, 256), (7, 256, 128)]
  args = [jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=sharding) for s in shapes]
  return programs.Program("nested", "train", lambda: jax.jit(_nested).trace(*args))


def _check_nested(c: analysis.Compiled):
  """The matmuls exactly, and the compiler counts each loop body once: a layer, the unrolled
  body's 2 matmuls and a chunk (elementwise work adds 0.3% on a TPU, 3% on the CPU, whose
  cost model counts a tanh element as some 26 FLOPs)."""
  assert c.matmul_flops == BY_HAND, (c.matmul_flops, BY_HAND)
  once = LAYER + 2 * LAYER + CHUNK
  assert once <= c.flops < 1.05 * once, (c.flops, once)
  # One factor for the whole program (the jaxpr's matmuls with over without trips, 205.5M /
  # 20.97M = 9.8) over the compiler's count, whose unrolled body holds 2 matmuls: 1.4x.
  assert c.flops * c.loop_factor > 1.3 * BY_HAND


@needs_libtpu
def test_nested_loops_of_different_trips_on_a_tpu():
  """One v5e chip. Beyond the matmuls the TPU's cost model counts 1 FLOP per element of
  elementwise work (tanh is a transcendental, apart): per inner trip the tanh's two converts
  ([64, 256] bf16 → f32 → bf16), per chunk its convert and sum ([64, 128]); 18 · 32,768 +
  7 · 16,384 = 704,512 (0.34%). The plan scales the compiler's loop-bodies-once count of them
  by the HLO's elementwise ratio, which mixes the loops' trips: within 1e-4 of the total."""
  devices = topology.devices(topology.parse("v5e-1"))
  mesh = jax.sharding.Mesh(devices, ("x",))
  c = analysis.compile_program(_nested_program(NamedSharding(mesh, P())))
  _check_nested(c)
  chex.assert_trees_all_close(c.call_flops, BY_HAND + 18 * 32768 + 7 * 16384, rtol=1e-4)


def test_nested_loops_of_different_trips_on_the_cpu():
  """The same path on this CPU: the matmuls exact; the rest within 5%, as the CPU's cost model
  counts a tanh element as some 26 FLOPs (its expansion) and converts outside the loops, which
  the HLO's elementwise ratio (1 per element) weighs otherwise."""
  c = analysis.compile_program(_nested_program(), platform="cpu", devices=1)
  _check_nested(c)
  assert BY_HAND <= c.call_flops <= 1.05 * BY_HAND, (c.call_flops, BY_HAND)


def test_matmul_flops_of_written_hlo_by_hand():
  """A dot (contracting 32) in a loop of 4 trips inside a loop of 3, a convolution (kernel
  [16 in, 8 out]) outside: 3·4·2·(8·16)·32 + 2·(8·8)·16 = 98,304 + 2,048."""
  text = """\
HloModule m

%fused_dot (p0: f32[8,32], p1: f32[32,16]) -> f32[8,16] {
  %p0 = f32[8,32]{1,0} parameter(0)
  %p1 = f32[32,16]{1,0} parameter(1)
  ROOT %d = f32[8,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%inner_cond (p: (s32[], f32[8,32])) -> pred[] {
  %p = (s32[], f32[8,32]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%inner (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]) parameter(0)
  %x = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %w = f32[32,16]{1,0} constant({...})
  %f = f32[8,16]{1,0} fusion(%x, %w), kind=kOutput, calls=%fused_dot
  ROOT %t = (s32[], f32[8,32]) tuple(%i, %x)
}

%outer (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]) parameter(0)
  %w2 = (s32[], f32[8,32]) while(%p), condition=%inner_cond, body=%inner
  ROOT %t = (s32[], f32[8,32]) tuple(%i, %x)
}

ENTRY %main (a: f32[8,32], b: f32[8,16]) -> f32[8,8] {
  %a = f32[8,32]{1,0} parameter(0)
  %b = f32[8,16]{1,0} parameter(1)
  %k = f32[16,8]{1,0} parameter(2)
  %w = (s32[], f32[8,32]) while(%a), condition=%c, body=%outer, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %conv = f32[8,8]{1,0} convolution(%b, %k), dim_labels=bf_io->bf
}
"""
  counted = hlo.flops(hlo.parse(text))
  assert counted.matmul_call == 3 * 4 * 2 * 8 * 16 * 32 + 2 * 8 * 8 * 16
  assert counted.matmul_once == 2 * 8 * 16 * 32 + 2 * 8 * 8 * 16


def test_a_loop_the_compiler_wrote_with_an_unsigned_counter_counts_its_trips():
  """A windowed einsum's loop (the TPU compiler's own, no known trip count) compares a `u32`
  counter with its bound, 4: its dot (2·8·16·32) counts 4 times a call, not once."""
  text = """\
HloModule m

%cond (p: (u32[], f32[8,32])) -> pred[] {
  %c = u32[]{:T(128)} constant(4), metadata={op_name="jit(step)/while/x"}
  %p = (u32[], f32[8,32]) parameter(0)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT
}

%body (p: (u32[], f32[8,32])) -> (u32[], f32[8,32]) {
  %p = (u32[], f32[8,32]) parameter(0)
  %x = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %w = f32[32,16]{1,0} constant({...})
  %d = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %t = (u32[], f32[8,32]) tuple(%i, %x)
}

ENTRY %main (a: (u32[], f32[8,32])) -> (u32[], f32[8,32]) {
  %a = (u32[], f32[8,32]) parameter(0)
  ROOT %w = (u32[], f32[8,32]) while(%a), condition=%cond, body=%body
}
"""
  counted = hlo.flops(hlo.parse(text))
  assert counted.matmul_call == 4 * 2 * 8 * 16 * 32 and counted.matmul_once == 2 * 8 * 16 * 32


def test_a_loop_unrolled_by_two_counts_half_its_bound():
  """The same loop as the compiler unrolls it by 2: two dots a trip and a counter that goes up
  by 2 (an add of 1 in the body indexes the second half, not the counter's next value): 2
  trips of 2 dots, the bound 4's worth of work, not twice it."""
  text = """\
HloModule m

%cond (p: (u32[], f32[8,32])) -> pred[] {
  %c = u32[]{:T(128)} constant(4)
  %p = (u32[], f32[8,32]) parameter(0)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %c), direction=LT
}

%body (p: (u32[], f32[8,32])) -> (u32[], f32[8,32]) {
  %one = u32[]{:T(128)} constant(1)
  %two = u32[]{:T(128)} constant(2)
  %p = (u32[], f32[8,32]) parameter(0)
  %i = u32[]{:T(128)} get-tuple-element(%p), index=0
  %x = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %half = u32[]{:T(128)} add(%i, %one)
  %w = f32[32,16]{1,0} constant({...})
  %d0 = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %d1 = f32[8,16]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %next = u32[]{:T(128)} add(%i, %two)
  ROOT %t = (u32[], f32[8,32]) tuple(%next, %x)
}

ENTRY %main (a: (u32[], f32[8,32])) -> (u32[], f32[8,32]) {
  %a = (u32[], f32[8,32]) parameter(0)
  ROOT %w = (u32[], f32[8,32]) while(%a), condition=%cond, body=%body
}
"""
  counted = hlo.flops(hlo.parse(text))
  assert counted.matmul_call == 2 * 2 * (2 * 8 * 16 * 32)


def test_a_conditional_counts_its_costliest_branch_by_hand():
  """A conditional in a loop of 5 trips: one branch a dot contracting 32 (2·8·16·32 = 8,192),
  the other two Pallas calls without estimates at 10,000 FLOPs a run (the kernel costs given),
  the third nothing. It runs one branch, so it counts the kernels' 20,000 a trip, not both."""
  text = """\
HloModule m

%b0 (p: f32[8,32]) -> f32[8,16] {
  %p = f32[8,32]{1,0} parameter(0)
  %w = f32[32,16]{1,0} constant({...})
  ROOT %d = f32[8,16]{1,0} dot(%p, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%b1 (p: f32[8,32]) -> f32[8,16] {
  %p = f32[8,32]{1,0} parameter(0)
  %k1 = f32[8,16]{1,0} custom-call(%p), custom_call_target="tpu_custom_call"
  ROOT %k2 = f32[8,16]{1,0} custom-call(%k1), custom_call_target="tpu_custom_call"
}

%b2 (p: f32[8,32]) -> f32[8,16] {
  %p = f32[8,32]{1,0} parameter(0)
  ROOT %z = f32[8,16]{1,0} constant({...})
}

%body (p: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %p = (s32[], f32[8,32]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8,32]{1,0} get-tuple-element(%p), index=1
  %c = f32[8,16]{1,0} conditional(%i, %x, %x, %x), branch_computations={%b0, %b1, %b2}
  ROOT %t = (s32[], f32[8,32]) tuple(%i, %x)
}

ENTRY %main (a: (s32[], f32[8,32])) -> (s32[], f32[8,32]) {
  %a = (s32[], f32[8,32]) parameter(0)
  ROOT %w = (s32[], f32[8,32]) while(%a), condition=%c, body=%body, backend_config={"known_trip_count":{"n":"5"}}
}
"""
  module = hlo.parse(text)
  counted = hlo.flops(module, kernel_cost=lambda k: 10_000.0)
  assert counted.matmul_call == counted.matmul_once == 0
  assert [(k.name, k.weight, k.once) for k in counted.kernels] == [("k1", 5, 1), ("k2", 5, 1)]
  cheap = hlo.flops(module, kernel_cost=lambda k: 1_000.0)  # 2 kernels at 2,000 < the dot's
  assert cheap.matmul_call == 5 * 2 * 8 * 16 * 32 and cheap.matmul_once == 2 * 8 * 16 * 32
  assert not cheap.kernels
  # Without costs, the kernels count their estimates (none here: 0), and the dot wins.
  assert hlo.flops(module).matmul_call == 5 * 8_192


B, T, N, K, H = 2, 1024, 4, 2, 128
SPLASH_LAYER = B * N * 3 * (2 * 2 + 5) * (2 * 512 * 512 * H)  # forward and backward kernels


def _splash_scan(windows=None) -> analysis.Compiled:
  """The gradient of a 3-layer rematerialised scan of splash attention, compiled for one v5e
  chip: causal in every layer, or with `windows`, each layer's traced window (0 = causal)."""
  from scope_jax.models import ops, splash
  kv, valid = jnp.zeros((B, T, K, H), jnp.bfloat16), jnp.ones((B, T), bool)
  devices = topology.devices(topology.parse("v5e-1"))
  q = jax.ShapeDtypeStruct((B, T, N, H), jnp.bfloat16,
                           sharding=NamedSharding(jax.sharding.Mesh(devices, ("x",)), P()))
  xs = None if windows is None else jnp.array(windows, jnp.int32)
  attend = lambda x, w: splash.attend(x, kv, kv, valid, window=w, sliding=256 if xs is not None
                                      else 0)

  def loss(q_):
    step = jax.checkpoint(lambda x, w: (attend(x, w), None),
                          policy=jax.checkpoint_policies.nothing_saveable)
    return jax.lax.scan(step, q_, xs, length=3)[0].astype(jnp.float32).sum()

  program = programs.Program("splash", "train", lambda: jax.jit(jax.grad(loss)).trace(q))
  with ops.compiling_for("tpu", 1):
    return analysis.compile_program(program)


@needs_libtpu
def test_splash_kernels_in_a_scan_are_counted_once_per_trip():
  """Splash attention (no cost estimate: the compiler counts nothing inside it) in a 3-layer
  scan, rematerialised, differentiated: its HLO custom calls are matched to the jaxpr's Pallas
  calls by name and shapes, each counted from its grid (as `test_plan`'s hand count) times the
  trips of the loop around it in the HLO."""
  c = _splash_scan()
  assert c.kernel_flops == 3 * SPLASH_LAYER, (c.kernel_flops, 3 * SPLASH_LAYER)
  # The compiler's own count (no matmul: the backward's row sums of o·do are fused as
  # elementwise products and a sum) lies inside the layer loop: 3 trips of it.
  assert c.matmul_flops == 0 and c.flops > 2 * B * N * T * H
  chex.assert_trees_all_close(c.call_flops - c.kernel_flops, 3 * c.flops, rtol=1e-3)


@needs_libtpu
def test_a_layer_choosing_causal_or_sliding_attention_counts_one_kernel():
  """The same 3-layer scan with a traced window per layer (0, 256, 0: OLMo-3's and Gemma-2's
  alternation) picks the causal or the local kernel with `lax.cond`: each layer runs one, so
  the count equals the all-causal scan's (the local one is counted as causal), not twice it."""
  c = _splash_scan(windows=(0, 256, 0))
  assert c.kernel_flops == 3 * SPLASH_LAYER, c.kernel_flops


@needs_libtpu
def test_batched_matmuls_the_tpu_writes_as_convolutions():
  """The TPU writes a batched matmul as a convolution whose batch dims are spatial, dilated so
  that one kernel tap per output lands on real input (`window={size=4x4 stride=3x3
  lhs_dilate=4x4}`): decode attention's scores and weighted values, 5 steps of
  [B=4, K=4, G=2, H=256] against [B, S=2048, K, H], 2 · 2·B·K·G·S·H each."""
  devices = topology.devices(topology.parse("v5p-8"))[:1]
  sharding = NamedSharding(jax.sharding.Mesh(devices, ("x",)), P())
  q = jax.ShapeDtypeStruct((4, 4, 2, 256), jnp.bfloat16, sharding=sharding)
  kv = jax.ShapeDtypeStruct((4, 2048, 4, 256), jnp.bfloat16, sharding=sharding)

  def steps(q, k, v):
    def step(q, _):
      s = jnp.einsum("BKGH,BSKH->BKGS", q, k, preferred_element_type=jnp.float32)
      p = jax.nn.softmax(s, axis=-1).astype(v.dtype)
      return jnp.einsum("BKGS,BSKH->BKGH", p, v), None
    return jax.lax.scan(step, q, None, length=5)[0]

  c = analysis.compile_program(programs.Program(
      "attend", "decode", lambda: jax.jit(steps).trace(q, kv, kv)))
  by_hand = 5 * 2 * (2 * 4 * 4 * 2 * 2048 * 256)
  assert c.matmul_flops == by_hand, (c.matmul_flops, by_hand)
  assert by_hand / 5 <= c.flops < 1.1 * by_hand / 5  # the softmax's elementwise work
