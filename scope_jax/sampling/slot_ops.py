"""The rollout engine's device programs over its slot cache (jitted, static shapes).

Every program works on a window of the first W cache positions (W a length bucket of the longest
slot involved), so attention follows the actual lengths rather than the capacity:
  * `prefill` truncates P chosen slots to the prefix they keep, appends a right-padded block of
    tokens and keeps each slot's last logits;
  * `copy_slots` copies whole slots (cache and next-token logits);
  * `decode` runs up to `chunk` steps over every slot, or over the live ones gathered per shard.
    Over every slot it decodes in place on TPU: the loop carries the whole donated cache,
    reads the window by slicing inside the body and writes at each row's `end`. Gathered rows
    (and every slot on CPU and GPU) are a copy of their window, and only the positions the chunk wrote
    go back. Why the gather stays a copy: see `decode`.
Rows are indexed per slot shard ([D, p] local indices, `take_rows` / `put_rows`), so nothing
crosses devices. The host side that schedules them is `engine.Engine`.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
from absl import logging

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import ops
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.sampling.sampler import SamplingSpec, argmax_last, truncate_logits

_TRACES = collections.Counter()


def _window(cache: kvc.KVCache, w: int) -> kvc.KVCache:
  """The first `w` positions of every slot: a copy where it is not read inside one fusion."""
  ka, va = kvc.slot_axes(kvc.cache_layout(cache))
  cut = lambda x, axis: jax.lax.slice_in_dim(x, 0, w, axis=axis)
  return kvc.KVCache(k=tuple(cut(k, ka) for k in cache.k), v=tuple(cut(v, va) for v in cache.v),
                     valid=cache.valid[:, :w], end=cache.end, next_pos=cache.next_pos,
                     pos=cache.pos[:, :w])


def _constrain(x, sharding):
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _split(x, axis: int, d: int):
  """The slot axis [B] as [D, B/D]: one block per slot shard (free under the batch sharding)."""
  return x.reshape(x.shape[:axis] + (d, x.shape[axis] // d) + x.shape[axis + 1:])


def _merge(x, axis: int):
  return x.reshape(x.shape[:axis] + (x.shape[axis] * x.shape[axis + 1],) + x.shape[axis + 2:])


def take_rows(x, idx_DP, axis: int):
  """Rows `idx_DP` [D, p] of each slot shard (indices local to the shard): [.., D·p, ..]. Each
  shard reads only its own rows, so nothing crosses devices."""
  take = lambda xs, i: jnp.take(xs, i, axis=axis, mode="clip")
  out = jax.vmap(take, in_axes=(axis, 0), out_axes=axis)(_split(x, axis, idx_DP.shape[0]), idx_DP)
  return _merge(out, axis)


def put_rows(x, idx_DP, rows, axis: int, window: int | None = None, window_axis: int = -1):
  """Writes `rows` [.., D·p, ..] at rows `idx_DP` of each shard (out of range: dropped), into the
  first `window` positions of `window_axis` (after the slot axis) when given."""
  tail = ()
  if window is not None:
    tail = (slice(None),) * (window_axis % x.ndim - axis - 1) + (slice(0, window),)
  put = lambda xs, i, ys: xs.at[(slice(None),) * axis + (i,) + tail].set(ys, mode="drop")
  d = idx_DP.shape[0]
  out = jax.vmap(put, in_axes=(axis, 0, axis), out_axes=axis)(
      _split(x, axis, d), idx_DP, _split(rows, axis, d))
  return _merge(out, axis)


def _take_cache(cache: kvc.KVCache, idx_DP, window: int) -> kvc.KVCache:
  view = _window(cache, window)
  take = lambda x: take_rows(x, idx_DP, 0)
  return kvc.KVCache(k=tuple(map(take, view.k)), v=tuple(map(take, view.v)),
                     valid=take_rows(view.valid, idx_DP, 0), end=take_rows(view.end, idx_DP, 0),
                     next_pos=take_rows(view.next_pos, idx_DP, 0),
                     pos=take_rows(view.pos, idx_DP, 0))


def _put_rows_state(cache: kvc.KVCache, idx_DP, rows: kvc.KVCache) -> dict:
  """Validity, offsets and positions of `rows` written at rows `idx_DP` (their window only)."""
  w = rows.valid.shape[1]
  return dict(valid=put_rows(cache.valid, idx_DP, rows.valid, 0, w),
              end=put_rows(cache.end, idx_DP, rows.end, 0),
              next_pos=put_rows(cache.next_pos, idx_DP, rows.next_pos, 0),
              pos=put_rows(cache.pos, idx_DP, rows.pos, 0, w))


def _put_cache(cache: kvc.KVCache, idx_DP, rows: kvc.KVCache, shardings) -> kvc.KVCache:
  w = rows.valid.shape[1]
  ka, va = kvc.slot_axes(kvc.cache_layout(cache))
  put = lambda x, r, axis: put_rows(x, idx_DP, r, 0, w, window_axis=axis)
  new = kvc.KVCache(k=tuple(put(x, r, ka) for x, r in zip(cache.k, rows.k)),
                    v=tuple(put(x, r, va) for x, r in zip(cache.v, rows.v)),
                    **_put_rows_state(cache, idx_DP, rows))
  return jax.tree.map(_constrain, new, shardings) if shardings is not None else new


def _span(view_x, start_B, n: int, axis: int):
  """Positions [start, start + n) of each row of a window view, along `axis`: [B, .., n, ..]."""
  return jax.vmap(lambda r, s: jax.lax.dynamic_slice_in_dim(r, s, n, axis - 1))(view_x, start_B)


def _store_spans(cache: kvc.KVCache, idx_DP, view: kvc.KVCache, start_B, n: int,
                 shardings) -> kvc.KVCache:
  """Writes back what a decode call changed in its window view: keys and values at positions
  [start, start + n) of each row (all a chunk can have written), the row's validity and
  positions, and its offsets. Rows are every slot in order (`idx_DP` None) or the gathered
  `idx_DP`. Writing the whole window back instead copied every decoded row's cache once more
  per call (300 MB at 12 rows × 3,072 positions of the ~100M model)."""
  w = view.valid.shape[1]
  ka, va = kvc.slot_axes(kvc.cache_layout(cache))
  if idx_DP is None:
    def put(x, y, axis):
      upd = lambda c, r, s: jax.lax.dynamic_update_slice_in_dim(c, r, s, axis - 1)
      return jax.vmap(upd)(x, _span(y, start_B, n, axis), start_B)
    new = kvc.KVCache(k=tuple(put(x, y, ka) for x, y in zip(cache.k, view.k)),
                      v=tuple(put(x, y, va) for x, y in zip(cache.v, view.v)),
                      valid=cache.valid.at[:, :w].set(view.valid), end=view.end,
                      next_pos=view.next_pos, pos=cache.pos.at[:, :w].set(view.pos))
  else:
    d = idx_DP.shape[0]

    def put(x, y, axis):
      def one(xs, i_p, ys_p, s_p):
        pos_pn = s_p[:, None] + jnp.arange(n)
        at = (i_p[:, None],) + (slice(None),) * (axis - 1) + (pos_pn,)
        return xs.at[at].set(jnp.moveaxis(ys_p, axis, 1), mode="drop")
      out = jax.vmap(one, in_axes=(0, 0, 0, 0))(
          _split(x, 0, d), idx_DP, _split(_span(y, start_B, n, axis), 0, d),
          _split(start_B, 0, d))
      return _merge(out, 0)
    new = kvc.KVCache(k=tuple(put(x, y, ka) for x, y in zip(cache.k, view.k)),
                      v=tuple(put(x, y, va) for x, y in zip(cache.v, view.v)),
                      **_put_rows_state(cache, idx_DP, view))
  return jax.tree.map(_constrain, new, shardings) if shardings is not None else new


@functools.partial(jax.jit, static_argnames=("config", "window", "dtype", "shardings",
                                             "activations"),
                   donate_argnames=("cache", "logits_BV"))
def prefill(config: ModelConfig, params, cache: kvc.KVCache, logits_BV, slots_DP, start_P,
            tokens_PT, mask_PT, *, window: int, dtype, shardings,
            activations: shd.Activations | None = None):
  """Truncates slots `slots_DP` (local to each slot shard; P = D·p rows, shard-major) to
  `start_P` tokens, appends the right-padded block and stores the logits after each row's last
  real token (rows with no real token keep theirs). `activations` (the engine's mesh and rules)
  pins the rows to the batch axes."""
  with shd.activation_sharding(activations):
    return _prefill(config, params, cache, logits_BV, slots_DP, start_P, tokens_PT, mask_PT,
                    window=window, dtype=dtype, shardings=shardings)


def _prefill(config, params, cache, logits_BV, slots_DP, start_P, tokens_PT, mask_PT, *,
             window, dtype, shardings):
  _TRACES["prefill"] += 1
  logging.info("Compiling engine prefill: %d rows × %d tokens, window %d.", *tokens_PT.shape,
               window)
  sub = _take_cache(cache, slots_DP, window)
  keep_PW = jnp.arange(window)[None, :] < start_P[:, None]
  sub = sub.replace(valid=sub.valid & keep_PW, end=start_P, next_pos=start_P)
  hidden_PTD, sub = transformer.forward(config, params, tokens_PT, attention_mask=mask_PT,
                                        cache=sub, return_hidden=True, dtype=dtype)
  n_P = mask_PT.sum(-1)
  last_P1D = jnp.take_along_axis(hidden_PTD, jnp.maximum(n_P - 1, 0)[:, None, None], axis=1)
  logits_PV = transformer.logits_from_hidden(last_P1D, transformer.unembedding(config, params),
                                             config.final_softcap)[:, 0]
  old_PV = take_rows(logits_BV, slots_DP, 0)
  logits_PV = jnp.where((n_P > 0)[:, None], logits_PV, old_PV)  # no real token: keep logits
  logits_BV = put_rows(logits_BV, slots_DP, logits_PV, 0)
  cache = _put_cache(cache, slots_DP, sub, shardings and shardings[0])
  return cache, _constrain(logits_BV, shardings and shardings[1])


@functools.partial(jax.jit, static_argnames=("window", "shardings"),
                   donate_argnames=("cache", "logits_BV"))
def copy_slots(cache: kvc.KVCache, logits_BV, src_DP, dst_DP, *, window: int, shardings):
  """Copies slots `src_DP` (cache window and logits) onto `dst_DP`, within each slot shard;
  every read happens before any write."""
  _TRACES["copy"] += 1
  logging.info("Compiling engine copy: %d rows, window %d.", src_DP.size, window)
  cache = _put_cache(cache, dst_DP, _take_cache(cache, src_DP, window),
                     shardings and shardings[0])
  logits_BV = put_rows(logits_BV, dst_DP, take_rows(logits_BV, src_DP, 0), 0)
  return cache, _constrain(logits_BV, shardings and shardings[1])


@functools.partial(jax.jit, static_argnames=("config", "slots", "capacity", "dtype", "shardings",
                                             "layout"))
def empty(config: ModelConfig, slots: int, capacity: int, dtype, *, shardings,
          layout: str | None = None):
  """An empty cache (in `layout`, default `kvc.default_layout()`) and logits, created in place
  on the mesh (every host's shards at once)."""
  cache = kvc.init_cache(config, slots, capacity, dtype, layout)
  logits_SV = jnp.zeros((slots, config.vocab_size), jnp.float32)
  if shardings is None:
    return cache, logits_SV
  return jax.tree.map(_constrain, cache, shardings[0]), _constrain(logits_SV, shardings[1])


def select_tokens_rows(logits_BV, keys_B, spec: SamplingSpec, temperature):
  """`sampler.select_tokens` with one key per row, so a row's draw is independent of the batch."""
  logits_BV = logits_BV.astype(jnp.float32)
  if spec.temperature == 0.0:
    token_B = argmax_last(logits_BV)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    allowed_BV = truncate_logits(scaled_BV, spec.top_k, spec.top_p)
    draw = lambda key: jax.random.gumbel(key, allowed_BV.shape[1:], allowed_BV.dtype)
    token_B = argmax_last(jax.vmap(draw)(keys_B) + allowed_BV)  # = categorical with row keys
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B


def row_keys(seed_B, turn_B, index_B):
  """The sampling key of each row's next token: a function of (seed, turn, token index) only."""
  key = lambda s, t, i: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), t), i)
  return jax.vmap(key)(seed_B, turn_B, index_B)


