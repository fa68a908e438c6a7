"""One preset wired end to end, in a process of its own on one CPU device: the preset at its
smoke sizes on the tiny model, every role played by the scripted model of its method.

    python -m tests.methods.wiring '{"method": "asl", "preset": "paper", "workdir": "/tmp/w"}'

It prints one JSON line: each role's search syntax and whether it has the tool, and the metrics
rows. The tests run it in a subprocess because one device compiles and runs these programs about
four times faster than the test session's eight virtual devices, with the same code path.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def wired_config(method, preset, overrides=None, smoke=True, **extra):
  """The preset (at its smoke sizes), on the tiny model (the scripted player writes the text)."""
  from scope_jax import configs_base
  from scope_jax.core import runner
  c = configs_base.load_file(ROOT / "configs" / f"{method}.py", preset)
  c.warmup.steps = 0
  c.update_from_flattened_dict(dict(overrides or {}))
  if smoke:  # shrunk to the run it would be (smoke itself refuses the demo and learn presets)
    from scope_jax.core import smoke as smoke_lib
    smoke_lib.shrink(c, runner.load_method(c).METHOD.smoke)
  runner.validate(c)
  if smoke:
    c.update_from_flattened_dict(DEMO_TOKEN_ROOM.get(f"{method}:{preset}", {}))
  c.model.source, c.model.tokenizer = "tiny", "demo"
  c.model.dtype = c.model.param_dtype = "float32"
  c.model.remat = "none"  # memory knobs of the real model; the tiny one compiles faster without
  c.model.moe_capacity_factor = 0  # the tiny model is dense
  c.progress = False
  c.update_from_flattened_dict(extra)
  return c


# Smoke's prompt limits are sized for the real tokenizer; the demo tokenizer's tokens are shorter.
# The thinking teacher's fixed text is 3,112 demo tokens (about 2,000 of Qwen's), above smoke's
# 3,072: it gets room for its question and part of its demonstration.
DEMO_TOKEN_ROOM = {"piplay:paper": {"piplay.roles.teacher.max_prompt_tokens": 3584}}


def run_scripted(config, workdir: pathlib.Path, **player) -> dict:
  """Runs `config` with every role played by its method's scripted model; the roles and rows."""
  from scope_jax.core import runner
  from tests.methods import scripted
  players = {"spell": scripted.ScriptedSpellSampler, "scope": scripted.ScriptedScopeSampler,
             "opensir": scripted.ScriptedOpenSirSampler, "asl": scripted.ScriptedAslSampler,
             "piplay": scripted.ScriptedPiPlaySampler}
  module = runner.load_method(config)
  made = {}

  def make(rt):
    made["method"] = module.METHOD(rt)
    scripted.play_all_roles(rt, players[config.method](rt.tokenizer, **player))
    return made["method"]

  module.make_method = make
  runner.run(config, str(workdir))
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  rt = made["method"].rt
  roles = rt.roles
  held = {"policies": sorted(rt.policies), "tracked": sorted(rt.tracked),
          "frozen": sorted(set(rt.frozen) - set(rt.tracked) - {"reference"})}
  return {"syntax": {n: r.syntax for n, r in roles.items()},
          "tool": {n: r.tool is not None for n, r in roles.items()}, "rows": rows, "held": held}


def run_in_subprocess(spec: dict, timeout: float = 900) -> dict:
  """`spec` (method, preset, workdir; optional overrides, smoke, extra, player) run by this
  module in a one-device process; its result."""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  proc = subprocess.run([sys.executable, "-m", "tests.methods.wiring", json.dumps(spec)],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
  if proc.returncode:
    raise AssertionError(f"the wired run failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-6000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(arg: str) -> None:
  import jax
  jax.config.update("jax_default_matmul_precision", "highest")
  spec = json.loads(arg)
  config = wired_config(spec["method"], spec["preset"], spec.get("overrides"),
                        spec.get("smoke", True), **spec.get("extra", {}))
  result = run_scripted(config, pathlib.Path(spec["workdir"]), **spec.get("player", {}))
  print(json.dumps(result))


if __name__ == "__main__":
  main(sys.argv[1])
