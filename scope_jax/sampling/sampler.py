"""Batched sampler over the functional decoder: bucketed prefill, fork, while-loop decode.

Flow for a batch of prompts (each sampled G times):
  1. left-pad the prompts to a length bucket and prefill them once (jitted per bucket);
  2. fork the KV cache and the last logits G times (rows prompt-major: p0 ×G, p1 ×G, ...);
  3. decode in a `lax.while_loop` with the state donated, stopping rows on EOS or their budget;
  4. between decode chunks, check stop strings on the host (exact truncation after the tag).

Log-prob convention: each sampled token's log-prob is log softmax(logits / T) over the full
vocabulary (T = 1 for greedy) — the same temperature-scaled policy the trainer differentiates;
top-k and top-p only restrict which tokens may be drawn, they do not renormalise the log-prob.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import weakref
from typing import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from scope_jax import sharding as shd
from scope_jax.shapes import length_bucket
from scope_jax.models import kv_cache as kvc
from scope_jax.models import ops
from scope_jax.models import lora as lora_lib
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.sampling import stops as stops_lib

FINISH_REASONS = ("running", "eos", "stop", "length")
_RUNNING, _EOS, _STOP, _LENGTH = range(4)
NEG = transformer.K_MASK


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
  """Sampling settings. All but a positive temperature's value are part of the compiled decode's
  identity (`compiled()`): roles that differ only in temperature share one decode program."""

  temperature: float = 0.0  # 0 = greedy
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1 = off
  eos_ids: tuple[int, ...] = ()

  def __post_init__(self):
    if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
      raise ValueError(f"Invalid sampling settings {self}: need temperature >= 0, "
                       "0 < top_p <= 1, top_k >= 0.")

  def compiled(self) -> "SamplingSpec":
    """The static part: greedy or not, top-k, top-p, EOS ids (the temperature is traced)."""
    return dataclasses.replace(self, temperature=float(self.temperature > 0))


@dataclasses.dataclass
class SampleResult:
  tokens: np.ndarray  # [n] int32, exactly as sampled (including EOS / the stop tag's tokens)
  logprobs: np.ndarray  # [n] float32, see the module docstring for the convention
  finish_reason: str  # 'eos' | 'stop' | 'length'
  prompt_index: int
  text: str | None = None
  stop: str | None = None  # the stop string that ended the row


@flax.struct.dataclass
class DecodeState:
  cache: kvc.KVCache
  logits: jax.Array  # [B, V] float32: logits for each row's next token
  tokens: jax.Array  # [B, N] int32 generated so far
  logprobs: jax.Array  # [B, N] float32
  length: jax.Array  # [B] int32 tokens generated per row
  budget: jax.Array  # [B] int32 max new tokens per row
  done: jax.Array  # [B] bool
  finish: jax.Array  # [B] int32 index into FINISH_REASONS
  step: jax.Array  # [] int32 decode steps taken
  rng: jax.Array


# --------------------------------------------------------------------------- token selection

def truncate_logits(scaled_BV: jax.Array, top_k: int, top_p: float) -> jax.Array:
  """Masks tokens outside the top-k and outside the smallest set with probability >= top_p."""
  if top_k > 0:
    kth_B1 = jax.lax.top_k(scaled_BV, top_k)[0][:, -1:]
    scaled_BV = jnp.where(scaled_BV < kth_B1, NEG, scaled_BV)
  if top_p < 1.0:
    sorted_BV = -jnp.sort(-scaled_BV, axis=-1)
    probs_BV = jax.nn.softmax(sorted_BV, axis=-1)
    keep_BV = (jnp.cumsum(probs_BV, axis=-1) - probs_BV) < top_p  # mass before this token
    threshold_B1 = jnp.min(jnp.where(keep_BV, sorted_BV, jnp.inf), axis=-1, keepdims=True)
    scaled_BV = jnp.where(scaled_BV < threshold_B1, NEG, scaled_BV)
  return scaled_BV


def argmax_last(x_BV: jax.Array) -> jax.Array:
  """`jnp.argmax(x, -1)` (the first index of the maximum) as plain reductions over blocks of the
  last axis: XLA:CPU's fused (value, index) reduction is about 10× slower on a [B, 150k] row."""
  v = x_BV.shape[-1]
  c = min(v, 1024)
  r = -(-v // c)
  blocks_BRC = jnp.pad(x_BV, ((0, 0), (0, r * c - v)), constant_values=-jnp.inf)
  blocks_BRC = blocks_BRC.reshape(x_BV.shape[0], r, c)
  j_B = jnp.argmax(jnp.max(blocks_BRC, axis=-1), axis=-1)  # first block holding the maximum
  block_BC = jnp.take_along_axis(blocks_BRC, j_B[:, None, None], axis=1)[:, 0]
  return (j_B * c + jnp.argmax(block_BC, axis=-1)).astype(jnp.int32)


def categorical(key: jax.Array, logits_BV: jax.Array) -> jax.Array:
  """`jax.random.categorical(key, logits)` (the same Gumbel draw, so the same samples) with
  `argmax_last`."""
  return argmax_last(jax.random.gumbel(key, logits_BV.shape, logits_BV.dtype) + logits_BV)


def select_tokens(logits_BV: jax.Array, key: jax.Array, spec: SamplingSpec, temperature=None):
  """Returns (token [B], log-prob [B]) under the temperature-scaled full distribution.
  `temperature` (a traced scalar) overrides `spec.temperature` when sampling; greedy is decided by
  `spec.temperature == 0`."""
  logits_BV = logits_BV.astype(jnp.float32)
  if spec.temperature == 0.0:
    token_B = argmax_last(logits_BV)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / (spec.temperature if temperature is None else temperature)
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    token_B = categorical(key, truncate_logits(scaled_BV, spec.top_k, spec.top_p))
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B


# ------------------------------------------------------------------------- jitted functions

_TRACES = {"prefill": 0, "decode": 0}


@functools.partial(jax.jit, static_argnames=("config", "capacity", "dtype", "cache_dtype",
                                             "layout", "activations"))
def _prefill(config: ModelConfig, params, tokens_BT, mask_BT, *, capacity: int, dtype,
             cache_dtype, layout: str | None = None, activations: shd.Activations | None = None):
  """Prefills left-padded prompts; returns (last-position logits [B, V], cache in `layout`,
  default `kvc.default_layout()`). `activations` (the sampler's mesh and rules) pins the rows to
  the batch axes."""
  with shd.activation_sharding(activations):
    return _prefill_body(config, params, tokens_BT, mask_BT, capacity=capacity, dtype=dtype,
                         cache_dtype=cache_dtype, layout=layout)


def _prefill_body(config: ModelConfig, params, tokens_BT, mask_BT, *, capacity: int, dtype,
                  cache_dtype, layout):
  _TRACES["prefill"] += 1
  logging.info("Compiling prefill for batch %d × length %d (cache %d).", *tokens_BT.shape, capacity)
  cache = kvc.init_cache(config, tokens_BT.shape[0], capacity, cache_dtype, layout)
  hidden_BTD, cache = transformer.forward(config, params, tokens_BT, attention_mask=mask_BT,
                                          cache=cache, return_hidden=True, dtype=dtype)
  last_B1D = hidden_BTD[:, -1:]
  logits_BV = transformer.logits_from_hidden(last_B1D, transformer.unembedding(config, params),
                                             config.final_softcap)
  return logits_BV[:, 0], cache


@functools.partial(jax.jit, static_argnames=("config", "spec", "dtype", "activations"),
                   donate_argnames=("state",))
def _decode(config: ModelConfig, spec: SamplingSpec, params, state: DecodeState, limit,
            temperature, *, dtype, activations: shd.Activations | None = None):
  """Runs decode steps until `limit` steps were taken or every row is done; `spec` is
  `SamplingSpec.compiled()` and `temperature` the traced float32 value."""
  with shd.activation_sharding(activations):
    return _decode_body(config, spec, params, state, limit, temperature, dtype=dtype)


def _decode_body(config: ModelConfig, spec: SamplingSpec, params, state: DecodeState, limit,
                 temperature, *, dtype):
  _TRACES["decode"] += 1
  logging.info("Compiling decode for batch %d, %d new tokens, cache %d.", *state.tokens.shape,
               state.cache.capacity)
  eos = jnp.asarray(spec.eos_ids or (-1,), jnp.int32)
  rows = jnp.arange(state.tokens.shape[0])
  n = state.tokens.shape[1]
  # CPU: sliced once, not on every step; elsewhere read in place inside the loop
  layers = transformer.layer_params(config, params) if ops.slice_layers_outside_loops() else None

  def cond(s: DecodeState):
    return (s.step < limit) & ~jnp.all(s.done)

  def body(s: DecodeState):
    rng, key = jax.random.split(s.rng)
    token_B, logp_B = select_tokens(s.logits, key, spec, temperature)
    active_B = ~s.done
    token_B = jnp.where(active_B, token_B, 0)
    slot_B = jnp.where(active_B, s.length, n)  # out of range → dropped
    tokens = s.tokens.at[rows, slot_B].set(token_B, mode="drop")
    logprobs = s.logprobs.at[rows, slot_B].set(logp_B, mode="drop")
    length_B = s.length + active_B.astype(jnp.int32)
    hit_eos_B = active_B & jnp.isin(token_B, eos)
    spent_B = active_B & ~hit_eos_B & (length_B >= s.budget)
    finish_B = jnp.where(hit_eos_B, _EOS, jnp.where(spent_B, _LENGTH, s.finish))
    logits_B1V, cache = transformer.forward(config, params, token_B[:, None],
                                            attention_mask=active_B[:, None], cache=s.cache,
                                            dtype=dtype, layers=layers)
    return DecodeState(cache=cache, logits=logits_B1V[:, 0], tokens=tokens, logprobs=logprobs,
                       length=length_B, budget=s.budget, done=s.done | hit_eos_B | spent_B,
                       finish=finish_B, step=s.step + 1, rng=rng)

  return jax.lax.while_loop(cond, body, state)


def compile_counts() -> dict[str, int]:
  """How many times prefill and decode were traced (= compiled) in this process."""
  return dict(_TRACES)


# ------------------------------------------------------------------------------ weights

def place_params(params, config: ModelConfig, mesh, rules: shd.Rules, dtype) -> tuple[object, list]:
  """(the params a player samples with, the leaves it made for that): on a mesh, the sampling
  layout (`transformer.sampling_params`: a leaf it moves is a copy, the others are `params`'
  own arrays); without one, `params` themselves and no copies."""
  if mesh is None:
    return params, []
  placed = transformer.sampling_params(params, config, mesh, rules, dtype)
  copies = [new for new, old in zip(jax.tree.leaves(placed), jax.tree.leaves(params))
            if new is not old]
  return placed, copies


def refresh_params(player, params):
  """Lays out `params` for `player` (a Sampler or Engine) and returns them, deleting the old
  sampling copies first (`release_copies`). A LoRA view (`lora.view`) has its base placed once
  for every player of that base (`_PLACED_BASES`), so every policy shares one sampling copy of
  the base and a refresh after an update moves and copies only the adapters; a player of plain
  params that are such a base (a frozen role or KL reference of a LoRA run) shares it too."""
  base, adapters = lora_lib.split(params)
  key = _base_key(base, player)
  if adapters is None and key not in _PLACED_BASES:
    key = None
  if player._base_held is not None and player._base_held[0] != key:
    player._base_held[1]()  # lets go of the old base (once; also run if the player is collected)
    player._base_held = None
  player._copies = release_copies(player._copies, params)
  if key is None:
    placed, player._copies = place_params(params, player.config, player.mesh, player.rules,
                                          player.dtype)
    return placed
  if player._base_held is None:
    _hold_base(key, base, player)
    release = weakref.finalize(player, _drop_base, key)
    release.atexit = False  # nothing to free at exit
    player._base_held = (key, release)
  if adapters is None:
    return _PLACED_BASES[key][1]
  placed = adapters if player.mesh is None else lora_lib.place(adapters, player.config,
                                                               player.mesh, player.rules)
  player._copies = [new for new, old in zip(jax.tree.leaves(placed), jax.tree.leaves(adapters))
                    if new is not old]
  return lora_lib.view(_PLACED_BASES[key][1], placed)


# key -> [source base, its sampling layout, the copies made for it, players holding it]. The
# entry holds the source arrays, so their ids in the key are never reused while it lives; a
# player's hold ends when it moves to another base or is garbage-collected.
_PLACED_BASES: dict = {}


def _base_key(base, player) -> tuple:
  rules = tuple(sorted((k, str(v)) for k, v in player.rules.items()))
  return (tuple(id(x) for x in jax.tree.leaves(base)), id(player.mesh), rules,
          jnp.dtype(player.dtype).name, player.config)


def _hold_base(key, base, player) -> None:
  if key not in _PLACED_BASES:
    placed, copies = place_params(base, player.config, player.mesh, player.rules, player.dtype)
    _PLACED_BASES[key] = [base, placed, copies, 0]
  _PLACED_BASES[key][3] += 1


def _drop_base(key) -> None:
  """A player lets go of a placed base; the last one deletes the copies made for it."""
  entry = _PLACED_BASES[key]
  entry[3] -= 1
  if entry[3] == 0:
    release_copies(entry[2])
    del _PLACED_BASES[key]


REFRESH_FREES_OLD_COPY = True  # `release_copies` runs before a refresh lays out new weights


def release_copies(copies: list, keep=None) -> list:
  """Deletes the leaves a player made (`place_params`) before it lays out new weights, so the
  old and the new sampling copies never coexist (a whole bf16 model per chip at a 7B paper
  preset's size); a leaf that `keep` (the incoming params) holds itself is kept. Returns []."""
  kept = {id(x) for x in jax.tree.leaves(keep)}
  for x in copies:
    if id(x) not in kept and isinstance(x, jax.Array) and not x.is_deleted():
      x.delete()
  return []


# ----------------------------------------------------------------------------- host driver

class Sampler:
  """Samples from one params pytree; reuse it across calls (compiled shapes are cached)."""

  def __init__(self, config: ModelConfig, params, *, dtype=jnp.float32, cache_dtype=None,
               mesh=None, rules: shd.Rules = shd.SAMPLING_RULES,
               decode: Callable[[Sequence[int]], str] | None = None,
               stop_check_interval: int = 16, max_context: int | None = None,
               pad_id: int | None = None, eos_ids: Sequence[int] | None = None):
    self.config = config
    self.dtype = dtype
    self.cache_dtype = cache_dtype or dtype
    self.mesh, self.rules = mesh, rules
    self.decode_text = decode
    self.stop_check_interval = stop_check_interval
    self.max_context = max_context or config.max_position_embeddings
    self.pad_id = pad_id if pad_id is not None else (config.pad_token_id or 0)
    self.eos_ids = tuple(config.eos_ids if eos_ids is None else eos_ids)
    self.stats = {"prefill_calls": 0, "prefill_rows": 0, "prefill_tokens": 0,
                  "prefill_padded_tokens": 0, "decode_calls": 0, "generated_tokens": 0}
    self.layout = kvc.default_layout()  # of the KV cache's buffers, for this backend
    self._copies: list = []  # params leaves this sampler made (sampling layout), not shared
    self._base_held = None  # a LoRA view's placed base, kept across refreshes (`refresh_params`)
    self.update_params(params)

  def update_params(self, params) -> None:
    """Points the sampler at new weights (resharded for sampling when a mesh is set). The old
    sampling copies are deleted first, so two never coexist."""
    self.params = None
    self.params = refresh_params(self, params)

  def _batch_multiple(self) -> int:
    if self.mesh is None:
      return 1
    return shd.batch_shards(self.mesh, self.rules)

  def _put(self, x):
    if self.mesh is None:
      return jnp.asarray(x)
    return shd.global_array(x, shd.batch_sharding(self.mesh, np.shape(x), self.rules))

  def _replicate(self, x):
    """A scalar placed as the decode returns it (replicated over the mesh), so the first chunk
    and the later ones share one compiled program."""
    if self.mesh is None:
      return x
    return shd.global_array(x, shd.replicated(self.mesh))

  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               stop: Sequence[str] = (), num_samples: int = 1, seed: int = 0,
               eos_ids: Sequence[int] | None = None) -> list[SampleResult]:
    """Samples `num_samples` completions per prompt; results are prompt-major."""
    prompts, spec = prepare(self, prompts, max_new_tokens, num_samples, stop,
                            temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos_ids)
    n, g = len(prompts), num_samples
    width = length_bucket(max(len(p) for p in prompts))
    new_bucket = length_bucket(max_new_tokens, minimum=8)
    rows_p = -(-length_bucket(n, minimum=1) // self._batch_multiple()) * self._batch_multiple()
    tokens = np.full((rows_p, width), self.pad_id, np.int32)
    mask = np.zeros((rows_p, width), np.int32)
    for i, p in enumerate(prompts):
      tokens[i, width - len(p):], mask[i, width - len(p):] = p, 1

    logits, cache = _prefill(self.config, self.params, self._put(tokens), self._put(mask),
                             capacity=width + new_bucket, dtype=self.dtype,
                             cache_dtype=self.cache_dtype, layout=self.layout,
                             activations=shd.activations(self.mesh, self.rules))
    self.stats["prefill_calls"] += 1
    self.stats["prefill_rows"] += n
    self.stats["prefill_tokens"] += sum(len(p) for p in prompts)
    self.stats["prefill_padded_tokens"] += tokens.size
    if g > 1:
      cache, logits = kvc.fork(cache, g), jnp.repeat(logits, g, axis=0)

    budget = np.zeros((rows_p * g,), np.int32)
    for i, p in enumerate(prompts):
      budget[i * g:(i + 1) * g] = max(0, min(max_new_tokens, self.max_context - len(p)))
    done = budget == 0
    b = rows_p * g
    state = DecodeState(
        cache=cache, logits=logits, tokens=self._put(np.zeros((b, new_bucket), np.int32)),
        logprobs=self._put(np.zeros((b, new_bucket), np.float32)),
        length=self._put(np.zeros((b,), np.int32)), budget=self._put(budget),
        done=self._put(done), finish=self._put(np.where(done, _LENGTH, _RUNNING).astype(np.int32)),
        step=self._replicate(jnp.zeros((), jnp.int32)),
        rng=self._replicate(jax.random.key(seed)))

    interval = self.stop_check_interval if stop else max_new_tokens
    checked = np.zeros((b,), np.int64)
    stop_hits: dict[int, stops_lib.StopMatch] = {}
    while True:
      limit = min(int(state.step) + interval, max_new_tokens)
      state = _decode(self.config, spec.compiled(), self.params, state,
                      jnp.asarray(limit, jnp.int32), jnp.float32(spec.temperature),
                      dtype=self.dtype, activations=shd.activations(self.mesh, self.rules))
      self.stats["decode_calls"] += 1
      if stop:
        state = self._apply_stops(state, stop, checked, stop_hits, n * g)
      if bool(jnp.all(state.done)) or int(state.step) >= max_new_tokens:
        break
    return self._results(state, prompts, g, stop_hits)

  def _apply_stops(self, state: DecodeState, stop, checked, hits, real_rows) -> DecodeState:
    length = np.array(shd.to_host(state.length))
    tokens = shd.to_host(state.tokens)
    done, finish = np.array(shd.to_host(state.done)), np.array(shd.to_host(state.finish))
    changed = False
    for r in range(real_rows):
      if r in hits or length[r] <= checked[r]:
        continue
      match = stops_lib.find_stop(tokens[r, :length[r]].tolist(), stop, self.decode_text,
                                  start=int(checked[r]))
      checked[r] = length[r]
      if match is not None:
        hits[r] = match
        length[r], done[r], finish[r] = match.num_tokens, True, _STOP
        changed = True
    if not changed:
      return state
    return state.replace(length=self._put(length), done=self._put(done), finish=self._put(finish))

  def _results(self, state: DecodeState, prompts, g: int, hits) -> list[SampleResult]:
    tokens, logprobs = shd.to_host(state.tokens), shd.to_host(state.logprobs)
    length, finish = shd.to_host(state.length), shd.to_host(state.finish)
    out = []
    for r in range(len(prompts) * g):
      reason = FINISH_REASONS[finish[r]] if finish[r] != _RUNNING else "length"
      res = SampleResult(tokens=tokens[r, :length[r]].copy(),
                         logprobs=logprobs[r, :length[r]].copy(), finish_reason=reason,
                         prompt_index=r // g)
      if r in hits:
        res.text, res.stop = hits[r].text, hits[r].stop
      elif self.decode_text is not None:
        res.text = self.decode_text(res.tokens.tolist())
      self.stats["generated_tokens"] += int(length[r])
      out.append(res)
    return out


def prepare(player, prompts, max_new_tokens: int, num_samples: int, stop, *, temperature: float,
            top_k: int, top_p: float, eos_ids) -> tuple[list[list[int]], SamplingSpec]:
  """A `generate` call's prompts as lists and its sampling spec, after checking both (shared by
  the sampler and the engine; `player` supplies the vocabulary, decode function and EOS ids)."""
  prompts = [list(p) for p in prompts]
  _validate(prompts, player.config.vocab_size, max_new_tokens, num_samples)
  if stop and player.decode_text is None:
    raise ValueError("Stop strings need a tokenizer (or decode function) to read the text.")
  stops_lib.check(stop)
  if not (math.isfinite(temperature) and temperature >= 0 and 0 < top_p <= 1 and top_k >= 0):
    raise ValueError(f"Sampling needs temperature >= 0 (0 is greedy), 0 < top_p <= 1 and "
                     f"top_k >= 0; got temperature={temperature}, top_p={top_p}, top_k={top_k}.")
  eos = tuple(player.eos_ids if eos_ids is None else eos_ids)
  return prompts, SamplingSpec(temperature=float(temperature), top_k=int(top_k),
                               top_p=float(top_p), eos_ids=eos)


def _validate(prompts, vocab_size, max_new_tokens, num_samples):
  if not prompts:
    raise ValueError("generate() needs at least one prompt.")
  if max_new_tokens < 1 or num_samples < 1:
    raise ValueError(f"max_new_tokens ({max_new_tokens}) and num_samples ({num_samples}) must "
                     "be >= 1.")
  for i, p in enumerate(prompts):
    if not p:
      raise ValueError(f"Prompt {i} is empty; every prompt needs at least one token.")
    bad = [t for t in p if not 0 <= int(t) < vocab_size]
    if bad:
      raise ValueError(f"Prompt {i} has token ids outside [0, {vocab_size}): {bad[:5]}.")
