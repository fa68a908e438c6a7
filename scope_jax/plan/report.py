"""A run's plan on a TPU slice: its programs compiled for the slice, what stays resident, the peak
of each phase against the chip's HBM, and estimates from the compiled code (decode bytes against
the minimum, train FLOPs against the model's, MFU at the roofline, collectives). Every time here
is a roofline estimate from the compiler's counts and the chip's public peaks, never a
measurement."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import ml_collections

from scope_jax import sharding as shd
from scope_jax.core import runner
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.plan import analysis, programs as prog, topology
from scope_jax.plan.topology import GIB


@dataclasses.dataclass
class Plan:
  slice: topology.Slice
  mesh: dict[str, int]
  model: ModelConfig
  compiled: list[analysis.Compiled]
  resident: prog.Resident
  weights: int  # bytes per chip of one copy of the weights in the sampling layout

  @property
  def hbm(self) -> int:
    return self.slice.chip.hbm_bytes

  def phase_peak(self, kinds) -> int:
    """Resident arrays plus the largest program of `kinds` (its own arrays beyond them); the
    rollout phase adds the KV cache, which is freed before every update."""
    extra = [c.extra() for c in self.compiled if c.program.kind in kinds]
    cache = self.resident.kv_cache if "decode" in kinds else 0
    return self.resident.total + cache + max(extra, default=0)

  @property
  def update_peak(self) -> int:
    return self.phase_peak(("train",))

  @property
  def rollout_peak(self) -> int:
    return self.phase_peak(("prefill", "decode", "encoder"))

  @property
  def peak(self) -> int:
    return max(self.update_peak, self.rollout_peak)

  @property
  def fits(self) -> bool:
    return self.peak <= self.hbm


def model_flops_per_token(model: ModelConfig, context: int) -> float:
  """6N (forward and backward over every matmul weight, the output projection included, not the
  input embedding lookup) plus causal attention, 6·L·heads·head_dim·T (scores and values)."""
  n = model.num_params() - model.vocab_size * model.hidden_size * (0 if model.tie_embeddings else 1)
  if model.num_experts:  # only the routed experts' weights multiply a token
    expert = 3 * model.hidden_size * model.moe_intermediate_size
    n -= model.num_layers * expert * (model.num_experts - model.num_experts_per_tok)
  return 6.0 * n + 6.0 * model.num_layers * model.num_heads * model.head_dim * context


def resident_memory(shapes: prog.RunShapes, states: dict[str, Any], cache: int) -> prog.Resident:
  """What lives for the whole run, per chip: each policy's params and optimizer state, a sampler
  copy of each played weight set where the sampling layout differs from the training one, the
  base model where a frozen role or a KL reference reads it, tracked params."""
  copy = shapes.sampler_copy_bytes()
  weights = prog.bytes_per_chip(shapes.params(shapes.train_rules))
  items = {}
  for name, state in states.items():
    items[f"{name}: params + optimizer state"] = prog.bytes_per_chip(state)
    if copy:
      items[f"{name}: sampler copy"] = copy
  players, c = shapes.players, shapes.config
  kl = c.loss.kl_beta > 0 or any(p.loss.get("kl_beta", 0) > 0 for p in players.policies.values())
  if players.frozen or kl:
    what = ", ".join(list(players.frozen) + (["KL reference"] if kl else []))
    items[f"base model ({what})"] = weights
    if players.frozen and copy:
      items["base model: sampler copy"] = copy
  for name in players.tracked:
    items[f"{name} (tracked)"] = weights + copy
  return prog.Resident(items, kv_cache=cache)


def build(config: ml_collections.ConfigDict, s: topology.Slice, programs: str = "all") -> Plan:
  """Compiles the run's programs for slice `s` under `config.mesh.shape` and its rules."""
  devices = topology.devices(s)
  mesh = shd.make_mesh(tuple(config.mesh.shape), devices)
  method = runner.load_method(config).METHOD
  shapes = prog.RunShapes(config, prog.model_config(config.model), mesh, method.players(config))
  train, states = prog.train_programs(shapes)
  if config.rollout.get("engine", True):
    sample, cache = prog.engine_programs(shapes)
  else:
    sample, cache = prog.sampler_programs(shapes)
  todo = train + sample
  if method.searches:
    todo.append(prog.encoder_program(shapes))
  if programs != "all":
    todo = [p for p in todo if any(p.name.startswith(k) for k in programs.split(","))]
  compiled = [analysis.compile_program(p, "tpu", len(devices)) for p in todo]
  return Plan(s, dict(mesh.shape), shapes.model, compiled,
              resident_memory(shapes, states, cache),
              prog.bytes_per_chip(shapes.sampling_params()))


