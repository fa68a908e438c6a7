"""What a method is given: the mesh, tokenizer, base model, learner, and constructors for its
trained policies, frozen params and roles.

A run has one base model and any number of trained *policies* (params + optimizer state, updated
by the shared `Learner`), *frozen* params (a judge, a KL reference: just other pytrees), and
*tracked* params that the method moves itself (an EMA teacher) and that are checkpointed with
the policies. A *role* (questioner, solver, judge, ...) is one of those plus its prompts,
sampling settings, optional tool and seed stream (`core/roles.py`).

With LoRA (`lora.rank > 0`, `models/lora.py`) every policy and tracked params tree is the one
shared base model plus its own adapters: a policy's TrainState, a tracked tree's updates and every
checkpoint hold adapters only, and the KL reference and frozen roles are the base itself.

The runtime owns what every method would otherwise write for itself: the KL reference (the base
model M0, used whenever a policy's `loss.kl_beta > 0`), the search syntax every role rolls out
with (the method section's `syntax`, the one its prompts ask for), freeing the rollout caches
before an update, and the `train/` prefix of the update's metrics.
"""

from __future__ import annotations

import atexit
import zlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from scope_jax import console
from scope_jax import metrics as metrics_lib
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.core import health
from scope_jax.core.roles import Role
from scope_jax.models import lora as lora_lib
from scope_jax.models import transformer
from scope_jax.models.load import load_model
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import losses, optim, train_step
from scope_jax.sampling import Engine, Sampler
from scope_jax.sampling import engine as engine_lib

# 'shuffled_rewards': the advantages alone are permuted (the same rows, the same inputs);
# 'shuffled_rewards_and_teacher' also permutes a distilling update's teacher inputs (a wider
# control: the teacher's log-probs act as a per-token reward, and it then reads another row's).
CONTROLS = ("", "shuffled_rewards", "shuffled_rewards_and_teacher")


def shuffled(advantages: Sequence, seed) -> list:
  """The control's update signal: the same advantages, permuted across the update's rows, so
  each row is pushed by another row's reward (the same distribution, no signal)."""
  order = np.random.default_rng(seed).permutation(len(advantages))
  return [advantages[i] for i in order]


def control_signal(control: str, advantages: Sequence, teacher_prompts, seed):
  """(advantages, teacher prompts) an update trains on under `control` (`CONTROLS`): as given
  with no control; the advantages permuted with 'shuffled_rewards' (rows and inputs untouched);
  the teacher prompts permuted too, under another seed, with 'shuffled_rewards_and_teacher'."""
  if control not in CONTROLS:
    raise ValueError(f"control={control!r}: choose one of {', '.join(map(repr, CONTROLS))}.")
  if not control:
    return list(advantages), teacher_prompts
  advantages = shuffled(list(advantages), seed)
  if control == "shuffled_rewards_and_teacher" and teacher_prompts:
    teacher_prompts = shuffled(list(teacher_prompts), list(seed) + [1])
  return advantages, teacher_prompts


def method_syntax(config: ml_collections.ConfigDict) -> str:
  """The search syntax of the run: the method section's `syntax` (its prompts ask for it), 'xml'
  for a method that does not search."""
  return config.get(config.method, {}).get("syntax", "xml")


RC_MODES = ("auto",) + losses.RC_MODES
LOW_PRECISION = ("bfloat16", "float16")


def sampler_dtype(config: ml_collections.ConfigDict) -> str:
  """The samplers' compute dtype: `rollout.dtype`, or the model's when it is empty."""
  return config.rollout.get("dtype", "") or config.model.dtype


