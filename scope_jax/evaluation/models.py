"""The models an evaluation reads: a run's trained role at a checkpoint step, the run's initial
model, or a base checkpoint named by a spec. Every one comes with its tokenizer.

    hf:<dir or gs://…>     a Hugging Face checkpoint (its tokenizer files from the same directory)
    gguf:<file or asset>   a GGUF file, with the tokenizer it embeds
    demo                   the bundled warmed-up demo model and the demo tokenizer
    preset:<name>          random weights of a preset architecture (needs --tokenizer)
    initial                (with --run) the run's own starting point: its warmed-up base model
                           when it had a warm-up, else its model.source
"""

from __future__ import annotations

import atexit
import dataclasses
import shutil
import tempfile
from typing import Any

import jax.numpy as jnp
import ml_collections
from etils import epath

from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax import data
from scope_jax.models.load import load_model
from scope_jax.models import ModelConfig, hf_io
from scope_jax.models import lora as lora_lib

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                   "tokenizer.model", "generation_config.json")
SPEC_HELP = ("'hf:<dir or gs://…>', 'gguf:<file or asset>', 'demo', 'preset:<name>', or (with "
             "--run) 'initial'")


@dataclasses.dataclass
class Model:
  label: str  # 'step_12', 'base', …: names the results directory and the table row
  step: int | None
  config: ModelConfig
  params: Any
  tokenizer: Any

  def __post_init__(self):
    """A tokenizer with ids past the model's vocabulary would index embeddings that do not exist
    (silently, on accelerators): refused before anything is evaluated."""
    n = len(self.tokenizer)
    if n > self.config.vocab_size:
      raise ValueError(f"The tokenizer of {self.label} has {n} tokens but the model's vocabulary "
                       f"is {self.config.vocab_size}: pass the model's own tokenizer "
                       "(--tokenizer).")


def local_tokenizer_dir(directory: str) -> str:
  """`directory` itself when local; else its tokenizer files copied to a temporary directory."""
  if "://" not in str(directory):
    return str(directory)
  local = tempfile.mkdtemp(prefix="scope_jax_tokenizer_")
  atexit.register(shutil.rmtree, local, ignore_errors=True)
  for name in TOKENIZER_FILES:
    src = epath.Path(directory) / name
    if src.exists():
      epath.Path(local, name).write_bytes(src.read_bytes())
  return local


def _hf_tokenizer(directory: str, override: str | None):
  if override:
    return tok_lib.load_tokenizer(override)
  local = local_tokenizer_dir(directory)
  if not any((epath.Path(local) / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
    raise FileNotFoundError(f"{directory} has no tokenizer files (tokenizer.json or "
                            "tokenizer_config.json); pass --tokenizer=<dir>, 'demo' or 'byte'.")
  return tok_lib.load_tokenizer(local)


def check_spec(spec: str, *, record=None, tokenizer: str | None = None) -> None:
  """The mistakes in `spec` that need no weights read: an unknown form, 'initial' without a run,
  'preset:' without a tokenizer, a hf: directory without config.json."""
  if spec == "initial" and record is None:
    raise ValueError("--model=initial names a run's starting model; it needs --run.")
  if spec.startswith("preset:") and not tokenizer:
    raise ValueError(f"--model={spec} has random weights and no tokenizer; pass --tokenizer.")
  if spec.startswith("hf:"):
    hf_io.check_hf_config(spec)  # a damaged size: one line, not a traceback from the builder
    hf_io.read_hf_config(spec[len("hf:"):])  # names the directory when it has no config.json
  elif spec not in ("initial", "demo") and not spec.startswith(("gguf:", "preset:")):
    raise ValueError(f"Unknown model spec {spec!r}; use {SPEC_HELP}.")


def load_spec(spec: str, mesh, rules: shd.Rules, dtype, *, record=None,
              tokenizer: str | None = None, label: str = "base") -> Model:
  """The base model named by `spec` (see the module docstring), on `mesh` under `rules`."""
  check_spec(spec, record=record, tokenizer=tokenizer)
  if spec == "initial":
    return _initial(record, mesh, rules, dtype, tokenizer, label)
  if spec == "demo":
    config, params = hf_io.load_hf(data.DEMO_MODEL, mesh=mesh, dtype=dtype, rules=rules)
    return Model(label, None, config, params, tok_lib.load_tokenizer(tokenizer or "demo"))
  if spec.startswith("hf:"):
    path = spec[len("hf:"):]
    config, params = hf_io.load_hf(path, mesh=mesh, dtype=dtype, rules=rules)
    return Model(label, None, config, params, _hf_tokenizer(path, tokenizer))
  if spec.startswith(("gguf:", "preset:")):
    source = _model_section(spec, param_dtype=jnp.dtype(dtype).name)
    config, params = load_model(source, mesh, 0, rules)
    tok = tok_lib.load_tokenizer(tokenizer or ("gguf:" + spec[len("gguf:"):]))
    return Model(label, None, config, params, tok)
  raise AssertionError(spec)  # check_spec rejects every other form


def _model_section(source: str, param_dtype: str):
  return ml_collections.ConfigDict(dict(source=source, param_dtype=param_dtype,
                                        tiny=dict(vocab_size=1)))


def _initial(record, mesh, rules, dtype, tokenizer, label) -> Model:
  tok = tok_lib.load_tokenizer(tokenizer) if tokenizer else run_record.load_tokenizer(record)
  config, params = initial_params(record, mesh, rules, dtype)
  return Model(label, None, config, params, tok)


def initial_params(record, mesh, rules, dtype):
  """(config, params) of the run's starting model: its warmed-up base when it had a warm-up,
  else its model.source (a LoRA run's shared base, which its adapters adapt)."""
  warm = epath.Path(record.path) / "warm_start"
  if (warm / "config.json").exists():
    return hf_io.load_hf(warm, mesh=mesh, dtype=dtype, rules=rules)
  section = ml_collections.ConfigDict(record.config.model.to_dict())
  section.param_dtype = jnp.dtype(dtype).name
  return load_model(section, mesh, record.config.seed, rules)


def load_step(record, step: int, role: str, mesh, rules: shd.Rules, dtype,
              tokenizer=None) -> Model:
  """The params of the run's trained `role` at checkpoint `step` (a LoRA run's: its base plus
  the step's adapters, `lora.view`)."""
  policy = run_record.policy_for(record, role)
  params = run_record.restore_params(record, step, policy, mesh, rules, dtype)
  if run_record.lora_of(record).rank:
    params = lora_lib.view(initial_params(record, mesh, rules, dtype)[1], params)
  return Model(f"step_{step}", step, record.model_config, params,
               tokenizer if tokenizer is not None else run_record.load_tokenizer(record))
