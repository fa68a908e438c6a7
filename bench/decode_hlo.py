"""What the engine's decode chunk compiles to on a TPU slice, per KV cache layout and decode mode
(compile-only devices from libtpu: no TPU needed).

    python -m bench.decode_hlo                           # 0.5B-shaped, 2 layers, 64 × 4,096, v5p-8
    python -m bench.decode_hlo --model 7b --capacity 20480
    python -m bench.decode_hlo --model gemma2-2b --variants slots/inplace   # head dim 256

For each variant it prints the compiler's temporaries (`memory_analysis`), the bytes one call
accesses as the compiler counts them (`cost_analysis`, the loop body counted once, so about one
step) and as the HLO counts them per step (`plan.hbm`: every op's HBM reads and writes, the call
over its steps), each against the minimum of a step (the weights once, less the embedding table
of which a step reads B rows, plus the KV window), and the whole-cache copies in the HLO
(`cache_copies`). On `SLOTS`, decode attention
is the Pallas kernel (`models/decode_attention.py`); `SCOPE_JAX_DECODE_KERNEL=off` measures XLA's.
"""

from __future__ import annotations

import argparse
import collections
import re
import time

from scope_jax.plan import hbm, hlo, topology

topology.quiet_libtpu()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from scope_jax import sharding as shd  # noqa: E402
from scope_jax.models import kv_cache as kvc  # noqa: E402
from scope_jax.models import ops, transformer  # noqa: E402
from scope_jax.models.config import ModelConfig, get_preset  # noqa: E402
from scope_jax.sampling import engine as engine_lib  # noqa: E402
from scope_jax.sampling import slot_ops  # noqa: E402
from scope_jax.sampling.sampler import SamplingSpec  # noqa: E402

MODELS = {  # Qwen2.5 shapes, cut to `--layers`
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_heads=14,
                 num_kv_heads=2, head_dim=64),
    "7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_heads=28,
               num_kv_heads=4, head_dim=128),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_heads=4,
                 num_kv_heads=2, head_dim=16),
}


PRESETS = ("gemma2-2b",)  # model presets cut to `--layers` (their own shapes otherwise)


def model_config(name: str, layers: int) -> ModelConfig:
  if name in PRESETS:
    base = get_preset(name)
    return base.replace(num_layers=layers, layer_types=base.layer_types[:layers])
  d = MODELS[name]
  return ModelConfig("qwen2", d["vocab_size"], d["hidden_size"], d["intermediate_size"], layers,
                     d["num_heads"], d["num_kv_heads"], d["head_dim"], rope_theta=1e6,
                     qkv_bias=True, max_position_embeddings=32768)


def _struct(x, sharding):
  return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def decode_program(config: ModelConfig, mesh, *, slots: int, capacity: int, chunk: int,
                   layout: str, in_place: bool, gathered: int = 0, window: int | None = None,
                   dtype=jnp.bfloat16):
  """The traced engine decode (every slot, or `gathered` rows per slot shard) for the TPU."""
  rules = shd.SAMPLING_RULES
  with ops.compiling_for("tpu", mesh.devices.size):
    cache_sh, row_col = engine_lib.cache_shardings(config, mesh, rules, capacity, layout)
    empty = jax.eval_shape(lambda: slot_ops.empty(config, slots, capacity, dtype, shardings=None,
                                                  layout=layout))
    cache = jax.tree.map(_struct, empty[0], cache_sh)
    logits = jax.ShapeDtypeStruct((slots, config.vocab_size), jnp.float32, sharding=row_col)
    shapes = transformer.param_shapes(config)
    shardings = transformer.param_shardings(config, mesh, rules)
    params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s, dtype, sharding=sh), shapes,
                          shardings, is_leaf=lambda x: isinstance(x, tuple))
    d = shd.batch_shards(mesh, rules)
    b = d * gathered if gathered else slots
    put = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt,
                                                 sharding=shd.batch_sharding(mesh, shape, rules))
    rows = put((d, gathered), jnp.int32) if gathered else None
    scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=shd.replicated(mesh))
    spec = SamplingSpec(temperature=1.0, eos_ids=(0,)).compiled()
    traced = slot_ops.decode.trace(
        config, spec, params, cache, logits, rows, put((b,), jnp.bool_), put((b,), jnp.int32),
        put((b,), jnp.int32), put((b,), jnp.int32), put((b,), jnp.int32), scalar, chunk=chunk,
        window=window or capacity, dtype=dtype, shardings=(cache_sh, row_col), in_place=in_place,
        activations=shd.activations(mesh, rules))  # as the engine traces it
  return traced, params, cache


def _shard_elems(x) -> int:
  shape = x.sharding.shard_shape(x.shape)
  n = 1
  for s in shape:
    n *= s
  return n


