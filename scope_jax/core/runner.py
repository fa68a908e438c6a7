"""The run loop shared by every method: validation, the demo warm-up, resume, checkpoints, metrics.

A method's `algorithm` module provides `METHOD` (its `core.method.Method` subclass, whose
declarations `validate` checks) and `make_method(rt)`. The method declares its roles in
`__init__` and runs one self-play step at a time; the runner adds every role's rollout metrics
and the timers to each step's metrics.
"""

from __future__ import annotations

import importlib
import json
import os
import time

import jax
import ml_collections
from absl import logging
from etils import epath
from tqdm import tqdm

from scope_jax import assets
from scope_jax import configs_base
from scope_jax import checkpoint as ckpt_lib
from scope_jax import console
from scope_jax import distributed
from scope_jax import metrics as metrics_lib
from scope_jax import report
from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.core import bounds
from scope_jax.core import evals as evals_lib
from scope_jax.core import health as health_lib
from scope_jax.core import smoke
from scope_jax.core import warmup as warmup_lib
from scope_jax.core.method import check_choice
from scope_jax.core.runtime import CONTROLS, Runtime, loss_config, optim_settings, role_context
from scope_jax.models import hf_io
from scope_jax.models import load as load_lib
from scope_jax.models import lora as lora_lib
from scope_jax.models import transformer
from scope_jax.rl import optim
from scope_jax.sampling import engine as engine_lib

# The methods that ship with the package, listed by their package (read by name: the core imports
# no method).
METHODS = tuple(importlib.import_module("scope_jax.methods").NAMES)


def load_method(config: ml_collections.ConfigDict):
  """The module of the run's method (it defines `METHOD` and `make_method`): a built-in method by
  name, or the module `method_module` names (a method outside the package; see
  docs/adding_a_method.md). Its `Method.name` is the config section it reads."""
  path = config.get("method_module", "")
  if not path:
    check_choice("method", config.method, METHODS)
    path = f"scope_jax.methods.{config.method}.algorithm"
  try:
    module = importlib.import_module(path)
  except ModuleNotFoundError as e:
    raise ValueError(f"method_module={path!r} cannot be imported ({e}); give a module on the "
                     "Python path that defines METHOD and make_method.") from None
  if getattr(getattr(module, "METHOD", None), "name", None) != config.method:
    raise ValueError(f"{path} defines no METHOD named {config.method!r} (its Method.name must be "
                     "the config's `method`, the section it reads).")
  return module

