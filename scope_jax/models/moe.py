"""Qwen3-MoE's routed experts: HF's routing math, and two ways to run the experts.

* `ragged_experts` (CPU, GPU, or no mesh): the M·k (token, expert) pairs are sorted by expert and
  run through `jax.lax.ragged_dot` against the whole [E, D, F] weights.
* `expert_parallel` (TPU meshes): inside `shard_map`, each shard of the `expert` mesh axis holds
  E/n experts; a shard's tokens are sorted by expert, sent to their experts' shards by
  `ragged_all_to_all`, multiplied there by megablox's grouped matmul (`gmm`, whose VJP is `gmm`
  for dX and `tgmm` for dW: routed FLOPs only, no weight gathers) and sent back. GSPMD cannot
  split `ragged_dot` over its groups: it would gather every expert's weights on every chip.

Dropless by default: the exchange's receive buffer then holds the worst case (every pair of the
`expert` group routed to one shard: 8x the average for 128 experts, top-8, on 8 shards). With a
capacity factor c (`ModelConfig.moe_capacity_factor`) a shard receives at most c x the balanced
average (`exchange_rows`), and the pairs beyond it are dropped (GShard's rule, pooled over a
shard's experts): such a pair contributes zero, its token keeps its other experts and the
residual. Which pairs drop is a function of every sender's pairs per expert (`capacity_counts`:
the busiest experts of an overfull shard are cut to a common level, earlier senders and earlier
tokens first), so `capacity_keep` reproduces it for `ragged_experts` from the token layout alone.
Only the rows that arrive are computed (the kernel's grid follows the group sizes), but the
compiler counts, and allocates, whole buffers. A shard with more tokens than `max_buffer_rows`
allows routes them in chunks, each rematerialised in the backward pass (bounded memory for one
more forward of the experts); with a capacity each chunk has its own. The path is chosen from the
mesh's devices, not from `jax.default_backend()`: the planner compiles TPU programs on a CPU host.

The module learns the mesh while tracing, from `use_mesh(mesh, rules)` or else from the
activation rules every sharded program already enters (`sharding.activation_sharding`: the train
step, prefill and decode); a program traced outside both stays on ragged_dot. Letters: M tokens, P pairs (M·k), R received rows, E experts (El
local), D model dim, F expert MLP dim.
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Iterator

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from scope_jax import sharding as shd

_CONTEXT: list[tuple[Mesh | None, Any, dict]] = []
BATCH_AXES = ("data", "fsdp")  # the token axes when no rules are given (with `expert`)
MAX_BUFFER_ROWS = 1 << 18  # rows a shard's receive buffer may hold (bf16 D=2048: 1 GiB)


@contextlib.contextmanager
def use_mesh(mesh: Mesh | None, rules: Any = None, **options) -> Iterator[None]:
  """Within this context, MoE layers traced on a TPU `mesh` run expert-parallel; `rules` (a
  sharding rules table) names the batch axes the tokens are split over and the `mlp` axes;
  `options` go to `expert_parallel` (e.g. max_buffer_rows)."""
  _CONTEXT.append((mesh, rules, options))
  try:
    yield
  finally:
    _CONTEXT.pop()


def current_mesh() -> tuple[Mesh | None, Any]:
  """The innermost `use_mesh` (mesh, rules), else the active activation rules' (mesh, rules),
  else (None, None)."""
  if _CONTEXT:
    return _CONTEXT[-1][:2]
  act = shd.active()
  return (act.mesh, act.rules_dict) if act is not None else (None, None)


def is_tpu(mesh: Mesh | None) -> bool:
  return mesh is not None and mesh.devices.flat[0].platform == "tpu"


# ------------------------------------------------------------------------------------ routing

def route(x_MD: jax.Array, router_DE: jax.Array, k: int, norm_topk: bool):
  """HF's order: softmax in float32, top-k, renormalise (`norm_topk_prob`), cast to x's dtype.
  Returns (weights [M, k], expert ids [M, k], router probs [M, E] float32)."""
  logits_ME = jnp.einsum("MD,DE->ME", x_MD, router_DE.astype(x_MD.dtype))
  probs_ME = jax.nn.softmax(logits_ME.astype(jnp.float32), axis=-1)
  top_MK, ids_MK = jax.lax.top_k(probs_ME, k)
  if norm_topk:
    top_MK = top_MK / top_MK.sum(-1, keepdims=True)
  return top_MK.astype(x_MD.dtype), ids_MK, probs_ME


def router_stats(ids_MK: jax.Array, probs_ME: jax.Array, mask_M: jax.Array | None,
                 keep_MK: jax.Array | None = None) -> dict:
  """Over the real tokens: each expert's routed pairs (`load` [E], what the balancing loss
  reads), router mass [E], the tokens, and the pairs computed (`computed`: all of them unless
  `keep_MK` says which a capacity kept)."""
  m, e = probs_ME.shape
  real_M = jnp.ones((m,), jnp.float32) if mask_M is None else mask_M.astype(jnp.float32)
  real_MK = jnp.broadcast_to(real_M[:, None], ids_MK.shape)
  load_E = jnp.zeros((e,), jnp.float32).at[ids_MK].add(real_MK)
  computed = real_MK.sum() if keep_MK is None else jnp.where(keep_MK, real_MK, 0.0).sum()
  return {"load": load_E, "prob": jnp.einsum("M,ME->E", real_M, probs_ME),
          "tokens": real_M.sum(), "computed": computed}


def _sort_pairs(ids_MK: jax.Array, num_experts: int):
  """(pair order [P] sorted by expert, token of each sorted pair [P], pairs per expert [E]).
  Ids equal to `num_experts` (padding) sort last and are counted nowhere."""
  k = ids_MK.shape[1]
  ids_P = ids_MK.reshape(-1)  # token-major
  order_P = jnp.argsort(ids_P, stable=True)
  sizes_E = jnp.bincount(ids_P, length=num_experts).astype(jnp.int32)
  return order_P, order_P // k, sizes_E


def _swiglu(x, gate, up, down, matmul):
  """down(silu(gate(x)) * up(x)) with `matmul(x, w)` a grouped product."""
  return matmul(jax.nn.silu(matmul(x, gate)) * matmul(x, up), down)


def ragged_experts(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD,
                   keep_MK: jax.Array | None = None) -> jax.Array:
  """The experts on one device (or under GSPMD): sorted pairs through `ragged_dot` [M, D]. The
  pairs `keep_MK` leaves out (a capacity's drops, `capacity_keep`) contribute zero."""
  dt = x_MD.dtype
  e = gate_EDF.shape[0]
  if keep_MK is not None:  # a dropped pair becomes padding: sorted last, in no group
    ids_MK = jnp.where(keep_MK, ids_MK, e)
  order_P, token_P, sizes_E = _sort_pairs(ids_MK, e)
  mm = lambda x, w: jax.lax.ragged_dot(x, w.astype(dt), sizes_E)
  out_PD = _swiglu(x_MD[token_P], gate_EDF, up_EDF, down_EFD, mm)
  out_PD = out_PD * weights_MK.reshape(-1)[order_P][:, None]
  return jnp.zeros_like(x_MD).at[token_P].add(out_PD)


# ------------------------------------------------------------------------ local grouped matmul

def row_tile(rows_per_group: int) -> int:
  """The kernel's row tile: about one group's expected rows, from 16 (a bfloat16 tile's rows)
  to 128 (the MXU's). Each group visits whole tiles, so decode, with a few rows per expert, wants
  small tiles (fewer rows read per weight tile); training wants 128."""
  return min(128, max(16, 1 << max(0, rows_per_group - 1).bit_length()))


def buffer_rows(rows: int, tile: int) -> int:
  """Rows of a grouped-matmul buffer that holds `rows`: a multiple of the row tile."""
  return max(tile, rows + -rows % tile)


def grouped_matmul(x_RD, w_EDF, sizes_E, first, num_experts: int, kernel: str,
                   tile: int = 128) -> jax.Array:
  """Rows x[R, D] in groups of `sizes_E` (local experts first..first+El) times w[El, D, F]; rows
  past the groups come out zero, and so do their cotangents.

  kernel: 'gmm' (megablox, TPU), 'gmm_interpret' (the same kernel interpreted: CPU tests), or
  'ragged' (`ragged_dot`). `tile`: the row tile, which must divide R (see `buffer_rows`)."""
  r, el = x_RD.shape[0], w_EDF.shape[0]
  w_EDF = w_EDF.astype(x_RD.dtype)
  if kernel == "ragged":  # rows past the groups are zero, both ways
    return jax.lax.ragged_dot(x_RD, w_EDF, sizes_E)
  if kernel not in ("gmm", "gmm_interpret"):
    raise ValueError(f"Unknown grouped-matmul kernel {kernel!r}; use 'gmm', 'gmm_interpret' or "
                     "'ragged'.")
  from jax.experimental.pallas.ops.tpu.megablox import gmm  # TPU kernels: imported on use
  # With some experts elsewhere the kernel zeroes the rows outside its groups (forward and dX);
  # with every expert here it leaves them unwritten: mask them both ways (a pass over R rows).
  valid_R = None if el < num_experts else (jnp.arange(r) < sizes_E.sum())[:, None]
  if valid_R is not None:
    x_RD = jnp.where(valid_R, x_RD, 0)
  # The kernel indexes groups globally: the local groups' sizes at `first`, zeros elsewhere.
  sizes_all = jax.lax.dynamic_update_slice(jnp.zeros((num_experts,), jnp.int32), sizes_E,
                                           (first,))
  t = min(128, *w_EDF.shape[1:])  # the MXU's 128, or the whole dim below that
  out = gmm(x_RD, w_EDF, sizes_all, x_RD.dtype, (min(tile, r), t, t),
            jnp.asarray(first, jnp.int32).reshape(()), None, False, kernel == "gmm_interpret")
  return out if valid_R is None else jnp.where(valid_R, out, 0)


# ------------------------------------------------------------------------------- the exchange

def emulated_ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets,
                               recv_sizes, *, axis_name):
  """`jax.lax.ragged_all_to_all`'s documented semantics from all-gathers and a scatter, for
  XLA:CPU, which lacks the op (it moves every shard's whole operand: tests only)."""
  del recv_sizes  # implied by the senders' send_sizes
  n = jax.lax.axis_size(axis_name)
  me = jax.lax.axis_index(axis_name)
  per = input_offsets.shape[0] // n  # slices per destination
  ops_all = jax.lax.all_gather(operand, axis_name)  # [n, rows, ...]
  ins, sends, outs = (jax.lax.all_gather(a, axis_name)[:, me * per + jnp.arange(per)]
                      for a in (input_offsets, send_sizes, output_offsets))  # [n senders, per]
  rows = operand.shape[0]
  j = jnp.arange(rows)
  # Sender s's row j goes to this device when it lies in one of the slices s sends here.
  inside = (j[None, :, None] >= ins[:, None, :]) & (j[None, :, None] < (ins + sends)[:, None, :])
  dest = jnp.where(inside, outs[:, None, :] + j[None, :, None] - ins[:, None, :], 0).sum(-1)
  dest = jnp.where(inside.any(-1), dest, output.shape[0])  # [n, rows]; past the end: dropped
  return output.at[dest.reshape(-1)].set(ops_all.reshape(-1, *operand.shape[1:]), mode="drop")


