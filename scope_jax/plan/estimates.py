"""Per program, what the compiled code costs per chip (FLOPs, HBM bytes, interconnect bytes),
what the model needs at least, and the times both imply on the slice's chips. Every figure is a
compiler estimate or arithmetic on public chip peaks, never a measurement.

Units: a train step's figures are one update; a decode program's are one decode step (a call of
`steps` steps divided by them; the bytes it moves once per call are also shown apart); the others'
are one call. Times per unit, per chip:

  overlapped = max(FLOPs / peak, HBM bytes / HBM bandwidth, ICI bytes / ICI ingress)
  serial     = their sum (nothing overlaps)
  floor      = the same max over the analytic minimums below
  MFU        = the minimum FLOPs (the model's) / (peak · overlapped)

Minimums (per chip; P parameters, N the matmul weights a token meets: lm_head included, the input
embedding lookup excluded, only the routed experts; L layers, heads × head_dim H; mesh data d,
fsdp f, tensor t; c and p the compute and parameter dtypes' bytes):

- train FLOPs: tokens · (6(N − N_out) + 6·L·heads·H·T) + response tokens · 6·N_out, with N_out
  the output projection (log-probs are needed on the response columns only) and the second term
  causal attention over T columns (scores and values, 2·2·T²/2 per head and layer forward,
  times 3 with the backward); each frozen forward the step runs (a KL reference's, a teacher's)
  adds a third of that (its forward, no backward), and its weights one more gather and read;
- train interconnect, FSDP: per micro-batch an all-gather of the matmul weights for the forward
  and again for the backward (the gathered copy is not kept between them) and a reduce-scatter
  of their gradients, all in the compute dtype over fsdp: 3·(f−1)/f·N·c/t (an untied input
  embedding is never gathered: a lookup reads its rows where they live, and its gradient is the
  looked-up rows' only, sent to their owners); with t > 1 also 2(t−1)/t · the
  micro-batch's activations per chip (rows/(d·f) × T × D × c) for 4 all-reduces per layer (2
  forward, 2 backward; 6 when remat recomputes the forward); per update, with d > 1, an all-reduce
  of the gradient shard, 2(d−1)/d·P·p/(f·t);
- train interconnect, mixture of experts on an expert axis of n (rows split over it too): FSDP
  gathers the experts a chip holds (E/n a layer, not the k routed), and each micro-batch's
  exchanges move a chip's k·tokens pairs of D values, (n−1)/n of them to other chips: two per
  forward (dispatch and combine; again under remat and in each frozen forward) and two in the
  backward; per update the gradients of the weights outside the experts, which the expert axis
  replicates, are all-reduced over data and expert, 2(dn−1)/(dn) of their shard; a chip's
  weights (P above, in the HBM terms too) hold E/n experts a layer;
- train HBM (an estimate): per micro-batch the gathered weights read twice and the gradients
  written once (3·P·c/t), the float32 gradient shard read and written (2·S, S = P·p/(f·t)), each
  layer's input written and read back (2·L · rows/(d·f) · T · D · c); per update the optimizer
  reads params, gradients and both moments and writes params and moments (7·S);
- decode step: the sampling weights once (an untied input embedding only at its rows) and the
  KV cache read once (its whole window), 2N + 4·L·heads·H·window FLOPs a row, and with t > 1
  two all-reduces per layer of the rows' hidden states;
- prefill call: the sampling weights once (as for decode) and the block's keys and values
  written, 2(N − N_out) + 2·L·heads·H·block FLOPs a token (at least causal attention within
  its own block) and 2·N_out a row (the next token's logits only);
- the retrieval encoder: no minimum given.

Not in the HBM minimums: the logits (a fused cross-entropy or sampling kernel need not write them
to HBM); so a train step's HBM ratio also shows what its chunked loss writes.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from scope_jax.models.config import ModelConfig
from scope_jax.plan import analysis, topology


@dataclasses.dataclass
class Estimate:
  """One program's per-chip figures per unit (see the module docstring) and its times."""
  program: str
  kind: str
  unit: str  # update | decode step | call
  flops: float
  hbm_bytes: float
  ici_bytes_per_chip: float
  flops_minimum: float | None
  hbm_bytes_minimum: float | None
  ici_bytes_per_chip_minimum: float | None
  step_seconds_overlapped: float
  step_seconds_serial: float
  step_seconds_floor: float | None
  mfu: float | None
  model_flops: float | None  # all chips: the minimum times the chips
  steps_per_call: int = 1
  per_call_bytes: float = 0.0  # decode: HBM bytes a call moves outside its step loop
  ici_by_kind: dict[str, float] = dataclasses.field(default_factory=dict)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Shapes:
  """What the minimums need beyond the program: the model, mesh sizes, dtypes and remat, and the
  per-chip bytes of the sampling weights and of one engine's KV cache."""
  model: ModelConfig
  mesh: dict[str, int]
  dtype: str
  param_dtype: str
  remat: str
  sampling_weights: int
  kv_cache: int  # one engine's, per chip
  slots: int  # rows that cache holds
  # The sampling weights at the compute dtype where they are stored wider (a tied embedding kept
  # in float32 for its lookup is read as the bfloat16 unembedding); 0: `sampling_weights`.
  sampling_read: int = 0