def validate(config: ml_collections.ConfigDict, devices=None, data: bool = True):
  """Fails fast (before loading anything) on settings that are typed right but invalid. With
  `smoke`, first shrinks the config (in place, idempotent) to the run it will be. The mesh is
  checked against `devices` (default: this run's); `data=False` (planning, which reads no
  weights, tokenizer or corpus) skips the checks that those paths are set."""
  configs_base.check_moved(config)  # an old setting's path: one line naming its new one
  module = load_method(config)
  if config.get("smoke", False):
    smoke.check_preset(config)
    bounds.check(config, *bounds.of_method(module.METHOD))  # a bad value given is refused
    changed = smoke.shrink(config, module.METHOD.smoke)
    if changed:  # validating again shrinks nothing more and says nothing
      logging.info("Smoke run: %d settings shrunk (run.json holds the run's config): %s",
                   len(changed), "; ".join(changed))
  bounds.check(config, *bounds.of_method(module.METHOD))  # every number in range: sizes ≥ 1, …
  if data and not config.model.tokenizer:
    raise ValueError("model.tokenizer is empty: set --config.model.tokenizer to the checkpoint's "
                     "directory (models are never downloaded at run time), 'demo' or 'gguf:<file>'.")
  if data:
    tok_lib.check_spec(config.model.tokenizer)
  check_choice("optim.schedule", config.optim.schedule, optim.SCHEDULES)
  check_choice("model.remat", config.model.remat, tuple(transformer.REMAT_POLICIES))
  check_choice("model.dtype", config.model.dtype, ("float32", "bfloat16"))
  check_choice("rollout.dtype", config.rollout.get("dtype", ""), ("", "float32", "bfloat16"))
  check_choice("model.param_dtype", config.model.get("param_dtype", "float32"),
               ("float32", "bfloat16"))
  if len(tuple(config.mesh.shape)) not in (3, 4):
    raise ValueError(f"mesh.shape={tuple(config.mesh.shape)} needs 3 entries (data, fsdp, tensor) "
                     "or 4 (and expert).")
  shd.config_rules(config)  # every rule names axes the mesh has
  lora_lib.from_config(config.get("lora"))  # rank, targets, dropout
  check_mesh(config, devices)
  if config.rollout.max_prompt_tokens >= config.rollout.max_context:
    raise ValueError(f"rollout.max_prompt_tokens={config.rollout.max_prompt_tokens} leaves no room "
                     f"for a response within rollout.max_context={config.rollout.max_context}.")
  loss_config(config)  # checks the names and values of the loss settings
  roles = config.get(config.method, {}).get("roles", {})
  for name, role in roles.items():
    limit = role.get("max_prompt_tokens", 0) or config.rollout.max_prompt_tokens
    context = role_context(config, role)
    if limit >= context:
      raise ValueError(f"{config.method}.roles.{name}.max_prompt_tokens={limit} leaves no room for "
                       f"a response within the role's context of {context} tokens "
                       "(rollout.max_context, or the role's own max_context).")
  load_lib.check_source(config.model.source, config.model.tie_embeddings)
  hf_io.check_hf_config(config.model.source)
  for name in ("source", "tokenizer"):
    check_gguf(f"model.{name}", config.model[name])
  warmup_lib.validate(config, module.METHOD)
  module.METHOD.validate(config, data=data)
  check_policies(module.METHOD, config)
  check_choice("control", config.get("control", ""), CONTROLS)
  check_world(config)
  if data:
    warn_trained_on_this_world(config)
  evals_lib.validate(config, module.METHOD)
  return module


def check_world(config: ml_collections.ConfigDict) -> None:
  """`world.corpus_seeds` adds documents to the 'world' corpus, so it needs a corpus that is the
  world's; its seeds are distinct non-negative worlds other than `world.seed`."""
  w = config.get("world", {})
  extra = tuple(w.get("corpus_seeds", ()))
  if not extra:
    return
  corpora = (config.get("retrieval", {}).get("corpus"), config.get("data", {}).get("corpus"))
  if "world" not in corpora:
    raise ValueError(f"world.corpus_seeds={extra} adds other worlds' documents to the 'world' "
                     "corpus, and this run reads none: set --config.retrieval.corpus=world (or "
                     "data.corpus=world), or leave world.corpus_seeds empty.")
  if any(not isinstance(s, int) or s < 0 for s in extra) or w.seed in extra or (
      len(set(extra)) != len(extra)):
    raise ValueError(f"world.corpus_seeds={extra} must be distinct non-negative integers other "
                     f"than world.seed={w.seed}, e.g. (500, 501, 502).")


def check_policies(method, config: ml_collections.ConfigDict) -> None:
  """Each declared policy's loss overrides name loss settings (an optimizer setting there, such
  as `lr`, is a one-line error that says where it goes), its optimizer overrides optimizer ones."""
  try:
    players = method.players(config)
  except NotImplementedError:  # a method of one's own that declares no players
    return
  for name, plan in players.policies.items():
    try:
      loss_config(config, plan.loss)
    except (ValueError, TypeError) as e:
      raise ValueError(f"policy {name!r}: {e}") from None
    try:
      optim_settings(config, plan.optim)
    except ValueError as e:
      raise ValueError(f"policy {name!r} optimizer overrides: {e}") from None


