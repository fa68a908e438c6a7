"""Multi-turn rollouts on the slot engine vs turn by turn on the sampler, in the same process.

    python -m bench.rollout                      # tiny and ~100M configs
    python -m bench.rollout --configs 100m --prompts 4

Workload: `--prompts` prompts × G = 8 samples; each row takes 1 to 5 turns, skewed (per group of
8: 1, 1, 1, 2, 2, 3, 5, 5 turns), generating 16 to 64 tokens a turn; every turn but the last ends
in a search whose observation holds 3 documents (~500 tokens). A random model cannot choose its
actions, so the script decides them: the turn lengths and counts are fixed per row, and both
sides are driven the way `rollout.run_rollout` drives them:
  * sampler (today's rollout): each turn, one `generate` over every live row's whole context,
    with the longest budget among them; a row's turn is its first L tokens;
  * engine: one request per row and turn with its own budget; a row's next turn is queued as
    soon as its observation is appended, so rows never wait for each other.
Decoding is greedy, so both sides produce the same tokens (checked). Timings exclude compilation
(each side runs the workload once before it is timed); the engine's multi-turn time includes
allocating its cache (in training: once per step and role). The last line reads
`multi-turn speedup: <ratio>x` for the last config (the ~100M model by default).
"""

from __future__ import annotations

import argparse
import collections
import time

import jax
import numpy as np

from scope_jax import host_memory
from scope_jax.models import ModelConfig, init_params, tiny_config
from scope_jax.sampling import Engine, Sampler

CONFIGS = {
    "tiny": lambda: tiny_config("qwen2"),
    "100m": lambda: ModelConfig("qwen2", 151936, 512, 1536, 8, 8, 2, 64, rope_theta=1e6,
                                qkv_bias=True, tie_embeddings=True, max_position_embeddings=4096),
}
CHAR0 = 100  # text encodes one id per character, from here on


TURNS = (1, 1, 1, 2, 2, 3, 5, 5)  # turns per row within a group of 8 samples


class DocumentTool:
  """Three documents per query (deterministic), about 500 tokens of observation in all."""

  def __call__(self, queries):
    rng = np.random.default_rng(0)
    words = ["river", "city", "founded", "by", "the", "in", "of", "a", "king", "north", "old"]
    return ["\n".join(f"Doc {k + 1}(Title: {q} {k}) " + " ".join(rng.choice(words, 34))
                      for k in range(3)) for q in queries]


def script(prompts: int, samples: int, seed: int = 0) -> list[list[int]]:
  """Per row, the new-token budget of each of its turns."""
  rng = np.random.default_rng(seed)
  return [rng.integers(16, 65, TURNS[r % len(TURNS)]).tolist() for r in range(prompts * samples)]


def observation(tool, row: int, turn: int) -> list[int]:
  text = "<information>" + tool([f"q{row}-{turn}"])[0] + "</information>"
  return [CHAR0 + min(ord(c), 1000) for c in text]


