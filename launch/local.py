"""Runs one command as N local processes of one multi-process JAX run, each with D CPU devices.

    python launch/local.py --num_processes=2 --devices_per_process=4 -- \
        python -m scope_jax.main --config=configs/spell.py --workdir=/tmp/spell_2x4

Each process gets a loopback coordinator on a free port, gloo CPU collectives and its id through
the environment that `scope_jax.distributed` reads (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID). Their output is streamed line by line with a `[p<i>]` prefix. When one process
fails the others are stopped and the launcher exits with its status; when one exits cleanly the
others get `--exit_grace` seconds to follow (a process stuck in a collective would wait forever),
then are stopped. SIGTERM and SIGINT are passed on to every process, and the processes die with
the launcher even when it is killed outright (Linux: PR_SET_PDEATHSIG). `--dry-run` prints each
process's environment and command instead.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

DEVICE_FLAG = "--xla_force_host_platform_device_count"
GRACE_SECONDS = 10.0  # after SIGTERM, before SIGKILL
EXIT_GRACE_SECONDS = 300.0  # after one process exits 0, for the others to finish
_PR_SET_PDEATHSIG = 1


def free_port() -> int:
  """A TCP port on the loopback interface that nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def xla_flags(existing: str, devices: int) -> str:
  """`existing` XLA_FLAGS with the host-platform device count set to `devices` (replaced, never
  duplicated, since each process must see exactly that many)."""
  kept = [f for f in existing.split() if not f.startswith(DEVICE_FLAG)]
  return " ".join(kept + [f"{DEVICE_FLAG}={devices}"])


def process_env(base: dict, *, process_id: int, num_processes: int, devices: int,
                port: int) -> dict:
  """The environment of process `process_id`: CPU devices, gloo, and the coordinator."""
  env = dict(base)
  env.update({
      "XLA_FLAGS": xla_flags(base.get("XLA_FLAGS", ""), devices),
      "JAX_PLATFORMS": "cpu",
      "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
      "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
      "JAX_NUM_PROCESSES": str(num_processes),
      "JAX_PROCESS_ID": str(process_id),
      "PYTHONUNBUFFERED": "1",  # lines arrive as they are written
  })
  return env


LAUNCH_VARS = ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_CPU_COLLECTIVES_IMPLEMENTATION",
               "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def describe(env: dict, command: list[str]) -> str:
  """One shell line: the variables the launcher sets, then the command."""
  assigns = " ".join(f"{k}={shlex.quote(env[k])}" for k in LAUNCH_VARS)
  return f"{assigns} {shlex.join(command)}"


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
  if "--" not in argv:
    raise SystemExit("Usage: launch/local.py --num_processes=N --devices_per_process=D [--dry-run] "
                     "-- <command>  (the command after a lone '--').")
  split = argv.index("--")
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--num_processes", type=int, default=2, help="processes to start")
  parser.add_argument("--devices_per_process", type=int, default=4, help="CPU devices each")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
  parser.add_argument("--exit_grace", type=float, default=EXIT_GRACE_SECONDS,
                      help="seconds the others get after one process exits 0")
  parser.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                      help="print each process's environment and command, start nothing")
  args = parser.parse_args(argv[:split])
  command = argv[split + 1:]
  if not command:
    parser.error("no command after '--'.")
  if not args.exit_grace >= 0:
    parser.error(f"--exit_grace={args.exit_grace} must be a number of seconds, at least 0.")
  if args.num_processes < 1 or args.devices_per_process < 1:
    parser.error(f"--num_processes={args.num_processes} and --devices_per_process="
                 f"{args.devices_per_process} must both be at least 1.")
  return args, command


def _stream(proc: subprocess.Popen, prefix: str, out) -> None:
  for line in iter(proc.stdout.readline, b""):
    out.write(prefix + line.decode("utf-8", "replace"))
    out.flush()


def _die_with(parent: int):
  """The child's pre-exec hook: SIGKILL when the launcher dies, however it dies (Linux)."""
  def hook():
    try:
      ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux glibc: SIGTERM/SIGINT forwarding still holds
      return
    if os.getppid() != parent:  # the launcher died before the hook ran
      os._exit(1)
  return hook


class Group:
  """The started processes: streamed, watched, stopped together."""

  def __init__(self, commands: list[tuple[dict, list[str]]], exit_grace: float = EXIT_GRACE_SECONDS):
    self.exit_grace = exit_grace
    # Every process starts before any streaming thread: the pre-exec hook runs single-threaded.
    self.procs: list[subprocess.Popen] = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         preexec_fn=_die_with(os.getpid()))
        for env, command in commands]
    self.threads: list[threading.Thread] = []
    for i, proc in enumerate(self.procs):
      thread = threading.Thread(target=_stream, args=(proc, f"[p{i}] ", sys.stdout), daemon=True)
      thread.start()
      self.threads.append(thread)

  def signal(self, signum: int) -> None:
    for proc in self.procs:
      if proc.poll() is None:
        proc.send_signal(signum)

  def stop(self) -> None:
    """SIGTERM to every process still running, SIGKILL to those alive after the grace period."""
    self.signal(signal.SIGTERM)
    deadline = time.time() + GRACE_SECONDS
    while any(p.poll() is None for p in self.procs) and time.time() < deadline:
      time.sleep(0.1)
    self.signal(signal.SIGKILL)

  def wait(self) -> int:
    """0 when every process exits 0; else the first failure's status, after stopping the rest.
    Once one process has exited 0 the others have `exit_grace` seconds; then they are stopped
    and the launcher fails (status 124, as `timeout` does)."""
    clean_since = None
    while True:
      codes = [p.poll() for p in self.procs]
      failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
      if failed:
        i, code = failed[0]
        if any(c is None for c in codes):
          print(f"[launch] process {i} exited with status {code}; stopping the others.",
                file=sys.stderr, flush=True)
          self.stop()
        return code if code > 0 else 128 - code  # killed by signal n: 128 + n, as a shell does
      if all(c == 0 for c in codes):
        return 0
      if clean_since is None and 0 in codes:
        clean_since = time.time()
      if clean_since is not None and time.time() - clean_since > self.exit_grace:
        running = [i for i, c in enumerate(codes) if c is None]
        print(f"[launch] processes {running} still run {self.exit_grace:.0f} s after process "
              f"{codes.index(0)} exited cleanly (stuck in a collective?); stopping them.",
              file=sys.stderr, flush=True)
        self.stop()
        return 124
      time.sleep(0.1)

  def join_output(self) -> None:
    for p in self.procs:
      p.wait()
    for t in self.threads:
      t.join(timeout=5)


def main(argv: list[str]) -> int:
  args, command = parse_args(argv)
  port = args.port or free_port()
  commands = [(process_env(os.environ, process_id=i, num_processes=args.num_processes,
                           devices=args.devices_per_process, port=port), command)
              for i in range(args.num_processes)]
  if args.dry_run:
    for i, (env, cmd) in enumerate(commands):
      print(f"[p{i}] {describe(env, cmd)}")
    return 0
  # A signal that lands while the processes start is kept and forwarded once they exist.
  pending: list[int] = []
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda signum, frame: pending.append(signum))
  group = Group(commands, exit_grace=args.exit_grace)
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda signum, frame: group.signal(signum))
  for signum in pending:
    group.signal(signum)
  code = group.wait()
  group.join_output()
  return code


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
