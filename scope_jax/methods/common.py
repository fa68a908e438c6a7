"""The method runner shared by all five methods.

A run has one base model and any number of *policies* (trained params pytrees, each with its own
optimizer, jitted train step and sampler) and *frozen* params (a judge, a KL reference, an EMA
teacher are just other pytrees). A role (questioner, responder, challenger, judge, ...) is a
policy or frozen params plus its own prompts, sampling settings and loss settings, declared in the
method's config. A method implements `Method` (one self-play step at a time); `run` owns the loop,
resume, checkpoints and metrics.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from scope_jax import checkpoint as ckpt_lib
from scope_jax import metrics as metrics_lib
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.models import ModelConfig, get_preset, hf_io, transformer
from scope_jax.rl import batch as batch_lib
from scope_jax.rl import optim, train_step
from scope_jax.rollout import RolloutConfig, render_chat, run_rollout
from scope_jax.rollout.types import Trajectory
from scope_jax.sampling import Sampler

METHODS = ("spell", "scope", "opensir", "asl", "piplay")


# ------------------------------------------------------------------------------ model loading

def load_model(cfg: ml_collections.ConfigDict, mesh, seed: int):
  """(ModelConfig, params) from `model.source`: 'tiny', 'preset:<name>' (random init),
  'hf:<dir or gs://>' or 'gguf:<file or asset>'."""
  dtype = jnp.dtype(cfg.param_dtype)
  source = cfg.source
  if source == "tiny":
    config = ModelConfig(**cfg.tiny.to_dict())
  elif source.startswith("preset:"):
    config = get_preset(source[len("preset:"):])
  elif source.startswith("hf:"):
    return hf_io.load_hf(source[len("hf:"):], mesh=mesh, dtype=dtype)
  elif source.startswith("gguf:"):
    import pathlib
    from scope_jax import assets
    from scope_jax.models import gguf_io
    target = source[len("gguf:"):]
    path = pathlib.Path(target) if pathlib.Path(target).exists() else assets.fetch(target)
    return gguf_io.load_gguf(path, mesh=mesh, dtype=dtype)
  else:
    raise ValueError(f"Unknown model.source {source!r}; use 'tiny', 'preset:<name>', "
                     "'hf:<path>' or 'gguf:<path or asset>'.")
  params = shd.init_sharded_params(config, jax.random.key(seed), mesh, dtype=dtype)
  return config, params


@dataclasses.dataclass
class Policy:
  """A trained params pytree: optimizer state, jitted train step and a sampler."""

  name: str
  state: train_step.TrainState
  step_fn: Any
  sampler: Sampler
  loss: train_step.LossConfig
  micro_rows: int


class Runtime:
  """Everything a method needs: model, tokenizer, policies, frozen params, metrics, timers."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.workdir = config, workdir
    self.mesh = shd.make_mesh(tuple(config.mesh.shape))
    self.tokenizer = tok_lib.load_tokenizer(config.model.tokenizer)
    self.model_config, self.base_params = load_model(config.model, self.mesh, config.seed)
    if self.model_config.vocab_size < _vocab_size(self.tokenizer):
      raise ValueError(f"The tokenizer has {_vocab_size(self.tokenizer)} ids but the model's "
                       f"vocabulary is {self.model_config.vocab_size}.")
    self.eos_ids = tok_lib.eos_ids(self.tokenizer) or self.model_config.eos_ids
    self.dtype = jnp.dtype(config.model.dtype)
    self.policies: dict[str, Policy] = {}
    self.frozen: dict[str, Any] = {}
    self.metrics = metrics_lib.MetricsWriter(workdir, enabled=jax.process_index() == 0)
    self.timer = metrics_lib.PhaseTimer()
    self.counters = {"rollout_tokens": 0, "train_tokens": 0}
    logging.info("Model %s: %s parameters; devices %s; mesh %s", self.model_config.model_type,
                 f"{transformer.count_params(self.base_params):,}", jax.devices(),
                 dict(self.mesh.shape))
    logging.info("Parameter shardings:\n%s", param_overview(self.base_params))

  # ---- roles
  def add_policy(self, name: str, params=None, loss_overrides: dict | None = None) -> Policy:
    """A trained policy initialised from `params` (default: a copy of the base model)."""
    c = self.config
    params = jax.tree.map(jnp.copy, self.base_params if params is None else params)
    opt = _optimizer(c)
    loss_cfg = dict(c.loss.to_dict(), **(loss_overrides or {}))
    loss_cfg.pop("micro_batch_rows", None)
    loss_cfg.pop("recompute_old_logp", None)
    loss_cfg["dual_clip"] = loss_cfg.get("dual_clip") or None
    loss = train_step.LossConfig(**loss_cfg)
    state = train_step.init_train_state(params, opt)
    sampler = Sampler(self.model_config, params, dtype=self.dtype,
                      decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=False),
                      max_context=c.rollout.max_context, pad_id=_pad_id(self.tokenizer),
                      eos_ids=self.eos_ids)
    policy = Policy(name, state, None, sampler, loss, c.loss.micro_batch_rows)
    self.policies[name] = policy
    return policy

  def add_frozen(self, name: str, params=None):
    self.frozen[name] = self.base_params if params is None else params
    return self.frozen[name]

  def frozen_sampler(self, name: str) -> Sampler:
    return Sampler(self.model_config, self.frozen[name], dtype=self.dtype,
                   decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=False),
                   max_context=self.config.rollout.max_context, pad_id=_pad_id(self.tokenizer),
                   eos_ids=self.eos_ids)

  # ---- rollouts
  def chat_prompts(self, conversations: Sequence[Sequence[dict]]) -> list[list[int]]:
    prompts = [render_chat(self.tokenizer, msgs) for msgs in conversations]
    limit = self.config.rollout.max_prompt_tokens
    return [p[-limit:] if len(p) > limit else p for p in prompts]

  def rollout(self, sampler: Sampler, prompts: Sequence[Sequence[int]], settings, *,
              num_samples: int = 1, seed: int = 0, tool=None,
              final_tags: Sequence[str] = ()) -> list[Trajectory]:
    """Single- or multi-turn rollouts with one role's sampling settings (a ConfigDict)."""
    rc = RolloutConfig(syntax=settings.get("syntax", "xml"), final_tags=tuple(final_tags),
                       max_turns=settings.get("max_turns", 0) if tool is not None else 0,
                       max_turn_tokens=settings.max_new_tokens,
                       max_obs_tokens=settings.get("max_obs_tokens", 500),
                       max_total_tokens=self.config.rollout.max_context,
                       temperature=settings.temperature, top_p=settings.top_p,
                       top_k=settings.get("top_k", 0))
    start = time.perf_counter()
    with self.timer("rollout"):
      trajs = run_rollout(sampler, self.tokenizer, prompts, tool, rc, num_samples=num_samples,
                          seed=seed, progress=self.config.get("progress", True))
    generated = sum(int(t.loss_mask.sum()) for t in trajs)
    self.counters["rollout_tokens"] += generated
    self.counters["rollout_seconds"] = self.counters.get("rollout_seconds", 0.0) + (
        time.perf_counter() - start)
    return trajs

  # ---- training
  def train(self, policy: Policy, trajectories: Sequence[Trajectory], advantages: Sequence,
            *, ref_params=None, teacher_params=None, teacher_prompts=None) -> dict[str, float]:
    """One jitted update of `policy` on the given trajectories; returns its metrics.

    With `loss.recompute_old_logp`, π_old is the trainer's own log-prob of the batch (ratio 1 at
    the first update) instead of the sampler's; the sampler-vs-trainer gap is still logged.
    """
    if not trajectories:
      return {}
    rows = policy.micro_rows
    mult = rows * int(np.prod([self.mesh.shape[a] for a in ("data", "fsdp")]))
    n = len(trajectories)
    micro = max(1, -(-n // rows))
    # Bounded recompilation with little padding: 1, 2, 4, 8, then multiples of 8.
    micro = 1 << (micro - 1).bit_length() if micro <= 8 else -(-micro // 8) * 8
    host = batch_lib.make_batch(trajectories, advantages, teacher_prompts=teacher_prompts,
                                pad_id=_pad_id(self.tokenizer), row_multiple=mult)
    total_rows = micro * rows
    if host.num_rows < total_rows:
      host = _pad_rows(host, total_rows)
    micro = host.num_rows // rows
    key = (micro,)
    if policy.step_fn is None or policy.step_fn[0] != key:
      fn = train_step.make_train_step(self.model_config, policy.loss, _optimizer(self.config),
                                      dtype=self.dtype, remat=self.config.model.remat,
                                      micro_batches=micro)
      policy.step_fn = (key, fn)
    start = time.perf_counter()
    with self.timer("train"):
      batch = train_step.place_batch(host, self.mesh)
      if self.config.loss.recompute_old_logp:
        logp = _logprobs_fn(self.model_config, policy.loss.temperature, policy.loss.chunk,
                            self.dtype)(policy.state.params, batch)
        metrics_gap = jnp.abs(logp - batch.old_logp) * batch.loss_mask
        self.counters["recomputed_gap"] = float(metrics_gap.sum() / jnp.maximum(
            batch.loss_mask.sum(), 1.0))
        batch = batch.replace(old_logp=logp * batch.loss_mask)
      policy.state, metrics = policy.step_fn[1](policy.state, batch, ref_params, teacher_params)
      metrics = jax.device_get(metrics)
    tokens = float(np.asarray(host.loss_mask).sum())
    self.counters["train_tokens"] += int(np.asarray(host.mask).sum())
    out = {k: float(v) for k, v in metrics.items()}
    out["train_tokens_per_s"] = float(np.asarray(host.mask).sum()) / max(
        time.perf_counter() - start, 1e-9)
    out["loss_tokens"] = tokens
    policy.sampler.update_params(policy.state.params)
    return out

  def device_state(self) -> dict:
    return {name: p.state for name, p in self.policies.items()}

  def load_device_state(self, state: dict) -> None:
    for name, s in state.items():
      self.policies[name].state = s
      self.policies[name].sampler.update_params(s.params)


@functools.lru_cache(maxsize=8)
def _logprobs_fn(model_config, temperature, chunk, dtype):
  return jax.jit(lambda params, batch: train_step.compute_logprobs(
      model_config, params, batch, temperature=temperature, chunk=chunk, dtype=dtype))


def _optimizer(c: ml_collections.ConfigDict):
  """The optimizer every policy of a run uses (from `config.optim`)."""
  return optim.make_optimizer(c.optim.lr, warmup_steps=c.optim.warmup_steps,
                              total_steps=c.optim.total_steps, schedule=c.optim.schedule,
                              weight_decay=c.optim.weight_decay, grad_clip=c.optim.grad_clip or None)


def param_overview(params) -> str:
  """One line per parameter: path, shape, dtype and PartitionSpec."""
  lines = []
  for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
    name = "/".join(str(getattr(k, "key", k)) for k in path)
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    lines.append(f"  {name:24s} {str(tuple(x.shape)):24s} {str(x.dtype):9s} {spec}")
  return "\n".join(lines)


def _pad_rows(batch: batch_lib.TrainBatch, rows: int) -> batch_lib.TrainBatch:
  def pad(x):
    if x is None:
      return None
    extra = np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)
    return np.concatenate([x, extra])
  return jax.tree.map(pad, batch)


def _pad_id(tokenizer) -> int:
  pid = getattr(tokenizer, "pad_token_id", None)
  return int(pid) if pid is not None else 0


def _vocab_size(tokenizer) -> int:
  """Ids the tokenizer can produce (HF `len` counts added special tokens; `vocab_size` does not)."""
  return len(tokenizer)


class Method:
  """One self-play method: builds its roles in __init__, then runs one step at a time."""

  def __init__(self, rt: Runtime):
    self.rt = rt

  def step(self, step: int) -> dict[str, float]:
    raise NotImplementedError

  def host_state(self) -> dict:
    """JSON-able method state (memories, pools, RNG) saved with every checkpoint."""
    return {}

  def load_host_state(self, state: dict) -> None:
    del state

  def summary(self) -> str:
    return ""


def check_choice(name: str, value, choices) -> None:
  if value not in choices:
    raise ValueError(f"{name}={value!r} is not valid; choose one of: {', '.join(map(str, choices))}.")


def validate(config: ml_collections.ConfigDict):
  """Fails fast (before loading anything) on settings that are typed right but invalid."""
  check_choice("method", config.method, METHODS)
  if not config.model.tokenizer:
    raise ValueError("model.tokenizer is empty: set --config.model.tokenizer to the checkpoint's "
                     "directory (models are never downloaded at run time), 'demo' or 'gguf:<file>'.")
  check_choice("optim.schedule", config.optim.schedule, optim.SCHEDULES)
  check_choice("model.remat", config.model.remat, tuple(transformer.REMAT_POLICIES))
  check_choice("model.dtype", config.model.dtype, ("float32", "bfloat16"))
  if len(tuple(config.mesh.shape)) != 3:
    raise ValueError(f"mesh.shape={tuple(config.mesh.shape)} needs 3 entries (data, fsdp, tensor).")
  loss = dict(config.loss.to_dict())
  for key in ("micro_batch_rows", "recompute_old_logp"):
    loss.pop(key, None)
  train_step.LossConfig(**{**loss, "dual_clip": loss.get("dual_clip") or None})  # checks names
  module = importlib.import_module(f"scope_jax.methods.{config.method}")
  if hasattr(module, "validate_config"):
    module.validate_config(config)
  return module


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs `config.total_steps` steps of `config.method`, resuming from `workdir` if possible."""
  module = validate(config)
  workdir = ckpt_lib.absolute(workdir)
  rt = Runtime(config, workdir)
  method: Method = module.make_method(rt)
  checkpointer = ckpt_lib.Checkpointer(f"{workdir}/checkpoints", keep=config.keep_checkpoints,
                                       async_save=config.async_checkpoint)
  start = 0
  restored = checkpointer.restore_latest(rt.device_state())
  if restored is not None:
    step, state, host = restored
    rt.load_device_state(state)
    method.load_host_state(host)
    start = step + 1
  last: dict[str, float] = {}
  run_start = time.perf_counter()
  from tqdm import tqdm
  bar = tqdm(total=config.total_steps, initial=start, desc=f"{config.method} steps", unit="step",
             disable=jax.process_index() != 0)
  for step in range(start, config.total_steps):
    rt.timer.reset()
    t0 = time.perf_counter()
    metrics = method.step(step)
    metrics.update(rt.timer.metrics())
    metrics["time/step"] = time.perf_counter() - t0
    last = rt.metrics.write(step, metrics)
    logging.info("step %d: %s", step, ", ".join(f"{k}={v:.4g}" for k, v in sorted(last.items())
                                                  if not k.startswith("time/")))
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.total_steps:
      checkpointer.save(step, rt.device_state(), method.host_state())
    bar.set_postfix({k.split("/")[0]: f"{v:.3g}" for k, v in last.items()
                     if k.endswith("reward/mean")}, refresh=False)
    bar.update(1)
  bar.close()
  checkpointer.close()
  rt.metrics.close()
  wall = time.perf_counter() - run_start
  if start >= config.total_steps:
    print(f"Nothing to run: {config.total_steps} steps of {config.method} are already done in "
          f"{workdir} (raise --config.total_steps to continue).")
    return last
  print(f"Finished {config.method} ({config.preset}): steps {start}..{config.total_steps - 1} in "
        f"{wall:.1f}s; workdir {workdir}")
  if last:
    keys = [k for k in sorted(last) if k.startswith("time/") or k.endswith("/reward/mean")]
    print("  " + "; ".join(f"{k} {last[k]:.3g}" for k in keys))
  text = method.summary()
  if text:
    print(text)
  return last