def rollout_correction_fields(config: ml_collections.ConfigDict, rc) -> dict:
  """`loss.rollout_correction` as LossConfig fields; mode 'auto' is truncate when the sampler
  computes in a low precision (its log-probs then differ from the trainer's at the same
  params), off when it computes in float32."""
  rc = dict(rc or {})
  unknown = sorted(set(rc) - {"mode", "level", "threshold"})
  if unknown:
    raise ValueError(f"loss.rollout_correction.{unknown[0]} is not a setting; use mode, level, "
                     "threshold.")
  mode = rc.get("mode", "auto")
  if mode not in RC_MODES:
    raise ValueError(f"loss.rollout_correction.mode={mode!r} is not valid; use one of "
                     f"{', '.join(RC_MODES)}.")
  if mode == "auto":
    mode = "truncate" if sampler_dtype(config) in LOW_PRECISION else "off"
  threshold = rc.get("threshold", 2.0)
  if not 1.0 < threshold < float("inf"):
    raise ValueError(f"loss.rollout_correction.threshold={threshold} must be above 1 (weights "
                     "are kept within [1/C, C]; e.g. 2.0).")
  level = rc.get("level", "token")
  if level not in losses.RC_LEVELS:
    raise ValueError(f"loss.rollout_correction.level={level!r} is not valid; use one of "
                     f"{', '.join(losses.RC_LEVELS)}.")
  return dict(rollout_corr_mode=mode, rollout_corr_level=level, rollout_corr_threshold=threshold)


def loss_config(config: ml_collections.ConfigDict, overrides=None) -> train_step.LossConfig:
  """The run's `LossConfig` (`config.loss`) with role overrides. Dr.GRPO's constant length
  defaults to the response budget (max_context − max_prompt_tokens); the rollout correction's
  section becomes its `rollout_corr_*` fields (a policy's override merges into it)."""
  overrides = dict(overrides or {})
  direct = sorted(k for k in overrides if k.startswith("rollout_corr_"))
  if direct:
    raise ValueError(f"{direct[0]} is set through the rollout_correction section: give "
                     "rollout_correction=dict(mode=..., level=..., threshold=...) instead.")
  unknown = sorted(set(overrides) - set(config.loss) - set(train_step.LossConfig.__annotations__))
  if unknown:
    where = " (an optimizer setting: give it in the policy's optimizer overrides)" \
        if set(unknown) & set(config.optim) else ""
    learner = sorted(set(unknown) & set(config.get("learner", {})))
    if learner:
      where = f" (a setting of the whole run's learner: learner.{learner[0]})"
    raise ValueError(f"{', '.join(unknown)} is not a loss setting{where}; loss settings: "
                     f"{', '.join(sorted(config.loss))}.")
  fields = dict(config.loss.to_dict(), **overrides)
  rc = dict(config.loss.get("rollout_correction", {}))
  rc.update(dict(overrides.get("rollout_correction", {})))
  fields.pop("rollout_correction", None)
  fields.update(rollout_correction_fields(config, rc))
  fields["dual_clip"] = fields.get("dual_clip") or None
  if not fields.get("norm_length"):
    fields["norm_length"] = max(config.rollout.max_context - config.rollout.max_prompt_tokens, 1)
  return train_step.LossConfig(**fields)


def role_context(config: ml_collections.ConfigDict, settings) -> int:
  """A role's prompt + response budget: its own `max_context` (e.g. a 4K examiner's), at
  most the run's `rollout.max_context` (the sampler's cache), which is the default."""
  own = settings.get("max_context", 0)
  return min(own, config.rollout.max_context) if own else config.rollout.max_context


def optim_settings(c: ml_collections.ConfigDict, overrides=None) -> dict:
  """`config.optim` with a policy's overrides (one that trains at its own lr and clip);
  a key `optim` does not have is a one-line error."""
  overrides = dict(overrides or {})
  unknown = sorted(set(overrides) - set(c.optim))
  if unknown:
    raise ValueError(f"{', '.join(unknown)} is not an optimizer setting; optimizer settings: "
                     f"{', '.join(sorted(c.optim))}.")
  return dict(c.optim.to_dict(), **overrides)


