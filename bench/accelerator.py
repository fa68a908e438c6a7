"""One-shot accelerator check: decode tokens/s and the train step's MFU on whatever JAX device is
present, for random-init Qwen2.5-0.5B / 1.5B / 7B shapes, as one table.

    python -m bench.accelerator                  # the three sizes (sized for under 8 minutes on one GPU)
    python -m bench.accelerator --sizes=qwen2.5-0.5b --decode_batches=1,64
    python -m bench.accelerator --dry            # a tiny model, seconds on a CPU (tested)

Decode: the sampler decodes greedily from a 32-token prompt; the time per step is the difference
of two runs (`--short` and `--long` new tokens) over the extra steps, so prefill and compilation
drop out. Its roofline is the bytes one step must read (the weights once, in the sampling dtype,
plus the KV cache up to the average context) over the device's HBM bandwidth: the table prints
that fraction against the datasheet bandwidth and, as the in-process baseline, against the read
bandwidth measured by streaming a large array just before. Train: one jitted GRPO step (forward,
backward, AdamW) on `--train_rows` × `--train_len` tokens, computed in bfloat16 on float32 master
weights (the trainer's layout);
MFU = (6·N + causal attention) FLOPs per token × tokens / step time / the chip's peak. Sizes that
do not fit print `OOM` and the table goes on. Every number is measured on this device; peak
figures come from `PEAKS` (datasheets).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.sampler import read_bandwidth
from scope_jax.models import config as model_config
from scope_jax.models import transformer
from scope_jax.rl.batch import TrainBatch
from scope_jax.rl.optim import make_optimizer
from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step
from scope_jax.sampling import Sampler


@dataclasses.dataclass(frozen=True)
class Peak:
  bf16_flops: float  # dense FLOP/s
  hbm_bandwidth: float  # bytes/s


# Datasheet figures (dense bfloat16, no sparsity). Matched against `device_kind` in order.
PEAKS = (
    ("H200", Peak(989e12, 4.8e12)),
    ("H100", Peak(989e12, 3.35e12)),
    ("A100", Peak(312e12, 2.039e12)),
    ("L4", Peak(121e12, 0.3e12)),
    ("TPU v5p", Peak(459e12, 2.765e12)),
    ("TPU v5 lite", Peak(197e12, 0.819e12)),
    ("TPU v5e", Peak(197e12, 0.819e12)),
    ("TPU v6", Peak(918e12, 1.64e12)),
    ("TPU v4", Peak(275e12, 1.2e12)),
)


def device_peak(kind: str) -> Peak | None:
  """The datasheet peak of a device kind ('NVIDIA H200', 'TPU v5p', ...); None when unknown."""
  for name, peak in PEAKS:
    if name.lower() in kind.lower():
      return peak
  return None


def model_for(size: str) -> model_config.ModelConfig:
  return model_config.tiny_config("qwen2") if size == "tiny" else model_config.get_preset(size)


def count_params(cfg) -> int:
  return sum(int(np.prod(s)) for s in jax.tree.leaves(
      transformer.param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)))


def matmul_params(cfg) -> int:
  """Weights the 6N rule counts: every matmul weight, the lm_head included (the tied embedding
  counts once, as the output projection), the input embedding lookup excluded."""
  n = count_params(cfg)
  return n if cfg.tie_embeddings else n - cfg.vocab_size * cfg.hidden_size


def train_flops_per_token(cfg, length: int) -> float:
  """6N plus causal attention (scores and weighted sum, forward and backward: 6·L·N·H·T per
  token on average over a causal row of T)."""
  return 6 * matmul_params(cfg) + 6 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length


def decode_step_bytes(cfg, context: float, dtype) -> float:
  """Bytes one decode step reads per row-independent part (the weights once) plus one row's
  KV cache at `context` positions (keys and values, every layer)."""
  itemsize = jnp.dtype(dtype).itemsize
  kv_per_pos = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * itemsize
  return count_params(cfg) * itemsize, kv_per_pos * context


def time_decode(cfg, params, batch: int, short: int, long: int, prompt_len: int, dtype,
                repeats: int = 3) -> float:
  """Seconds per decode step at `batch` rows (prefill and compilation excluded; the fastest of
  `repeats` runs of each length)."""
  sampler = Sampler(cfg, params, dtype=dtype)
  prompts = [list(range(1, prompt_len + 1))] * batch
  times = {}
  for n in (short, long):
    sampler.generate(prompts, max_new_tokens=n, eos_ids=())  # compile
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      out = sampler.generate(prompts, max_new_tokens=n, eos_ids=())
      best = min(best, time.perf_counter() - start)
    times[n] = best
    assert all(len(r.tokens) == n for r in out), "a row stopped early"
  if times[long] <= times[short]:
    raise RuntimeError(f"decode of {long} tokens took no longer than {short} ({times[long]:.4f} s "
                       f"vs {times[short]:.4f} s): raise --long to measure per-step time.")
  return (times[long] - times[short]) / (long - short)


def train_batch(cfg, rows: int, length: int) -> TrainBatch:
  rng = np.random.default_rng(0)
  loss_mask = np.ones((rows, length), np.float32)
  loss_mask[:, :length // 4] = 0  # a prompt quarter
  return TrainBatch(
      tokens=jnp.asarray(rng.integers(0, cfg.vocab_size, (rows, length)), jnp.int32),
      mask=jnp.ones((rows, length), jnp.int32), loss_mask=jnp.asarray(loss_mask),
      advantages=jnp.asarray(rng.normal(size=(rows, length)), jnp.float32),
      old_logp=jnp.full((rows, length), -8.0, jnp.float32))


def time_train(cfg, params, rows: int, length: int, steps: int, remat: str) -> float:
  """Seconds per jitted GRPO step (forward, backward, AdamW): bfloat16 compute, float32 master
  weights and moments, as the trainer holds them."""
  opt = make_optimizer(1e-6)
  step = make_train_step(cfg, LossConfig(chunk=512), opt, dtype=jnp.bfloat16, remat=remat)
  state = init_train_state(jax.tree.map(lambda x: x.astype(jnp.float32), params), opt)
  batch = train_batch(cfg, rows, length)
  state, m = step(state, batch)  # compile
  jax.block_until_ready(m["loss"])
  start = time.perf_counter()
  for _ in range(steps):
    state, m = step(state, batch)
  jax.block_until_ready(m["loss"])
  return (time.perf_counter() - start) / steps


def _oom(e: Exception) -> bool:
  text = str(e)
  return "RESOURCE_EXHAUSTED" in text or "Out of memory" in text or "out of memory" in text


def run(args) -> list[dict]:
  """Measures every size; one dict per (size, measurement) row of the table."""
  device = jax.devices()[0]
  peak = device_peak(device.device_kind)
  bw = read_bandwidth(args.bandwidth_bytes)
  print(f"device: {device.platform} ({device.device_kind}), {jax.device_count()} device(s) "
        f"(the first is measured); datasheet: "
        + (f"{peak.bf16_flops / 1e12:.0f} TFLOP/s bf16, {peak.hbm_bandwidth / 1e12:.2f} TB/s"
           if peak else "unknown (no MFU or datasheet roofline)")
        + f"; measured stream read {bw / 1e9:.1f} GB/s", flush=True)
  rows = []
  for size in args.sizes.split(","):
    cfg = model_for(size)
    n = count_params(cfg)
    try:
      params = jax.jit(lambda k, c=cfg: transformer.init_params(c, k, jnp.bfloat16))(
          jax.random.key(0))
    except Exception as e:  # noqa: BLE001 - a size that does not fit is a row, not a crash
      if not _oom(e):
        raise
      rows.append(dict(size=size, params=n, what="init", result="OOM"))
      continue
    for batch in map(int, args.decode_batches.split(",")):
      row = dict(size=size, params=n, what=f"decode, batch {batch}")
      try:
        sec = time_decode(cfg, params, batch, args.short, args.long, args.prompt_len,
                          jnp.bfloat16)
      except Exception as e:  # noqa: BLE001
        if not _oom(e):
          raise
        rows.append({**row, "result": "OOM"})
        continue
      weights, kv = decode_step_bytes(cfg, args.prompt_len + (args.short + args.long) / 2,
                                      jnp.bfloat16)
      need = weights + batch * kv
      row.update(result=f"{batch / sec:,.0f} tok/s", step_ms=sec * 1e3,
                 roofline_measured=need / bw / sec,
                 roofline_datasheet=(need / peak.hbm_bandwidth / sec) if peak else None)
      rows.append(row)
      print(_line(row), flush=True)
    if args.train_rows:
      row = dict(size=size, params=n, what=f"train, {args.train_rows}×{args.train_len}")
      try:
        sec = time_train(cfg, params, args.train_rows, args.train_len, args.train_steps,
                         args.remat)
      except Exception as e:  # noqa: BLE001
        if not _oom(e):
          raise
        rows.append({**row, "result": "OOM"})
        print(_line(rows[-1]), flush=True)
        del params
        continue
      tokens = args.train_rows * args.train_len
      flops = train_flops_per_token(cfg, args.train_len) * tokens
      row.update(result=f"{tokens / sec:,.0f} tok/s", step_ms=sec * 1e3,
                 mfu=(flops / sec / peak.bf16_flops) if peak else None)
      rows.append(row)
      print(_line(row), flush=True)
    del params
  return rows


def _count(n: int) -> str:
  return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _pct(x) -> str:
  return "n/a" if x is None else f"{x:.1%}"


def _line(r: dict) -> str:
  if r.get("result") == "OOM":
    return f"{r['size']} {r['what']}: OOM"
  extra = (f"MFU {_pct(r.get('mfu'))}" if "mfu" in r else
           f"roofline {_pct(r.get('roofline_datasheet'))} (of measured read: "
           f"{_pct(r.get('roofline_measured'))})")
  return f"{r['size']} {r['what']}: {r['result']}, {r['step_ms']:.2f} ms/step, {extra}"


def table(rows: list[dict]) -> str:
  """The one table: a Markdown row per measurement."""
  out = ["| model | params | measurement | throughput | ms/step | HBM roofline (datasheet) | "
         "HBM roofline (measured read) | MFU |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    out.append(f"| {r['size']} | {_count(r['params'])} | {r['what']} | {r['result']} | "
               + (f"{r['step_ms']:.2f}" if "step_ms" in r else "–") + " | "
               + (_pct(r.get("roofline_datasheet")) if "roofline_measured" in r else "–") + " | "
               + (_pct(r.get("roofline_measured")) if "roofline_measured" in r else "–") + " | "
               + (_pct(r.get("mfu")) if "mfu" in r else "–") + " |")
  return "\n".join(out)


def parse(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--sizes", default="qwen2.5-0.5b,qwen2.5-1.5b,qwen2.5-7b")
  ap.add_argument("--decode_batches", default="1,64")
  ap.add_argument("--prompt_len", type=int, default=32)
  ap.add_argument("--short", type=int, default=32, help="new tokens of the shorter decode run")
  ap.add_argument("--long", type=int, default=160, help="new tokens of the longer decode run")
  ap.add_argument("--train_rows", type=int, default=8)
  ap.add_argument("--train_len", type=int, default=2048)
  ap.add_argument("--train_steps", type=int, default=3)
  ap.add_argument("--remat", default="full")
  ap.add_argument("--bandwidth_bytes", type=int, default=1 << 30)
  ap.add_argument("--dry", action="store_true",
                  help="a tiny model and tiny shapes: checks the script runs (seconds on a CPU)")
  args = ap.parse_args(argv)
  if args.short >= args.long:
    ap.error(f"--short ({args.short}) must be below --long ({args.long}).")
  if args.dry:
    args.sizes, args.decode_batches, args.short, args.long = "tiny", "1,4", 4, 64
    args.train_rows, args.train_len, args.train_steps = 2, 64, 1
    args.bandwidth_bytes = 1 << 22
  return args


def main(argv=None) -> int:
  args = parse(argv)
  rows = run(args)
  print()
  print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
