"""A slot-based rollout engine: B fixed KV-cache slots, continuous batching, multi-turn reuse.

Device side (`slot_ops`: jitted, static shapes, on a window of the first W cache positions, W a
length bucket (at least `min_window`) of the longest slot involved): `prefill` appends a block
of tokens to chosen slots (chunked: a long input takes several calls), `copy_slots` copies
slots (the G samples of a prompt share one prefill, and any input may start from a slot that
holds a common prefix), `decode` runs up to `chunk` steps over the live slots.

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
import weakref
from typing import Any, Callable, Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from scope_jax import sharding as shd
from scope_jax.shapes import length_bucket
from scope_jax.models import kv_cache as kvc
from scope_jax.models.config import ModelConfig
from scope_jax.sampling import slot_ops
from scope_jax.sampling import stops as stops_lib
from scope_jax.sampling.sampler import SampleResult, SamplingSpec, prepare, refresh_params

_ENGINES = weakref.WeakSet()  # every engine, so `free_caches` can reach them
compile_counts = slot_ops.compile_counts  # how often each engine program was traced


def max_live_caches() -> int:
  """How many engine KV caches can be allocated at once in this process (for memory planning):
  one. An engine frees every other idle engine's cache before it allocates its own, parked slots
  included (a parked key's next turn then prefills its whole context again), and the rollouts
  drive one engine at a time; an engine still generating is never freed (`_allocate` logs it).
  Its logits ([slots, vocab] float32) come and go with it."""
  return 1


def live_caches() -> int:
  """How many engines hold a KV cache now."""
  return sum(engine.cache is not None for engine in list(_ENGINES))


def free_caches() -> None:
  """Gives every idle engine's KV cache back, so training has the memory (verl frees its rollout
  engine's cache the same way); engines allocate again on their next request."""
  for engine in list(_ENGINES):
    if not engine.busy():
      engine.free()


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


def row_bucket(n: int) -> int:
  """Rows of a prefill, copy or gathered decode call (per slot shard): 1, 2, 3, 4, 6, 8, 12, 16,
  ... (at most a third padding: a padded row costs as much as a real one)."""
  p = length_bucket(n, minimum=1)
  return 3 * p // 4 if p >= 4 and 3 * p // 4 >= n else p


def block_bucket(n: int) -> int:
  """Prefill block lengths: multiples of 64 (a short continuation shares the 64 program; a
  ~525-token observation pads to 576 tokens, one block: see `Engine._piece`)."""
  return max(1, -(-n // 64)) * 64


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
  n = min(len(a), len(b))
  if n == 0:
    return 0
  diff = np.flatnonzero(a[:n] != b[:n])
  return int(diff[0]) if diff.size else n


def cache_shardings(config: ModelConfig, mesh, rules: shd.Rules, capacity: int,
                    layout: str | None = None):
  """(KV cache, [slots, 1] rows) shardings of an engine's cache on `mesh` (buffers in `layout`,
  default `kvc.default_layout()`): slots split over the batch axes, KV heads over the mesh axis
  the rules give them where it divides them."""
  layout = layout or kvc.default_layout()
  m = shd.batch_shards(mesh, rules)  # slots are always a multiple of m
  spec = lambda axes, shape: jax.sharding.NamedSharding(
      mesh, shd.logical_to_spec(axes, shape, mesh, rules))
  # KV heads that a mesh axis can't divide stay whole
  k_shape, v_shape = kvc.buffer_shapes(config, m, capacity, layout)
  k_axes, v_axes = kvc.buffer_axes(layout)
  k, v = spec(k_axes, k_shape), spec(v_axes, v_shape)
  row, row_col = spec(("batch",), (m,)), spec(("batch", None), (m, 1))
  layers = range(config.num_layers)
  cache = kvc.KVCache(k=tuple(k for _ in layers), v=tuple(v for _ in layers), valid=row_col,
                      end=row, next_pos=row, pos=row_col)
  return cache, row_col


# ------------------------------------------------------------------------------- host side

class Engine:
  """B slots over one params pytree. Use `add` / `step` / `release` (the multi-turn rollout does),
  or `generate`, which has `Sampler.generate`'s contract."""

  def __init__(self, config: ModelConfig, params, *, num_slots: int = 32,
               max_context: int | None = None, chunk: int = 16, prefill_rows: int = 4,
               prefill_chunk: int = 512, min_window: int = 256, dtype=jnp.float32,
               cache_dtype=None, mesh=None, rules: shd.Rules = shd.SAMPLING_RULES,
               decode: Callable[[Sequence[int]], str] | None = None, pad_id: int | None = None,
               eos_ids: Sequence[int] | None = None):
    self.config, self.dtype = config, dtype
    self.mesh, self.rules = mesh, rules
    self.decode_text = decode
    self.chunk, self.prefill_chunk, self.min_window = chunk, prefill_chunk, min_window
    self.max_context = max_context or config.max_position_embeddings
    self.capacity = length_bucket(self.max_context)
    self.pad_id = pad_id if pad_id is not None else (config.pad_token_id or 0)
    self.eos_ids = tuple(config.eos_ids if eos_ids is None else eos_ids)
    m = self._batch_multiple()
    self.max_slots = -(-num_slots // m) * m
    self.layout = kvc.default_layout()  # of the cache's buffers (`kv_cache`), for this backend
    self.in_place = slot_ops.in_place_decode()
    self.max_prefill_rows = prefill_rows
    self.num_slots = self.prefill_rows = 0  # set when the cache is allocated
    self._shardings = self._make_shardings()
    self.cache_dtype = cache_dtype or dtype
    self.cache = self.logits = None  # allocated on first use, freed by `free`
    self._copies: list = []  # params leaves this engine made (sampling layout), not shared
    self._base_held = None  # a LoRA view's placed base, kept across refreshes (`refresh_params`)
    self.slots: list[_Slot] = []
    self.waiting: collections.deque[Request] = collections.deque()
    self.stats = collections.Counter()
    self.update_params(params)
    _ENGINES.add(self)

  # ------------------------------------------------------------------------ placement
  def update_params(self, params) -> None:
    """Points the engine at new weights. Every slot is emptied (its keys and values came from
    the old weights and must not be reused as a prefix); an allocated cache is kept."""
    if self.busy():
      raise RuntimeError("The engine's weights cannot change while requests are generating.")
    self.params = None
    self.params = refresh_params(self, params)
    for s in self.slots:
      s.tokens, s.owner = np.zeros((0,), np.int32), None

  def _allocate(self) -> None:
    """The cache: always `num_slots` slots, so every call shares the same programs (a small call
    does not pay for the empty slots: decode gathers the live ones). Other idle engines give
    theirs back first, parked slots included (a parked key's next turn then starts from an empty
    slot: its request holds the whole context): one cache at a time (`max_live_caches`),
    whatever the number of roles' weights."""
    for other in list(_ENGINES):
      if other is not self and other.cache is not None and not other.busy():
        other.free()
    if live_caches() >= max_live_caches():
      logging.warning("Allocating a KV cache while %d other engine(s) generate with theirs: "
                      "more caches than the memory plan counts.", live_caches())
    self.num_slots = self.max_slots
    self.prefill_rows = max(1, min(self.max_prefill_rows, self.num_slots // self._batch_multiple()))
    self.cache, self.logits = slot_ops.empty(self.config, self.num_slots, self.capacity,
                                             self.cache_dtype, shardings=self._shardings,
                                             layout=self.layout)
    self.slots = [_Slot(np.zeros((0,), np.int32)) for _ in range(self.num_slots)]

  def free(self) -> None:
    """Gives the cache's memory back (before training: `free_caches`); the next request
    allocates it again. Between calls the cache is kept, so what its slots hold serves later
    calls as shared prefixes."""
    if self.busy():
      raise RuntimeError("The engine cannot free its cache while requests are generating.")
    self.cache = self.logits = None
    self.slots = []

  def _batch_multiple(self) -> int:
    if self.mesh is None:
      return 1
    return shd.batch_shards(self.mesh, self.rules)

  def _window(self, n: int) -> int:
    """The cache positions a program works on to cover `n`: a length bucket (powers of two, then
    multiples of 1024), at least `min_window` (short contexts share one program), at most the
    capacity."""
    return min(self.capacity, length_bucket(n, minimum=self.min_window))

  def _make_shardings(self):
    if self.mesh is None:
      return None
    return cache_shardings(self.config, self.mesh, self.rules, self.capacity, self.layout)

  def _put(self, x):
    x = np.asarray(x)
    if self.mesh is None:
      return jnp.asarray(x)
    return shd.global_array(x, shd.batch_sharding(self.mesh, x.shape, self.rules))

  # ------------------------------------------------------------------------ requests
  def add(self, request: Request) -> None:
    """Queues a request; a key that is live already is refused."""
    stops_lib.check(request.stop)
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
    """Drops every waiting and live request and frees every slot. A parked slot's cache stays
    usable as a prefix; a live one may have been cut off mid-step (an exception), so it is
    emptied rather than trusted."""
    self.waiting.clear()
    for s in self.slots:
      if s.request is not None:
        s.tokens = np.zeros((0,), np.int32)
      s.owner, s.request, s.generated, s.logprobs, s.checked = None, None, [], [], 0

  def busy(self) -> bool:
    return bool(self.waiting) or any(s.request is not None for s in self.slots)

  def step(self, steps: int | None = None) -> list[Completion]:
    """Admits what fits, decodes one chunk (`chunk` steps, or `steps` rounded up to a power of
    two when the caller knows nothing needs the host sooner), returns the requests that finished."""
    try:
      return self._step(steps)
    except BaseException:  # a device call may have taken the donated cache: start again clean
      self.waiting.clear()
      self.cache = self.logits = None
      self.slots = []
      raise

  def _step(self, steps: int | None) -> list[Completion]:
    finished = self._admit()
    live = [i for i, s in enumerate(self.slots) if s.request is not None]
    if not live:
      return finished
    spec = self._spec(live)
    rows_DP, order = self._decode_rows(live)
    b = len(order)
    live_B, budget_B = np.zeros((b,), bool), np.zeros((b,), np.int32)
    seed_B, turn_B, count_B = (np.zeros((b,), np.int32) for _ in range(3))
    for r, i in enumerate(order):
      s = self.slots[i] if i is not None else None
      if s is None or s.request is None:
        continue
      live_B[r], budget_B[r] = True, s.budget - len(s.generated)
      seed_B[r], turn_B[r], count_B[r] = s.request.seed, s.request.turn, len(s.generated)
    chunk = self.chunk if steps is None else max(self.chunk, length_bucket(steps, minimum=1))
    steps = min(chunk, int(budget_B.max()))
    window = self._window(max(len(self.slots[i].tokens) for i in live) + steps)
    self.cache, self.logits, tok, lp, n, eos = slot_ops.decode(
        self.config, spec.compiled(), self.params, self.cache, self.logits,
        None if rows_DP is None else self._put(rows_DP), self._put(live_B), self._put(budget_B),
        self._put(seed_B), self._put(turn_B), self._put(count_B), jnp.float32(spec.temperature),
        chunk=chunk, window=window, dtype=self.dtype, shardings=self._shardings,
        in_place=self.in_place, activations=shd.activations(self.mesh, self.rules))
    tok, lp, n, eos = (shd.to_host(x) for x in (tok, lp, n, eos))
    self.stats["decode_calls"] += 1
    self.stats["slot_steps"] += self.num_slots * int(n.max())
    self.stats["decoded_row_steps"] += b * int(n.max())
    self.stats["live_slot_steps"] += int(n.sum())
    self.stats["decode_tokens"] += int(n.sum())
    row_of = {i: r for r, i in enumerate(order) if i is not None}
    for i in live:
      r = row_of[i]
      finished += self._absorb(i, tok[r, :n[r]], lp[r, :n[r]], bool(eos[r]))
    return finished

  def _decode_rows(self, live) -> tuple[np.ndarray | None, list]:
    """The rows one decode call runs: every slot, or (when a smaller row bucket holds them) the
    live slots gathered per shard into [D, p], p a row bucket. Returns the indices (None: every
    slot) and the slot behind each decoded row (None for padding)."""
    d = self._batch_multiple()
    per = self.num_slots // d
    groups = [[i for i in live if self._shard(i) == s] for s in range(d)]
    p = row_bucket(max(len(g) for g in groups))
    if p >= per:
      return None, list(range(self.num_slots))
    idx = np.full((d, p), per, np.int32)
    order = [None] * (d * p)
    for s, g in enumerate(groups):
      for k, i in enumerate(g):
        idx[s, k], order[s * p + k] = i - s * per, i
    return idx, order
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
  def _shard(self, i: int) -> int:
    return i // (self.num_slots // self._batch_multiple())

  def _admit(self) -> list[Completion]:
    """Places waiting requests: copies of shared prefixes, then chunked prefills, then forks of
    requests prefilled in this same round (identical inputs: G samples of one prompt). Copies
    stay within a slot shard: a shard that lacks a prefix prefills it itself, in parallel. No
    shard takes more than its share of the rows while another has room: a decode call costs
    as many rows on every shard as the fullest one holds."""
    if self.cache is None and self.waiting:
      self._allocate()
    live = sum(s.request is not None for s in self.slots)
    share = -(-(live + len(self.waiting)) // self._batch_multiple())
    finished, copies, prefills, forks = [], [], [], []
    before = [s.tokens for s in self.slots]  # copies read the state before this round
    fresh: dict[tuple[int, bytes], int] = {}  # (shard, input) prefilled this round -> slot
    assigned: set[int] = set()  # slots written this round: no longer a source
    still = collections.deque()
    while self.waiting:
      req = self.waiting.popleft()
      tokens = np.asarray(req.tokens, np.int32)
      if len(tokens) == 0:
        raise ValueError(f"Request {req.key!r} has no tokens; every input needs at least one.")
      budget = min(req.max_new_tokens, self.max_context - len(tokens), self.capacity - len(tokens))
      i = self._parked(req.key)
      if i is None:
        i = self._free_slot(tokens, before, fresh, assigned, share)
      if i is None:
        still.append(req)
        continue
      s = self.slots[i]
      s.owner, s.request, s.budget = req.key, req, budget
      if budget <= 0:  # no room: nothing to generate, as the sampler reports it
        finished.append(self._finish(i, "length", 0))
        continue
      assigned.add(i)
      digest = (self._shard(i), tokens.tobytes())
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
    self._run_copies(copies, before)
    self._run_prefills(prefills)
    self._run_copies(forks, [s.tokens for s in self.slots])
    self.stats["forked_rows"] += len(forks)
    return finished

  def _parked(self, key) -> int | None:
    for i, s in enumerate(self.slots):
      if s.owner == key and s.request is None:
        return i
    return None

  def _free_slot(self, tokens, before, fresh, assigned, share: int) -> int | None:
    """A free slot in the shard that best serves `tokens`, among the shards holding fewer than
    `share` rows (all of them when none does): one prefilling the same input this round, else
    the longest cached prefix, else the most free slots. Inside the shard, the slot holding that
    prefix itself if it is free, else the free slot holding the least."""
    free = [i for i, s in enumerate(self.slots) if s.owner is None and s.request is None]
    if not free:
      return None
    rows = collections.Counter(self._shard(i) for i, s in enumerate(self.slots)
                               if s.request is not None)
    shards = sorted({self._shard(i) for i in free})
    shards = [d for d in shards if rows[d] < share] or shards
    free = [i for i in free if self._shard(i) in shards]
    digest = tokens.tobytes()
    for d in shards:
      if (d, digest) in fresh:
        return min((i for i in free if self._shard(i) == d), key=lambda i: len(before[i]))
    prefix = [0] * len(self.slots)
    for j, held in enumerate(before):
      if j not in assigned and len(held) and self._shard(j) in shards:
        prefix[j] = common_prefix(held, tokens)
    count = collections.Counter(self._shard(i) for i in free)
    best = collections.Counter()
    for j, n in enumerate(prefix):
      best[self._shard(j)] = max(best[self._shard(j)], n)
    # Balance wins unless a shard's prefix saves 128 tokens of prefill or more: slots that still
    # hold an earlier call's prompts would otherwise pile every row onto one shard.
    d = max(shards, key=lambda d: (best[d] // 128, count[d], best[d]))
    mine = [i for i in free if self._shard(i) == d]
    top = max(mine, key=lambda i: prefix[i])
    if prefix[top] > 0 and prefix[top] == best[d]:
      return top
    return min(mine, key=lambda i: len(before[i]))

  def _best_source(self, target: int, tokens: np.ndarray, before, assigned) -> tuple[int, int]:
    """The slot of the target's shard whose cached tokens share the longest prefix with `tokens`
    (the target itself on a tie), and that prefix's length. A whole match only counts where the
    source's logits are the next-token ones, i.e. its tokens are exactly `tokens`."""
    best, keep = target, common_prefix(before[target], tokens)
    for j, held in enumerate(before):
      if j == target or j in assigned or not len(held) or self._shard(j) != self._shard(target):
        continue
      n = common_prefix(held, tokens)
      if n == len(tokens) and len(held) != len(tokens):
        n -= 1  # the logits after tokens[-1] are not stored: prefill the last token again
      if n > keep:
        best, keep = j, n
    if best == target and keep == len(tokens):
      keep -= 1
    return best, keep

  def _by_shard(self, items, slot_of) -> tuple[np.ndarray, list[list[int]]]:
    """Up to `prefill_rows` items per shard: local slot indices [D, p] (p a row bucket; padding
    points past the shard) and, per shard, which items were taken."""
    d = self._batch_multiple()
    per = self.num_slots // d
    groups: list[list[int]] = [[] for _ in range(d)]
    for k, item in enumerate(items):
      g = groups[self._shard(slot_of(item))]
      if len(g) < self.prefill_rows:
        g.append(k)
    p = min(self.prefill_rows, row_bucket(max(len(g) for g in groups)))
    idx = np.full((d, p), per, np.int32)
    for s, g in enumerate(groups):
      for k, item_k in enumerate(g):
        idx[s, k] = slot_of(items[item_k]) - s * per
    return idx, groups

  def _run_copies(self, pairs, held) -> None:
    """Slot copies (source, target), each within its shard; `held` says what sources hold."""
    while pairs:
      dst, groups = self._by_shard(pairs, lambda pair: pair[1])
      src = np.full_like(dst, 0)
      taken = [k for g in groups for k in g]
      per = self.num_slots // len(groups)
      for s, g in enumerate(groups):
        for k, item_k in enumerate(g):
          src[s, k] = pairs[item_k][0] - s * per
      window = self._window(max(len(held[pairs[k][0]]) for k in taken))
      self.cache, self.logits = slot_ops.copy_slots(self.cache, self.logits, self._put(src),
                                                    self._put(dst), window=window,
                                                    shardings=self._shardings)
      self.stats["copies"] += len(taken)
      pairs = [pair for k, pair in enumerate(pairs) if k not in set(taken)]

  def _piece(self, n: int) -> int:
    """Tokens of an n-token input that the next prefill block takes: `prefill_chunk`, or all of
    them when at most a quarter more (a short tail costs a call of its own for a few tokens)."""
    return n if n <= self.prefill_chunk + self.prefill_chunk // 4 else self.prefill_chunk

  def _run_prefills(self, items) -> None:
    """Chunked prefills: per shard up to `prefill_rows` slots × one piece (`_piece`) a call."""
    queue = list(items)
    while queue:
      idx, groups = self._by_shard(queue, lambda item: item[0])
      d, p = idx.shape
      taken = [k for g in groups for k in g]
      t = block_bucket(max(self._piece(len(queue[k][2])) for k in taken))
      start = np.zeros((d * p,), np.int32)
      tokens = np.full((d * p, t), self.pad_id, np.int32)
      mask = np.zeros((d * p, t), np.int32)
      later = []
      for s, g in enumerate(groups):
        for k, item_k in enumerate(g):
          i, keep, rest = queue[item_k]
          piece, row = rest[:self._piece(len(rest))], s * p + k
          start[row] = keep
          tokens[row, :len(piece)], mask[row, :len(piece)] = piece, 1
          if len(rest) > len(piece):
            later.append((i, keep + len(piece), rest[len(piece):]))
      window = self._window(int((start + mask.sum(1)).max()))
      self.cache, self.logits = slot_ops.prefill(
          self.config, self.params, self.cache, self.logits, self._put(idx),
          self._put(start), self._put(tokens), self._put(mask), window=window, dtype=self.dtype,
          shardings=self._shardings, activations=shd.activations(self.mesh, self.rules))
      self.stats["prefill_calls"] += 1
      self.stats["prefill_tokens"] += int(mask.sum())
      self.stats["prefill_padded_tokens"] += d * p * t
      done = set(taken)
      queue = later + [item for k, item in enumerate(queue) if k not in done]

  # ------------------------------------------------------------------------ one-shot generation
  def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
               temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
               stop: Sequence[str] = (), num_samples: int = 1, seed: int = 0,
               eos_ids: Sequence[int] | None = None) -> list[SampleResult]:
    """`Sampler.generate` on the engine: `num_samples` completions per prompt, prompt-major."""
    prompts, spec = prepare(self, prompts, max_new_tokens, num_samples, stop,
                            temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=eos_ids)
    n = len(prompts) * num_samples
    free = (sum(s.owner is None and s.request is None for s in self.slots) if self.slots
            else self.max_slots)
    to_end = not stop and not self.waiting and n <= free  # nothing for the host to do until the end
    for r in range(n):
      self.add(Request(("generate", r), prompts[r // num_samples], max_new_tokens,
                       seed=row_seed(seed, r), stop=tuple(stop), spec=spec))
    done: dict[Any, Completion] = {}
    try:
      while self.busy():
        for c in self.step(max_new_tokens if to_end else None):
          done[c.key] = c
          self.release(c.key)
    except BaseException:
      self.cancel()
      raise
    out = []
    for r in range(n):
      c = done[("generate", r)]
      out.append(SampleResult(c.tokens, c.logprobs, c.finish_reason, r // num_samples,
                              text=c.text, stop=c.stop))
    return out


def row_seed(seed: int, row: int) -> int:
  """A row's sampling seed from a call's seed: distinct per row, independent of any slot."""
  return int(np.random.SeedSequence([seed, row]).generate_state(1)[0] % (2**31))
