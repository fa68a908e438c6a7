"""A run's device programs built from its config alone — the same model config, mesh, sharding
rules, losses and rollout shapes a run uses — with every input an abstract array
(`jax.ShapeDtypeStruct` with its `NamedSharding`), so they compile for any target, no weights read.

Programs: each policy's train step (the KL reference's and a teacher's forwards run inside it),
the rollout engine's prefill and decode, and the retrieval encoder where the method searches.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from etils import epath

from scope_jax import assets
from scope_jax import sharding as shd
from scope_jax.core import runtime as rt_lib
from scope_jax.core.method import Players
from scope_jax.models import gguf_io, hf_io, transformer
from scope_jax.models import kv_cache as kvc
from scope_jax.models import load as load_lib
from scope_jax.models import lora as lora_lib
from scope_jax.models.config import ModelConfig, get_preset
from scope_jax.retrieval import encoder as enc_lib
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import train_step
from scope_jax.rl.batch import TrainBatch
from scope_jax.sampling import engine as engine_lib
from scope_jax.sampling import sampler as sampler_lib
from scope_jax.sampling import slot_ops
from scope_jax.sampling.sampler import SamplingSpec
from scope_jax.shapes import length_bucket

# E5-base-v2 (BERT-base), the paper presets' retriever, when the config names no checkpoint.
E5_BASE = enc_lib.EncoderConfig(vocab_size=30522, hidden_size=768, intermediate_size=3072,
                                num_layers=12, num_heads=12)


@dataclasses.dataclass
class Program:
  """One program to compile: `trace()` gives its `jax.stages.Traced` (its jaxpr, then lowered
  and compiled); `tokens` the tokens one call processes."""
  name: str
  kind: str  # train | prefill | decode | encoder
  trace: Callable[[], Any]
  tokens: int = 0
  note: str = ""
  resident_inputs: int = 0  # bytes per chip of its inputs that live for the whole run anyway
  rows: int = 0  # rows one call processes (train: the update's; decode: the slots)
  columns: int = 0  # tokens per row (train: the update's columns; decode: the cache window)
  prompt_columns: int = 0  # train: of `columns`, the prompt's (no log-probs are needed there)
  micro_batches: int = 1  # train: micro-batches per update
  forwards: int = 0  # train: frozen models' forwards inside the step (KL reference, teacher)
  steps: int = 1  # decode: steps per call (at most: a call stops when every row is done)


@dataclasses.dataclass
class Resident:
  """Arrays that live for the whole run (per chip, bytes), by what holds them."""
  items: dict[str, int] = dataclasses.field(default_factory=dict)
  kv_cache: int = 0  # one engine's cache; every cache is freed before every update
  engines: int = 1  # engines that may hold a cache at once (one per played weight set)
  refresh: int = 0  # the sampler's new copy, built after each update while the old one lives

  @property
  def total(self) -> int:
    return sum(self.items.values())

  @property
  def kv_caches(self) -> int:
    """Every engine's cache: an engine keeps its cache while any of its slots is parked, so the
    caches of all the run's engines can be live at once."""
    return self.kv_cache * self.engines


def struct(shape, dtype, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding)


def bytes_per_chip(tree, itemsize: int | None = None) -> int:
  """Bytes one device holds of a tree of sharded abstract arrays (the largest shard), in
  Python integers (a 72B model's shards exceed 2^31 elements); with `itemsize`, each element
  at most that many bytes."""
  total = 0
  for x in jax.tree.leaves(tree):
    shard = x.sharding.shard_shape(x.shape) if x.sharding is not None else x.shape
    size = jnp.dtype(x.dtype).itemsize
    total += min(size, itemsize or size) * math.prod(int(d) for d in shard)
  return total


# A GGUF asset's architecture as its header gives it (tests/plan hold the two equal where the
# asset is fetched): planning a smoke run does not download 491 MB to read a header.
ASSET_PRESETS = {"qwen2.5-0.5b-gguf": "qwen2.5-0.5b"}


