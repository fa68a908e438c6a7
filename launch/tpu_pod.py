"""TPU VM pods through gcloud: create (or reuse) a slice, copy and install the project on every
worker, run one scope_jax.main command on all workers, tail the log, delete the slice.

    python launch/tpu_pod.py up --name=spell-7b --zone=us-east5-a --accelerator=v5p-8 -- \
        --config=configs/spell.py:paper --workdir=gs://my-bucket/spell-7b \
        --config.model.source=hf:gs://my-bucket/Qwen2.5-7B-Instruct \
        --config.model.tokenizer=gs://my-bucket/Qwen2.5-7B-Instruct
    python launch/tpu_pod.py logs   --name=spell-7b --zone=us-east5-a
    python launch/tpu_pod.py delete --name=spell-7b --zone=us-east5-a

`up` reuses a READY slice of that name, else creates one (`--queued` through a queued resource,
`--spot` on spot capacity). With `--max_restarts=N` a run that ends because the slice was
preempted is started again on a fresh slice, up to N times; it resumes from its gs:// workdir.
Every worker runs with `SCOPE_JAX_DISTRIBUTED=auto`, so JAX finds the other workers itself.
`--dry-run` prints the gcloud commands instead of running them.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
import time

# This checkout's accelerators.py (standard library only), loaded by its path: the launcher runs
# with or without the package installed and never imports the package itself.
_SPEC = importlib.util.spec_from_file_location(
    "accelerators", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scope_jax", "accelerators.py"))
accelerators = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(accelerators)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REMOTE_DIR = "~/scope_jax"
REMOTE_LOG = "~/scope_jax.log"
TARBALL = "scope_jax-src.tgz"
READY, GONE = "READY", ("PREEMPTED", "TERMINATED", "")


class Shell:
  """Runs commands, or prints them (dry run) and answers as if each succeeded with no output."""

  def __init__(self, dry_run: bool):
    self.dry_run = dry_run

  def __call__(self, cmd: list[str], *, check: bool = True,
               capture: bool = False) -> tuple[int, str]:
    if self.dry_run:
      print(shlex.join(cmd))
      return 0, ""
    print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, text=True, capture_output=capture)
    if check and out.returncode:
      raise SystemExit(f"Command failed with status {out.returncode}: {shlex.join(cmd)}\n"
                       f"{(out.stderr or '')[-2000:]}")
    return out.returncode, (out.stdout or "").strip()


def where(a) -> list[str]:
  return [f"--zone={a.zone}"] + ([f"--project={a.project}"] if a.project else [])


def tpu(a, verb: str, *extra: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "tpu-vm", verb, a.name, *where(a), *extra]


def queued(a, verb: str, *extra: str) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", verb, a.name, *where(a), *extra]


def create_cmd(a) -> list[str]:
  s = accelerators.get(a.accelerator)
  version = a.runtime_version or s.runtime
  spot = ["--spot"] if a.spot else []
  if a.queued:
    return queued(a, "create", f"--node-id={a.name}", f"--accelerator-type={s.name}",
                  f"--runtime-version={version}", *spot)
  return tpu(a, "create", f"--accelerator-type={s.name}", f"--version={version}", *spot)


def delete_cmd(a) -> list[str]:
  return queued(a, "delete", "--force", "--quiet") if a.queued else tpu(a, "delete", "--quiet")


def state_cmd(a) -> list[str]:
  return tpu(a, "describe", "--format=value(state)")


def ssh(a, command: str, worker: str = "all") -> list[str]:
  return tpu(a, "ssh", f"--worker={worker}", f"--command={command}")


def setup_cmds(a) -> list[list[str]]:
  """The project's files packed here, copied to every worker and installed in a venv there."""
  # A fresh private directory per run: concurrent launches never share the archive, and no
  # symlink planted at a fixed /tmp path can redirect the write.
  folder = "<private temporary directory>" if a.dry_run else tempfile.mkdtemp(prefix="scope_jax-src-")
  local = os.path.join(folder, TARBALL)
  pack = ["tar", "-czf", local, "-C", a.source, "--exclude=.venv", "--exclude=.git",
          "--exclude=runs", "--exclude=__pycache__", "."]
  install = (f"set -e; rm -rf {REMOTE_DIR} && mkdir -p {REMOTE_DIR} && "
             f"tar -xzf ~/{TARBALL} -C {REMOTE_DIR} && python3 -m venv {REMOTE_DIR}/.venv && "
             f"{REMOTE_DIR}/.venv/bin/pip install -q -U pip && "
             f"{REMOTE_DIR}/.venv/bin/pip install -q {shlex.quote(a.jax_spec)} -e {REMOTE_DIR}")
  return [pack, tpu(a, "scp", local, f"{a.name}:~/{TARBALL}", "--worker=all"), ssh(a, install)]


