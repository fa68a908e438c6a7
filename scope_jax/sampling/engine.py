"""A slot-based rollout engine: B fixed KV-cache slots, continuous batching, multi-turn reuse.

Device side (jitted, static shapes; every program works on a window of the first W cache
positions, W a power-of-two bucket of the longest slot involved, so attention follows the
actual lengths rather than the capacity):
  * `_prefill` truncates P chosen slots to the prefix they keep, appends a right-padded block of
    tokens (chunked: a long input takes several calls) and keeps each slot's last logits;
  * `_copy` copies whole slots (cache and next-token logits): the G samples of a prompt share one
    prefill, and any input may start from a slot that holds a common prefix;
  * `_decode` runs up to `chunk` steps over all slots; live slots emit one token per step.

Host side (`Engine.step`): admit waiting requests into free slots (a continuation goes back to
the slot its key parked in), run one decode chunk, then apply stop strings, EOS and budgets and
hand back the finished completions. A finished slot stays parked for its key, cache intact,
until the caller continues it (the next turn: only the new tokens are prefilled) or releases it.

Exactness: slots hold their tokens without holes (slot index = RoPE position), so a slot's
cache equals a fresh prefill of its tokens; the log-prob convention is the sampler's
(log softmax(logits / T) of the full vocabulary); sampling keys depend on the request's seed,
its turn and the token index only, so results do not depend on the slot or the schedule.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from scope_jax import sharding as shd
from scope_jax.models import kv_cache as kvc
from scope_jax.models import transformer
from scope_jax.models.config import ModelConfig
from scope_jax.sampling import stops as stops_lib
from scope_jax.sampling.sampler import (SampleResult, SamplingSpec, _validate, length_bucket,
                                        truncate_logits)

_TRACES = collections.Counter()


@dataclasses.dataclass
class Request:
  """Generate up to `max_new_tokens` after `tokens` (the whole context, not a suffix)."""

  key: Hashable  # the caller's id for this sequence; a continuation reuses the key's slot
  tokens: Sequence[int]
  max_new_tokens: int
  seed: int = 0  # with `turn`, the only inputs of the sampling keys
  turn: int = 0
  stop: tuple[str, ...] = ()
  spec: SamplingSpec = SamplingSpec()


@dataclasses.dataclass
class Completion:
  key: Hashable
  tokens: np.ndarray  # [n] int32 exactly as sampled (a stop string's last token included)
  logprobs: np.ndarray  # [n] float32
  finish_reason: str  # 'eos' | 'stop' | 'length'
  text: str | None = None
  stop: str | None = None


@dataclasses.dataclass
class _Slot:
  tokens: np.ndarray  # what the slot's cache holds, in order (its logits follow the last one)
  owner: Hashable = None  # the key parked or live here
  request: Request | None = None  # set while live
  generated: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  budget: int = 0
  checked: int = 0  # generated tokens already searched for stop strings


# ------------------------------------------------------------------------------ device side

def _window(cache: kvc.KVCache, w: int) -> kvc.KVCache:
  return kvc.KVCache(k=cache.k[:, :, :w], v=cache.v[:, :, :w], valid=cache.valid[:, :w],
                     end=cache.end, next_pos=cache.next_pos, pos=cache.pos[:, :w])


def _constrain(x, sharding):
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _store(cache: kvc.KVCache, rows, view: kvc.KVCache, shardings) -> kvc.KVCache:
  """Writes a window view back: all rows (`rows` None) or the rows `rows` (out of range: dropped)."""
  w = view.valid.shape[1]
  r = slice(None) if rows is None else rows
  put = lambda full, part, idx: full.at[idx].set(part, mode="drop")
  new = kvc.KVCache(k=put(cache.k, view.k, (slice(None), r, slice(0, w))),
                    v=put(cache.v, view.v, (slice(None), r, slice(0, w))),
                    valid=put(cache.valid, view.valid, (r, slice(0, w))),
                    end=put(cache.end, view.end, (r,)), next_pos=put(cache.next_pos, view.next_pos, (r,)),
                    pos=put(cache.pos, view.pos, (r, slice(0, w))))
  return jax.tree.map(_constrain, new, shardings) if shardings is not None else new


@functools.partial(jax.jit, static_argnames=("config", "window", "dtype", "shardings"),
                   donate_argnames=("cache", "logits_BV"))
def _prefill(config: ModelConfig, params, cache: kvc.KVCache, logits_BV, slots_P, start_P,
             tokens_PT, mask_PT, *, window: int, dtype, shardings):
  """Truncates slots `slots_P` to `start_P` tokens, appends the right-padded block and stores
  the logits after each row's last real token (rows with no real token keep theirs)."""
  _TRACES["prefill"] += 1
  logging.info("Compiling engine prefill: %d rows × %d tokens, window %d.", *tokens_PT.shape,
               window)
  sub = jax.tree.map(lambda x: x[slots_P] if x.ndim < 5 else x[:, slots_P], _window(cache, window))
  keep_PW = jnp.arange(window)[None, :] < start_P[:, None]
  sub = sub.replace(valid=sub.valid & keep_PW, end=start_P, next_pos=start_P)
  hidden_PTD, sub = transformer.forward(config, params, tokens_PT, attention_mask=mask_PT,
                                        cache=sub, return_hidden=True, dtype=dtype)
  n_P = mask_PT.sum(-1)
  last_P1D = jnp.take_along_axis(hidden_PTD, jnp.maximum(n_P - 1, 0)[:, None, None], axis=1)
  logits_PV = transformer.logits_from_hidden(last_P1D, transformer.unembedding(config, params),
                                             config.final_softcap)[:, 0]
  keep_slots_P = jnp.where(n_P > 0, slots_P, cache.end.shape[0])  # no real token: keep logits
  logits_BV = logits_BV.at[keep_slots_P].set(logits_PV, mode="drop")
  cache = _store(cache, slots_P, sub, shardings and shardings[0])
  return cache, _constrain(logits_BV, shardings and shardings[1])


