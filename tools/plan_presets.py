"""Every paper preset planned on the TPU slice `launch/README.md` recommends for it: the table in
that README is this script's output.

    python tools/plan_presets.py --out=/tmp/plans --jobs=2         # all ten, one process each
    python tools/plan_presets.py --out=/tmp/plans --presets=asl:paper
    python tools/plan_presets.py --out=/tmp/train --programs=train_step      # partial plans
    python tools/plan_presets.py --out=/tmp/decode --programs=engine/decode
    python tools/plan_presets.py --targets=/tmp/train,/tmp/decode        # the roofline table
    python tools/plan_presets.py --out=/tmp/lora --lora --jobs=2   # rank-64 adapters, LORA_SLICES

Each preset runs `python -m scope_jax.plan ... --json=<out>/<method>_<preset>.json`; the
markdown table is printed from those files at the end (and by `--table_only`). A preset whose
plan fails has its old JSON removed first, so it gets no row, and the script exits 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import subprocess
import sys
import time

from scope_jax.plan.recommended import LORA_RANK, LORA_SLICES, SLICES

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def slice_args(spec: str, lora: bool) -> list[str]:
  """The plan's slice, mesh and overrides for a preset: its full-training slice, or with `lora`
  its rank-64 adapters on the smallest slice they fit (`LORA_SLICES`)."""
  if not lora:
    topo, mesh = SLICES[spec]
    return [f"--topology={topo}", f"--config.mesh.shape={mesh}"]
  topo, mesh, overrides = LORA_SLICES[spec]
  return [f"--topology={topo}", f"--config.mesh.shape={mesh}", f"--config.lora.rank={LORA_RANK}",
          *(f"--config.{key}={value}" for key, value in overrides.items())]


def plan(spec: str, out: pathlib.Path, extra=(), lora: bool = False) -> dict:
  """Plans one preset into `<out>/<method>_<preset>.json`; {} when the plan failed (no file)."""
  method, preset = spec.split(":")
  path = out / f"{method}_{preset}.json"
  path.unlink(missing_ok=True)  # a failed plan must not leave an earlier run's row behind
  args = slice_args(spec, lora)
  topo = args[0].split("=", 1)[1]
  cmd = [sys.executable, "-m", "scope_jax.plan", f"--config=configs/{method}.py:{preset}",
         *args, f"--json={path}", *extra]
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode:
    print(f"{spec}: plan failed:\n{proc.stderr[-3000:]}", flush=True)
    return {}
  print(f"{spec} on {topo}: {time.perf_counter() - start:.0f} s", flush=True)
  return json.loads(path.read_text())


def _est(program: dict, key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
  value = program.get(key)
  return "—" if value is None else fmt.format(value * scale)


def _floor_ratio(program: dict) -> str:
  floor = program.get("step_seconds_floor")
  return f"{program['step_seconds_overlapped'] / floor:.2f}×" if floor else "—"


def row(spec: str, p: dict) -> str:
  """One preset's table row: memory per chip, the verdict, and the compiler estimates of its
  largest train step (per update) and its decode chunk program (per decode step)."""
  programs = [q for q in p["programs"] if not q.get("error")]
  train = max((q for q in programs if q["kind"] == "train"), key=lambda q: q.get("flops") or 0,
              default=None)
  decode = next((q for q in programs if q["name"] == "engine/decode"),
                next((q for q in programs if q["kind"] == "decode"), None))
  peak = max(p["update_peak"], p["rollout_peak"], p.get("refresh_peak", 0))
  verdict = ("partial plan" if p.get("partial") else
             f"fits, {(p['hbm_bytes'] - peak) / GIB:.1f} to spare" if p["fits"] else
             f"**does not fit** ({(peak - p['hbm_bytes']) / GIB:.1f} over)")
  cells = [spec, f"{p['slice']} `{tuple(p['mesh'].values())}`",
           f"{sum(p['resident'].values()) / GIB:.1f}", f"{p.get('kv_caches', p['kv_cache']) / GIB:.1f}",
           f"{p['update_peak'] / GIB:.1f}", f"{p['rollout_peak'] / GIB:.1f}",
           f"{p['hbm_bytes'] / GIB:.0f}", verdict]
  if train:
    ratio = train["flops"] / train["flops_minimum"] if train.get("flops_minimum") else None
    ici = (train["ici_bytes_per_chip"] / train["ici_bytes_per_chip_minimum"]
           if train.get("ici_bytes_per_chip_minimum") else None)
    cells.append(f"{'—' if ratio is None else f'{ratio:.2f}×'} / "
                 f"{'—' if ici is None else f'{ici:.1f}×'} / {_est(train, 'mfu', 100, '{:.0f}%')} / "
                 f"{_est(train, 'step_seconds_overlapped', 1, '{:,.0f} s')} "
                 f"({_floor_ratio(train)} floor)")
  else:
    cells.append("—")
  if decode:
    ratio = (decode["hbm_bytes"] / decode["hbm_bytes_minimum"]
             if decode.get("hbm_bytes_minimum") else None)
    cells.append(f"{'—' if ratio is None else f'{ratio:.2f}×'} / "
                 f"{_est(decode, 'step_seconds_overlapped', 1e3, '{:.1f} ms')}")
  else:
    cells.append("—")
  return "| " + " | ".join(cells) + " |"


def _worst(programs: list[dict], kind: str, key: str, minimum: str) -> dict | None:
  """The program of `kind` farthest above its minimum in `key` (the one a target must hold); of
  programs at the same ratio (to 2 decimals, as printed), the largest."""
  done = [q for q in programs if q["kind"] == kind and not q.get("error") and q.get(minimum)]
  return max(done, key=lambda q: (round(q[key] / q[minimum], 2), q[key]), default=None)


def targets(dirs: list[pathlib.Path]) -> None:
  """Per preset, the compiler estimates against the roofline targets, from the plans in `dirs`
  (later directories win): train FLOPs and ICI bytes over their minimums, the update's
  overlapped time over its floor and MFU (every train step's worst), and decode HBM bytes per
  step over the minimum (the engine's chunk program)."""
  plans: dict[str, dict] = {}
  for d in dirs:
    for path in sorted(d.glob("*.json")):
      new, old = json.loads(path.read_text()), plans.get(path.stem, {})
      names = {q["name"] for q in new["programs"]}  # a later plan's program replaces an earlier's
      new["programs"] = [q for q in old.get("programs", []) if q["name"] not in names] + \
          new["programs"]
      new["update_peak"] = max(new["update_peak"], old.get("update_peak", 0))
      new["rollout_peak"] = max(new.get("rollout_peak", 0), old.get("rollout_peak", 0))
      plans[path.stem] = new
  print("| preset | slice | train FLOPs / minimum | train ICI / minimum | update overlapped "
        "(/ floor) | MFU | update peak | decode HBM bytes / minimum | decode step |")
  print("|---|---|---|---|---|---|---|---|---|")
  for stem, p in plans.items():
    progs = p["programs"]
    flops = _worst(progs, "train", "flops", "flops_minimum")
    ici = _worst(progs, "train", "ici_bytes_per_chip", "ici_bytes_per_chip_minimum")
    time = _worst(progs, "train", "step_seconds_overlapped", "step_seconds_floor")
    decode = next((q for q in progs if q["name"] == "engine/decode" and not q.get("error")), None)
    ratio = lambda q, a, b: f"{q[a] / q[b]:.2f}×" if q else "—"
    cells = [stem.replace("_", ":", 1), p["slice"], ratio(flops, "flops", "flops_minimum"),
             ratio(ici, "ici_bytes_per_chip", "ici_bytes_per_chip_minimum"),
             f"{time['step_seconds_overlapped']:,.0f} s ({ratio(time, 'step_seconds_overlapped', 'step_seconds_floor')})"
             if time else "—", _est(time, "mfu", 100, "{:.0f}%") if time else "—",
             f"{p['update_peak'] / GIB:.1f} GiB" if flops else "—",
             ratio(decode, "hbm_bytes", "hbm_bytes_minimum"),
             _est(decode, "step_seconds_overlapped", 1e3, "{:.1f} ms") if decode else "—"]
    print("| " + " | ".join(cells) + " |")
  print("\nMemory from the same plans (GiB per chip; a phase's peak counts the programs planned:"
        " the rollout's, decode only, not prefill):\n")
  print("| preset | slice, mesh | resident | KV caches | update peak | rollout peak (decode) | HBM | "
        "verdict (planned programs) |")
  print("|---|---|---|---|---|---|---|---|")
  for stem, p in plans.items():
    if "resident" not in p:
      continue
    peak = max(p["update_peak"], p["rollout_peak"], p.get("refresh_peak", 0))
    verdict = (f"fits, {(p['hbm_bytes'] - peak) / GIB:.1f} to spare" if peak <= p["hbm_bytes"]
               else f"**does not fit** ({(peak - p['hbm_bytes']) / GIB:.1f} over)")
    print(f"| {stem.replace('_', ':', 1)} | {p['slice']} `{tuple(p['mesh'].values())}` | "
          f"{sum(p['resident'].values()) / GIB:.1f} | "
          f"{p.get('kv_caches', p['kv_cache']) / GIB:.1f} | {p['update_peak'] / GIB:.1f} | "
          f"{p['rollout_peak'] / GIB:.1f} | {p['hbm_bytes'] / GIB:.0f} | {verdict} |")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path)
  parser.add_argument("--presets", default=",".join(SLICES))
  parser.add_argument("--table_only", action="store_true")
  parser.add_argument("--lora", action="store_true",
                      help=f"rank-{LORA_RANK} LoRA adapters, on each preset's LORA_SLICES slice")
  parser.add_argument("--jobs", type=int, default=1, help="presets planned at once")
  parser.add_argument("--programs", default="",
                      help="plan only these programs (a partial plan: no verdict), e.g. train_step")
  parser.add_argument("--targets", default="",
                      help="comma-separated plan directories: print the roofline targets table")
  args = parser.parse_args()
  if args.targets:
    targets([pathlib.Path(d) for d in args.targets.split(",")])
    return
  if args.out is None:
    sys.exit("Error: --out is required (the directory the plans are written to).")
  args.out.mkdir(parents=True, exist_ok=True)
  specs = [s.strip() for s in args.presets.split(",") if s.strip()]
  unknown = [s for s in specs if s not in SLICES]
  if unknown:
    sys.exit(f"Error: unknown presets {', '.join(unknown)}; choose from {', '.join(SLICES)}.")
  failed = []
  if not args.table_only:
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      extra = [f"--programs={args.programs}"] if args.programs else []
      results = list(pool.map(lambda spec: plan(spec, args.out, extra, args.lora), specs))
    failed = [spec for spec, r in zip(specs, results) if not r]
  plans = {}
  for spec in specs:
    method, preset = spec.split(":")
    path = args.out / f"{method}_{preset}.json"
    if spec not in failed and path.exists():
      plans[spec] = json.loads(path.read_text())
  print("\n| preset | slice, mesh | resident | KV caches | update peak | rollout peak | HBM | "
        "verdict | train: FLOPs vs minimum / ICI vs minimum / MFU / update, overlapped (vs floor) (est.) | "
        "decode: HBM bytes vs minimum / step (est.) |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for spec, p in plans.items():
    print(row(spec, p))
  if failed:
    print(f"\nPlan failed for: {', '.join(failed)} (no row).", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  main()