_OP = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\w+)\[([\d,]*)\]\S* (\w[\w-]*)\(")
_CALLS = re.compile(r"calls=%([\w.-]+)")


def cache_copies(hlo: str, buffer_shape) -> collections.Counter:
  """Copies and transposes whose result is a KV buffer (any order of `buffer_shape`'s dims):
  top-level ops of the entry and loop computations, or top-level fusions whose root is one.
  A relayout inside a fusion (the attention's operand read) is not a copy in memory."""
  comps, comp, roots, fused = collections.defaultdict(list), None, {}, set()
  for line in hlo.splitlines():
    head = re.match(r"^(?:ENTRY )?%([\w.-]+) ", line)
    if head and line.rstrip().endswith("{"):
      comp = head.group(1)
    m = _OP.match(line)
    if not m or comp is None:
      continue
    comps[comp].append((m, line))
    if line.lstrip().startswith("ROOT"):
      roots[comp] = m.group(4)
    calls = _CALLS.search(line)
    if m.group(4) == "fusion" and calls:
      fused.add(calls.group(1))
  want = sorted(buffer_shape)
  found = collections.Counter()
  for name, ops_ in comps.items():
    if name in fused:
      continue
    for m, line in ops_:
      if sorted(int(x) for x in m.group(3).split(",") if x) != want:
        continue
      op = m.group(4)
      if op == "fusion":
        calls = _CALLS.search(line)
        op = "fusion:" + roots.get(calls.group(1), "?") if calls else op
      if op in ("copy", "transpose", "fusion:copy", "fusion:transpose", "copy-start"):
        found[op] += 1
  return found


def measure(config, mesh, **kw) -> dict:
  start = time.perf_counter()
  traced, params, cache = decode_program(config, mesh, **kw)
  compiled = traced.lower().compile()
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  item = jnp.dtype(cache.k[0].dtype).itemsize
  layer = _shard_elems(cache.k[0])
  window = kw.get("window") or kw["capacity"]
  rows = kw.get("gathered") or kw["slots"] // shd.batch_shards(mesh, shd.SAMPLING_RULES)
  per_row = layer // (kw["slots"] // shd.batch_shards(mesh, shd.SAMPLING_RULES))
  kv_read = 2 * config.num_layers * rows * per_row * window // kw["capacity"] * item
  read = {k: v for k, v in params.items() if k != "embed" or config.tie_embeddings}  # rows only
  weights = sum(_shard_elems(x) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(read))
  cache_bytes = sum(_shard_elems(x) * jnp.dtype(x.dtype).itemsize for x in cache.k + cache.v)
  text = compiled.as_text()
  counted = hbm.traffic(hlo.parse(text))
  steps = kw["chunk"]
  return dict(temp=mem.temp_size_in_bytes, bytes=float(cost.get("bytes accessed", 0.0)),
              step=counted.call / steps, loop_step=(counted.call - counted.outside) / steps,
              outside=counted.outside, minimum=weights + kv_read, cache=cache_bytes,
              copies=cache_copies(text, cache.k[0].sharding.shard_shape(cache.k[0].shape)),
              seconds=time.perf_counter() - start)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--model", default="0.5b", choices=sorted(MODELS) + list(PRESETS))
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--slots", type=int, default=64)
  ap.add_argument("--capacity", type=int, default=4096)
  ap.add_argument("--chunk", type=int, default=16)
  ap.add_argument("--topology", default="v5p-8")
  ap.add_argument("--variants", default="heads/copy,heads/inplace,slots/copy,slots/inplace,"
                  "slots/inplace/gather12")
  args = ap.parse_args()
  config = model_config(args.model, args.layers)
  devices = topology.devices(topology.parse(args.topology))
  mesh = shd.make_mesh((1, -1, 1), devices)
  print(f"{args.model}-shaped, {args.layers} layers, {args.slots} slots × {args.capacity}, "
        f"chunk {args.chunk}, {args.topology} mesh {dict(mesh.shape)}; MiB per chip")
  print(f"{'variant':24s} {'temp':>9s} {'cache':>8s} {'bytes':>9s} {'ratio':>6s} {'HLO step':>9s} "
        f"{'ratio':>6s} {'minimum':>9s} {'whole-cache copies':>20s} {'compile':>8s}")
  for variant in args.variants.split(","):
    parts = variant.split("/")
    gathered = int(parts[2][len("gather"):]) if len(parts) > 2 else 0
    r = measure(config, mesh, slots=args.slots, capacity=args.capacity, chunk=args.chunk,
                layout=parts[0], in_place=parts[1] == "inplace", gathered=gathered)
    mib = lambda x: x / 2**20
    copies = ", ".join(f"{k} {v}" for k, v in sorted(r["copies"].items())) or "none"
    print(f"{variant:24s} {mib(r['temp']):9.1f} {mib(r['cache']):8.1f} {mib(r['bytes']):9.1f} "
          f"{r['bytes'] / r['minimum']:5.2f}x {mib(r['step']):9.1f} "
          f"{r['step'] / r['minimum']:5.2f}x "
          f"{mib(r['minimum']):9.1f} {copies:>20s} {r['seconds']:7.0f}s", flush=True)


if __name__ == "__main__":
  main()
