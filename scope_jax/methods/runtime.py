"""What a method is given: the mesh, tokenizer, base model, learner, and constructors for its
trained policies, frozen params and roles.

A run has one base model and any number of trained *policies* (params + optimizer state, updated
by the shared `Learner`), *frozen* params (a judge, a KL reference: just other pytrees), and
*tracked* params that the method moves itself (an EMA teacher) and that are checkpointed with
the policies. A *role* (questioner, solver, judge, ...) is one of those plus its prompts,
sampling settings, optional tool and seed stream (`methods/roles.py`).
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from scope_jax import assets
from scope_jax import metrics as metrics_lib
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.methods.roles import Role
from scope_jax.models import ModelConfig, get_preset, gguf_io, hf_io, transformer
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import optim, train_step
from scope_jax.sampling import Engine, Sampler

LOSS_ONLY_RUNNER_KEYS = ("micro_batch_rows", "recompute_old_logp")


def mesh_rules(config: ml_collections.ConfigDict) -> tuple[shd.Rules, shd.Rules]:
  """(training rules, sampling rules) from `config.mesh.rules`."""
  return (shd.rules_from_config(config.mesh.rules.train, what="mesh.rules.train"),
          shd.rules_from_config(config.mesh.rules.sampling, what="mesh.rules.sampling"))


def load_model(cfg: ml_collections.ConfigDict, mesh, seed: int, rules: shd.Rules = shd.TRAIN_RULES):
  """(ModelConfig, params) from `model.source`: 'tiny', 'preset:<name>' (random init),
  'hf:<dir or gs://>' or 'gguf:<file or asset>'; placed on `mesh` under `rules`."""
  dtype = jnp.dtype(cfg.param_dtype)
  source = cfg.source
  if source == "tiny":
    config = ModelConfig(**cfg.tiny.to_dict())
  elif source.startswith("preset:"):
    config = get_preset(source[len("preset:"):])
  elif source.startswith("hf:"):
    return hf_io.load_hf(source[len("hf:"):], mesh=mesh, dtype=dtype, rules=rules)
  elif source.startswith("gguf:"):
    target = source[len("gguf:"):]
    path = pathlib.Path(target) if pathlib.Path(target).exists() else assets.fetch(target)
    return gguf_io.load_gguf(path, mesh=mesh, dtype=dtype, rules=rules)
  else:
    raise ValueError(f"Unknown model.source {source!r}; use 'tiny', 'preset:<name>', "
                     "'hf:<path>' or 'gguf:<path or asset>'.")
  params = transformer.init_sharded_params(config, jax.random.key(seed), mesh, rules, dtype)
  return config, params


def loss_config(config: ml_collections.ConfigDict, overrides=None) -> train_step.LossConfig:
  """The run's `LossConfig` (`config.loss` without the runner-only keys) with role overrides.
  Dr.GRPO's constant length defaults to the response budget (max_context − max_prompt_tokens)."""
  fields = dict(config.loss.to_dict(), **dict(overrides or {}))
  for key in LOSS_ONLY_RUNNER_KEYS:
    fields.pop(key, None)
  fields["dual_clip"] = fields.get("dual_clip") or None
  if not fields.get("norm_length"):
    fields["norm_length"] = max(config.rollout.max_context - config.rollout.max_prompt_tokens, 1)
  return train_step.LossConfig(**fields)


def role_context(config: ml_collections.ConfigDict, settings) -> int:
  """A role's prompt + response budget: its own `max_context` (e.g. π-Play's 4K examiner), at
  most the run's `rollout.max_context` (the sampler's cache), which is the default."""
  own = settings.get("max_context", 0)
  return min(own, config.rollout.max_context) if own else config.rollout.max_context


def make_optimizer(c: ml_collections.ConfigDict):
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


def pad_id(tokenizer) -> int:
  pid = getattr(tokenizer, "pad_token_id", None)
  return int(pid) if pid is not None else 0