def model_config(model: ml_collections.ConfigDict) -> ModelConfig:
  """The architecture a run's `model` section loads, from its config file alone: a preset or
  'tiny', an `hf:` checkpoint's config.json, or a GGUF's header."""
  source, tie = model.source, model.get("tie_embeddings", "auto")
  load_lib.check_source(source, tie)
  if source.startswith("hf:"):
    config = hf_io.read_hf_config(source[len("hf:"):])
  elif source.startswith("gguf:"):
    target = source[len("gguf:"):]
    if (not epath.Path(target).exists() and target in ASSET_PRESETS
        and not assets.is_fetched(target)):  # no download of weights to read a known header
      config = get_preset(ASSET_PRESETS[target])
    else:
      path = epath.Path(target) if epath.Path(target).exists() else assets.fetch(target)
      config, _ = gguf_io.open_gguf(path)  # the header only: tensors are read when asked for
  else:
    config = load_lib.model_config(model)
  config = load_lib.run_options(config, model)
  return config.replace(tie_embeddings=True) if tie == "yes" else config


def param_structs(config: ModelConfig, mesh, rules: shd.Rules, dtype) -> Any:
  shapes = transformer.param_shapes(config)
  shardings = transformer.param_shardings(config, mesh, rules)
  return jax.tree.map(lambda s, sh: struct(s, dtype, sh), shapes, shardings,
                      is_leaf=lambda x: isinstance(x, tuple))


def _outputs(fn, *args) -> Any:
  """The abstract outputs of `jax.jit(fn)(*args)`, with the shardings the compiler gives them."""
  lowered = jax.jit(fn).lower(*args)
  shardings = lowered.compile().output_shardings
  return jax.tree.map(lambda a, s: struct(a.shape, a.dtype, s), lowered.out_info, shardings)


def train_state_structs(params, optimizer) -> train_step.TrainState:
  """A policy's TrainState as `init_train_state` lays it out (moments sharded like their
  params, counts replicated)."""
  shardings = train_step.opt_state_shardings(optimizer, params)
  opt = jax.tree.map(lambda a, s: struct(a.shape, a.dtype, s),
                     jax.eval_shape(optimizer.init, params), shardings)
  rep = shd.replicated(next(iter(jax.tree.leaves(params))).sharding.mesh)
  zero = lambda: struct((), jnp.int32, rep)
  return train_step.TrainState(params=params, opt_state=opt, step=zero(), skipped=zero())


def batch_structs(rows: int, prompt_cols: int, cols: int, mesh, rules, teacher: bool):
  sh = shd.batch_sharding(mesh, (rows, cols), rules)
  array = lambda dtype: struct((rows, cols), dtype, sh)
  return TrainBatch(tokens=array(jnp.int32), mask=array(jnp.int32), loss_mask=array(jnp.float32),
                    advantages=array(jnp.float32), old_logp=array(jnp.float32),
                    teacher_tokens=array(jnp.int32) if teacher else None,
                    teacher_mask=array(jnp.int32) if teacher else None, prompt_cols=prompt_cols)