def in_place_decode() -> bool:
  """Whether `decode` runs its loop on the donated cache itself, reading the window by slicing
  inside the body and writing at each row's `end`: on TPU, where a loop over a copy of the
  window keeps the donated cache and the copy alive together (one more cache in temporaries)
  and the slice fuses into the attention read. XLA:CPU copies a slice inside a loop on every
  step and layer (attention over 3,072 of 4,096 slots read by a slice took 1.7x the time of
  all 4,096), so there, and on GPU (not measured), the window is copied once per call and the
  positions the chunk wrote go back."""
  return ops.target_platform() == "tpu"


@functools.partial(jax.jit, static_argnames=("config", "spec", "chunk", "window", "dtype",
                                             "shardings", "in_place", "activations"),
                   donate_argnames=("cache", "logits_SV"))
def decode(config: ModelConfig, spec: SamplingSpec, params, cache: kvc.KVCache, logits_SV,
           rows_DP, live_B, budget_B, seed_B, turn_B, count_B, temperature, *, chunk: int,
           window: int, dtype, shardings, in_place: bool | None = None,
           activations: shd.Activations | None = None):
  """`_decode` with the rows pinned to the batch axes by `activations` (the engine's mesh and
  rules)."""
  with shd.activation_sharding(activations):
    return _decode(config, spec, params, cache, logits_SV, rows_DP, live_B, budget_B, seed_B,
                   turn_B, count_B, temperature, chunk=chunk, window=window, dtype=dtype,
                   shardings=shardings, in_place=in_place)