# ------------------------------------------------------------------------------- estimates

def decode_rows(plan: Plan) -> list[dict]:
  """Per decode step: bytes the compiled step reads against the minimum (the weights once and
  the whole KV cache), and the step time that chip bandwidth implies."""
  out = []
  for c in plan.compiled:
    if not c.program.name.endswith("decode_step") or c.error:
      continue
    minimum = plan.weights + plan.resident.kv_cache
    seconds = c.call_bytes / plan.slice.chip.hbm_bandwidth
    out.append({"program": c.program.name, "bytes": c.call_bytes, "minimum": minimum,
                "ratio": c.call_bytes / minimum, "seconds": seconds,
                "tokens_per_s": c.program.tokens / seconds if seconds else math.nan})
  return out


def train_rows(plan: Plan, config: ml_collections.ConfigDict) -> list[dict]:
  """Per update: model FLOPs against the compiled FLOPs (remat's recompute and any waste) and
  the MFU the step would reach if it ran its compiled FLOPs at the chip's peak."""
  chip, chips = plan.slice.chip, plan.slice.total_chips
  prompt = prog.length_bucket(config.rollout.max_prompt_tokens)
  out = []
  for c in plan.compiled:
    if c.program.kind != "train" or c.error:
      continue
    cols = prompt + prog.length_bucket(
        max(config.rollout.max_context - config.rollout.max_prompt_tokens, 1))
    model = c.program.tokens * model_flops_per_token(plan.model, cols)
    seconds = c.call_flops / chip.bf16_flops  # the compiled FLOPs at the chip's peak
    out.append({"program": c.program.name, "model_flops": model,
                "compiled_flops": c.call_flops * chips, "ratio": c.call_flops * chips / model,
                "seconds": seconds, "mfu": model / chips / (seconds * chip.bf16_flops)})
  return out


def loop_gathers(plan: Plan) -> list[str]:
  """All-gathers of a whole weight inside a decode loop: a layout that gathers weights on every
  generated token."""
  shapes = jax.tree.leaves(transformer.param_shapes(plan.model),
                           is_leaf=lambda x: isinstance(x, tuple))
  whole = {tuple(s) for s in shapes} | {tuple(s[1:]) for s in shapes if len(s) > 1}
  flagged = []
  for c in plan.compiled:
    if c.program.kind != "decode":
      continue
    for shape, size in c.loop_gathers:
      dims = tuple(int(d) for d in shape.split("[")[1].rstrip("]").split(",") if d)
      if dims in whole or tuple(d for d in dims if d != 1) in whole:
        flagged.append(f"{c.program.name}: all-gather {shape} ({size / 2**20:.1f} MiB) every step")
  return flagged


# ------------------------------------------------------------------------------- tables

def _gib(n: float) -> str:
  return f"{n / GIB:.2f}"


