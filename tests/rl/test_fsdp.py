"""The train step is FSDP on a TPU slice: compiled ahead of time for a v5p-8 (mesh (1, 4, 1)),
a 2-layer Qwen2.5-0.5B-shaped model gathers its weights (about twice per layer: forward, and
backward with the rematerialised forward) and reduce-scatters its gradients; no activation is
all-reduced, and the unembedding is gathered once per micro-batch, not once per loss chunk.

Run as a script to print the toy's collectives and FLOPs (SCOPE_JAX_SPLASH=off for the XLA
attention over the full [T, T]):
  python -m tests.rl.test_fsdp [remat] [file for the compiled HLO]
"""

from __future__ import annotations

import collections
import re

import jax
import jax.numpy as jnp
import optax
import pytest

from scope_jax import sharding as shd
from scope_jax.models import config as model_config
from scope_jax.models import transformer
from scope_jax.plan import analysis, estimates, programs, topology
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import train_step

MIB = 2 ** 20
ROWS, COLS, MICRO, LAYERS = 8, 1024, 2, 2  # 2 micro-batches × 4 rows × 1,024 tokens
TEST_COLS = 512  # the tests' rows: shorter, to compile faster


def toy_model():
  """Qwen2.5-0.5B's dims with 2 layers and an untied lm_head (as the review's toy)."""
  return model_config.PRESETS["qwen2.5-0.5b"].replace(num_layers=LAYERS, tie_embeddings=False)


def compile_toy(remat: str = "full", rules=shd.TRAIN_RULES, loss=None, cols: int = COLS):
  """(compiled, traced) train step of the toy for a v5p-8, bfloat16 compute, float32 params:
  2 micro-batches of 4 rows (one per chip) × `cols` tokens."""
  model = toy_model()
  devices = topology.devices(topology.parse("v5p-8"))
  mesh = shd.make_mesh((1, 4, 1), devices)
  learner = learner_lib.Learner(model, optax.adamw(1e-6), mesh, dtype=jnp.bfloat16, remat=remat,
                                micro_batch_rows=ROWS // MICRO, rules=rules)
  params = programs.param_structs(model, mesh, rules, jnp.float32)
  state = programs.train_state_structs(params, learner.optimizer)
  batch = programs.batch_structs(ROWS, 128, cols, mesh, rules, teacher=False)
  step = learner.compiled_step(loss or train_step.LossConfig(), MICRO)
  from scope_jax.models import ops
  with ops.compiling_for("tpu", len(devices)):
    traced = step.trace(state, batch, None, None)
  return traced.lower().compile(), traced


_OP = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.*?) (all-gather|all-reduce|reduce-scatter)"
                 r"(?:-start)?\(")


def collective_shapes(hlo: str) -> dict[str, collections.Counter]:
  """Result types of every all-gather / all-reduce / reduce-scatter op in the HLO text (loop
  bodies once), by kind."""
  out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for line in hlo.splitlines():
    m = _OP.match(line)
    if m:
      out[m.group(2)][m.group(1)] += 1
  return out


def weight_bytes(model, itemsize: int) -> int:
  return itemsize * sum(int(jnp.prod(jnp.asarray(s))) for s in jax.tree.leaves(
      transformer.param_shapes(model), is_leaf=lambda x: isinstance(x, tuple)))


@pytest.fixture(scope="module")
def toy():
  pytest.importorskip("libtpu")
  before = jax.config.jax_enable_compilation_cache  # compile-only programs cannot be cached
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    compiled, _ = compile_toy(cols=TEST_COLS)
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
  return compiled


def test_no_activation_is_all_reduced(toy):
  """Every all-reduce is small (a norm, a count) or weight-shaped: none carries rows × T of
  activations ([4, T, ·] or [1, T, ·] per chip, T the row or a loss chunk), as tensor
  parallelism over `embed` would."""
  shapes = collective_shapes(toy.as_text())
  big = [s for s in shapes["all-reduce"] if re.search(rf"\[(1|4),({TEST_COLS}|256),", s)]
  assert not big, big


def test_all_gathers_are_the_weights_about_twice(toy):
  """All-gather bytes per step ≤ per micro-batch 2.2 × the layers' bf16 weights (forward, and
  backward with the rematerialised forward) + 1.1 × the bf16 lm_head (once, not once per loss
  chunk and pass): FSDP gathers weights, not activations."""
  model = toy_model()
  colls, _ = analysis.hlo_collectives(toy.as_text())
  v, d = model.vocab_size, model.hidden_size
  layers = weight_bytes(model, 2) - 2 * 2 * v * d  # bf16 layer weights (embed, lm_head apart)
  bound = MICRO * (2.2 * layers + 1.1 * 2 * v * d)
  assert colls["all-gather"].bytes <= bound, (colls["all-gather"].bytes / MIB, bound / MIB)


def test_interconnect_per_micro_batch_is_within_fsdps_minimum(toy):
  """The step's interconnect bytes per chip (every collective with its traffic factor: the
  plan's `collective_traffic`) are at most 1.3x FSDP's minimum for the same shapes (weights
  gathered for the forward and again for the backward, gradients reduce-scattered:
  `estimates.train_minimum`). Tensor parallelism over `embed` (rows replicated, activations
  all-reduced) moves several times that."""
  model = toy_model()
  shapes = estimates.Shapes(model, {"data": 1, "fsdp": 4, "tensor": 1}, "bfloat16", "float32",
                            "full", sampling_weights=0, kv_cache=0, slots=0)
  _, _, minimum = estimates.train_minimum(shapes, ROWS, TEST_COLS, MICRO, chips=4)
  traffic = analysis.collective_traffic(toy.as_text())
  assert traffic["total"] <= 1.3 * minimum, (
      {k: v / MIB for k, v in traffic.items()}, minimum / MIB)


if __name__ == "__main__":
  import sys
  remat = sys.argv[1] if len(sys.argv) > 1 else "full"
  compiled, traced = compile_toy(remat)
  hlo = compiled.as_text()
  if len(sys.argv) > 2:  # where to write the compiled HLO
    with open(sys.argv[2], "w") as f:
      f.write(hlo)
  colls, _ = analysis.hlo_collectives(hlo)
  for kind, c in colls.items():
    print(f"{kind:20s} {c.count:5d} ops {c.bytes / MIB:10.1f} MiB")
  for kind, counter in collective_shapes(hlo).items():
    print(kind)
    for shape, n in counter.most_common(40):
      print(f"   {n:3d} × {shape}")
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  jaxpr = traced.jaxpr.jaxpr
  model = toy_model()
  n = weight_bytes(model, 1) - model.vocab_size * model.hidden_size  # matmul weights
  tokens = ROWS * COLS
  attn = 6 * LAYERS * model.num_heads * model.head_dim * COLS  # causal: half of 12·L·N·H·T
  kernels = hlo.count('custom_call_target="tpu_custom_call"')
  print(f"temp {compiled.memory_analysis().temp_size_in_bytes / MIB:.0f} MiB/chip; "
        f"Pallas kernel calls in the HLO: {kernels}")
  print(f"compiled flops/chip (loops once) {cost.get('flops', 0):.4g}; "
        f"loop factor {analysis.loop_factor(jaxpr):.3f}; "
        f"per chip per call {cost.get('flops', 0) * analysis.loop_factor(jaxpr):.4g}")
  print(f"jaxpr matmul flops (all chips) {analysis.matmul_flops(jaxpr):.4g}; "
        f"6N+causal attn {tokens * (6 * n + attn):.4g} (6N {6 * n * tokens:.4g})")