def gathered_weights(model: ModelConfig, expert_shards: int = 1) -> int:
  """The matmul weights FSDP gathers whole onto a chip: `matmul_weights`, with each layer's k
  routed experts replaced by the E/n the chip holds on an expert axis of n."""
  n = matmul_weights(model)
  if model.num_experts:
    expert = 3 * model.hidden_size * model.moe_intermediate_size
    n += model.num_layers * expert * (model.num_experts // expert_shards
                                      - model.num_experts_per_tok)
  return n


def matmul_weights(model: ModelConfig) -> int:
  """N: the weights a token multiplies (lm_head included, the input embedding lookup not; of a
  mixture of experts only the routed ones)."""
  n = model.num_params() - model.vocab_size * model.hidden_size * (0 if model.tie_embeddings else 1)
  if model.num_experts:
    expert = 3 * model.hidden_size * model.moe_intermediate_size
    n -= model.num_layers * expert * (model.num_experts - model.num_experts_per_tok)
  return n


def output_weights(model: ModelConfig) -> int:
  """N_out: the output projection's weights (the vocabulary times the hidden size)."""
  return model.vocab_size * model.hidden_size


def attention_width(model: ModelConfig) -> int:
  return model.num_layers * model.num_heads * model.head_dim


def train_flops_per_token(model: ModelConfig, context: int) -> float:
  """6N plus causal attention over `context` columns forward and backward, 6·L·heads·H·T."""
  return 6.0 * matmul_weights(model) + 6.0 * attention_width(model) * context


def _itemsize(dtype: str) -> int:
  return jnp.dtype(dtype).itemsize


def _share(n: int) -> float:
  return (n - 1) / n if n > 1 else 0.0


def train_minimum(s: Shapes, rows: int, cols: int, micro: int, chips: int,
                  prompt: int = 0, forwards: int = 0) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, ICI bytes) per chip of one update at the analytic minimum (the first
  `prompt` columns of each row need no log-probs; `forwards` frozen models' forwards, the KL
  reference's or a teacher's, run inside the step)."""
  m, mesh = s.model, s.mesh
  d, f, t = mesh.get("data", 1), mesh.get("fsdp", 1), mesh.get("tensor", 1)
  n = mesh.get("expert", 1) if m.num_experts else 1  # rows split over expert too
  c, p = _itemsize(s.dtype), _itemsize(s.param_dtype)
  params = m.num_params()
  out = 6.0 * output_weights(m)
  flops = rows * (cols * (train_flops_per_token(m, cols) - out) + (cols - prompt) * out) / chips
  flops *= (3 + forwards) / 3  # a frozen forward is a third of a forward and backward
  experts = m.num_layers * m.num_experts * 3 * m.hidden_size * m.moe_intermediate_size
  held = params - experts + experts // n  # a chip's weights whole along fsdp: E/n experts a layer
  gathered = held * c / t  # in the compute dtype
  moved = gathered_weights(m, n) * c / t  # what FSDP gathers (not an untied lookup table)
  shard = held * p / (f * t)
  tokens = max(rows // max(micro, 1), 1) / (d * f * n) * cols  # a micro-batch's tokens on one chip
  activations = tokens * m.hidden_size * c
  reduces = 4 + (2 if s.remat != "none" else 0)
  reduces += 2 * forwards
  ici_micro = (3 + forwards) * _share(f) * moved + 2 * _share(t) * reduces * m.num_layers * activations
  if n > 1:  # the experts' exchanges: each forward's dispatch and combine, and their transposes
    exchanges = 2 * (1 + (s.remat != "none") + forwards) + 2
    pairs = tokens * m.num_experts_per_tok * m.hidden_size * c
    ici_micro += exchanges * m.num_layers * _share(n) * pairs
  # per update, the gradient all-reduce over the axes that replicate a weight: data, and for
  # the weights outside the experts expert too (n = 1: 2(d−1)/d of the shard)
  ici = micro * ici_micro + 2 * (_share(d * n) * (params - experts)
                                 + _share(d) * experts // n) * p / (f * t)
  hbm = (micro * ((3 + forwards) * gathered + 2 * shard + 2 * m.num_layers * activations)
         + 7 * shard)
  return flops, hbm, ici


def decode_minimum(s: Shapes, rows: int, window: int, chips: int) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, ICI bytes) per chip of one decode step of `rows` rows."""
  m, mesh = s.model, s.mesh
  d, f, t = mesh.get("data", 1), mesh.get("fsdp", 1), mesh.get("tensor", 1)
  flops = rows * (2.0 * matmul_weights(m) + 4.0 * attention_width(m) * window) / chips
  hidden = rows / (d * f) * m.hidden_size * _itemsize(s.dtype)
  ici = 2 * _share(t) * 2 * m.num_layers * hidden
  return flops, float(_weights_read(s, rows / (d * f)) + s.kv_cache), ici