def render(plan: Plan, config: ml_collections.ConfigDict) -> str:
  s, lines = plan.slice, []
  lines.append(f"## {config.method} on {s.name} ({s.total_chips} × {s.chip.generation}, "
               f"{_gib(s.chip.hbm_bytes)} GiB HBM per chip), mesh {plan.mesh}")
  lines.append(f"Model {plan.model.model_type}: {plan.model.num_params() / 1e9:.2f}B parameters; "
               f"params {config.model.param_dtype}, compute {config.model.dtype}, "
               f"remat {config.model.remat}.\n")
  lines.append("| program | what | compile (s) | arguments | outputs | temporaries | "
               "peak (GiB per chip) |")
  lines.append("|---|---|---|---|---|---|---|")
  for c in plan.compiled:
    if c.error:
      lines.append(f"| {c.program.name} | {c.program.note} | {c.seconds:.0f} | — | — | "
                   f"{_gib(c.temp)} | refused by the compiler: {c.error} |")
      continue
    lines.append(f"| {c.program.name} | {c.program.note} | {c.seconds:.0f} | {_gib(c.argument)} | "
                 f"{_gib(c.output - c.alias)} | {_gib(c.temp)} | {_gib(c.peak)} |")
  lines.append("\n| resident for the whole run | GiB per chip |\n|---|---|")
  for name, n in plan.resident.items.items():
    lines.append(f"| {name} | {_gib(n)} |")
  lines.append(f"| KV cache (rollouts only, one engine at a time) | {_gib(plan.resident.kv_cache)} |")
  verdict = (f"**fits**, {_gib(plan.hbm - plan.peak)} GiB to spare" if plan.fits
             else f"**does not fit**, {_gib(plan.peak - plan.hbm)} GiB over")
  lines.append(f"\nPeak per chip: update {_gib(plan.update_peak)} GiB, rollout "
               f"{_gib(plan.rollout_peak)} GiB, of {_gib(plan.hbm)} GiB: {verdict}.")
  lines.append("\nEstimates from the compiled code and the chip's peaks (not measurements):\n")
  lines.append("| program | estimate |\n|---|---|")
  for r in decode_rows(plan):
    lines.append(f"| {r['program']} | reads {_gib(r['bytes'])} GiB per step per chip, "
                 f"{r['ratio']:.2f}× the minimum (weights + KV cache {_gib(r['minimum'])} GiB); "
                 f"{r['seconds'] * 1e3:.2f} ms per step at HBM bandwidth, "
                 f"{r['tokens_per_s']:,.0f} tokens/s |")
  for r in train_rows(plan, config):
    lines.append(f"| {r['program']} | compiled FLOPs {r['ratio']:.2f}× the model's "
                 f"({r['model_flops'] / 1e15:.1f} PFLOP per update); roofline "
                 f"{r['seconds']:.1f} s per update, MFU {100 * r['mfu']:.0f}% |")
  lines.append("\n| program | all-gather | reduce-scatter | all-reduce | all-to-all | "
               "collective-permute |\n|---|---|---|---|---|---|")
  for c in plan.compiled:
    cells = [f"{v.count} × {v.bytes / max(v.count, 1) / 2**20:.1f} MiB" if v.count else "—"
             for v in c.collectives.values()]
    lines.append(f"| {c.program.name} | " + " | ".join(cells) + " |")
  flagged = loop_gathers(plan)
  lines.append("\n" + ("\n".join(f"WARNING: {f}" for f in flagged) if flagged else
                       "No decode loop gathers a whole weight."))
  return "\n".join(lines)


def to_json(plan: Plan, config: ml_collections.ConfigDict) -> dict:
  return {
      "slice": plan.slice.name, "chips": plan.slice.total_chips, "mesh": plan.mesh,
      "hbm_bytes": plan.hbm, "fits": plan.fits, "update_peak": plan.update_peak,
      "rollout_peak": plan.rollout_peak, "resident": plan.resident.items,
      "kv_cache": plan.resident.kv_cache,
      "programs": [{"name": c.program.name, "note": c.program.note, "compile_s": c.seconds,
                    "error": c.error,
                    "argument": c.argument, "output": c.output, "alias": c.alias,
                    "temp": c.temp, "peak": c.peak, "flops": c.flops,
                    "call_flops": c.call_flops, "bytes_accessed": c.bytes_accessed,
                    "loop_factor": c.loop_factor,
                    "collectives": {k: dataclasses.asdict(v) for k, v in c.collectives.items()}}
                   for c in plan.compiled],
      "decode": decode_rows(plan), "train": train_rows(plan, config),
      "loop_gathers": loop_gathers(plan)}


def mesh_candidates(chips: int, expert: bool = False) -> list[tuple[int, ...]]:
  """(data, fsdp, tensor[, expert]) shapes over `chips`: tensor 1–8, data 1 or 2, fsdp the rest."""
  out = []
  for tensor in (1, 2, 4, 8):
    for data in (1, 2):
      if chips % (tensor * data) or (data == 2 and chips // tensor < 4):
        continue
      shape = (data, chips // (tensor * data), tensor)
      out.append(shape + (1,) if expert else shape)
  return out
