"""The generic demo warm-up: fine-tune the tiny demo model on demonstrations of every role's
output format, so each CPU demo runs every phase of its algorithm on the model's own output.

The papers start from instruction-tuned 7–8B models that already follow each role's format; a
random 0.8M-parameter model follows none, so nothing would parse and nothing would train. With
`warmup.steps > 0` the runner asks the method for `demonstrations(rng)` (built from the corpus,
with real search results as observations), fits the base model on them (token NLL, `rl/sft.py`),
and rebases every policy and frozen copy of the base model on the result. Paper presets keep it
off.

Where the warmed weights come from, first match wins:
  1. `<workdir>/warm_start`: a resumed run reuses its own (so a frozen Judge stays bit-identical),
     when its stamp (the settings key and the demonstrations' digest) is this run's;
  2. the bundled demo model (`data/bundled/demo_model`), fitted once on every method's
     demonstrations by `python tools/build_demo_model.py`, when its settings and this
     method's demonstrations are the ones it was fitted on;
  3. the asset cache, keyed by the settings and the demonstrations' tokens;
  4. fitted now on this method's demonstrations, then saved to the cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath

from scope_jax import assets, distributed
from scope_jax import checkpoint as ckpt_lib
from scope_jax.data import DEMO_MODEL
from scope_jax.core import vocab_rows
from scope_jax.models import hf_io
from scope_jax.rl import sft
from scope_jax.rollout.types import Trajectory

BUNDLED = DEMO_MODEL


def validate(config: ml_collections.ConfigDict, method_cls=None) -> None:
  """The shared `warmup.*` settings (a method checks its own demonstrations' knobs, kept in
  its section, in its `check`)."""
  w = config.get("warmup")
  if w is None or not w.steps:
    return
  for name in ("lr", "batch_rows", "documents"):
    if w[name] <= 0:
      raise ValueError(f"warmup.{name} must be positive when warmup.steps > 0, got {w[name]}.")
  if (w.get("world_seed", -1) >= 0 and method_cls is not None
      and not method_cls.world_demonstrations):
    raise ValueError(f"warmup.world_seed={w.world_seed}: {method_cls.name}'s warm-up has no "
                     "demonstrations from other worlds; set it to -1.")
  seeds = range(w.get("world_seed", -1), w.get("world_seed", -1) + w.get("worlds", 1))
  if w.get("world_seed", -1) >= 0 and config.world.seed in seeds:
    raise ValueError(f"warmup.world_seed={w.world_seed} with warmup.worlds={w.worlds} includes "
                     f"the run's world.seed={config.world.seed}: demonstrations from the world "
                     "being learned teach its facts; use seeds apart from it.")


def _model_fields(model_config) -> dict:
  """The architecture's fields that differ from their defaults: a stable description (adding
  a defaulted field for another family changes no existing key)."""
  return {f.name: getattr(model_config, f.name) for f in dataclasses.fields(model_config)
          if f.default is dataclasses.MISSING or getattr(model_config, f.name) != f.default}


def settings_key(config: ml_collections.ConfigDict, model_config) -> str:
  """What the fit depends on besides the demonstrations: model (and the weights it starts from),
  warm-up settings, seed, dtypes."""
  w = config.warmup
  fields = [_model_fields(model_config), [w.steps, w.lr, w.batch_rows], config.seed,
            config.model.param_dtype, config.model.dtype]
  if w.get("max_tokens"):  # keys of whole-demonstration fits (the bundled model's) unchanged
    fields.append(["max_tokens", w.max_tokens])
  source = config.model.source
  if source.startswith("hf:") and _same_path(source[len("hf:"):], BUNDLED):
    fields.append(["bundled demo model", _bundled_meta()])  # its fit, wherever it is installed
  elif not (source == "tiny" or source.startswith("preset:")):  # these weights, not a random init
    fields.append(source)
    if not _bundled_source(source):  # a released vocabulary: `vocab_rows` seeds its fill rows
      fields.append("untrained rows seeded")
  blob = json.dumps(fields, default=str, sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:24]


def demos_digest(demos: Sequence[Trajectory]) -> str:
  h = hashlib.sha256()
  for d in demos:
    h.update(np.asarray(d.tokens, np.int32).tobytes())
    h.update(np.asarray(d.loss_mask, np.int32).tobytes())
  return h.hexdigest()[:24]


def demonstrations(method, config) -> list[Trajectory]:
  """The method's demonstrations, from its own seeded stream (the same in every process)."""
  return list(method.demonstrations(np.random.default_rng([config.seed, 99])))


FULL_LOGITS_VOCAB = 8192  # up to this vocabulary the warm-up forms [B, T, V] logits at once


def fit_memory(rt) -> dict:
  """How the warm-up bounds its memory: a small vocabulary (the bundled models' 2,048) forms
  whole logits, the fastest; a real one (Qwen's 151,936: 1.2 GB per 1K tokens in float32) takes
  its log-probs in `loss.chunk` chunks, and the layers are rematerialised as `model.remat` says,
  as the RL step does."""
  chunk = 0 if rt.model_config.vocab_size <= FULL_LOGITS_VOCAB else int(rt.config.loss.chunk)
  return {"chunk": chunk, "remat": rt.config.model.remat}