def with_sampler(sampler, prompts, plan, g, tool):
  """Today's rollout: all live rows generate a turn together, from their whole context."""
  ctx = [list(prompts[r // g]) for r in range(len(plan))]
  out = [[] for _ in plan]
  for turn in range(max(map(len, plan))):
    live = [r for r in range(len(plan)) if turn < len(plan[r])]
    budget = max(plan[r][turn] for r in live)
    if turn == 0:
      res = sampler.generate(prompts, max_new_tokens=budget, num_samples=g, eos_ids=())
    else:
      res = sampler.generate([ctx[r] for r in live], max_new_tokens=budget, eos_ids=())
    for r, x in zip(live, res if turn else [res[r] for r in live]):
      gen = x.tokens[:plan[r][turn]].tolist()
      out[r] += gen
      ctx[r] += gen
    searched = [r for r in live if turn + 1 < len(plan[r])]
    for r in searched:  # one batched tool call per turn
      ctx[r] += observation(tool, r, turn)
  return out


def with_engine(engine, prompts, plan, g, tool):
  """The engine: a row's next turn is queued as soon as its own observation is in."""
  from scope_jax.sampling import Request, SamplingSpec
  spec = SamplingSpec(eos_ids=())
  ctx = [list(prompts[r // g]) for r in range(len(plan))]
  out, turn = [[] for _ in plan], [0] * len(plan)
  for r in range(len(plan)):
    engine.add(Request(r, ctx[r], plan[r][0], spec=spec))
  while engine.busy():
    for c in engine.step():
      r = c.key
      gen = c.tokens.tolist()
      out[r] += gen
      ctx[r] += gen
      turn[r] += 1
      if turn[r] < len(plan[r]):
        ctx[r] += observation(tool, r, turn[r] - 1)
        engine.add(Request(r, ctx[r], plan[r][turn[r]], turn=turn[r], spec=spec))
      else:
        engine.release(r)
  engine.free()
  return out


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def run_config(name: str, args) -> float:
  cfg = CONFIGS[name]()
  params = init_params(cfg, jax.random.key(0))
  rng = np.random.default_rng(1)
  prompts = [rng.integers(CHAR0 + 97, CHAR0 + 123, args.prompt_len).tolist()
             for _ in range(args.prompts)]
  g, tool = args.samples, DocumentTool()
  plan = script(args.prompts, g)
  sampler = Sampler(cfg, params, max_context=args.max_context)
  engine = Engine(cfg, params, num_slots=args.slots, chunk=args.chunk,
                  max_context=args.max_context, prefill_rows=args.prefill_rows)
  with_sampler(sampler, prompts, plan, g, tool), with_engine(engine, prompts, plan, g, tool)
  sampler.stats = {k: 0 for k in sampler.stats}
  engine.stats.clear()
  ref, t_ref = timed(lambda: with_sampler(sampler, prompts, plan, g, tool))
  ours, t_ours = timed(lambda: with_engine(engine, prompts, plan, g, tool))
  same = ref == ours
  gen = sum(map(len, ref))
  n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  print(f"\n[{name}] {n / 1e6:.1f}M params; {len(prompts)} prompts × G={g}; turns per row "
        f"{dict(sorted(collections.Counter(map(len, plan)).items()))}; {gen} generated tokens; "
        f"identical tokens: {same}")
  print(f"{'':8s} {'wall s':>7s} {'gen tok/s':>9s} {'prefill tok':>11s} {'padded':>8s} "
        f"{'decoded':>8s} {'slot use':>8s}")
  s, e = sampler.stats, engine.stats
  print(f"{'sampler':8s} {t_ref:7.2f} {gen / t_ref:9.1f} {s['prefill_tokens']:11d} "
        f"{s['prefill_padded_tokens']:8d} {s['generated_tokens']:8d} {'':>8s}")
  use = e["live_slot_steps"] / max(e["slot_steps"], 1)
  print(f"{'engine':8s} {t_ours:7.2f} {gen / t_ours:9.1f} {e['prefill_tokens']:11d} "
        f"{e['prefill_padded_tokens']:8d} {e['decode_tokens']:8d} {use:8.0%}")
  print(f"prefill tokens: {s['prefill_tokens'] - e['prefill_tokens']} fewer on the engine "
        f"({e['prefill_tokens'] / max(s['prefill_tokens'], 1):.0%} of the sampler's)")
  # Warmed up on other prompts (no shared prefix), so the timed call prefills its own; the
  # engine's cache stays allocated between calls with the same weights.
  other = [rng.integers(CHAR0 + 65, CHAR0 + 91, args.prompt_len).tolist() for _ in prompts]
  single = lambda player, ps: player.generate(ps, max_new_tokens=args.turn_tokens,
                                              num_samples=g, eos_ids=())
  single(sampler, other), single(engine, other)
  _, t1_ref = timed(lambda: single(sampler, prompts))
  _, t1_ours = timed(lambda: single(engine, prompts))
  print(f"single-turn ({len(prompts) * g} rows × {args.turn_tokens} tokens): sampler "
        f"{t1_ref:.2f} s, engine {t1_ours:.2f} s ({t1_ref / t1_ours:.2f}x)")
  print(f"multi-turn: sampler {t_ref:.2f} s, engine {t_ours:.2f} s ({t_ref / t_ours:.2f}x)")
  return t_ref / t_ours


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--configs", default="tiny,100m")
  ap.add_argument("--prompts", type=int, default=4)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--prompt_len", type=int, default=400,
                  help="prompt tokens: instructions, the tool's description and the question")
  ap.add_argument("--turn_tokens", type=int, default=64)
  ap.add_argument("--max_context", type=int, default=4096)
  ap.add_argument("--slots", type=int, default=32)
  ap.add_argument("--chunk", type=int, default=8)
  ap.add_argument("--prefill_rows", type=int, default=8)
  args = ap.parse_args()
  host_memory.reuse_freed_memory()  # as the entrypoint does, before JAX's first call
  print(f"backend: {jax.default_backend()}; devices: {len(jax.devices())}")
  ratio = None
  for name in args.configs.split(","):
    ratio = run_config(name, args)
  print(f"multi-turn speedup: {ratio:.2f}x")


if __name__ == "__main__":
  main()
