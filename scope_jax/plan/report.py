"""A run's plan on a TPU slice: its programs compiled for the slice, what stays resident, the peak
of each phase against the chip's HBM, and per program the compiler's FLOPs, HBM bytes and
interconnect bytes per chip next to the analytic minimums, with the step times they imply
(`estimates`). Every time here is a roofline estimate from the compiler's counts and the chip's
public peaks, never a measurement."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath

from scope_jax import sharding as shd
from scope_jax.core import runner
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.plan import analysis, estimates as est, programs as prog, topology
from scope_jax.plan.topology import GIB
from scope_jax.sampling import engine as engine_lib
from scope_jax.sampling import sampler as sampler_lib


@dataclasses.dataclass
class Plan:
  slice: topology.Slice
  mesh: dict[str, int]
  model: ModelConfig
  compiled: list[analysis.Compiled]
  resident: prog.Resident
  weights: int  # bytes per chip of one copy of the weights in the sampling layout
  shapes: est.Shapes | None = None  # what the minimums need
  programs: tuple[str, ...] = ()  # every program of the run (`compiled` may be a subset)

  @property
  def hbm(self) -> int:
    return self.slice.chip.hbm_bytes

  @property
  def partial(self) -> bool:
    """Only some of the run's programs were compiled: no verdict for the whole run."""
    return {c.program.name for c in self.compiled} != set(self.programs)

  def phase_peak(self, kinds) -> int:
    """Resident arrays plus the largest program of `kinds` (its own arrays beyond them); the
    rollout phase adds every engine's KV cache (freed before every update)."""
    extra = [c.extra() for c in self.compiled if c.program.kind in kinds]
    cache = self.resident.kv_caches if "decode" in kinds else 0
    return self.resident.total + cache + max(extra, default=0)

  @property
  def refresh_peak(self) -> int:
    """After each update the sampler's new copy of the weights is built while the old one is
    alive: resident arrays plus one more sampler copy, for a moment."""
    return self.resident.total + self.resident.refresh

  @property
  def update_peak(self) -> int:
    return self.phase_peak(("train",))

  @property
  def rollout_peak(self) -> int:
    return self.phase_peak(("prefill", "decode", "encoder"))

  @property
  def peak(self) -> int:
    return max(self.update_peak, self.rollout_peak, self.refresh_peak)

  def estimates(self) -> list[est.Estimate]:
    return [est.estimate(c, self.shapes, self.slice) for c in self.compiled
            if not c.error and self.shapes is not None]

  @property
  def fits(self) -> bool:
    return self.peak <= self.hbm


def model_flops_per_token(model: ModelConfig, context: int) -> float:
  """6N (forward and backward over every matmul weight, the output projection included, not the
  input embedding lookup) plus causal attention, 6·L·heads·head_dim·T (scores and values)."""
  return est.train_flops_per_token(model, context)


# Linq-Embed-Mistral's config.json (Mistral-7B): OpenSIR's paper embedder, when
# `opensir.encoder` names no checkpoint the plan can read.
LINQ_EMBED_MISTRAL = {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
                      "num_hidden_layers": 32, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "vocab_size": 32000,
                      "max_position_embeddings": 32768, "rms_norm_eps": 1e-5,
                      "rope_theta": 10000.0, "tie_word_embeddings": False}
BERT_ENCODERS = ("minilm", "e5", "bge")  # small encoders, replicated: a few hundred MiB at most


def embedder_bytes(shapes: prog.RunShapes) -> tuple[str, int]:
  """OpenSIR's diversity embedder (a decoder, float32 weights sharded as training shards the
  policy's): its name and bytes per chip; ('', 0) for other methods and small BERT encoders."""
  c = shapes.config
  if c.method != "opensir":
    return "", 0
  path = c.opensir.get("encoder", "")
  if path.lower().startswith(BERT_ENCODERS):
    return "", 0
  config_json = epath.Path(path) / "config.json" if path else None
  if config_json is not None and config_json.exists():
    hf = json.loads(config_json.read_text())
    if hf.get("model_type") not in ("llama", "mistral", "qwen2", "qwen3", "gemma2"):
      return "", 0
    name = path
  else:
    hf, name = LINQ_EMBED_MISTRAL, "Linq-Embed-Mistral (assumed: opensir.encoder names no config.json)"
  model = ModelConfig.from_hf_config(hf)
  return name, prog.bytes_per_chip(prog.param_structs(model, shapes.mesh, shapes.train_rules,
                                                      jnp.float32))