def make_optimizer(c: ml_collections.ConfigDict, overrides=None):
  """A policy's optimizer: `config.optim` with the policy's overrides (default: none)."""
  o = optim_settings(c, overrides)
  return optim.make_optimizer(o["lr"], warmup_steps=o["warmup_steps"],
                              total_steps=o["total_steps"], schedule=o["schedule"],
                              weight_decay=o["weight_decay"], grad_clip=o["grad_clip"] or None)


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
    self.train_rules, self.sampling_rules = shd.config_rules(config)
    self.syntax = method_syntax(config)
    self.tokenizer = tok_lib.load_tokenizer(config.model.tokenizer)
    self.model_config, self.base_params = load_model(config.model, self.mesh, config.seed,
                                                     self.train_rules)
    if self.model_config.vocab_size < len(self.tokenizer):
      raise ValueError(f"The tokenizer has {len(self.tokenizer)} ids but the model's "
                       f"vocabulary is {self.model_config.vocab_size}: set model.tokenizer to "
                       "the model's own.")
    if config.rollout.max_context > self.model_config.max_position_embeddings:
      raise ValueError(f"rollout.max_context={config.rollout.max_context} is beyond the model's "
                       f"{self.model_config.max_position_embeddings} positions; lower it.")
    self.lora = lora_lib.from_config(config.get("lora"))
    self.eos_ids = tok_lib.eos_ids(self.tokenizer) or self.model_config.eos_ids
    self.dtype = jnp.dtype(config.model.dtype)
    self.pad_id = pad_id(self.tokenizer)
    self.learner = learner_lib.Learner(
        self.model_config, make_optimizer(config), self.mesh, dtype=self.dtype,
        remat=config.model.remat, micro_batch_rows=config.learner.micro_batch_rows,
        recompute_old_logp=config.learner.recompute_old_logp, pad_id=self.pad_id,
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
    if self.mesh.size > 1:  # on one device every array is whole
      logging.info("Parameter shardings under mesh.rules.train:\n%s",
                   param_overview(self.base_params))

  # ---------------------------------------------------------------------------- players
  def sampler(self, params) -> Sampler | Engine:
    """What plays `params` (in the sampling layout: weights whole along fsdp): the slot engine,
    or the turn-by-turn sampler when `rollout.engine` is off."""
    r = self.config.rollout
    common = dict(dtype=jnp.dtype(sampler_dtype(self.config)), mesh=self.mesh, rules=self.sampling_rules,
                  decode=lambda ids: self.tokenizer.decode(list(ids), skip_special_tokens=False),
                  max_context=r.max_context, pad_id=self.pad_id, eos_ids=self.eos_ids)
    if r.get("engine", False):
      return Engine(self.model_config, params, num_slots=r.slots, chunk=r.chunk,
                    prefill_rows=r.prefill_rows, prefill_chunk=r.prefill_chunk,
                    min_window=r.min_window, **common)
    return Sampler(self.model_config, params, **common)

  def add_policy(self, name: str, params=None, loss_overrides=None,
                 optim_overrides=None) -> learner_lib.Policy:
    """A trained policy initialised from a copy of `params` (default: the base model), with its
    own loss and optimizer settings where the method gives overrides. With LoRA it trains fresh
    adapters on the shared base."""
    optimizer = make_optimizer(self.config, optim_overrides) if optim_overrides else None
    loss = loss_config(self.config, loss_overrides)
    if self.lora.rank:
      self._no_params_with_lora(name, params)
      adapters = self.fresh_adapters()
      policy = self.learner.init_policy(name, adapters, loss, optimizer=optimizer,
                                        base=self._base())
      policy.sampler = self.sampler(policy.played())
    else:
      params = jax.tree.map(jnp.copy, self._base() if params is None else params)
      policy = self.learner.init_policy(name, params, loss, sampler=self.sampler(params),
                                        optimizer=optimizer)
    self.policies[name] = policy
    return policy

  def fresh_adapters(self):
    """LoRA adapters at init (b = 0: the base model's function), the same for every policy and
    tracked tree (as every one starts from the same base without LoRA), laid out for training."""
    return lora_lib.init_sharded_adapters(self.model_config, self.lora,
                                          jax.random.key(self.config.seed), self.mesh,
                                          self.train_rules)

  def _no_params_with_lora(self, name: str, params) -> None:
    if params is not None:
      raise ValueError(f"{name!r}: with lora.rank > 0 every policy and tracked tree starts from "
                       "fresh adapters on the shared base; it cannot start from other params.")

  def add_frozen(self, name: str, params=None):
    """Frozen params (default: the base model itself, never updated)."""
    if params is None:
      self._base_frozen.add(name)
    self.frozen[name] = self._base() if params is None else params
    return self.frozen[name]

  def add_tracked(self, name: str, params=None):
    """Params the method updates itself (an EMA teacher: `set_frozen` after each change), saved in
    every checkpoint next to the policies; a copy of `params` (default: the base model)."""
    self.tracked.append(name)
    if self.lora.rank:
      self._no_params_with_lora(name, params)
      self.frozen[name] = lora_lib.view(self._base(), self.fresh_adapters())
    else:
      self.frozen[name] = jax.tree.map(jnp.copy, self._base() if params is None else params)
    return self.frozen[name]

  def trained_part(self, name: str):
    """What tracked params `name` train and checkpoint: their adapters with LoRA, else the
    params themselves (e.g. what an EMA teacher averages)."""
    return lora_lib.split(self.frozen[name])[1] if self.lora.rank else self.frozen[name]

  def set_trained_part(self, name: str, trained) -> None:
    """Replaces the trained part of tracked params `name` (see `trained_part`)."""
    self.set_frozen(name, lora_lib.view(self._base(), trained) if self.lora.rank else trained)

  def set_frozen(self, name: str, params) -> None:
    """Replaces the frozen (or tracked) params `name`; roles playing them see the new weights."""
    self.frozen[name] = params
    if name in self._frozen_samplers:
      self._frozen_samplers[name].update_params(params)

  def restart_optimizer(self, policy: learner_lib.Policy) -> None:
    """Fresh optimizer moments and schedule for `policy`, params kept: a new trainer on the last
    checkpoint, as Dr.Zero starts each self-play iteration."""
    s = policy.state
    policy.state = train_step.init_train_state(s.params, policy.optimizer).replace(
        step=s.step, skipped=s.skipped)

  def rebase(self, params) -> None:
    """Makes `params` the base model (after the demo warm-up): every policy restarts from a
    copy of it, and every frozen copy of the base (a judge, a KL reference) becomes it."""
    self.base_params = params
    for policy in self.policies.values():
      if self.lora.rank:  # fresh adapters on the new base
        policy.base = params
        policy.state = train_step.init_train_state(self.fresh_adapters(), policy.optimizer)
        policy.sampler.update_params(policy.played())
        continue
      copy = jax.tree.map(jnp.copy, params)
      policy.state = train_step.init_train_state(copy, policy.optimizer)
      policy.sampler.update_params(copy)
    for name in self._base_frozen:
      self.set_frozen(name, params)
    for name in self.tracked:  # tracked params start again from a copy of the new base
      self.set_frozen(name, lora_lib.view(params, self.fresh_adapters()) if self.lora.rank
                      else jax.tree.map(jnp.copy, params))

  def drop_train_states(self) -> None:
    """Lets go of every policy's train state before a warm-up that `rebase` follows (it makes
    new ones from the warmed base): on a real model the params copy and optimizer moments are
    three copies of the weights (6 GB for a 0.5B model in float32) beside the warm-up's own."""
    for policy in self.policies.values():
      policy.state = None

  def release_base(self) -> bool:
    """Drops the base params when nothing reads them again (no frozen role plays them, no
    policy's loss has a KL term, the warm-up is over): one copy of the weights less for the whole
    run (2.5 GB for a 0.6B model in float32). True when released."""
    if (self._base_frozen or self.base_params is None or self.lora.rank
        or any(p.loss.kl_beta > 0 for p in self.policies.values())):
      return False
    self.base_params = None
    logging.info("The base params are released: no frozen role or KL reference reads them.")
    return True

  def _base(self):
    if self.base_params is None:
      raise RuntimeError("The base params were released after the method was built (nothing "
                         "read them); add policies, frozen params and KL references in the "
                         "method's __init__.")
    return self.base_params

  def reference(self):
    """The KL reference π_ref: the base model M0 (frozen; the warmed model after the demo's
    warm-up). It costs no memory of its own: it is the base params themselves."""
    if "reference" not in self.frozen:
      self.add_frozen("reference")
    return self.frozen["reference"]

  def add_role(self, name: str, settings: ml_collections.ConfigDict, *, policy=None,
               frozen: str | None = None, tool=None, final_tags=(),
               strip_think: bool = False, system: str | None = None) -> Role:
    """A role played by a trained `policy` or by the frozen params named `frozen`; a role with a
    tool searches in the run's syntax (`self.syntax`), the one its prompts ask for."""
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
                policy=policy, timer=self.timer,
                progress=console.progress_on(self.config.get("progress", True))
                and jax.process_index() == 0,
                strip_think=strip_think, system=system, frozen=frozen, syntax=self.syntax)
    self.roles[name] = role
    return role

  def add_players(self, players, settings: ml_collections.ConfigDict, *, tool=None,
                  system=lambda role: None) -> dict[str, Role]:
    """Builds a method's declared `players` (`core.method.Players`): its policies with their loss
    and optimizer overrides, frozen and tracked copies of the base model, and its roles, each with
    its sampling `settings[role]`, `tool` if it searches, and its system message `system(role)`."""
    for name, plan in players.policies.items():
      self.add_policy(name, loss_overrides=dict(plan.loss), optim_overrides=dict(plan.optim))
    for name in players.frozen:
      self.add_frozen(name)
    for name in players.tracked:
      self.add_tracked(name)
    return {name: self.add_role(name, settings[name], policy=self.policies.get(r.by),
                                frozen=None if r.by in self.policies else r.by,
                                tool=tool if r.tool else None, final_tags=r.final,
                                strip_think=r.strip_think, system=system(name))
            for name, r in players.roles.items()}

  def own(self, resource):
    """`resource`, closed when the process exits (a worker process such as the math checker)."""
    atexit.register(resource.close)
    return resource

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

  def train(self, policy: learner_lib.Policy | str, trajectories, advantages, *,
            loss: train_step.LossConfig | None = None, teacher: str | None = None,
            teacher_prompts=None) -> dict[str, float]:
    """One update of `policy` (or the policy of that name) with `loss` (default: the policy's own), its metrics under
    `train/` (`<policy>/train/` when the run trains several policies). The KL reference is
    passed whenever the loss has β > 0; `teacher` names frozen params for distillation."""
    policy = self.policies[policy] if isinstance(policy, str) else policy
    loss = loss or policy.loss
    engine_lib.free_caches()  # the rollouts are over: their KV caches' memory goes to training
    ref = self.reference() if loss.kl_beta > 0 else None
    teacher_params = self.frozen[teacher] if teacher is not None and teacher_prompts else None
    trajectories, advantages = list(trajectories), list(advantages)
    seed = [self.config.seed, getattr(self, "step", 0), zlib.crc32(policy.name.encode())]
    advantages, teacher_prompts = control_signal(
        self.config.get("control", ""), advantages,
        teacher_prompts if teacher_params is not None else None, seed)
    stats = health.update_stats(trajectories, advantages)
    with self.timer("train"):
      out = self.learner.train(policy, list(trajectories), list(advantages), loss=loss,
                               ref_params=ref, teacher_params=teacher_params,
                               teacher_prompts=teacher_prompts if teacher_params is not None
                               else None)
    if out:
      out.update(stats)
    return {f"{self.train_prefix(policy)}{k}": v for k, v in out.items()}

  def train_prefix(self, policy: learner_lib.Policy) -> str:
    return "train/" if len(self.policies) == 1 else f"{policy.name}/train/"

  # ---------------------------------------------------------------------------- state
  def device_state(self) -> dict:
    """What a checkpoint holds on device: each policy's TrainState and each tracked params tree
    (as {"params": ...}, so evaluation restores either the same way); with LoRA, adapters and
    their optimizer state only (the base is the run's model, or its saved warm-up)."""
    state = {name: p.state for name, p in self.policies.items()}
    state.update({name: {"params": self.trained_part(name)} for name in self.tracked})
    return state

  def load_device_state(self, state: dict) -> None:
    for name, s in state.items():
      if name in self.tracked:
        self.set_trained_part(name, s["params"])
        continue
      self.policies[name].state = s
      self.policies[name].sampler.update_params(self.policies[name].played())

  def checkpointed(self) -> list[str]:
    """Names whose params every checkpoint holds: the policies, then the tracked params."""
    return list(self.policies) + list(self.tracked)
