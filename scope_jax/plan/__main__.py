"""Will a run fit a TPU slice, and how fast could it be? Compiles the run's programs for the slice
ahead of time, on this machine, with no TPU and no weights (libtpu: pip install -e '.[tpu]'):

    python -m scope_jax.plan --config=configs/spell.py:paper --topology=v5p-8
    python -m scope_jax.plan --config=configs/scope.py:paper --topology=v5litepod-16 --search_mesh
    python -m scope_jax.plan --config=configs/asl.py:paper --topology=v6e-64 \
        --config.mesh.shape='(1,16,4)' --json=plan.json

It prints, per program, the per-chip bytes the compiler reports, what stays resident, each
phase's peak against the chip's HBM (fits or not, by how much), and compiler estimates per chip:
FLOPs, HBM bytes and interconnect bytes next to their analytic minimums, the step times they
imply (overlapped, serial, floor) and MFU, and the collectives. Times are roofline estimates,
never measurements.
"""

import json
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the host compiles; libtpu only describes the slice

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from scope_jax import cli_errors  # noqa: E402
from scope_jax.core import runner  # noqa: E402
from scope_jax.plan import recommended, report, topology  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Method config file (configs/*.py[:preset]).",
                                          lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU slice: v4-8, v5p-8, v5litepod-16, v6e-64, "
                                "or 2xv5p-8 for two slices.")
_SEARCH = flags.DEFINE_bool("search_mesh", False, "Try the mesh shapes that divide the slice and list "
                            "those that fit, best first.")
_PROGRAMS = flags.DEFINE_string("programs", "all", "Comma-separated program names or prefixes to "
                                "compile (train_step, engine, engine/decode, sampler, retrieval), "
                                "or 'all'; a subset gives a partial plan, without a verdict.")
_JSON = flags.DEFINE_string("json", None, "Also write the plan (or every searched mesh) as JSON here.")


def _plan(config, s):
  runner.validate(config, devices=topology.devices(s), data=False)
  return report.build(config, s, _PROGRAMS.value)


def search(config, s) -> list[dict]:
  """Every candidate mesh: its peak and estimated update time; those that fit first, fastest first."""
  rows = []
  expert = len(tuple(config.mesh.shape)) == 4
  for shape in report.mesh_candidates(s.total_chips, expert):
    trial = config.copy_and_resolve_references()
    with trial.unlocked():
      trial.mesh.shape = shape
    plan = _plan(trial, s)
    seconds = report.update_seconds(plan)
    fits = None if plan.partial else plan.fits
    rows.append({"mesh": shape, "fits": fits, "partial": plan.partial, "peak": plan.peak,
                 "update_s": seconds, "plan": report.to_json(plan, trial)})
    what = "partial plan" if plan.partial else "fits" if plan.fits else "does not fit"
    print(f"mesh {shape}: peak {plan.peak / topology.GIB:.2f} GiB per chip ({what}), "
          f"update ≈ {seconds:.1f} s (compiler estimate, overlapped)", flush=True)
  rows.sort(key=lambda r: (r["fits"] is False, r["update_s"], r["peak"]))
  return rows


def check_output(path: str | None) -> None:
  """Fails before any compile when `--json` cannot be written."""
  if not path:
    return
  target = os.path.abspath(path)
  folder = os.path.dirname(target)
  if os.path.isdir(target) or not os.path.isdir(folder) or not os.access(folder, os.W_OK) or (
      os.path.exists(target) and not os.access(target, os.W_OK)):
    raise ValueError(f"--json={path}: cannot write there (is {folder} an existing, writable "
                     "folder?); give a writable file path.")


def main(argv):
  del argv
  cli_errors.quiet_chatty_libraries()
  try:
    config = _CONFIG.value
    s = topology.parse(_TOPOLOGY.value)
    check_output(_JSON.value)
    if _SEARCH.value:
      rows = search(config, s)
      print("\n| mesh | fits | peak (GiB per chip) | update (s, compiler estimate) |\n"
            "|---|---|---|---|")
      for r in rows:
        fits = "partial plan" if r["partial"] else "yes" if r["fits"] else "no"
        print(f"| {r['mesh']} | {fits} | {r['peak'] / topology.GIB:.2f} | {r['update_s']:.1f} |")
      out = rows
    else:
      note = recommended.mesh_advice(f"{config.method}:{config.get('preset')}", s,
                                     config.mesh.shape, config.lora.rank > 0)
      if note:
        print(note, flush=True)
      plan = _plan(config, s)
      print(report.render(plan, config))
      out = report.to_json(plan, config)
    if _JSON.value:
      with open(_JSON.value, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, default=str)
  except (OSError, ValueError, KeyError, RuntimeError) as e:
    cli_errors.fail(e)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config", "topology"])
  app.run(main, flags_parser=cli_errors.parse_flags)
