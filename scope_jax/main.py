"""Entry point for every method: builds the mesh and runs one config in a workdir.

    python -m scope_jax.main --config=configs/spell.py --workdir=runs/spell
    python -m scope_jax.main --config=configs/spell.py:paper --workdir=gs://bucket/run \
        --config.model.source=hf:/ckpt/Qwen2.5-7B-Instruct --config.optim.lr=1e-6

Multi-host: every host runs the same command; launch/ sets the environment that
`scope_jax.distributed` reads (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).
"""

import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from scope_jax import checkpoint, cli_errors, distributed, host_memory
from scope_jax.core import runner

_CONFIG = config_flags.DEFINE_config_file("config", None, "Method config file (configs/*.py[:preset]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (local or gs://): checkpoints, metrics.")


def main(argv):
  del argv
  cli_errors.quiet_chatty_libraries()
  try:  # a missing config file, or settings typed right but invalid: one line, before loading
    host_memory.reuse_freed_memory(os.environ)  # before JAX starts its threads
    distributed.initialize(os.environ)  # multi-host: one process per host
    config = _CONFIG.value
    runner.validate(config)
    runner.check_writable(checkpoint.absolute(_WORKDIR.value))
  except (OSError, ValueError, KeyError) as e:
    cli_errors.fail(e)
  logging.info("JAX %s: %d processes, devices %s", jax.__version__, jax.process_count(),
               jax.devices())
  logging.info("Config: %s (%s), %d steps; the whole config goes to <workdir>/run.json",
               config.method, config.preset, config.total_steps)
  logging.debug("Config:\n%s", config)
  try:  # what only loading shows (a tokenizer larger than the model's vocabulary): one line
    runner.run(config, _WORKDIR.value)
  except ValueError as e:
    if not cli_errors.raised_here(e, within="build"):  # a step's error keeps its traceback
      raise
    cli_errors.fail(e)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main, flags_parser=cli_errors.parse_flags)