@functools.partial(jax.jit, static_argnames=("shardings",), donate_argnames=("cache", "logits_BV"))
def _copy(cache: kvc.KVCache, logits_BV, src_P, dst_P, *, shardings):
  """Copies slots `src_P` (cache and logits) onto `dst_P`; reads happen before any write."""
  _TRACES["copy"] += 1
  take = lambda x: x[:, src_P] if x.ndim == 5 else x[src_P]
  put = lambda x, y: (x.at[:, dst_P] if x.ndim == 5 else x.at[dst_P]).set(y, mode="drop")
  cache = jax.tree.map(lambda x: put(x, take(x)), cache)
  logits_BV = put(logits_BV, take(logits_BV))
  if shardings is not None:
    cache = jax.tree.map(_constrain, cache, shardings[0])
    logits_BV = _constrain(logits_BV, shardings[1])
  return cache, logits_BV


def select_tokens_rows(logits_BV, keys_B, spec: SamplingSpec, temperature):
  """`sampler.select_tokens` with one key per row, so a row's draw is independent of the batch."""
  logits_BV = logits_BV.astype(jnp.float32)
  if spec.temperature == 0.0:
    token_B = jnp.argmax(logits_BV, axis=-1)
    logp_BV = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled_BV = logits_BV / temperature
    logp_BV = jax.nn.log_softmax(scaled_BV, axis=-1)
    allowed_BV = truncate_logits(scaled_BV, spec.top_k, spec.top_p)
    token_B = jax.vmap(jax.random.categorical)(keys_B, allowed_BV)
  logp_B = jnp.take_along_axis(logp_BV, token_B[:, None], axis=-1)[:, 0]
  return token_B.astype(jnp.int32), logp_B


def row_keys(seed_B, turn_B, index_B):
  """The sampling key of each row's next token: a function of (seed, turn, token index) only."""
  key = lambda s, t, i: jax.random.fold_in(jax.random.fold_in(jax.random.key(s), t), i)
  return jax.vmap(key)(seed_B, turn_B, index_B)


