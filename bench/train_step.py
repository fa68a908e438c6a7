"""Train-step throughput: our jitted GRPO step (forward + backward + AdamW) vs the same model in
PyTorch (transformers) doing forward + backward + AdamW on the same tokens, in one process.

    python -m bench.train_step --configs tiny,100m --batch 4 --seq 256
    python -m bench.train_step --configs 100m --padding_rows 9 --seq 256   # padding skipped

Tokens/s counts every position of the [batch, seq] block per step. With --flops it also prints
model FLOPs utilisation against a peak given in TFLOP/s (6·N·tokens + attention).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench.sampler import load
from scope_jax import host_memory
from scope_jax.models import save_hf
from scope_jax.rl import learner as learner_lib
from scope_jax.rl.batch import TrainBatch
from scope_jax.rl.optim import make_optimizer
from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step


def make_batch(cfg, batch, seq, seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  loss_mask = np.ones((batch, seq), np.float32)
  loss_mask[:, :seq // 4] = 0  # a prompt quarter
  return TrainBatch(tokens=jnp.asarray(tokens), mask=jnp.asarray(mask),
                    loss_mask=jnp.asarray(loss_mask),
                    advantages=jnp.asarray(rng.normal(size=(batch, seq)).astype(np.float32)),
                    old_logp=jnp.full((batch, seq), -8.0, jnp.float32))


def time_ours(cfg, params, batch, steps, dtype, remat):
  opt = make_optimizer(1e-5)
  step = make_train_step(cfg, LossConfig(chunk=128), opt, dtype=dtype, remat=remat)
  state = init_train_state(jax.tree.map(jnp.copy, params), opt)
  state, m = step(state, batch)
  jax.block_until_ready(m["loss"])
  start = time.perf_counter()
  for _ in range(steps):
    state, m = step(state, batch)
  jax.block_until_ready(m["loss"])
  return (time.perf_counter() - start) / steps


def time_torch(model, batch, steps):
  import torch
  tokens = torch.tensor(np.asarray(batch.tokens), dtype=torch.long)
  loss_mask = torch.tensor(np.asarray(batch.loss_mask))
  adv = torch.tensor(np.asarray(batch.advantages))
  opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
  model.train()

  def one():
    logits = model(input_ids=tokens).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    m = loss_mask[:, 1:]
    loss = -(torch.exp(logp - logp.detach()) * adv[:, 1:] * m).sum() / m.sum()
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  one()
  start = time.perf_counter()
  for _ in range(steps):
    one()
  return (time.perf_counter() - start) / steps


def padding_skip(cfg, params, rows: int, seq: int, steps: int, micro_rows: int = 2) -> None:
  """`rows` real rows padded to the learner's micro-batch bucket: the step as it runs (padding
  micro-batches skipped) against the same step made to compute every micro-batch (one token of
  each padding row unmasked; its loss mask stays 0, so the update is the same)."""
  host = jax.tree.map(np.asarray, make_batch(cfg, rows, seq))
  micro = learner_lib.micro_batch_count(rows, micro_rows)
  host = learner_lib.fill_micro_batches(learner_lib.pad_rows(host, micro * micro_rows), rows, micro)
  forced = host.replace(mask=np.where(host.mask.sum(1, keepdims=True) > 0, host.mask,
                                      np.eye(1, seq, 0, dtype=host.mask.dtype)))
  opt = make_optimizer(1e-5)
  step = make_train_step(cfg, LossConfig(chunk=128), opt, micro_batches=micro)
  times = {}
  for name, batch in (("every micro-batch", forced), ("padding skipped", host)):
    state = init_train_state(jax.tree.map(jnp.copy, params), opt)
    state, m = step(state, jax.tree.map(jnp.asarray, batch))
    jax.block_until_ready(m["loss"])
    start = time.perf_counter()
    for _ in range(steps):
      state, m = step(state, jax.tree.map(jnp.asarray, batch))
    jax.block_until_ready(m["loss"])
    times[name] = (time.perf_counter() - start) / steps
  base = times["every micro-batch"]
  print(f"{rows} rows × {seq} in {micro} micro-batches of {micro_rows} "
        f"({-(-rows // micro_rows)} hold real rows):")
  for name, t in times.items():
    print(f"  {name:18s} {t * 1e3:9.1f} ms/step  {base / t:5.2f}x")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--configs", default="tiny,100m")
  ap.add_argument("--batch", type=int, default=4)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--remat", default="none")
  ap.add_argument("--peak_tflops", type=float, default=0.0, help="for MFU (e.g. 989 on H100 bf16)")
  ap.add_argument("--padding_rows", type=int, default=0,
                  help="instead: time skipping the padding micro-batches of this many rows")
  args = ap.parse_args()
  host_memory.reuse_freed_memory()  # as the entrypoint does, before JAX's first call
  if args.padding_rows:
    for name in args.configs.split(","):
      padding_skip(*load(name), args.padding_rows, args.seq, args.steps)
    return
  from tests.hf_reference import hf_model
  print(f"backend: {jax.default_backend()}; batch {args.batch} × seq {args.seq}")
  print(f"{'config':10s} {'params':>8s} {'ours tok/s':>11s} {'torch tok/s':>12s} {'ratio':>6s} "
        f"{'MFU':>6s}")
  for name in args.configs.split(","):
    cfg, params = load(name)
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    batch = make_batch(cfg, args.batch, args.seq)
    with tempfile.TemporaryDirectory() as d:
      save_hf(cfg, params, d)
      model = hf_model(d)
    ours = time_ours(cfg, params, batch, args.steps, jnp.dtype(args.dtype), args.remat)
    theirs = time_torch(model, batch, args.steps)
    tokens = args.batch * args.seq
    mfu = ""
    if args.peak_tflops:
      attn = 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * args.seq
      mfu = f"{(6 * n + attn) * tokens / ours / (args.peak_tflops * 1e12):.1%}"
    print(f"{name:10s} {n / 1e6:7.1f}M {tokens / ours:11.1f} {tokens / theirs:12.1f} "
          f"{theirs / ours:5.2f}x {mfu:>6s}", flush=True)


if __name__ == "__main__":
  main()