def _exclusive_cumsum(x, axis):
  return jnp.cumsum(x, axis=axis) - x


def exchange_plan(counts_NE: jax.Array, me: jax.Array, kept_NE: jax.Array | None = None):
  """Offsets for both exchanges, from every shard's pairs per expert counts[n, E] (n shards of
  the `expert` axis, El = E/n experts each). Pairs leave sorted by expert in one slice per
  expert; they arrive grouped by local expert, senders in order within a group (what the grouped
  matmul needs), and go back to where they came from. `kept_NE` (a capacity's, default all):
  the first kept[s, e] of sender s's pairs for expert e travel; the rest stay, and come back zero.

  Returns (dispatch (input_offsets, send_sizes, output_offsets, recv_sizes), combine (same four),
  local group sizes [El])."""
  n, e = counts_NE.shape
  el = e // n
  kept_NE = counts_NE if kept_NE is None else kept_NE
  mine = me * el + jnp.arange(el)  # this shard's experts
  totals_E = kept_NE.sum(0)
  starts_E = _exclusive_cumsum(totals_E.reshape(n, el), 1).reshape(e)  # group start on its shard
  before_NE = _exclusive_cumsum(kept_NE, 0)  # rows earlier senders put in the same group
  sent_from_NE = _exclusive_cumsum(counts_NE, 1)  # where each sender's slice starts
  received_NL = kept_NE[:, mine]  # from each sender, per local expert
  dispatch = (sent_from_NE[me], kept_NE[me], starts_E + before_NE[me],
              received_NL.reshape(-1))
  landed_NL = starts_E[mine][None, :] + before_NE[:, mine]
  combine = (landed_NL.reshape(-1), received_NL.reshape(-1), sent_from_NE[:, mine].reshape(-1),
             kept_NE[me])
  cast = lambda t: tuple(a.astype(jnp.int32) for a in t)
  return cast(dispatch), cast(combine), totals_E[mine].astype(jnp.int32)