@functools.partial(jax.jit, static_argnames=("config", "spec", "chunk", "window", "dtype",
                                             "shardings"),
                   donate_argnames=("cache", "logits_BV"))
def _decode(config: ModelConfig, spec: SamplingSpec, params, cache: kvc.KVCache, logits_BV,
            live_B, budget_B, seed_B, turn_B, count_B, temperature, *, chunk: int, window: int,
            dtype, shardings):
  """Up to `chunk` decode steps over every slot; returns the cache, logits, the emitted tokens
  and log-probs [B, chunk], how many each slot emitted and whether it ended on EOS."""
  _TRACES["decode"] += 1
  logging.info("Compiling engine decode: %d slots, chunk %d, window %d.", live_B.shape[0], chunk,
               window)
  eos = jnp.asarray(spec.eos_ids or (-1,), jnp.int32)
  b = live_B.shape[0]
  view = _window(cache, window)

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
                                        attention_mask=active_B[:, None], cache=view, dtype=dtype)
    logits_BV = jnp.where(active_B[:, None], new_B1V[:, 0], logits_BV)
    return i + 1, view, logits_BV, tokens_BN, logp_BN, done_B, n_B, eos_B | hit_B

  init = (jnp.int32(0), view, logits_BV.astype(jnp.float32), jnp.zeros((b, chunk), jnp.int32),
          jnp.zeros((b, chunk), jnp.float32), ~live_B | (budget_B <= 0),
          jnp.zeros((b,), jnp.int32), jnp.zeros((b,), bool))
  _, view, logits_BV, tokens_BN, logp_BN, _, n_B, eos_B = jax.lax.while_loop(cond, body, init)
  cache = _store(cache, None, view, shardings and shardings[0])
  return cache, _constrain(logits_BV, shardings and shardings[1]), tokens_BN, logp_BN, n_B, eos_B


def compile_counts() -> dict[str, int]:
  """How many times the engine's programs were traced (= compiled) in this process."""
  return dict(_TRACES)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  if n == 0:
    return 0
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


# ------------------------------------------------------------------------------- host side