def warn_trained_on_this_world(config: ml_collections.ConfigDict) -> None:
  """A warning when `model.source` is an export (scope_jax_export.json) of a run that trained on
  this run's world: its `world:` evaluations are then not held out."""
  source = str(config.model.source)
  if not source.startswith("hf:") or not str(config.get("eval", {}).get("benchmarks", "")):
    return
  info = epath.Path(source[len("hf:"):]) / "scope_jax_export.json"
  try:
    seen = json.loads(info.read_text()).get("worlds") or {}
  except (OSError, ValueError, AttributeError):
    return  # not an export of a run (or not readable here): nothing is known
  seed = config.world.seed
  if evals_lib.WORLD_PREFIX in str(config.eval.benchmarks) and (
      seed == seen.get("seed") or seed in seen.get("corpus_seeds", ())
      or seed in seen.get("warmup_seeds", ())):
    logging.warning("model.source=%s was exported from a run that trained on world %d (%s): "
                    "this run's world:<set> evaluations of world %d are not held out.",
                    source, seed, info, seed)


def check_gguf(name: str, spec: str) -> None:
  """A `gguf:` spec names a local file or a bundled asset: a path that is neither is a missing
  file, said so in one line (not 'unknown asset')."""
  if not str(spec).startswith("gguf:"):
    return
  target = spec[len("gguf:"):]
  if target in assets.REGISTRY or "://" in target or epath.Path(target).exists():
    return
  raise ValueError(f"{name}={spec!r}: no file at {target}, and no bundled asset of that name "
                   f"(assets: {', '.join(sorted(assets.REGISTRY))}).")


def check_mesh(config: ml_collections.ConfigDict, devices=None) -> None:
  """The mesh fits this run's devices, counted over every process (a multi-host run's mesh spans
  all hosts); fails before anything loads, naming the device count."""
  try:
    shd.make_mesh(tuple(config.mesh.shape), devices)
  except ValueError as e:
    raise ValueError(f"mesh.shape={tuple(config.mesh.shape)} does not fit: {e}") from None


def build(config: ml_collections.ConfigDict, workdir: str, *, warm_start: bool = True):
  """(runtime, method): the method's roles, rebased on the warmed-up demo model when the
  config asks for the warm-up (`warmup.steps > 0`) and `warm_start` is set."""
  module = validate(config)
  workdir = ckpt_lib.absolute(workdir)
  check_writable(workdir)
  resumable = bool(ckpt_lib.Checkpointer.list_steps(f"{workdir}/checkpoints"))
  metrics_lib.check_fresh(workdir, resumable, config.overwrite)
  if config.overwrite and not resumable:  # starting over: nothing of the old run is reused
    clear_derived(workdir)
  rt = Runtime(config, workdir)
  method = module.make_method(rt)
  if warm_start:
    info = warmup_lib.warm_start(rt, method)
    if info:
      logging.info("Warm-up: %s", info)
    rt.release_base()  # after the warm-up, which rebases on the warmed weights
  return rt, method


DERIVED = ("world", "warm_start")  # what a run writes for itself besides metrics and checkpoints


def clear_derived(workdir: str) -> None:
  """Removes a workdir's world files and warm-up (`overwrite`: a new run there reuses neither)."""
  if distributed.is_primary():
    for name in DERIVED:
      path = epath.Path(workdir) / name
      if path.exists():
        logging.info("overwrite: removing %s", path)
        path.rmtree()
  distributed.barrier("clear_derived")


