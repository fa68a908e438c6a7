"""Smoke run of the model layer: a random tiny Qwen2.5-shaped model, greedy-decoded on CPU.

    python -m scope_jax.models.smoke
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import forward, init_cache, init_params, tiny_config


def main():
  cfg = tiny_config("qwen2")
  params = init_params(cfg, jax.random.key(0))
  prompt = jnp.asarray([[1, 2, 3, 4, 5]], jnp.int32)
  step = jax.jit(lambda p, t, c: forward(cfg, p, t, cache=c))
  start = time.perf_counter()
  logits, cache = step(params, prompt, init_cache(cfg, 1, 64))
  out = []
  for _ in range(16):
    nxt = jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(jnp.int32)
    out.append(int(nxt[0, 0]))
    logits, cache = step(params, nxt, cache)
  print(f"devices: {jax.devices()}")
  print(f"params: {sum(np.prod(x.shape) for x in jax.tree.leaves(params)):,}")
  print(f"greedy tokens: {out} ({time.perf_counter() - start:.2f}s)")


if __name__ == "__main__":
  main()