# ---------------------------------------------------------------------------------- capacity

def exchange_rows(rows: int, n: int, k: int, e: int, capacity_factor: float | None = 0.0):
  """(row tile, receive buffer rows) of one shard's exchange when each of the n shards of the
  expert group sends the pairs of `rows` tokens: the worst case (every pair lands here), or with
  `capacity_factor` c that many times the balanced average rows·k, in whole tiles."""
  el = e // n
  tile = row_tile(-(-rows * k // el))  # a balanced router's rows per local expert
  worst = n * rows * min(k, el)
  want = min(worst, math.ceil(capacity_factor * rows * k)) if capacity_factor else worst
  return tile, buffer_rows(want, tile)


def capacity_counts(counts_NE: jax.Array, capacity: int) -> jax.Array:
  """Pairs kept [n, E] of each sender's counts[n, E] when each shard (El = E/n experts) receives
  at most `capacity` rows. A shard that fits keeps every pair; one that does not cuts its
  busiest experts to one common level (the highest that fits; the rows left over go one each to
  the cut experts, lowest index first), and an expert's kept rows are its earliest senders'."""
  n, e = counts_NE.shape
  el = e // n
  totals_NL = counts_NE.sum(0).reshape(n, el)
  used = lambda t_N: jnp.minimum(totals_NL, t_N[:, None]).sum(1)
  level_N = jnp.zeros((n,), counts_NE.dtype)
  for bit in reversed(range(max(int(capacity), 1).bit_length())):  # the highest level that fits
    trial_N = level_N + (1 << bit)
    level_N = jnp.where(used(trial_N) <= capacity, trial_N, level_N)
  cut_NL = totals_NL > level_N[:, None]
  spare_N = capacity - used(level_N)  # fewer than the cut experts: level + 1 would not fit
  bonus_NL = cut_NL & (_exclusive_cumsum(cut_NL.astype(jnp.int32), 1) < spare_N[:, None])
  cap_E = (jnp.minimum(totals_NL, level_N[:, None]) + bonus_NL).reshape(e)
  return jnp.clip(cap_E - _exclusive_cumsum(counts_NE, 0), 0, counts_NE)


def _kept_sorted(ids_MK, order_P, counts_E, kept_E) -> jax.Array:
  """Of the pairs sorted by expert (`_sort_pairs`), those among their expert's first kept_E [P]
  (a token's pairs in token order; padding is never kept)."""
  e = counts_E.shape[0]
  id_P = ids_MK.reshape(-1)[order_P]
  safe_P = jnp.minimum(id_P, e - 1)
  rank_P = jnp.arange(id_P.shape[0]) - _exclusive_cumsum(counts_E, 0)[safe_P]
  return (id_P < e) & (rank_P < kept_E[safe_P])


def _unsort(sorted_P, order_P, shape) -> jax.Array:
  return jnp.zeros_like(sorted_P).at[order_P].set(sorted_P).reshape(shape)


def capacity_keep(ids_MK: jax.Array, num_experts: int, mesh: Mesh, rules: Any = None,
                  capacity_factor: float | None = 0.0,
                  max_buffer_rows: int = MAX_BUFFER_ROWS) -> jax.Array | None:
  """Which pairs [M, k] the expert-parallel layer on `mesh` computes under `capacity_factor`,
  from the global ids alone (the same token layout, chunks and rule): a mask for
  `ragged_experts`. None where every pair is computed (no capacity, or no expert axis)."""
  m, k = ids_MK.shape
  n = mesh.shape.get("expert", 1)
  if not capacity_factor or n == 1:
    return None
  if num_experts % n:
    raise ValueError(f"{num_experts} experts do not split over the mesh's expert axis of size "
                     f"{n}; make mesh.shape's expert entry divide num_experts.")
  tokens = token_axes(mesh, rules)
  sizes = [mesh.shape[a] for a in tokens]
  chunks, chunk = chunking(m, math.prod(sizes), n, k, num_experts, max_buffer_rows,
                           capacity_factor)
  _, capacity = exchange_rows(chunk, n, k, num_experts, capacity_factor)
  ids = jnp.pad(ids_MK, ((0, math.prod(sizes) * chunks * chunk - m), (0, 0)),
                constant_values=num_experts)
  # [token shards..., chunks, chunk, k] -> [others, chunks, n senders, chunk, k]
  where = tokens.index("expert")
  grouped = jnp.moveaxis(ids.reshape(*sizes, chunks, chunk, k), where, -3).reshape(-1, n, chunk, k)
  sort = jax.vmap(jax.vmap(lambda i: _sort_pairs(i, num_experts)))
  order, _, counts = sort(grouped)  # [G, n, P], [G, n, E]
  kept = jax.vmap(lambda c: capacity_counts(c, capacity))(counts)
  keep_sorted = jax.vmap(jax.vmap(_kept_sorted))(grouped, order, counts, kept)
  keep = jax.vmap(jax.vmap(lambda s, o: _unsort(s, o, (chunk, k))))(keep_sorted, order)
  others = [size for a, size in zip(tokens, sizes) if a != "expert"]
  keep = keep.reshape(*others, chunks, n, chunk, k)
  keep = jnp.moveaxis(keep, -3, where)
  return keep.reshape(-1, k)[:m]


# ------------------------------------------------------------------------------ the shard_map

def _names(target) -> tuple[str, ...]:
  return (target,) if isinstance(target, str) else tuple(target or ())


def token_axes(mesh: Mesh, rules: Any = None) -> tuple[str, ...]:
  """Mesh axes the tokens are split over inside the layer: the rules' batch axes and `expert`
  (each shard of the expert group routes its own tokens), those of size > 1."""
  batch = _names(rules.get("batch")) if rules is not None else BATCH_AXES
  axes = tuple(a for a in dict.fromkeys(batch + ("expert",)) if mesh.shape.get(a, 1) > 1)
  return axes


def _mlp_axes(mesh: Mesh, rules: Any, f: int, taken: tuple[str, ...]) -> tuple[str, ...]:
  """Mesh axes that split F (the rules' `mlp` axes that the tokens do not use and that divide
  F): each shard computes a partial sum of the down projection."""
  axes = tuple(a for a in _names(rules.get("mlp") if rules is not None else None)
               if mesh.shape.get(a, 1) > 1 and a not in taken and a != "expert")
  return axes if axes and f % math.prod(mesh.shape[a] for a in axes) == 0 else ()


def chunking(m: int, shards: int, n: int, k: int, e: int, max_buffer_rows: int,
             capacity_factor: float | None = 0.0):
  """(chunks, tokens per chunk) of each of `shards` token shards, so that a chunk's receive
  buffer (the worst case: every pair of the n-shard expert group landing on one shard; or
  `capacity_factor` x the average) fits the budget."""
  rows = -(-m // shards)
  per_token = n * min(k, e // n) if n > 1 else k  # worst-case received rows per sent token
  if capacity_factor and n > 1:
    per_token = min(per_token, capacity_factor * k)
  chunks = max(1, math.ceil(rows * per_token / max_buffer_rows))
  return chunks, -(-rows // chunks)


def expert_parallel(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD, mesh: Mesh,
                    rules: Any = None, *, kernel: str = "gmm", exchange: str = "ragged",
                    max_buffer_rows: int = MAX_BUFFER_ROWS, capacity_factor: float | None = 0.0,
                    return_kept: bool = False):
  """The experts split over the mesh's `expert` axis: [M, D] (and with `return_kept` the pairs
  computed [M, k] bool).

  kernel: the local grouped matmul (`grouped_matmul`). exchange: 'ragged'
  (`jax.lax.ragged_all_to_all`, TPU/GPU) or 'emulated' (the same semantics on XLA:CPU).
  max_buffer_rows: a shard whose receive buffer would exceed it routes its tokens in chunks,
  each rematerialised in the backward pass. capacity_factor: 0 or None, dropless (worst-case
  buffers); else each shard receives at most that many times the balanced average, dropping the
  rest (`capacity_counts`; `capacity_keep` names the same pairs)."""
  m, d = x_MD.shape
  e, _, f = gate_EDF.shape
  k = ids_MK.shape[1]
  n = mesh.shape.get("expert", 1)
  if e % n:
    raise ValueError(f"{e} experts do not split over the mesh's expert axis of size {n}; make "
                     "mesh.shape's expert entry divide num_experts.")
  if capacity_factor is not None and capacity_factor < 0:
    raise ValueError(f"capacity_factor={capacity_factor} is negative; use 0 (dropless) or a "
                     "multiple of the balanced load such as 1.25.")
  tokens = token_axes(mesh, rules)
  shards = math.prod(mesh.shape[a] for a in tokens)
  chunks, chunk = chunking(m, shards, n, k, e, max_buffer_rows, capacity_factor)
  pad = shards * chunks * chunk - m  # padding tokens get expert id E: never sent or computed
  if pad:
    x_MD = jnp.pad(x_MD, ((0, pad), (0, 0)))
    weights_MK = jnp.pad(weights_MK, ((0, pad), (0, 0)))
    ids_MK = jnp.pad(ids_MK, ((0, pad), (0, 0)), constant_values=e)
  mlp = _mlp_axes(mesh, rules, f, tokens)
  one = functools.partial(_local_experts, num_experts=e, n=n, k=k, rows=chunk, mlp=mlp,
                          kernel=kernel, exchange=exchange, capacity_factor=capacity_factor)

  def body(x_MD, weights_MK, ids_MK, *w):
    if chunks == 1:
      return one(x_MD, weights_MK, ids_MK, *w)
    split = lambda a: a.reshape(chunks, chunk, *a.shape[1:])
    step = jax.checkpoint(lambda xs: one(*xs, *w))
    y, kept = jax.lax.map(step, tuple(map(split, (x_MD, weights_MK, ids_MK))))
    return y.reshape(-1, d), kept.reshape(-1, k)

  tok = P(tokens or None, None)
  ex, mlp_spec = ("expert" if n > 1 else None), (mlp or None)
  y_MD, kept_MK = jax.shard_map(
      body, mesh=mesh,
      in_specs=(tok, tok, tok, P(ex, None, mlp_spec), P(ex, None, mlp_spec),
                P(ex, mlp_spec, None)),
      out_specs=(tok, tok), check_vma=False)(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF,
                                              down_EFD)
  return (y_MD[:m], kept_MK[:m]) if return_kept else y_MD[:m]


def _local_experts(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD, *, num_experts, n, k,
                   rows, mlp, kernel, exchange, capacity_factor):
  """One shard: sort its pairs, send them (those its shard's capacity keeps) to their experts'
  shards, compute, send back, combine. Returns (output [M, D], pairs computed [M, k])."""
  dt = x_MD.dtype
  e, el = num_experts, num_experts // n
  order_P, token_P, counts_E = _sort_pairs(ids_MK, e)
  xs_PD = x_MD[token_P]
  p = xs_PD.shape[0]
  tile, capacity = exchange_rows(rows, n, k, e, capacity_factor)
  if n == 1:
    x_RD = jnp.pad(xs_PD, ((0, buffer_rows(p, tile) - p), (0, 0)))
    first, sizes_L = jnp.int32(0), counts_E
    kept_P = ids_MK.reshape(-1)[order_P] < e
  else:
    a2a = (jax.lax.ragged_all_to_all if exchange == "ragged"
           else emulated_ragged_all_to_all if exchange == "emulated" else None)
    if a2a is None:
      raise ValueError(f"Unknown exchange {exchange!r}; use 'ragged' or 'emulated'.")
    me = jax.lax.axis_index("expert")
    counts_NE = jax.lax.all_gather(counts_E, "expert")
    kept_NE = capacity_counts(counts_NE, capacity) if capacity_factor else counts_NE
    dispatch, combine, sizes_L = exchange_plan(counts_NE, me, kept_NE)
    kept_P = _kept_sorted(ids_MK, order_P, counts_E, kept_NE[me])
    x_RD = a2a(xs_PD, jnp.zeros((capacity, x_MD.shape[1]), dt), *dispatch, axis_name="expert")
    first = me * el
  mm = lambda x, w: grouped_matmul(x, w.astype(dt), sizes_L, first, e, kernel, tile)
  out_RD = _swiglu(x_RD, gate_EDF, up_EDF, down_EFD, mm)
  if n == 1:
    out_PD = out_RD[:p]
  else:
    out_PD = a2a(out_RD, jnp.zeros_like(xs_PD), *combine, axis_name="expert")
  out_PD = out_PD * weights_MK.reshape(-1)[order_P][:, None]
  y_MD = jnp.zeros_like(x_MD).at[token_P].add(out_PD)
  kept_MK = _unsort(kept_P, order_P, ids_MK.shape)
  return (jax.lax.psum(y_MD, mlp) if mlp else y_MD), kept_MK


def experts(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD,
            capacity_factor: float | None = 0.0) -> tuple[jax.Array, jax.Array | None]:
  """The routed experts' output [M, D] and the pairs computed [M, k] (None: all of them):
  expert-parallel on a TPU mesh, else ragged; on a mesh with an expert axis the ragged path
  drops the pairs the expert-parallel layer would (`capacity_keep`), so CPU runs train the same
  model."""
  mesh, rules = current_mesh()
  options = dict(_CONTEXT[-1][2]) if _CONTEXT else {}
  options.setdefault("capacity_factor", capacity_factor)
  if is_tpu(mesh):
    return expert_parallel(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD, mesh, rules,
                           return_kept=True, **options)
  keep_MK = None
  if mesh is not None and options["capacity_factor"]:
    keep_MK = capacity_keep(ids_MK, gate_EDF.shape[0], mesh, rules, options["capacity_factor"],
                            options.get("max_buffer_rows", MAX_BUFFER_ROWS))
  return ragged_experts(x_MD, weights_MK, ids_MK, gate_EDF, up_EDF, down_EFD, keep_MK), keep_MK