def refresh_frees_first() -> bool:
  """Whether the samplers free their old copy before building the new one after an update (a
  flag the sampling code sets once it does); until then the plan counts both copies."""
  return any(getattr(m, "REFRESH_FREES_OLD_COPY", False) for m in (engine_lib, sampler_lib))


def resident_memory(shapes: prog.RunShapes, states: dict[str, Any], cache: int) -> prog.Resident:
  """What lives for the whole run, per chip: each policy's params and optimizer state, a sampler
  copy of each played weight set where the sampling layout differs from the training one, the
  base model where a frozen role or a KL reference reads it, tracked params, OpenSIR's embedder;
  and apart, every engine's KV cache (rollouts only) and the sampler copy built after each update
  while the old one lives."""
  copy = shapes.sampler_copy_bytes()
  weights = prog.bytes_per_chip(shapes.params(shapes.train_rules))
  if shapes.lora.rank:
    return _lora_resident(shapes, states, cache, weights, copy)
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
  return _resident(shapes, items, cache, refresh=copy)


def _resident(shapes: prog.RunShapes, items: dict[str, int], cache: int, *, refresh: int
              ) -> prog.Resident:
  """`items` plus the retrieval embedder, with one engine per policy and frozen role (of which at
  most `max_live_caches()` hold a cache) and `refresh` bytes for a weight refresh in flight."""
  embedder, size = embedder_bytes(shapes)
  if size:
    items[f"embedder: {embedder}"] = size
  players = shapes.players
  engines = min(len(players.policies) + len(players.frozen), engine_lib.max_live_caches())
  return prog.Resident(items, kv_cache=cache, engines=max(engines, 1),
                       refresh=0 if refresh_frees_first() else refresh)


def _lora_resident(shapes: prog.RunShapes, states: dict[str, Any], cache: int, weights: int,
                   copy: int) -> prog.Resident:
  """With LoRA: one base (every policy, the KL reference and frozen roles read it) and one
  sampler copy of it shared by every player (`sampler.refresh_params`), then per policy its
  adapters + their optimizer state and its adapters' sampler copy, and per tracked tree its
  adapters."""
  players = shapes.players
  adapters = prog.bytes_per_chip(shapes.adapters(shapes.train_rules))
  moved = [b for a, b in zip(jax.tree.leaves(shapes.adapters(shapes.train_rules)),
                             jax.tree.leaves(shapes.adapters(shapes.sampling_rules)))
           if not a.sharding.is_equivalent_to(b.sharding, len(a.shape))]
  adapter_copy = prog.bytes_per_chip(moved)
  items = {"base model (shared by every policy and frozen role)": weights}
  if copy:
    items["base model: sampler copy (shared by every player)"] = copy
  for name, state in states.items():
    items[f"{name}: LoRA adapters + optimizer state"] = prog.bytes_per_chip(state)
    if adapter_copy:
      items[f"{name}: adapters' sampler copy"] = adapter_copy
  for name in players.tracked:
    items[f"{name} (tracked adapters)"] = adapters + adapter_copy
  return _resident(shapes, items, cache, refresh=adapter_copy)


def select(names: list[str], programs: str) -> list[str]:
  """The programs `--programs` picks: 'all', or comma-separated names or prefixes of names
  (`train_step`, `engine/decode`); an item that matches none is an error naming the valid ones."""
  if programs.strip() == "all":
    return names
  items = [k.strip() for k in programs.split(",") if k.strip()]
  unknown = [k for k in items if not any(n.startswith(k) for n in names)]
  if unknown or not items:
    raise ValueError(f"--programs={programs!r}: {', '.join(unknown) or 'no name'} matches none of "
                     f"this run's programs; choose from: all, {', '.join(names)} (or a prefix "
                     "such as train_step or engine).")
  return [n for n in names if any(n.startswith(k) for k in items)]


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
  names = [p.name for p in todo]
  chosen = select(names, programs)
  compiled = [analysis.compile_program(p, "tpu", len(devices)) for p in todo if p.name in chosen]
  weights = prog.bytes_per_chip(shapes.sampling_params())
  decode = next((p for p in sample if p.kind == "decode"), None)
  read = prog.bytes_per_chip(shapes.sampling_params(), shapes.sampler_dtype.itemsize)
  info = est.Shapes(shapes.model, dict(mesh.shape), str(shapes.dtype), str(shapes.param_dtype),
                    config.model.remat, weights, cache, decode.rows if decode else 0, read)
  return Plan(s, dict(mesh.shape), shapes.model, compiled, resident_memory(shapes, states, cache),
              weights, info, tuple(names))