class Runtime:
  """Everything a method needs: model, tokenizer, learner, policies, frozen params and roles."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    self.config, self.workdir = config, workdir
    self.mesh = shd.make_mesh(tuple(config.mesh.shape))
    self.train_rules, self.sampling_rules = mesh_rules(config)
    self.tokenizer = tok_lib.load_tokenizer(config.model.tokenizer)
    self.model_config, self.base_params = load_model(config.model, self.mesh, config.seed,
                                                     self.train_rules)
    if self.model_config.vocab_size < len(self.tokenizer):
      raise ValueError(f"The tokenizer has {len(self.tokenizer)} ids but the model's "
                       f"vocabulary is {self.model_config.vocab_size}.")
    self.eos_ids = tok_lib.eos_ids(self.tokenizer) or self.model_config.eos_ids
    self.dtype = jnp.dtype(config.model.dtype)
    self.pad_id = pad_id(self.tokenizer)
    self.learner = learner_lib.Learner(
        self.model_config, make_optimizer(config), self.mesh, dtype=self.dtype,
        remat=config.model.remat, micro_batch_rows=config.loss.micro_batch_rows,
        recompute_old_logp=config.loss.recompute_old_logp, pad_id=self.pad_id,
        rules=self.train_rules)
    self.policies: dict[str, learner_lib.Policy] = {}
    self.frozen: dict[str, Any] = {}
    self.tracked: list[str] = []  # frozen params the method updates itself, checkpointed
    self.roles: dict[str, Role] = {}
    self._frozen_samplers: dict[str, Sampler] = {}
    self._base_frozen: set[str] = set()
    self.metrics = metrics_lib.MetricsWriter(workdir, enabled=jax.process_index() == 0)
    self.timer = metrics_lib.PhaseTimer()
    self.step = 0
    logging.info("Model %s: %s parameters; devices %s; mesh %s", self.model_config.model_type,
                 f"{transformer.count_params(self.base_params):,}", jax.devices(),
                 dict(self.mesh.shape))
    logging.info("Parameter shardings under mesh.rules.train %s:\n%s", self.train_rules,
                 param_overview(self.base_params))

  # ---------------------------------------------------------------------------- players
  def sampler(self, params) -> Sampler | Engine:
    """What plays `params` (in the sampling layout: weights whole along fsdp): the slot engine,
    or the turn-by-turn sampler when `rollout.engine` is off."""
    r = self.config.rollout
    common = dict(dtype=self.dtype, mesh=self.mesh, rules=self.sampling_rules,
                  decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=False),
                  max_context=r.max_context, pad_id=self.pad_id, eos_ids=self.eos_ids)
    if r.get("engine", False):
      return Engine(self.model_config, params, num_slots=r.slots, chunk=r.chunk,
                    prefill_rows=r.prefill_rows, prefill_chunk=r.prefill_chunk,
                    min_window=r.min_window, **common)
    return Sampler(self.model_config, params, **common)

  def add_policy(self, name: str, params=None, loss_overrides=None) -> learner_lib.Policy:
    """A trained policy initialised from a copy of `params` (default: the base model)."""
    params = jax.tree.map(jnp.copy, self.base_params if params is None else params)
    policy = self.learner.init_policy(name, params, loss_config(self.config, loss_overrides),
                                      sampler=self.sampler(params))
    self.policies[name] = policy
    return policy

  def add_frozen(self, name: str, params=None):
    """Frozen params (default: the base model itself, never updated)."""
    if params is None:
      self._base_frozen.add(name)
    self.frozen[name] = self.base_params if params is None else params
    return self.frozen[name]

  def add_tracked(self, name: str, params=None):
    """Params the method updates itself (an EMA teacher: `set_frozen` after each change), saved in
    every checkpoint next to the policies; a copy of `params` (default: the base model)."""
    self.tracked.append(name)
    self.frozen[name] = jax.tree.map(jnp.copy, self.base_params if params is None else params)
    return self.frozen[name]

  def set_frozen(self, name: str, params) -> None:
    """Replaces the frozen (or tracked) params `name`; roles playing them see the new weights."""
    self.frozen[name] = params
    if name in self._frozen_samplers:
      self._frozen_samplers[name].update_params(params)

  def rebase(self, params) -> None:
    """Makes `params` the base model (after the demo warm-up): every policy restarts from a
    copy of it, and every frozen copy of the base (a judge, a KL reference) becomes it."""
    self.base_params = params
    for policy in self.policies.values():
      copy = jax.tree.map(jnp.copy, params)
      policy.state = train_step.init_train_state(copy, self.learner.optimizer)
      policy.sampler.update_params(copy)
    for name in self._base_frozen:
      self.set_frozen(name, params)
    for name in self.tracked:  # tracked params start again from a copy of the new base
      self.set_frozen(name, jax.tree.map(jnp.copy, params))

  def add_role(self, name: str, settings: ml_collections.ConfigDict, *, policy=None,
               frozen: str | None = None, tool=None, final_tags=(), templates=None,
               strip_think: bool = False, system: str | None = None) -> Role:
    """A role played by a trained `policy` or by the frozen params named `frozen`."""
    if (policy is None) == (frozen is None):
      raise ValueError(f"Role {name!r} needs exactly one of a policy or frozen params.")
    if policy is not None:
      sampler = policy.sampler
    else:
      if frozen not in self.frozen:
        raise ValueError(f"Role {name!r}: no frozen params named {frozen!r}; add them first.")
      if frozen not in self._frozen_samplers:
        self._frozen_samplers[frozen] = self.sampler(self.frozen[frozen])
      sampler = self._frozen_samplers[frozen]
    limit = settings.get("max_prompt_tokens", 0) or self.config.rollout.max_prompt_tokens
    role = Role(name, settings, sampler=sampler, tokenizer=self.tokenizer,
                max_prompt_tokens=limit, max_context=role_context(self.config, settings),
                seed=self.config.seed, tool=tool, final_tags=tuple(final_tags),
                templates=templates, policy=policy, timer=self.timer,
                progress=self.config.get("progress", True) and jax.process_index() == 0,
                strip_think=strip_think,
                system=system, frozen=frozen)
    self.roles[name] = role
    return role

  # ---------------------------------------------------------------------------- steps
  def begin_step(self, step: int) -> None:
    """Resets every role's seed stream and rollout metrics for runner step `step`."""
    self.step = step
    for role in self.roles.values():
      role.begin_step(step)

  def role_metrics(self) -> dict[str, float]:
    out: dict[str, float] = {}
    for role in self.roles.values():
      out.update(role.metrics())
    return out

  def train(self, policy: learner_lib.Policy, trajectories, advantages, **kwargs) -> dict:
    with self.timer("train"):
      return self.learner.train(policy, trajectories, advantages, **kwargs)

  # ---------------------------------------------------------------------------- state
  def device_state(self) -> dict:
    """What a checkpoint holds on device: each policy's TrainState and each tracked params tree
    (as {"params": ...}, so evaluation restores either the same way)."""
    state = {name: p.state for name, p in self.policies.items()}
    state.update({name: {"params": self.frozen[name]} for name in self.tracked})
    return state

  def load_device_state(self, state: dict) -> None:
    for name, s in state.items():
      if name in self.tracked:
        self.set_frozen(name, s["params"])
        continue
      self.policies[name].state = s
      self.policies[name].sampler.update_params(s.params)

  def checkpointed(self) -> list[str]:
    """Names whose params every checkpoint holds: the policies, then the tracked params."""
    return list(self.policies) + list(self.tracked)