def run_command(main_args: list[str]) -> str:
  """What every worker runs: scope_jax.main with JAX's own cluster detection, logged to a file."""
  main = shlex.join([".venv/bin/python", "-m", "scope_jax.main", *main_args])
  inner = (f"set -o pipefail; cd {REMOTE_DIR} && SCOPE_JAX_DISTRIBUTED=auto {main} 2>&1 | "
           f"tee -a {REMOTE_LOG}")
  return f"bash -c {shlex.quote(inner)}"


def ensure_slice(a, sh: Shell) -> bool:
  """Reuses a READY slice of this name or creates one; True when it was created (needs setup)."""
  code, state = sh(state_cmd(a), check=False, capture=True)
  if not sh.dry_run and code == 0 and state == READY:
    print(f"Reusing the READY slice {a.name}.", file=sys.stderr)
    return False
  if not sh.dry_run and code == 0 and state not in GONE:
    raise SystemExit(f"Slice {a.name} is {state}; wait until it is READY, or delete it.")
  if not sh.dry_run and code == 0:  # preempted or terminated: start over
    sh(delete_cmd(a))
  sh(create_cmd(a))
  if a.queued:
    wait_active(a, sh)
  return True


def wait_active(a, sh: Shell) -> None:
  """Polls the queued resource until its slice is ACTIVE."""
  cmd = queued(a, "describe", "--format=value(state.state)")
  while True:
    _, state = sh(cmd, check=False, capture=True)
    if sh.dry_run or state == "ACTIVE":
      return
    if state in ("FAILED", "SUSPENDED"):
      raise SystemExit(f"Queued resource {a.name} is {state}.")
    time.sleep(30)


def up(a, sh: Shell) -> int:
  """Create or reuse, set up, run; on preemption (with --max_restarts) a fresh slice resumes."""
  for attempt in range(a.max_restarts + 1):
    if ensure_slice(a, sh) or a.reinstall:
      for cmd in setup_cmds(a):
        sh(cmd)
    code, _ = sh(ssh(a, run_command(a.main_args)), check=False)
    if sh.dry_run and a.max_restarts:
      print(f"# if the run ends with the slice preempted: delete it, create, set up and run "
            f"again (up to {a.max_restarts} restarts); the run resumes from its gs:// workdir")
    if code == 0:
      if a.delete_after:
        sh(delete_cmd(a))
      return 0
    _, state = sh(state_cmd(a), check=False, capture=True)
    if state == READY or attempt == a.max_restarts:
      return code  # the run itself failed, or no restarts left
    print(f"Slice {a.name} is {state or 'gone'} (attempt {attempt + 1}); starting again.",
          file=sys.stderr)
  return 1


def parse_args(argv: list[str]) -> argparse.Namespace:
  main_args: list[str] = []
  if "--" in argv:
    argv, main_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("action", choices=("up", "create", "setup", "run", "logs", "delete"))
  p.add_argument("--name", required=True, help="TPU VM (and queued resource) name")
  p.add_argument("--zone", required=True)
  p.add_argument("--project", default="", help="GCP project (default: gcloud's)")
  p.add_argument("--accelerator", default="v5p-8", help="e.g. v5p-8, v5e-16, v6e-64")
  p.add_argument("--runtime_version", default="", help="TPU VM software (default per slice)")
  p.add_argument("--spot", action="store_true", help="spot capacity (preemptible)")
  p.add_argument("--queued", action="store_true", help="create through a queued resource")
  p.add_argument("--max_restarts", type=int, default=0, help="restarts after a preemption")
  p.add_argument("--delete_after", action="store_true", help="delete the slice after `up` succeeds")
  p.add_argument("--reinstall", action="store_true", help="copy and install even on a reused slice")
  p.add_argument("--source", default=ROOT, help="project directory copied to the workers")
  p.add_argument("--jax_spec", default="jax[tpu]", help="pip requirement for JAX on the workers")
  p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                 help="print the gcloud commands, run nothing")
  a = p.parse_args(argv)
  a.main_args = main_args
  if a.max_restarts < 0:
    p.error(f"--max_restarts={a.max_restarts}: use 0 (no restart) or more.")
  try:
    s = accelerators.get(a.accelerator)
    if a.action in ("up", "run"):
      if not main_args:
        p.error("no scope_jax.main flags after '--' (at least --config and --workdir).")
      accelerators.check_shared_workdir(main_args, s.hosts)
      accelerators.check_mesh(accelerators.mesh_shape_arg(main_args), s.chips, s.name)
  except ValueError as e:
    p.error(str(e))
  return a


def main(argv: list[str]) -> int:
  a = parse_args(argv)
  sh = Shell(a.dry_run)
  if a.action == "up":
    return up(a, sh)
  if a.action == "create":
    ensure_slice(a, sh)
  elif a.action == "setup":
    for cmd in setup_cmds(a):
      sh(cmd)
  elif a.action == "run":
    return sh(ssh(a, run_command(a.main_args)), check=False)[0]
  elif a.action == "logs":
    return sh(ssh(a, f"tail -n 200 -F {REMOTE_LOG}", worker="0"), check=False)[0]
  elif a.action == "delete":
    sh(delete_cmd(a))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