def check_writable(workdir: str) -> None:
  """Fails at once (before any model loads) when the workdir, local or gs://, cannot be written."""
  probe = epath.Path(workdir) / f".write_check_{jax.process_index()}_{os.getpid()}"
  try:
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text("ok")
    probe.unlink()
  except Exception as e:  # noqa: BLE001 — permissions, read-only or missing file systems, auth
    raise ValueError(f"The workdir {workdir} is not writable ({type(e).__name__}: {e}); choose "
                     "another --workdir.") from e


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Runs `config.total_steps` steps of `config.method`, resuming from `workdir` if possible."""
  rt, method = build(config, workdir)
  workdir = rt.workdir
  run_record.write(rt, workdir)  # what the evaluator and the exporter read back
  checkpointer = ckpt_lib.Checkpointer(f"{workdir}/checkpoints", keep=config.keep_checkpoints,
                                       async_save=config.async_checkpoint)
  start = 0
  restored = checkpointer.restore_latest(rt.device_state())
  if restored is not None:
    step, state, host = restored
    rt.load_device_state(state)
    method.load_host_state(host)
    start = step + 1
  # A resumed run drops what comes after its checkpoint, to write it again; a finished one
  # keeps its last row, the evaluation after its last update (nothing runs again to rewrite it).
  keep = None if restored is None else start if start >= config.total_steps else start - 1
  rt.metrics.start(keep, overwrite=config.overwrite)
  evaluations = evals_lib.Evaluations(rt, method) if evals_lib.due(0, config) else None

  def evaluate(updates: int) -> None:  # held-out scores after `updates` updates (config.eval)
    if evaluations is not None and evals_lib.due(updates, config):
      engine_lib.free_caches()
      rt.metrics.write(updates, evaluations.run(updates))

  final_eval = False  # the evaluation after the last update, run again: it was cut short
  if start < config.total_steps:
    evaluate(start)
  elif (start == config.total_steps and evaluations is not None
        and evals_lib.due(start, config)
        and distributed.broadcast_int(not evals_lib.done(rt.metrics.rows(), start))):
    logging.warning("The evaluation after the last update (%d) is missing: the run stopped "
                    "during it. Running it now.", start)
    evaluate(start)
    final_eval = True
  last: dict[str, float] = {}
  health = health_lib.Health()  # counts updates that could not teach (this process's steps)
  run_start = time.perf_counter()
  bar = tqdm(total=config.total_steps, initial=start, desc=f"{config.method} steps", unit="step",
             disable=(jax.process_index() != 0
                      or not console.progress_on(config.get("progress", True))))
  for step in range(start, config.total_steps):
    engine_lib.free_caches()  # every step starts from empty caches, as a resumed run does
    rt.timer.reset()
    rt.begin_step(step)
    t0 = time.perf_counter()
    metrics = method.step(step)
    guard = getattr(method, "guard", None)  # model output its parsers could not read
    if guard is not None:
      metrics["parse_errors"] = float(guard.take())
    metrics.update(rt.role_metrics())
    metrics.update(rt.timer.metrics())
    metrics["time/step"] = time.perf_counter() - t0
    metrics["train/skipped_updates"] = float(rt.learner.counters["skipped_updates"])
    for warning in health.observe(metrics):
      logging.warning("step %d: %s.", step, warning)
    last = rt.metrics.write(step, metrics)
    logging.info("%s", console.step_line(step, config.total_steps, last))  # the rest: metrics.jsonl
    host = method.host_state()
    distributed.check_agree(f"step {step}'s host state",  # multi-host: every host decided alike
                            {k: v for k, v in host.items() if k not in method.host_local_keys})
    if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.total_steps:
      checkpointer.save(step, rt.device_state(), host)
    evaluate(step + 1)
    bar.set_postfix({k.split("/")[0]: f"{v:.3g}" for k, v in last.items()
                     if k.endswith("reward/mean")}, refresh=False)
    bar.update(1)
  bar.close()
  checkpointer.close()
  rt.metrics.close()
  if evaluations is not None and distributed.is_primary():
    logging.info("Learning curves: %s", report.plot(workdir))
  wall = time.perf_counter() - run_start
  if not distributed.is_primary():  # the summary is printed once
    return last
  if final_eval:
    print(f"Ran the missing evaluation after the last of {config.total_steps} steps of "
          f"{config.method} in {workdir}.")
    return last
  if start >= config.total_steps:
    print(f"Nothing to run: {config.total_steps} steps of {config.method} are already done in "
          f"{workdir} (raise --config.total_steps to continue).")
    return last
  print(f"Finished {config.method} ({config.preset}): steps {start}..{config.total_steps - 1} in "
        f"{wall:.1f}s; workdir {workdir}")
  if last:
    keys = [k for k in sorted(last) if k.startswith("time/") or k.endswith("/reward/mean")]
    print(console.clip("  " + "; ".join(f"{k} {last[k]:.3g}" for k in keys), console.MAX_LINE))
  text = method.summary()
  if text:
    print(console.clip(text, console.MAX_LINE))
  warning = health.summary()
  if warning:
    print(warning)
    logging.warning("%s", warning)
  return last