def _decode(config, spec, params, cache, logits_SV, rows_DP, live_B, budget_B, seed_B, turn_B,
            count_B, temperature, *, chunk, window, dtype, shardings, in_place):
  """Up to `chunk` decode steps over B rows: every slot (`rows_DP` None), or the slots `rows_DP`
  (local to each shard; B = D·p), gathered into a dense batch so that idle slots cost nothing.
  Returns the cache, logits, the emitted tokens and log-probs [B, chunk], how many each row
  emitted and whether it ended on EOS.

  Over every slot, with `in_place` (default `in_place_decode()`), the loop carries the whole
  donated cache: each step writes at the rows' `end` and attends to the first `window` slots
  (a slice read inside the body), so no copy of the cache exists. Gathered rows are copied
  (their window, p rows of each shard's slots, once per call) and their chunk's positions
  written back: the engine gathers only when at most 3/4 of a shard's slots are live, and
  reading rows by index inside the body needs a paged attention kernel (Pallas, TPU only; an
  XLA gather inside the body would materialise the rows on every step). Its cost, v5p-8,
  Qwen2.5-7B shapes, 2 layers, 12 of 16 rows per shard at 4,096 slots: 296 MiB of temporaries
  for a 256 MiB cache and 2.44x a step's minimum bytes, against 35 MiB and 1.19x over every
  slot in place (`python -m bench.decode_hlo --model 7b`)."""
  _TRACES["decode"] += 1
  logging.info("Compiling engine decode: %d rows, chunk %d, window %d.", live_B.shape[0], chunk,
               window)
  in_place = in_place_decode() if in_place is None else in_place
  eos = jnp.asarray(spec.eos_ids or (-1,), jnp.int32)
  b = live_B.shape[0]
  # CPU: sliced once, not on every step; elsewhere read in place inside the loop
  layers = transformer.layer_params(config, params) if ops.slice_layers_outside_loops() else None
  whole = rows_DP is None and in_place  # the loop runs on the cache itself
  if whole:  # buffers whole; validity and positions of the window (what attention reads)
    view = cache.replace(valid=cache.valid[:, :window], pos=cache.pos[:, :window])
    logits_BV = logits_SV
  elif rows_DP is None:
    view, logits_BV = _window(cache, window), logits_SV
  else:
    view, logits_BV = _take_cache(cache, rows_DP, window), take_rows(logits_SV, rows_DP, 0)
  # The positions a copy's loop can write: from each row's end, `chunk` of them (moved back to
  # fit the window; positions before the end are rewritten with what they hold).
  n = min(chunk, window)
  start_B = jnp.clip(view.end, 0, window - n)

  def cond(carry):
    i, done_B = carry[0], carry[5]
    return (i < chunk) & ~jnp.all(done_B)

  def body(carry):
    i, view, logits_BV, tokens_BN, logp_BN, done_B, n_B, eos_B = carry
    keys_B = row_keys(seed_B, turn_B, count_B + n_B)
    token_B, lp_B = select_tokens_rows(logits_BV, keys_B, spec, temperature)
    active_B = ~done_B
    token_B = jnp.where(active_B, token_B, 0)
    tokens_BN = tokens_BN.at[:, i].set(token_B)
    logp_BN = logp_BN.at[:, i].set(jnp.where(active_B, lp_B, 0.0))
    n_B = n_B + active_B.astype(jnp.int32)
    hit_B = active_B & jnp.isin(token_B, eos)
    done_B = done_B | hit_B | (n_B >= budget_B)
    new_B1V, view = transformer.forward(config, params, token_B[:, None],
                                        attention_mask=active_B[:, None], cache=view, dtype=dtype,
                                        layers=layers)
    logits_BV = jnp.where(active_B[:, None], new_B1V[:, 0], logits_BV)
    return i + 1, view, logits_BV, tokens_BN, logp_BN, done_B, n_B, eos_B | hit_B

  init = (jnp.int32(0), view, logits_BV.astype(jnp.float32), jnp.zeros((b, chunk), jnp.int32),
          jnp.zeros((b, chunk), jnp.float32), ~live_B | (budget_B <= 0),
          jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
  _, view, logits_BV, tokens_BN, logp_BN, _, n_B, eos_B = jax.lax.while_loop(cond, body, init)
  if whole:
    cache = view.replace(valid=cache.valid.at[:, :window].set(view.valid),
                         pos=cache.pos.at[:, :window].set(view.pos))
    if shardings is not None:
      cache = jax.tree.map(_constrain, cache, shardings[0])
  else:
    cache = _store_spans(cache, rows_DP, view, start_B, n, shardings and shardings[0])
  if rows_DP is None:
    logits_SV = logits_BV
  else:
    logits_SV = put_rows(logits_SV, rows_DP, logits_BV, 0)
  return cache, _constrain(logits_SV, shardings and shardings[1]), tokens_BN, logp_BN, n_B, eos_B


def compile_counts() -> dict[str, int]:
  """How many times the engine's programs were traced (= compiled) in this process."""
  return dict(_TRACES)