# ------------------------------------------------------------------------------- estimates

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


def update_seconds(plan: Plan) -> float:
  """One update of every policy, overlapped time (the compiler estimate), summed."""
  return sum(e.step_seconds_overlapped for e in plan.estimates() if e.kind == "train")


# ------------------------------------------------------------------------------- tables

def _gib(n: float) -> str:
  return f"{n / GIB:.2f}"


def _si(n: float | None, unit: str) -> str:
  if n is None:
    return "—"
  for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
    if abs(n) >= scale:
      return f"{n / scale:.2f} {prefix}{unit}"
  return f"{n:.0f} {unit}"


def _ms(t: float | None) -> str:
  return "—" if t is None else (f"{t:.1f} s" if t >= 10 else f"{t * 1e3:.2f} ms")


def verdict(plan: Plan) -> str:
  if plan.partial:
    return (f"partial plan (programs: {', '.join(c.program.name for c in plan.compiled)}): "
            "no verdict for the whole run")
  return (f"**fits**, {_gib(plan.hbm - plan.peak)} GiB to spare" if plan.fits
          else f"**does not fit**, {_gib(plan.peak - plan.hbm)} GiB over")


def count(n: int) -> str:
  """A parameter count as people write it: '7.62B', '494M', '838K'."""
  for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
    if n >= scale:
      return f"{n / scale:.3g}{unit}"
  return str(n)