def _weights_read(s: Shapes, rows: float) -> float:
  """The sampling weights a forward reads per chip, each at most in the compute dtype: all,
  except an untied input embedding, of which only the rows' entries (the table is split over
  tensor where the vocabulary is)."""
  m, t = s.model, s.mesh.get("tensor", 1)
  weights = s.sampling_read or s.sampling_weights
  if m.tie_embeddings:
    return weights
  table = m.vocab_size * m.hidden_size * _itemsize(s.dtype) / (t if m.vocab_size % t == 0 else 1)
  return max(weights - table, 0) + rows * m.hidden_size * _itemsize(s.dtype)


def prefill_minimum(s: Shapes, tokens: int, rows: int, window: int,
                    chips: int) -> tuple[float, float, float]:
  """(FLOPs, HBM bytes, ICI bytes) per chip of one prefill call of `tokens` tokens in `rows`
  rows (blocks) into a `window`-position cache."""
  m, mesh = s.model, s.mesh
  d, f, t = mesh.get("data", 1), mesh.get("fsdp", 1), mesh.get("tensor", 1)
  block = tokens / max(rows, 1)
  body = 2.0 * (matmul_weights(m) - output_weights(m)) + 2.0 * attention_width(m) * block
  flops = (tokens * body + rows * 2.0 * output_weights(m)) / chips
  written = s.kv_cache * tokens / max(s.slots * window, 1)  # the block's share of the cache
  hidden = tokens / (d * f) * m.hidden_size * _itemsize(s.dtype)
  ici = 2 * _share(t) * 2 * m.num_layers * hidden
  return flops, float(_weights_read(s, tokens / (d * f)) + written), ici


def _seconds(chip: topology.Chip, ingress: float, flops: float, hbm: float, ici: float):
  parts = (flops / chip.bf16_flops, hbm / chip.hbm_bandwidth, ici / ingress if ici else 0.0)
  return max(parts), sum(parts)


def estimate(c: analysis.Compiled, s: Shapes, sl: topology.Slice) -> Estimate:
  """A compiled program's per-chip figures per unit, next to the minimums, with times."""
  p, chips = c.program, sl.total_chips
  steps = p.steps if p.kind == "decode" else 1
  # The HLO's count has a decode call's step loop at its bound; the jaxpr's has it once.
  flops = c.call_flops / steps if c.hlo_flops is not None else c.call_flops
  hbm = c.call_bytes / steps
  ici_kind = {k: v.traffic / steps for k, v in c.collectives.items()}
  ici = sum(ici_kind.values())
  minimum = None
  if p.kind == "train":
    minimum = train_minimum(s, p.rows, p.columns, p.micro_batches, chips, p.prompt_columns,
                            p.forwards)
  elif p.kind == "decode":
    minimum = decode_minimum(s, p.rows, p.columns, chips)
  elif p.kind == "prefill" and p.columns:
    minimum = prefill_minimum(s, p.tokens, p.rows, p.columns, chips)
  overlapped, serial = _seconds(sl.chip, sl.ici_ingress, flops, hbm, ici)
  floor = mfu = model = None
  if minimum is not None:
    floor = _seconds(sl.chip, sl.ici_ingress, *minimum)[0]
    mfu = minimum[0] / (sl.chip.bf16_flops * overlapped) if overlapped else None
    model = minimum[0] * chips
  unit = {"train": "update", "decode": "decode step"}.get(p.kind, "call")
  return Estimate(
      p.name, p.kind, unit, flops, hbm, ici,
      *(minimum if minimum is not None else (None, None, None)),
      step_seconds_overlapped=overlapped, step_seconds_serial=serial, step_seconds_floor=floor,
      mfu=mfu, model_flops=model, steps_per_call=steps,
      per_call_bytes=c.outside_bytes if p.kind == "decode" else 0.0, ici_by_kind=ici_kind)


def ratio(a: float, b: float | None) -> float:
  return a / b if b else math.nan