def fit(rt, demos: Sequence[Trajectory], params=None):
  """The base model fine-tuned on `demos` with `config.warmup`'s settings; returns (params, s)."""
  w = rt.config.warmup
  start = time.perf_counter()
  demos = sft.cut(demos, w.get("max_tokens", 0))
  if not demos:
    raise ValueError(f"warmup.max_tokens={w.max_tokens} leaves no demonstration a trained "
                     "token; raise it (or 0 for whole demonstrations).")
  logging.info("Format warm-up: %d demonstrations, %d steps", len(demos), w.steps)
  params = jax.tree.map(jnp.copy, params or rt.base_params)
  params, seeded = vocab_rows.seed_untrained(params, rt.model_config, rt.tokenizer,
                                             {int(t) for d in demos for t in d.tokens})
  if seeded:
    logging.info("Untrained vocabulary rows start from their spellings' rows: %s",
                 ", ".join(rt.tokenizer.decode([i]) for i in seeded))
  params, losses = sft.fit(rt.model_config, params,
                           demos, steps=w.steps, lr=w.lr, batch_rows=w.batch_rows,
                           seed=rt.config.seed, mesh=rt.mesh, pad_id=rt.pad_id, dtype=rt.dtype,
                           log_every=max(w.steps // 5, 1), **fit_memory(rt))
  seconds = time.perf_counter() - start
  logging.info("Format warm-up done in %.1fs: nll %.3f → %.3f", seconds, losses[0], losses[-1])
  return params, seconds


def warm_start(rt, method) -> dict[str, float]:
  """Rebases the run on the warmed base model (when `warmup.steps > 0`); returns metrics."""
  w = rt.config.get("warmup")
  if w is None or not w.steps:
    return {}
  dtype = jnp.dtype(rt.config.model.param_dtype)
  local = epath.Path(rt.workdir) / "warm_start"
  demos = demonstrations(method, rt.config)
  key, digest = settings_key(rt.config, rt.model_config), demos_digest(demos)
  stamp = f"{key}-{digest}"  # what the fit depends on: another warm-up is never reused
  mine = stamp_of(local)
  if mine is None and (local / "config.json").exists() and ckpt_lib.Checkpointer.list_steps(
      f"{rt.workdir}/checkpoints"):
    mine = stamp  # saved before warm-ups were stamped, by the run being resumed: its own
  if distributed.broadcast_int(mine == stamp):  # process 0's view, for all
    logging.info("Loading the warmed-up base model of this run from %s", local)
    rt.rebase(load(local, rt, dtype))
    return {"warmup/source_run": 1.0, "warmup/demonstrations": float(len(demos))}
  if distributed.broadcast_int((local / "config.json").exists()):
    logging.warning("%s holds a warm-up with other settings or demonstrations; replacing it.",
                    local)
  meta = _bundled_meta()
  cached = assets.cache_dir() / "warm_start" / f"{key}-{digest}"
  # The asset cache is each host's own disk: a multi-host run uses it only if every host has it.
  in_cache = distributed.on_every_host((cached / "config.json").exists())
  if meta.get("settings") == key and meta.get("demos", {}).get(rt.config.method) == digest:
    logging.info("Using the bundled warmed-up demo model %s", BUNDLED)
    params, out = load(BUNDLED, rt, dtype), {"warmup/source_bundled": 1.0}
  elif in_cache:
    logging.info("Using the cached warmed-up base model %s", cached)
    params, out = load(cached, rt, dtype), {"warmup/source_cache": 1.0}
  else:
    if meta:
      logging.info("The bundled demo model was fitted with other settings or demonstrations; "
                   "warming up again (cached afterwards in %s).", cached)
    rt.drop_train_states()  # rebased below: room for the warm-up's own copy and moments
    params, seconds = fit(rt, demos)
    save(rt.model_config, params, cached, stamp)
    out = {"warmup/seconds": seconds}
  save(rt.model_config, params, local, stamp)
  rt.rebase(params)
  out["warmup/demonstrations"] = float(len(demos))
  return out


def _bundled_source(source: str) -> bool:
  """A model fitted by this project (`scope_jax/data/bundled`): no untrained fill rows."""
  data = os.path.realpath(BUNDLED.parent) + os.sep
  return source.startswith("hf:") and os.path.realpath(source[len("hf:"):]).startswith(data)


def _same_path(a, b) -> bool:
  return os.path.realpath(str(a)) == os.path.realpath(str(b))


def _bundled_meta() -> dict:
  path = BUNDLED / "warmup.json"
  return json.loads(path.read_text()) if path.exists() else {}


def load(path, rt, dtype):
  _, params = hf_io.load_hf(path, mesh=rt.mesh, dtype=dtype)
  same = jax.tree.map(lambda a, b: a.shape == b.shape, params, rt.base_params)
  if not all(jax.tree.leaves(same)):
    raise ValueError(f"{path} holds a model of a different shape than model.source; use a new "
                     "workdir (or delete that directory to warm up again).")
  return params


STAMP = "warmup_key"  # in a saved warm-up: the settings key and demonstrations digest


def stamp_of(path) -> str | None:
  """The key a saved warm-up was fitted under (None: no warm-up, or one saved without it)."""
  path = epath.Path(path) / STAMP
  return path.read_text().strip() if path.exists() else None


def save(model_config, params, path, stamp: str | None = None) -> None:
  """Writes to a temporary sibling, then renames: an interrupted save is never picked up. A
  warm-up already there under `stamp` stays; one under another key is replaced."""
  path = epath.Path(path)
  tmp = epath.Path(f"{path}.tmp{os.getpid()}")
  hf_io.save_hf(model_config, params, tmp)
  if jax.process_index() != 0:
    return
  if stamp is not None:
    (tmp / STAMP).write_text(stamp)
  if path.exists() and stamp_of(path) == stamp:
    tmp.rmtree()  # another process got there first with the same content
    return
  if path.exists():
    path.rmtree()
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp.rename(path)