def render(plan: Plan, config: ml_collections.ConfigDict) -> str:
  s, lines = plan.slice, []
  lines.append(f"## {config.method} on {s.name} ({s.total_chips} × {s.chip.generation}, "
               f"{_gib(s.chip.hbm_bytes)} GiB HBM per chip), mesh {plan.mesh}")
  lines.append(f"Model {plan.model.model_type}: {count(plan.model.num_params())} parameters; "
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
  r = plan.resident
  lines.append("\n| resident for the whole run | GiB per chip |\n|---|---|")
  for name, n in r.items.items():
    lines.append(f"| {name} | {_gib(n)} |")
  lines.append(f"| KV caches (rollouts only): {r.engines} engine(s) × {_gib(r.kv_cache)} | "
               f"{_gib(r.kv_caches)} |")
  if r.refresh:
    lines.append(f"| sampler refresh after each update (the new copy built while the old lives; "
                 f"a moment) | {_gib(r.refresh)} |")
  lines.append(f"\nPeak per chip: update {_gib(plan.update_peak)} GiB, rollout "
               f"{_gib(plan.rollout_peak)} GiB, sampler refresh {_gib(plan.refresh_peak)} GiB, "
               f"of {_gib(plan.hbm)} GiB: {verdict(plan)}.")
  lines.append(f"\nCompiler estimates per chip, not measurements ({s.chip.generation}: "
               f"{s.chip.bf16_flops / 1e12:.0f} TFLOP/s bf16, {s.chip.hbm_bandwidth / 1e9:,.0f} GB/s "
               f"HBM, {s.ici_ingress / 1e9:,.0f} GB/s ICI ingress); each next to its analytic "
               "minimum; a train step per update, a decode program per decode step:\n")
  lines.append("| program | per | FLOPs (min) | HBM bytes (min) | ICI bytes (min) | time overlapped "
               "/ serial / floor | MFU |\n|---|---|---|---|---|---|---|")
  for e in plan.estimates():
    cells = [f"{_si(e.flops, 'FLOP')} ({_si(e.flops_minimum, 'FLOP')})",
             f"{_si(e.hbm_bytes, 'B')} ({_si(e.hbm_bytes_minimum, 'B')})",
             f"{_si(e.ici_bytes_per_chip, 'B')} ({_si(e.ici_bytes_per_chip_minimum, 'B')})",
             f"{_ms(e.step_seconds_overlapped)} / {_ms(e.step_seconds_serial)} / "
             f"{_ms(e.step_seconds_floor)}",
             "—" if e.mfu is None else f"{100 * e.mfu:.0f}%"]
    lines.append(f"| {e.program} | {e.unit} | " + " | ".join(cells) + " |")
    if e.steps_per_call > 1:
      lines.append(f"| {e.program} | call | one call of {e.steps_per_call} steps moves "
                   f"{_si(e.per_call_bytes, 'B')} outside its step loop (copies), "
                   f"{_si(e.per_call_bytes / e.steps_per_call, 'B')} a step of the figure above | | | | |")
  lines.append("\n| program | all-gather | reduce-scatter | all-reduce | all-to-all | "
               "collective-permute |\n|---|---|---|---|---|---|")
  for c in plan.compiled:
    cells = [f"{v.count} × {v.bytes / max(v.count, 1) / 2**20:.1f} MiB, ICI {v.traffic / 2**20:.1f} MiB"
             if v.count else "—" for v in c.collectives.values()]
    lines.append(f"| {c.program.name} | " + " | ".join(cells) + " |")
  flagged = loop_gathers(plan)
  lines.append("\n" + ("\n".join(f"WARNING: {f}" for f in flagged) if flagged else
                       "No decode loop gathers a whole weight."))
  return "\n".join(lines)


ESTIMATE_FIELDS = ("flops", "flops_minimum", "hbm_bytes", "hbm_bytes_minimum", "ici_bytes_per_chip",
                   "ici_bytes_per_chip_minimum", "step_seconds_overlapped", "step_seconds_serial",
                   "step_seconds_floor", "mfu")  # per program in `to_json`; None where refused


def to_json(plan: Plan, config: ml_collections.ConfigDict) -> dict:
  """The plan as data. Per program `estimate` holds, per chip and per unit (`unit`: update,
  decode step or call): flops, flops_minimum, hbm_bytes, hbm_bytes_minimum, ici_bytes_per_chip,
  ici_bytes_per_chip_minimum, step_seconds_overlapped, step_seconds_serial, step_seconds_floor,
  mfu (compiler estimates; the minimums are arithmetic); the same keys sit on the program too."""
  del config
  r = plan.resident
  estimates = {e.program: e.to_json() for e in plan.estimates()}
  programs = []
  for c in plan.compiled:
    row = {"name": c.program.name, "kind": c.program.kind, "note": c.program.note,
           "compile_s": c.seconds, "error": c.error, "argument": c.argument, "output": c.output,
           "alias": c.alias, "temp": c.temp, "peak": c.peak,
           "compiler_flops_loop_bodies_once": c.flops,
           "compiler_bytes_loop_bodies_once": c.bytes_accessed,
           "loop_factor": c.loop_factor, "bytes_factor": c.bytes_factor,
           "kernel_flops": c.kernel_flops, "matmul_flops": c.matmul_flops,
           "call_flops": c.call_flops,
           "collectives": {k: dataclasses.asdict(v) for k, v in c.collectives.items()}}
    row.update(estimates.get(c.program.name, dict.fromkeys(ESTIMATE_FIELDS)))
    programs.append(row)
  return {
      "slice": plan.slice.name, "chips": plan.slice.total_chips, "mesh": plan.mesh,
      "chip": {"generation": plan.slice.chip.generation, "bf16_flops": plan.slice.chip.bf16_flops,
               "hbm_bandwidth": plan.slice.chip.hbm_bandwidth,
               "ici_ingress": plan.slice.ici_ingress},
      "hbm_bytes": plan.hbm, "partial": plan.partial,
      "fits": None if plan.partial else plan.fits, "verdict": verdict(plan),
      "update_peak": plan.update_peak, "rollout_peak": plan.rollout_peak,
      "refresh_peak": plan.refresh_peak, "resident": r.items, "kv_cache": r.kv_cache,
      "engines": r.engines, "kv_caches": r.kv_caches, "sampler_refresh": r.refresh,
      "programs": programs, "all_programs": list(plan.programs),
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