@dataclasses.dataclass
class RunShapes:
  """What the programs are built from: the config's model, mesh, rules, dtypes and players."""
  config: ml_collections.ConfigDict
  model: ModelConfig
  mesh: Any
  players: Players

  @property
  def train_rules(self):
    return shd.config_rules(self.config)[0]

  @property
  def sampling_rules(self):
    return shd.config_rules(self.config)[1]

  @property
  def param_dtype(self):
    return jnp.dtype(self.config.model.param_dtype)

  @property
  def dtype(self):
    return jnp.dtype(self.config.model.dtype)

  @property
  def sampler_dtype(self):
    """The samplers' compute dtype (`rollout.dtype`, default the model's)."""
    return jnp.dtype(rt_lib.sampler_dtype(self.config))

  def params(self, rules) -> Any:
    return param_structs(self.model, self.mesh, rules, self.param_dtype)

  @property
  def lora(self) -> lora_lib.LoraConfig:
    return lora_lib.from_config(self.config.get("lora"))

  def adapters(self, rules) -> Any:
    """A policy's LoRA adapters (float32) laid out under `rules`; None without LoRA."""
    if not self.lora.rank:
      return None
    shardings = lora_lib.adapter_shardings(self.model, self.lora, self.mesh, rules)
    return jax.tree.map(lambda s, sh: struct(s, jnp.float32, sh),
                        lora_lib.adapter_shapes(self.model, self.lora), shardings.weights,
                        is_leaf=lambda x: isinstance(x, tuple))

  def sampling_params(self) -> Any:
    """What a sampler plays: the trained params as `transformer.sampling_params` lays them out
    (a leaf the sampling layout moves is copied in the compute dtype where the forward casts it);
    with LoRA, the base so laid out plus the adapters under the sampling rules."""
    shardings, dtypes = transformer.sampling_layout(
        self.model, self.params(self.train_rules), self.mesh, self.sampling_rules,
        self.sampler_dtype)
    base = jax.tree.map(lambda a, s, dt: struct(a.shape, dt, s),
                        self.params(self.train_rules), shardings, dtypes)
    adapters = self.adapters(self.sampling_rules)
    if adapters is None:
      return base
    return lora_lib.view(base, lora_lib.Adapters(adapters, self.lora.scale))

  def sampler_copy_bytes(self) -> int:
    """Bytes per chip a sampler holds beyond the trained params: the leaves it moves."""
    train, sample = self.params(self.train_rules), lora_lib.split(self.sampling_params())[0]
    moved = [b for a, b in zip(jax.tree.leaves(train), jax.tree.leaves(sample))
             if not a.sharding.is_equivalent_to(b.sharding, len(a.shape))]
    return bytes_per_chip(moved)

  def columns(self) -> tuple[int, int]:
    """(prompt columns, all columns) of an update's rows: the rollout's longest prompt and the
    rest of the context, each in its length bucket (as `rl.batch.make_batch` pads them)."""
    r = self.config.rollout
    prompt = length_bucket(r.max_prompt_tokens)
    return prompt, prompt + length_bucket(max(r.max_context - r.max_prompt_tokens, 1))


def train_programs(shapes: RunShapes) -> tuple[list[Program], dict[str, Any]]:
  """Each policy's train step at its update's rows, micro-batches, columns and remat; and the
  abstract train state of each (for the resident memory)."""
  c, mesh = shapes.config, shapes.mesh
  learner = learner_lib.Learner(
      shapes.model, rt_lib.make_optimizer(c), mesh, dtype=shapes.dtype, remat=c.model.remat,
      micro_batch_rows=c.learner.micro_batch_rows, recompute_old_logp=c.learner.recompute_old_logp,
      rules=shapes.train_rules)
  params = shapes.params(shapes.train_rules)
  adapters = shapes.adapters(shapes.train_rules)
  if adapters is not None:  # LoRA: the state trains adapters; the shared base is an argument
    adapters = lora_lib.Adapters(adapters, shapes.lora.scale)
  prompt_cols, cols = shapes.columns()
  programs, states = [], {}
  for name, plan in shapes.players.policies.items():
    loss = rt_lib.loss_config(c, plan.loss)
    if c.learner.recompute_old_logp:
      loss = dataclasses.replace(loss, old_logp_from_trainer=True)
    if plan.teacher and loss.distill_coef <= 0:
      loss = dataclasses.replace(loss, distill_coef=1.0)  # λ > 0 at some iteration
    rows, micro = learner.batch_layout(plan.rows)
    state = states[name] = train_state_structs(adapters or params, learner.optimizer)
    batch = batch_structs(rows, prompt_cols, cols, mesh, shapes.train_rules, plan.teacher)
    ref = params if loss.kl_beta > 0 else None
    teacher = params if plan.teacher else None
    base = None
    if adapters is not None:  # the base is shared: counted once whatever reads it
      base, teacher = params, lora_lib.view(params, adapters) if plan.teacher else None
    step = learner.compiled_step(loss, micro)
    extra = [w for w, on in (("KL reference", ref), ("teacher", teacher)) if on is not None]
    held = (state, ref, teacher)
    if base is not None:
      held = (state, base, adapters if plan.teacher else None)
    programs.append(Program(
        f"train_step/{name}", "train",
        lambda step=step, state=state, batch=batch, ref=ref, teacher=teacher, base=base:
            step.trace(state, batch, ref, teacher, base),
        tokens=rows * cols, rows=rows, columns=cols, prompt_columns=prompt_cols,
        micro_batches=micro, forwards=len(extra),
        resident_inputs=bytes_per_chip(held),
        note=f"{rows} rows × {cols} tokens in {micro} micro-batches"
             + (f"; {' and '.join(extra)} forward inside" if extra else "")))
  return programs, states