class Engine:
  """B slots over one params pytree. Use `add` / `step` / `release` (the multi-turn rollout does),
  or `generate`, which has `Sampler.generate`'s contract."""

  def __init__(self, config: ModelConfig, params, *, num_slots: int = 32,
               max_context: int | None = None, chunk: int = 16, prefill_rows: int = 8,
               prefill_chunk: int = 512, dtype=jnp.float32, cache_dtype=None, mesh=None,
               rules: shd.Rules = shd.SAMPLING_RULES,
               decode: Callable[[Sequence[int]], str] | None = None, pad_id: int | None = None,
               eos_ids: Sequence[int] | None = None):
    self.config, self.dtype = config, dtype
    self.mesh, self.rules = mesh, rules
    self.decode_text = decode
    self.chunk, self.prefill_chunk = chunk, prefill_chunk
    self.max_context = max_context or config.max_position_embeddings
    self.capacity = length_bucket(self.max_context)
    self.pad_id = pad_id if pad_id is not None else (config.pad_token_id or 0)
    self.eos_ids = tuple(config.eos_ids if eos_ids is None else eos_ids)
    m = self._batch_multiple()
    self.num_slots = -(-num_slots // m) * m
    self.prefill_rows = -(-min(prefill_rows, self.num_slots) // m) * m
    self._shardings = self._make_shardings()
    cache = kvc.init_cache(config, self.num_slots, self.capacity, cache_dtype or dtype)
    logits = jnp.zeros((self.num_slots, config.vocab_size), jnp.float32)
    if self._shardings is not None:
      cache = jax.device_put(cache, self._shardings[0])
      logits = jax.device_put(logits, self._shardings[1])
    self.cache, self.logits = cache, logits
    self.waiting: collections.deque[Request] = collections.deque()
    self.slots: list[_Slot] = []
    self.stats = collections.Counter()
    self.update_params(params)

  # ------------------------------------------------------------------------ placement
  def update_params(self, params) -> None:
    """Points the engine at new weights. Every slot is emptied: its keys and values came from
    the old weights and must not be reused as a prefix."""
    if self.busy():
      raise RuntimeError("The engine's weights cannot change while requests are generating.")
    if self.mesh is not None:
      params = transformer.shard_params(params, self.config, self.mesh, self.rules)
    self.params = params
    self.slots = [_Slot(np.zeros((0,), np.int32)) for _ in range(self.num_slots)]

  def _batch_multiple(self) -> int:
    if self.mesh is None:
      return 1
    return int(np.prod([self.mesh.shape[a] for a in ("data", "fsdp")]))

  def _make_shardings(self):
    if self.mesh is None:
      return None
    spec = lambda *axes: jax.sharding.NamedSharding(
        self.mesh, shd.logical_to_spec(axes, None, self.mesh, self.rules))
    kv = spec("layers", "batch", "cache", "kv_heads", "head_dim")
    row, row_col = spec("batch"), spec("batch", None)
    cache = kvc.KVCache(k=kv, v=kv, valid=row_col, end=row, next_pos=row, pos=row_col)
    return cache, row_col

  def _put(self, x):
    x = np.asarray(x)
    if self.mesh is None:
      return jnp.asarray(x)
    return jax.device_put(x, shd.batch_sharding(self.mesh, x.shape, self.rules))

  # ------------------------------------------------------------------------ requests
  def add(self, request: Request) -> None:
    """Queues a request; a key that is live already is refused."""
    if any(s.request is not None and s.owner == request.key for s in self.slots):
      raise ValueError(f"Request key {request.key!r} is still generating; wait for its "
                       "completion before continuing it.")
    self.waiting.append(request)

  def release(self, key: Hashable) -> None:
    """Frees the slot parked for `key` (its tokens stay available as a shared prefix)."""
    for s in self.slots:
      if s.owner == key and s.request is None:
        s.owner = None

  def cancel(self) -> None:
    """Drops every waiting and live request and frees every slot (what a slot's cache holds
    stays usable as a prefix: it always matches the slot's recorded tokens between steps)."""
    self.waiting.clear()
    for s in self.slots:
      s.owner, s.request, s.generated, s.logprobs, s.checked = None, None, [], [], 0

  def busy(self) -> bool:
    return bool(self.waiting) or any(s.request is not None for s in self.slots)

  def step(self) -> list[Completion]:
    """Admits what fits, decodes one chunk, returns the requests that finished."""
    finished = self._admit()
    live = [i for i, s in enumerate(self.slots) if s.request is not None]
    if not live:
      return finished
    spec = self._spec(live)
    b = self.num_slots
    live_B, budget_B = np.zeros((b,), bool), np.zeros((b,), np.int32)
    seed_B, turn_B, count_B = (np.zeros((b,), np.int32) for _ in range(3))
    for i in live:
      s = self.slots[i]
      live_B[i], budget_B[i] = True, s.budget - len(s.generated)
      seed_B[i], turn_B[i], count_B[i] = s.request.seed, s.request.turn, len(s.generated)
    steps = min(self.chunk, int(budget_B.max()))
    window = min(self.capacity, length_bucket(max(len(self.slots[i].tokens) for i in live) + steps))
    self.cache, self.logits, tok, lp, n, eos = _decode(
        self.config, spec.compiled(), self.params, self.cache, self.logits, self._put(live_B),
        self._put(budget_B), self._put(seed_B), self._put(turn_B), self._put(count_B),
        jnp.float32(spec.temperature), chunk=self.chunk, window=window, dtype=self.dtype,
        shardings=self._shardings)
    tok, lp, n, eos = (np.asarray(x) for x in (tok, lp, n, eos))
    self.stats["decode_calls"] += 1
    self.stats["slot_steps"] += b * int(n.max())
    self.stats["live_slot_steps"] += int(n.sum())
    self.stats["decode_tokens"] += int(n.sum())
    for i in live:
      finished += self._absorb(i, tok[i, :n[i]], lp[i, :n[i]], bool(eos[i]))
    return finished

  def _spec(self, live) -> SamplingSpec:
    specs = {self.slots[i].request.spec for i in live}
    if len(specs) > 1:
      raise ValueError(f"Live requests use different sampling settings {sorted(map(str, specs))}; "
                       "run one setting at a time through an engine.")
    return specs.pop()

  def _absorb(self, i: int, tokens, logprobs, hit_eos: bool) -> list[Completion]:
    s = self.slots[i]
    s.tokens = np.concatenate([s.tokens, tokens.astype(np.int32)])
    s.generated += tokens.tolist()
    s.logprobs += logprobs.tolist()
    match = None
    if s.request.stop:
      match = stops_lib.find_stop(s.generated, s.request.stop, self.decode_text, start=s.checked)
      s.checked = len(s.generated)
    if match is not None:
      return [self._finish(i, "stop", match.num_tokens, match)]
    if hit_eos:
      return [self._finish(i, "eos", len(s.generated))]
    if len(s.generated) >= s.budget:
      return [self._finish(i, "length", len(s.generated))]
    return []

  def _finish(self, i: int, reason: str, n: int, match=None) -> Completion:
    s = self.slots[i]
    out = Completion(s.request.key, np.asarray(s.generated[:n], np.int32),
                     np.asarray(s.logprobs[:n], np.float32), reason)
    if match is not None:
      out.text, out.stop = match.text, match.stop
    elif self.decode_text is not None:
      out.text = self.decode_text(out.tokens.tolist())
    s.request, s.generated, s.logprobs, s.checked = None, [], [], 0
    return out

  # ------------------------------------------------------------------------ admission
  def _admit(self) -> list[Completion]:
    """Places waiting requests: copies of shared prefixes, then chunked prefills, then forks of
    requests prefilled in this same round (identical inputs: G samples of one prompt)."""
    finished, copies, prefills, forks = [], [], [], []
    before = [s.tokens for s in self.slots]  # copies read the state before this round
    fresh: dict[bytes, int] = {}  # input tokens prefilled this round -> slot
    assigned: set[int] = set()  # slots written this round: no longer a source
    still = collections.deque()
    while self.waiting:
      req = self.waiting.popleft()
      tokens = np.asarray(req.tokens, np.int32)
      budget = min(req.max_new_tokens, self.max_context - len(tokens), self.capacity - len(tokens))
      if len(tokens) == 0:
        raise ValueError(f"Request {req.key!r} has no tokens; every input needs at least one.")
      i = self._slot_for(req.key)
      if i is None:
        still.append(req)
        continue
      s = self.slots[i]
      s.owner, s.request, s.budget = req.key, req, budget
      if budget <= 0:  # no room: nothing to generate, as the sampler reports it
        finished.append(self._finish(i, "length", 0))
        continue
      assigned.add(i)
      digest = tokens.tobytes()
      if digest in fresh:
        forks.append((fresh[digest], i))
        s.tokens = tokens
        continue
      src, keep = self._best_source(i, tokens, before, assigned)
      if src != i:
        copies.append((src, i))
      s.tokens = tokens
      if keep == len(tokens) and src != i:  # an exact copy: its logits are already the next ones
        continue
      keep = min(keep, len(tokens) - 1)
      prefills.append((i, keep, tokens[keep:]))
      fresh[digest] = i
    self.waiting = still
    self._run_copies(copies)
    self._run_prefills(prefills)
    self._run_copies(forks)
    self.stats["forked_rows"] += len(forks)
    return finished

  def _slot_for(self, key) -> int | None:
    """The slot parked for `key`, else a free slot (the least useful one as a prefix)."""
    for i, s in enumerate(self.slots):
      if s.owner == key and s.request is None:
        return i
    free = [i for i, s in enumerate(self.slots) if s.owner is None and s.request is None]
    return min(free, key=lambda i: len(self.slots[i].tokens)) if free else None

  def _best_source(self, target: int, tokens: np.ndarray, before, assigned) -> tuple[int, int]:
    """The slot whose cached tokens share the longest prefix with `tokens` (the target itself on
    a tie), and that prefix's length. An exact match only counts where the source's logits are
    the next-token ones, i.e. its tokens are exactly `tokens`."""
    best, keep = target, common_prefix(before[target], tokens)
    for j, held in enumerate(before):
      if j == target or j in assigned or not len(held):
        continue
      n = common_prefix(held, tokens)
      if n == len(tokens) and len(held) != len(tokens):
        n -= 1  # the logits after tokens[-1] are not stored: prefill the last token again
      if n > keep:
        best, keep = j, n
    if best == target and keep == len(tokens):
      keep -= 1
    return best, keep

  def _run_copies(self, pairs) -> None:
    p = self.prefill_rows
    for lo in range(0, len(pairs), p):
      part = pairs[lo:lo + p]
      src = np.full((p,), self.num_slots, np.int32)
      dst = np.full((p,), self.num_slots, np.int32)
      for k, (a, b) in enumerate(part):
        src[k], dst[k] = a, b
      src = np.minimum(src, self.num_slots - 1)  # padding reads any slot; its write is dropped
      self.cache, self.logits = _copy(self.cache, self.logits, jnp.asarray(src), jnp.asarray(dst),
                                      shardings=self._shardings)
      self.stats["copies"] += len(part)

  def _run_prefills(self, items) -> None:
    """Chunked prefills, `prefill_rows` slots × at most `prefill_chunk` tokens per call."""
    queue = [(i, keep, rest) for i, keep, rest in items]
    p = self.prefill_rows
    while queue:
      batch, queue = queue[:p], queue[p:]
      t = min(self.prefill_chunk, length_bucket(max(len(r) for _, _, r in batch), minimum=8))
      slots = np.full((p,), self.num_slots, np.int32)
      start = np.zeros((p,), np.int32)
      tokens = np.full((p, t), self.pad_id, np.int32)
      mask = np.zeros((p, t), np.int32)
      later = []
      for k, (i, keep, rest) in enumerate(batch):
        piece = rest[:t]
        slots[k], start[k] = i, keep
        tokens[k, :len(piece)], mask[k, :len(piece)] = piece, 1
        if len(rest) > t:
          later.append((i, keep + t, rest[t:]))
      window = min(self.capacity, length_bucket(int((start + mask.sum(1)).max())))
      self.cache, self.logits = _prefill(
          self.config, self.params, self.cache, self.logits, self._put(slots), self._put(start),
          self._put(tokens), self._put(mask), window=window, dtype=self.dtype,
          shardings=self._shardings)
      self.stats["prefill_calls"] += 1
      self.stats["prefill_tokens"] += int(mask.sum())
      self.stats["prefill_padded_tokens"] += p * t
      queue = later + queue

  # ------------------------------------------------------------------------ one-shot generation
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               stop: Sequence[str] = (), num_samples: int = 1, seed: int = 0,
               eos_ids: Sequence[int] | None = None) -> list[SampleResult]:
    """`Sampler.generate` on the engine: `num_samples` completions per prompt, prompt-major."""
    prompts = [list(p) for p in prompts]
    _validate(prompts, self.config.vocab_size, max_new_tokens, num_samples)
    if stop and self.decode_text is None:
      raise ValueError("Stop strings need a tokenizer (or decode function) to read the text.")
    spec = SamplingSpec(float(temperature), int(top_k), float(top_p),
                        tuple(self.eos_ids if eos_ids is None else eos_ids))
    n = len(prompts) * num_samples
    for r in range(n):
      self.add(Request(("generate", r), prompts[r // num_samples], max_new_tokens,
                       seed=row_seed(seed, r), stop=tuple(stop), spec=spec))
    done: dict[Any, Completion] = {}
    while self.busy():
      for c in self.step():
        done[c.key] = c
        self.release(c.key)
    out = []
    for r in range(n):
      c = done[("generate", r)]
      out.append(SampleResult(c.tokens, c.logprobs, c.finish_reason, r // num_samples,
                              text=c.text, stop=c.stop))
    return out


def row_seed(seed: int, row: int) -> int:
  """A row's sampling seed from a call's seed: distinct per row, independent of any slot."""
  return int(np.random.SeedSequence([seed, row]).generate_state(1)[0] % (2**31))
