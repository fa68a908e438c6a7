"""Every paper preset planned on the TPU slice `launch/README.md` recommends for it: the table in
that README is this script's output.

    python tools/plan_presets.py --out=/tmp/plans --jobs=2         # all ten, one process each
    python tools/plan_presets.py --out=/tmp/plans --presets=asl:paper

Each preset runs `python -m scope_jax.plan ... --json=<out>/<method>_<preset>.json`; the
markdown table is printed from those files at the end (and by `--table_only`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import pathlib
import subprocess
import sys
import time

from scope_jax.plan.recommended import SLICES

ROOT = pathlib.Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def plan(spec: str, out: pathlib.Path, extra=()) -> dict:
  method, preset = spec.split(":")
  topo, mesh = SLICES[spec]
  path = out / f"{method}_{preset}.json"
  cmd = [sys.executable, "-m", "scope_jax.plan", f"--config=configs/{method}.py:{preset}",
         f"--topology={topo}", f"--config.mesh.shape={mesh}", f"--json={path}", *extra]
  start = time.perf_counter()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
  if proc.returncode:
    print(f"{spec}: plan failed:\n{proc.stderr[-3000:]}", flush=True)
    return {}
  print(f"{spec} on {topo}: {time.perf_counter() - start:.0f} s", flush=True)
  return json.loads(path.read_text())


def row(spec: str, p: dict) -> str:
  resident = sum(p["resident"].values())
  train = max((r for r in p["train"]), key=lambda r: r["compiled_flops"], default=None)
  decode = next(iter(p["decode"]), None)
  verdict = (f"fits, {(p['hbm_bytes'] - max(p['update_peak'], p['rollout_peak'])) / GIB:.1f} "
             "to spare" if p["fits"] else
             f"**does not fit** ({(max(p['update_peak'], p['rollout_peak']) - p['hbm_bytes']) / GIB:.1f} over)")
  cells = [spec, f"{p['slice']} `{tuple(p['mesh'].values())}`", f"{resident / GIB:.1f}",
           f"{p['kv_cache'] / GIB:.1f}", f"{p['update_peak'] / GIB:.1f}",
           f"{p['rollout_peak'] / GIB:.1f}", f"{p['hbm_bytes'] / GIB:.0f}", verdict]
  if train:
    cells.append(f"{train['ratio']:.2f}× / {100 * train['mfu']:.0f}%")
  if decode:
    cells.append(f"{decode['ratio']:.2f}× / {decode['seconds'] * 1e3:.1f} ms")
  return "| " + " | ".join(cells) + " |"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", type=pathlib.Path, required=True)
  parser.add_argument("--presets", default=",".join(SLICES))
  parser.add_argument("--table_only", action="store_true")
  parser.add_argument("--jobs", type=int, default=1, help="presets planned at once")
  args = parser.parse_args()
  args.out.mkdir(parents=True, exist_ok=True)
  specs = args.presets.split(",")
  if not args.table_only:
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      list(pool.map(lambda spec: plan(spec, args.out), specs))
  plans = {}
  for spec in specs:
    method, preset = spec.split(":")
    path = args.out / f"{method}_{preset}.json"
    if path.exists():
      plans[spec] = json.loads(path.read_text())
  print("\n| preset | slice, mesh | resident | KV cache | update peak | rollout peak | HBM | "
        "verdict | train FLOPs vs model / MFU (est.) | decode bytes vs minimum / step (est.) |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for spec, p in plans.items():
    print(row(spec, p))


if __name__ == "__main__":
  main()
