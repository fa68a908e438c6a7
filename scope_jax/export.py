"""Exports a run's trained role at a step (or a base model) as a Hugging Face checkpoint.

    python -m scope_jax.export --run=gs://bucket/runs/spell --step=latest --role=policy \
        --out=/tmp/spell-hf
    python -m scope_jax.export --model=gguf:qwen2.5-0.5b-gguf --out=gs://bucket/qwen-coder-hf

The result loads with `transformers.AutoModelForCausalLM.from_pretrained(out)` and
`AutoTokenizer.from_pretrained(out)`.
"""

import jax.numpy as jnp
from absl import app, flags, logging

from scope_jax import cli_errors, run_record
from scope_jax import sharding as shd
from scope_jax.evaluation import export as export_lib
from scope_jax.evaluation import models

_RUN = flags.DEFINE_string("run", None, "A run's workdir (local or gs://).")
_STEP = flags.DEFINE_string("step", "latest", "latest or a step number (with --run).")
_ROLE = flags.DEFINE_string("role", None, "The trained role (or policy) to export.")
_MODEL = flags.DEFINE_string("model", None, "Instead of --run: a model spec (hf:, gguf:, demo).")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer of --model when it has none.")
_OUT = flags.DEFINE_string("out", None, "Output directory (local or gs://).")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                           "Saved dtype (default: the params' dtype).")


def load():
  """The model the flags name, on all devices (the export gathers it to the host)."""
  if bool(_RUN.value) == bool(_MODEL.value):
    raise ValueError("Pass exactly one of --run (with --role) or --model.")
  mesh = shd.make_mesh((1, -1, 1))
  if _MODEL.value:
    model = models.load_spec(_MODEL.value, mesh, shd.SAMPLING_RULES, jnp.float32,
                             tokenizer=_TOKENIZER.value)
    return model, {"model": _MODEL.value}
  if not _ROLE.value:
    raise ValueError("--run needs --role: the trained role (or policy) to export.")
  record = run_record.read(_RUN.value)
  policy = run_record.policy_for(record, _ROLE.value)
  available = run_record.committed_steps(record)
  if not available:
    raise ValueError(f"The run {record.path} has no committed checkpoint yet.")
  step = run_record.select_steps(available, _STEP.value)
  if len(step) != 1:
    raise ValueError(f"--step={_STEP.value!r} names {len(step)} steps; export one at a time.")
  run_record.check_tokenizer(record)  # both one line, before any weights are read
  run_record.check_checkpoint(record, step[0], policy)
  dtype = jnp.dtype(record.config.model.param_dtype)
  model = models.load_step(record, step[0], policy, mesh, shd.SAMPLING_RULES, dtype)
  return model, {"run": record.path, "method": record.method, "step": step[0], "role": _ROLE.value,
                 "policy": policy, "worlds": run_record.worlds(record.config)}


def main(argv):
  del argv
  cli_errors.quiet_chatty_libraries()
  try:
    if not _OUT.value:
      raise ValueError("--out is required: the directory (local or gs://) to write.")
    model, info = load()
    out = export_lib.export(model, _OUT.value, dtype=_DTYPE.value and jnp.dtype(_DTYPE.value),
                            info=info)
  except (OSError, ValueError, KeyError) as e:  # bad flags, paths, roles; an unwritable --out
    cli_errors.fail(e)
  logging.info("Exported %s to %s", info, out)
  print(f"Exported {info} to {out}")


if __name__ == "__main__":
  app.run(main)
