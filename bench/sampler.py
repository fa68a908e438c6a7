"""Decode throughput of the JAX sampler vs Hugging Face `generate` (PyTorch) on the same weights.

    python -m bench.sampler                 # tiny and ~100M configs (+ real Qwen2.5 0.5B if fetched)
    python -m bench.sampler --new_tokens 64 --configs tiny

Both sides decode greedily for exactly `new_tokens` tokens after a 32-token prompt (EOS ignored);
tokens/s counts generated tokens (batch × new tokens) over wall time including prefill. At batch
1 it also prints the fraction of the memory-bandwidth roofline: bytes read per decode step
(weights + KV cache) / measured device read bandwidth, against the measured time per step.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax import host_memory
from scope_jax.models import ModelConfig, init_params, save_hf, tiny_config
from scope_jax.sampling import Sampler

CONFIGS = {
    "tiny": lambda: tiny_config("qwen2"),
    "100m": lambda: ModelConfig("qwen2", 151936, 512, 1536, 8, 8, 2, 64, rope_theta=1e6,
                                qkv_bias=True, tie_embeddings=True, max_position_embeddings=4096),
}


def read_bandwidth(nbytes: int = 512 * 2**20) -> float:
  """Bytes/s of streaming a large device array through a reduction (the roofline's denominator)."""
  x = jnp.ones((nbytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  total(x).block_until_ready()
  reps = 5
  start = time.perf_counter()
  for _ in range(reps):
    y = total(x)
  y.block_until_ready()
  return nbytes * reps / (time.perf_counter() - start)


def time_ours(cfg, params, batch, prompt_len, new_tokens, dtype) -> float:
  sampler = Sampler(cfg, params, dtype=dtype)
  prompts = [list(range(1, prompt_len + 1))] * batch
  sampler.generate(prompts, max_new_tokens=new_tokens, eos_ids=())  # compile
  start = time.perf_counter()
  out = sampler.generate(prompts, max_new_tokens=new_tokens, eos_ids=())
  elapsed = time.perf_counter() - start
  assert all(len(r.tokens) == new_tokens for r in out)
  return elapsed


def time_hf(model, batch, prompt_len, new_tokens) -> float:
  import torch
  ids = torch.arange(1, prompt_len + 1).repeat(batch, 1)
  kwargs = dict(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                pad_token_id=0, attention_mask=torch.ones_like(ids))
  with torch.no_grad():
    model.generate(ids, **{**kwargs, "max_new_tokens": 2, "min_new_tokens": 2})
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
  assert out.shape[1] == prompt_len + new_tokens
  return time.perf_counter() - start


def load(name):
  if name != "qwen2.5-0.5b":
    cfg = CONFIGS[name]()
    return cfg, init_params(cfg, jax.random.key(0))
  from scope_jax import assets
  from scope_jax.models import gguf_io
  return gguf_io.load_gguf(assets.path("qwen2.5-0.5b-gguf"))


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--configs", default="tiny,100m,qwen2.5-0.5b")
  ap.add_argument("--batches", default="1,16")
  ap.add_argument("--new_tokens", type=int, default=128)
  ap.add_argument("--prompt_len", type=int, default=32)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  args = ap.parse_args()
  host_memory.reuse_freed_memory()  # as the entrypoint does, before JAX's first call
  import torch
  from tests.hf_reference import hf_model

  dtype = jnp.dtype(args.dtype)
  bw = read_bandwidth()
  print(f"backend: {jax.default_backend()} ({jax.devices()[0].device_kind}); torch threads "
        f"{torch.get_num_threads()}; read bandwidth {bw / 1e9:.1f} GB/s")
  print(f"{'config':14s} {'params':>9s} {'batch':>5s} {'ours tok/s':>11s} {'HF tok/s':>9s} "
        f"{'ratio':>6s} {'roofline':>8s}")
  for name in args.configs.split(","):
    try:
      cfg, params = load(name)
    except FileNotFoundError as e:
      print(f"{name:14s} skipped: {e}")
      continue
    with tempfile.TemporaryDirectory() as d:
      save_hf(cfg, params, d)
      model = hf_model(d)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    for batch in map(int, args.batches.split(",")):
      ours = time_ours(cfg, params, batch, args.prompt_len, args.new_tokens, dtype)
      hf = time_hf(model, batch, args.prompt_len, args.new_tokens)
      ours_tps, hf_tps = batch * args.new_tokens / ours, batch * args.new_tokens / hf
      roof = ""
      if batch == 1:
        ctx = args.prompt_len + args.new_tokens / 2
        kv = 2 * cfg.num_layers * ctx * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize
        step_bytes = n_params * dtype.itemsize + kv
        roof = f"{(step_bytes / bw) / (ours / args.new_tokens):.0%}"
      print(f"{name:14s} {n_params / 1e6:8.1f}M {batch:5d} {ours_tps:11.1f} {hf_tps:9.1f} "
            f"{ours_tps / hf_tps:5.2f}x {roof:>8s}", flush=True)


if __name__ == "__main__":
  main()