def target_layout(mesh) -> str:
  """The KV cache layout the programs use on `mesh`'s devices (slot-major on TPU): chosen here,
  as the cache's abstract arrays are built before the programs are traced for the target."""
  return kvc.SLOTS if mesh.devices.flat[0].platform == "tpu" else kvc.HEADS


def engine_programs(shapes: RunShapes) -> tuple[list[Program], int]:
  """The rollout engine's prefill (one block of `prefill_chunk` tokens) and decode (one chunk of
  `chunk` steps over every slot) at the whole cache window; and its KV cache's bytes per chip."""
  c, mesh, model = shapes.config, shapes.mesh, shapes.model
  r = c.rollout
  rules = shapes.sampling_rules
  shards = shd.batch_shards(mesh, rules)
  slots = -(-r.slots // shards) * shards
  capacity = length_bucket(r.max_context)
  layout = target_layout(mesh)
  cache_sh, row_col = engine_lib.cache_shardings(model, mesh, rules, capacity, layout)
  empty = jax.eval_shape(lambda: slot_ops.empty(model, slots, capacity, shapes.sampler_dtype,
                                                shardings=None, layout=layout))
  pinned = shd.activations(mesh, rules)
  cache = jax.tree.map(lambda a, s: struct(a.shape, a.dtype, s), empty[0], cache_sh)
  logits = struct((slots, model.vocab_size), jnp.float32, row_col)
  params = shapes.sampling_params()
  put = lambda shape, dtype: struct(shape, dtype, shd.batch_sharding(mesh, shape, rules))
  scalar = struct((), jnp.float32, shd.replicated(mesh))
  spec = SamplingSpec(temperature=1.0, eos_ids=tuple(model.eos_ids or (0,))).compiled()
  per = max(1, min(r.prefill_rows, slots // shards))
  p_rows, block = shards * per, r.prefill_chunk

  def decode(chunk):
    row = lambda dtype: put((slots,), dtype)
    return slot_ops.decode.trace(
        model, spec, params, cache, logits, None, row(jnp.bool_), row(jnp.int32), row(jnp.int32),
        row(jnp.int32), row(jnp.int32), scalar, chunk=chunk, window=capacity,
        dtype=shapes.sampler_dtype, shardings=(cache_sh, row_col), activations=pinned)

  prefill = lambda: slot_ops.prefill.trace(
      model, params, cache, logits, put((shards, per), jnp.int32), put((p_rows,), jnp.int32),
      put((p_rows, block), jnp.int32), put((p_rows, block), jnp.int32), window=capacity,
      dtype=shapes.sampler_dtype, shardings=(cache_sh, row_col), activations=pinned)
  held = bytes_per_chip((params, cache, logits))
  programs = [
      Program("engine/prefill", "prefill", prefill, tokens=p_rows * block, resident_inputs=held,
              rows=p_rows, columns=capacity,
              note=f"{p_rows} rows × {block} tokens into a {capacity}-token window"),
      Program("engine/decode_step", "decode", lambda: decode(1), tokens=slots,
              resident_inputs=held, rows=slots, columns=capacity,
              note=f"one step of {slots} slots, a {capacity}-token window"),
      Program("engine/decode", "decode", lambda: decode(r.chunk),
              tokens=slots * r.chunk, resident_inputs=held, rows=slots, columns=capacity,
              steps=r.chunk, note=f"{r.chunk} steps of {slots} slots (one call)")]
  return programs, bytes_per_chip(cache) + bytes_per_chip(logits)


def encoder_config(retrieval: ml_collections.ConfigDict) -> enc_lib.EncoderConfig:
  """The retrieval encoder's architecture: its checkpoint's config.json, else E5-base-v2's."""
  path = epath.Path(retrieval.encoder) if retrieval.encoder not in ("", "minilm") else None
  if path is not None and (path / "config.json").exists():
    return enc_lib.EncoderConfig.from_hf_config(json.loads((path / "config.json").read_text()))
  return E5_BASE


def encoder_program(shapes: RunShapes, batch: int = 64, length: int = 256) -> Program:
  """One batch of queries through the retrieval encoder (weights replicated, rows split)."""
  enc = encoder_config(shapes.config.retrieval)
  mesh = shapes.mesh
  rep = shd.replicated(mesh)
  params = jax.tree.map(lambda s: struct(s, jnp.float32, rep), enc_lib.param_shapes(enc),
                        is_leaf=lambda x: isinstance(x, tuple))
  rows = -(-batch // shd.batch_shards(mesh)) * shd.batch_shards(mesh)
  tok = struct((rows, length), jnp.int32, shd.batch_sharding(mesh, (rows, length)))
  fn = jax.jit(lambda p, t, m: enc_lib.embed(enc, p, t, m))
  return Program("retrieval/encoder", "encoder", lambda: fn.trace(params, tok, tok),
                 tokens=rows * length, resident_inputs=bytes_per_chip(params),
                 note=f"{rows} queries × {length} tokens")


def sampler_programs(shapes: RunShapes) -> tuple[list[Program], int]:
  """The turn-by-turn sampler's prefill (a batch of `rollout.slots` prompts of the longest
  prompt bucket) and one decode step, when the run samples without the engine; and its cache's
  bytes per chip."""
  c, mesh, model = shapes.config, shapes.mesh, shapes.model
  r, rules = c.rollout, shapes.sampling_rules
  shards = shd.batch_shards(mesh, rules)
  rows = -(-r.slots // shards) * shards
  width = length_bucket(r.max_prompt_tokens)
  new = length_bucket(max(r.max_context - r.max_prompt_tokens, 8), minimum=8)
  params = shapes.sampling_params()
  put = lambda shape, dtype: struct(shape, dtype, shd.batch_sharding(mesh, shape, rules))
  rep = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=shd.replicated(mesh))
  prefill_args = (model, params, put((rows, width), jnp.int32), put((rows, width), jnp.int32))
  pinned = shd.activations(mesh, rules)
  prefill_kw = dict(capacity=width + new, dtype=shapes.sampler_dtype,
                    cache_dtype=shapes.sampler_dtype,
                    layout=target_layout(mesh), activations=pinned)
  logits, cache = _outputs(lambda p, t, m: sampler_lib._prefill(model, p, t, m, **prefill_kw),
                           *prefill_args[1:])
  state = sampler_lib.DecodeState(
      cache=cache, logits=logits, tokens=put((rows, new), jnp.int32),
      logprobs=put((rows, new), jnp.float32), length=put((rows,), jnp.int32),
      budget=put((rows,), jnp.int32), done=put((rows,), jnp.bool_),
      finish=put((rows,), jnp.int32), step=rep(jax.ShapeDtypeStruct((), jnp.int32)),
      rng=rep(jax.eval_shape(lambda: jax.random.key(0))))
  spec = SamplingSpec(temperature=1.0, eos_ids=tuple(model.eos_ids or (0,))).compiled()
  scalar = lambda dtype: struct((), dtype, shd.replicated(mesh))
  programs = [
      Program("sampler/prefill", "prefill",
              lambda: sampler_lib._prefill.trace(*prefill_args, **prefill_kw),
              tokens=rows * width, resident_inputs=bytes_per_chip(params),
              note=f"{rows} prompts × {width} tokens"),
      Program("sampler/decode_step", "decode",
              lambda: sampler_lib._decode.trace(model, spec, params, state, scalar(jnp.int32),
                                                scalar(jnp.float32), dtype=shapes.sampler_dtype,
                                                activations=pinned),
              tokens=rows, resident_inputs=bytes_per_chip((params, state)), rows=rows,
              columns=width + new,
              note=f"decode steps of {rows} rows, a {width + new}-token cache")]
  return programs, bytes_per_chip(cache) + bytes_per_chip(logits)
