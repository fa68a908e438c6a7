"""launch/: every script's dry run prints commands that carry the environment scope_jax reads
(checked by feeding it to `distributed.init_args`), and the local launcher streams, fails and
forwards signals as a process group."""

import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest
import yaml

from launch import tpu_pod
from launch.gke import render
from scope_jax import distributed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(ROOT, "launch")
MAIN_ARGS = ["--config=configs/spell.py:paper", "--workdir=gs://bucket/spell-7b",
             "--config.mesh.shape=(1,4,4)"]


def _script(name, *args, env=None, timeout=60):
  return subprocess.run([sys.executable, os.path.join(LAUNCH, name), *args], capture_output=True,
                        text=True, cwd=ROOT, env=env, timeout=timeout)


def _assignments(line: str) -> tuple[dict, list[str]]:
  """(VAR=value assignments, the command) of one shell line."""
  words, env = shlex.split(line), {}
  while words and "=" in words[0] and not words[0].startswith("-"):
    key, value = words.pop(0).split("=", 1)
    env[key] = value
  return env, words


# ------------------------------------------------------------------------------------ local.py

def test_local_dry_run_sets_what_the_code_reads():
  out = _script("local.py", "--num_processes=3", "--devices_per_process=2", "--port=23456",
                "--dry-run", "--", "python", "-m", "scope_jax.main", "--workdir=/tmp/x")
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert len(lines) == 3
  for i, line in enumerate(lines):
    assert line.startswith(f"[p{i}] ")
    env, command = _assignments(line[len(f"[p{i}] "):])
    assert command == ["python", "-m", "scope_jax.main", "--workdir=/tmp/x"]
    assert distributed.init_args(env) == {"coordinator_address": "127.0.0.1:23456",
                                          "num_processes": 3, "process_id": i}
    assert env["JAX_CPU_COLLECTIVES_IMPLEMENTATION"] == "gloo" and env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_FLAGS"].split().count("--xla_force_host_platform_device_count=2") == 1
    assert "device_count=8" not in env["XLA_FLAGS"]  # the test platform's own count is replaced


def test_local_usage_errors():
  assert "lone '--'" in _script("local.py", "--num_processes=2").stderr
  out = _script("local.py", "--num_processes=0", "--", "true")
  assert out.returncode == 2 and "must both be at least 1" in out.stderr


def test_local_streams_prefixed_lines_and_stops_everyone_when_one_fails():
  code = ("import os, sys, time\n"
          "i = int(os.environ['JAX_PROCESS_ID'])\n"
          "print('hello from', i, os.environ['JAX_NUM_PROCESSES'], flush=True)\n"
          "if i == 1: sys.exit(3)\n"
          "time.sleep(120)\n")
  start = time.time()
  out = _script("local.py", "--num_processes=2", "--devices_per_process=1", "--",
                sys.executable, "-c", code, timeout=60)
  assert out.returncode == 3
  assert time.time() - start < 30  # process 0 was stopped, not waited for
  assert "[p0] hello from 0 2" in out.stdout and "[p1] hello from 1 2" in out.stdout
  assert "process 1 exited with status 3; stopping the others" in out.stderr


def test_local_forwards_sigterm_to_every_process():
  code = ("import os, signal, sys, time\n"
          "def bye(*_):\n"
          "  print('got SIGTERM', flush=True); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, bye)\n"
          "print('ready', flush=True)\n"
          "time.sleep(120)\n")
  proc = subprocess.Popen([sys.executable, os.path.join(LAUNCH, "local.py"), "--num_processes=2",
                           "--devices_per_process=1", "--", sys.executable, "-c", code],
                          stdout=subprocess.PIPE, text=True, cwd=ROOT)
  seen = []
  while sum("ready" in line for line in seen) < 2:
    seen.append(proc.stdout.readline())
  proc.send_signal(signal.SIGTERM)
  try:
    rest, _ = proc.communicate(timeout=30)
  except subprocess.TimeoutExpired:
    proc.kill()
    rest, _ = proc.communicate()
    raise AssertionError(f"the launcher still ran 30 s after SIGTERM; it wrote {seen + [rest]}")
  assert proc.returncode == 0, (proc.returncode, seen, rest)
  assert "[p0] got SIGTERM" in rest and "[p1] got SIGTERM" in rest, (seen, rest)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not running
    return f.read().split(")")[-1].split()[0] != "Z"


def test_local_children_die_with_a_killed_launcher():
  """SIGKILL cannot be forwarded: the children must not outlive the launcher as orphans."""
  code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(120)"
  proc = subprocess.Popen([sys.executable, os.path.join(LAUNCH, "local.py"), "--num_processes=2",
                           "--devices_per_process=1", "--", sys.executable, "-c", code],
                          stdout=subprocess.PIPE, text=True, cwd=ROOT)
  pids = []
  while len(pids) < 2:
    line = proc.stdout.readline()
    if " pid " in line:
      pids.append(int(line.split()[-1]))
  proc.kill()
  proc.wait(timeout=10)
  deadline = time.time() + 10
  while any(_alive(p) for p in pids) and time.time() < deadline:
    time.sleep(0.1)
  assert not any(_alive(p) for p in pids), pids


def test_local_a_clean_exit_starts_a_bounded_wait_for_the_others():
  """Process 0 finishes; process 1 hangs (as in a collective): the launcher stops it and fails."""
  code = ("import os, time\n"
          "if os.environ['JAX_PROCESS_ID'] == '1': time.sleep(120)\n")
  start = time.time()
  out = _script("local.py", "--num_processes=2", "--devices_per_process=1", "--exit_grace=2",
                "--", sys.executable, "-c", code, timeout=60)
  assert out.returncode == 124, out.stderr
  assert time.time() - start < 30
  assert "processes [1] still run 2 s after process 0 exited cleanly" in out.stderr


# ---------------------------------------------------------------------------------- tpu_pod.py

def _remote_command(dry_run_stdout: str) -> str:
  """The --command of the ssh line that runs scope_jax.main on every worker."""
  for line in dry_run_stdout.splitlines():
    if " ssh " in line and "scope_jax.main" in line:
      words = shlex.split(line)
      assert "--worker=all" in words
      return next(w for w in words if w.startswith("--command=")).split("=", 1)[1]
  raise AssertionError(f"no run command in:\n{dry_run_stdout}")


def test_tpu_pod_up_dry_run():
  out = _script("tpu_pod.py", "up", "--name=spell-7b", "--zone=us-east5-a",
                "--accelerator=v5e-16", "--dry-run", "--", *MAIN_ARGS)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  create = next(shlex.split(line) for line in lines if " create " in line)
  assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
  assert "--accelerator-type=v5litepod-16" in create and "--zone=us-east5-a" in create
  assert "--version=v2-alpha-tpuv5-lite" in create and "--spot" not in create
  assert any(" scp " in line and "--worker=all" in line for line in lines)
  install = next(line for line in lines if "pip install" in line)
  assert "--worker=all" in install and "jax[tpu]" in install and "-e ~/scope_jax" in install
  inner = shlex.split(_remote_command(out.stdout))  # bash -c '<script>'
  assert inner[:2] == ["bash", "-c"] and "set -o pipefail" in inner[2]
  env, command = _assignments(inner[2].split("&&", 1)[1].split("2>&1")[0].strip())
  assert distributed.init_args(env) == {}  # JAX finds the workers itself
  assert command == [".venv/bin/python", "-m", "scope_jax.main", *MAIN_ARGS]
  assert "tee -a ~/scope_jax.log" in inner[2]


def test_tpu_pod_queued_spot_with_restarts_and_other_actions():
  out = _script("tpu_pod.py", "up", "--name=n", "--zone=z", "--project=p", "--accelerator=v6e-64",
                "--queued", "--spot", "--max_restarts=5", "--delete_after", "--dry-run", "--",
                "--config=configs/spell.py:paper", "--workdir=gs://b/r")
  assert out.returncode == 0, out.stderr
  create = next(shlex.split(line) for line in out.stdout.splitlines() if " create " in line)
  assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources", "create", "n"]
  assert {"--node-id=n", "--accelerator-type=v6e-64", "--runtime-version=v2-alpha-tpuv6e",
          "--spot", "--project=p"} <= set(create)
  assert "queued-resources describe n" in out.stdout  # waits for ACTIVE
  assert "up to 5 restarts" in out.stdout and "resumes from its gs:// workdir" in out.stdout
  logs = _script("tpu_pod.py", "logs", "--name=n", "--zone=z", "--dry-run")
  assert "--worker=0" in logs.stdout and "tail -n 200 -F ~/scope_jax.log" in logs.stdout
  delete = _script("tpu_pod.py", "delete", "--name=n", "--zone=z", "--queued", "--dry-run")
  assert shlex.split(delete.stdout)[:6] == ["gcloud", "compute", "tpus", "queued-resources",
                                            "delete", "n"]


@pytest.mark.parametrize("args, message", [
    (["--workdir=/tmp/run"], "local to each host, but this slice has 4 hosts"),
    (["--workdir=gs://b/r", "--config.mesh.shape=(1,3,1)"], "does not fit v5litepod-16's 16 chips"),
    ([], "no scope_jax.main flags"),
])
def test_tpu_pod_refuses_what_cannot_run_before_creating_anything(args, message):
  out = _script("tpu_pod.py", "up", "--name=n", "--zone=z", "--accelerator=v5e-16", "--dry-run",
                "--", *args)
  assert out.returncode == 2 and message in out.stderr and not out.stdout


def test_tpu_pod_single_host_slice_accepts_a_local_workdir():
  out = _script("tpu_pod.py", "run", "--name=n", "--zone=z", "--accelerator=v5p-8", "--dry-run",
                "--", "--config=configs/spell.py", "--workdir=/home/me/run")
  assert out.returncode == 0, out.stderr
  assert "--workdir=/home/me/run" in _remote_command(out.stdout)


# ------------------------------------------------------------------------------------------ GKE

def test_gke_manifest_dry_run():
  out = _script(os.path.join("gke", "render.py"), "--name=spell-7b", "--accelerator=v5e-16",
                "--image=registry/scope-jax:1", "--spot", "--dry-run", "--", *MAIN_ARGS)
  assert out.returncode == 0, out.stderr
  assert "# kubectl apply -f -" in out.stdout
  manifest = yaml.safe_load(out.stdout)
  assert manifest["kind"] == "JobSet" and manifest["metadata"]["name"] == "spell-7b"
  job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
  assert job["parallelism"] == job["completions"] == 4 and job["completionMode"] == "Indexed"
  pod = job["template"]["spec"]
  assert pod["nodeSelector"] == {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
                                 "cloud.google.com/gke-tpu-topology": "4x4",
                                 "cloud.google.com/gke-spot": "true"}
  container = pod["containers"][0]
  assert container["command"] == ["python", "-m", "scope_jax.main", *MAIN_ARGS]
  assert container["resources"]["limits"]["google.com/tpu"] == 4
  env = {e["name"]: e for e in container["env"]}
  index = env[distributed.ENV_PROCESS_ID]["valueFrom"]["fieldRef"]["fieldPath"]
  assert index == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
  for i in range(4):  # what each pod sees once Kubernetes fills in its index
    seen = {k: e.get("value", str(i)) for k, e in env.items()}
    assert distributed.init_args(seen) == {
        "coordinator_address": "spell-7b-slice-0-0.spell-7b:12355", "num_processes": 4,
        "process_id": i}


def test_gke_refuses_a_local_workdir_on_several_hosts():
  out = _script(os.path.join("gke", "render.py"), "--name=n", "--accelerator=v6e-64",
                "--image=i", "--dry-run", "--", "--workdir=/tmp/run")
  assert out.returncode == 2 and "16 hosts" in out.stderr


@pytest.mark.parametrize("flag,value,match", [
    ("--image", "registry/x:1\n              securityContext: {privileged: true}", "--image="),
    ("--image", "registry/x:1 extra", "--image="),
    ("--workdir_in_image", "/app\n  hostNetwork: true", "--workdir_in_image="),
    ("--name", "Spell_7B", "must be a DNS label"), ("--name", "a\nb", "must be a DNS label")])
def test_gke_refuses_values_that_would_change_the_manifest(flag, value, match):
  """A newline in --image once added `securityContext: {privileged: true}` to the pod."""
  args = {"--name": "n", "--image": "i", "--workdir_in_image": "/app", flag: value}
  out = _script(os.path.join("gke", "render.py"), "--accelerator=v5p-8", "--dry-run",
                *[f"{k}={v}" for k, v in args.items()], "--", "--workdir=gs://b/r")
  assert out.returncode == 2 and match in out.stderr and "privileged" not in out.stdout


def test_gke_quotes_what_it_copies_into_the_manifest():
  manifest = yaml.safe_load(render.render("n", "v5p-8", "registry/x:1#not-a-comment",
                                          ["--workdir=gs://b/r"], workdir_in_image="/app: x"
                                          .replace(" ", "")))
  container = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
      "containers"][0]
  assert container["image"] == "registry/x:1#not-a-comment"
  assert container["workingDir"] == "/app:x"


# ---------------------------------------------------------------------------------------- Slurm

def _fake_slurm(tmp_path):
  """scontrol, srun (runs the task once per SLURM_PROCID) and a python that prints what
  scope_jax.distributed reads, so the script runs here as it would on a cluster."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  files = {
      "scontrol": "#!/bin/bash\necho gpu-node-3\necho gpu-node-4\n",
      "srun": ("#!/bin/bash\nwhile [[ \"$1\" == --* ]]; do shift; done\n"
               "for ((i = 0; i < SLURM_NTASKS; i++)); do\n"
               "  SLURM_PROCID=$i \"$@\" || exit $?\n"
               "done\n"),
      "fake_python": (f"#!/bin/bash\nexec {shlex.quote(sys.executable)} -c "
                      "'import json, os, sys; from scope_jax import distributed; "
                      "print(json.dumps([os.getcwd(), distributed.init_args(os.environ), "
                      "sys.argv[1:]]))' \"$@\"\n"),
  }
  for name, text in files.items():
    (bin_dir / name).write_text(text)
    (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
  return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
              SLURM_JOB_NODELIST="gpu-node-[3-4]", SLURM_NTASKS="2", SCOPE_JAX_DIR=ROOT,
              SCOPE_JAX_PYTHON=str(bin_dir / "fake_python"), PYTHONPATH=ROOT)


def test_slurm_dry_run_and_run_set_what_the_code_reads(tmp_path):
  env = _fake_slurm(tmp_path)
  script = os.path.join(LAUNCH, "slurm.sbatch")
  dry = subprocess.run(["bash", script, "--dry-run", *MAIN_ARGS], capture_output=True, text=True,
                       env=env, timeout=60)
  assert dry.returncode == 0, dry.stderr
  first, second, command = dry.stdout.splitlines()
  seen = {**_assignments(first)[0], "JAX_PROCESS_ID": "1"}
  assert distributed.init_args(seen)["num_processes"] == 2
  assert "JAX_COORDINATOR_ADDRESS=gpu-node-3:12355" in first and "SLURM_PROCID" in second
  words = shlex.split(command)
  assert words[:2] == ["srun", "--kill-on-bad-exit=1"] and words[-len(MAIN_ARGS):] == MAIN_ARGS
  run = subprocess.run(["bash", script, *MAIN_ARGS], capture_output=True, text=True, env=env,
                       timeout=120)
  assert run.returncode == 0, run.stderr
  tasks = [json.loads(line) for line in run.stdout.splitlines()]
  assert [t[1] for t in tasks] == [{"coordinator_address": "gpu-node-3:12355", "num_processes": 2,
                                    "process_id": i} for i in range(2)]
  assert all(t[0] == ROOT and t[2] == ["-m", "scope_jax.main", *MAIN_ARGS] for t in tasks)


def test_slurm_dry_run_anywhere_never_starts_the_job(tmp_path):
  """`--dry-run` after the main flags was once passed on to srun: the job really started."""
  env = _fake_slurm(tmp_path)
  out = subprocess.run(["bash", os.path.join(LAUNCH, "slurm.sbatch"), *MAIN_ARGS, "--dry-run"],
                       capture_output=True, text=True, env=env, timeout=60)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("JAX_COORDINATOR_ADDRESS=") and len(lines) == 3
  assert "--dry-run" not in lines[2] and shlex.split(lines[2])[-len(MAIN_ARGS):] == MAIN_ARGS


def test_tpu_pod_packs_into_a_private_directory_per_run():
  args = tpu_pod.argparse.Namespace(dry_run=False, source=ROOT, jax_spec="jax[tpu]", name="n",
                                    zone="z", project=None)
  firsts = []
  for _ in range(2):
    try:
      pack = tpu_pod.setup_cmds(args)[0]
    except AttributeError as e:  # the namespace lacks a field tpu() reads: name it here
      raise AssertionError(e) from None
    local = pack[2]
    assert not local.startswith("/tmp/scope_jax-src.tgz")
    assert os.path.isdir(os.path.dirname(local)) and not os.listdir(os.path.dirname(local))
    assert stat.S_IMODE(os.stat(os.path.dirname(local)).st_mode) == 0o700
    firsts.append(local)
    os.rmdir(os.path.dirname(local))
  assert firsts[0] != firsts[1]


def test_slurm_outside_an_allocation_says_how_to_submit():
  env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
  out = subprocess.run(["bash", os.path.join(LAUNCH, "slurm.sbatch"), "--dry-run", *MAIN_ARGS],
                       capture_output=True, text=True, env=env, timeout=60)
  assert out.returncode == 2 and "submit this script with sbatch" in out.stderr


@pytest.mark.parametrize("script, args", [
    ("tpu_pod.py", ("up", "--name=n", "--zone=z", "--accelerator=v5p-8", "--dry-run", "--",
                    "--config=configs/spell.py", "--workdir=/tmp/w")),
    (os.path.join("gke", "render.py"), ("--name=n", "--accelerator=v5p-8", "--image=r/x:1",
                                        "--dry-run", "--", "--config=configs/spell.py",
                                        "--workdir=/tmp/w"))])
def test_launchers_run_from_a_checkout_without_the_package_installed(script, args):
  """A Python without the project installed (-S: no site-packages) runs the launchers from the
  checkout: they import only the standard library and this checkout's accelerators."""
  out = subprocess.run([sys.executable, "-S", os.path.join(LAUNCH, script), *args],
                       capture_output=True, text=True, cwd="/", timeout=60,
                       env={"PATH": os.environ.get("PATH", "")})
  assert out.returncode == 0, out.stderr
  assert "ModuleNotFoundError" not in out.stderr


@pytest.mark.parametrize("script, flag, message", [
    (os.path.join("gke", "render.py"), "--port=-5", "--port=-5: use a TCP port from 1 to 65535"),
    (os.path.join("gke", "render.py"), "--port=99999", "--port=99999: use a TCP port"),
    (os.path.join("gke", "render.py"), "--max_restarts=-1", "--max_restarts=-1: use 0"),
    ("tpu_pod.py", "--max_restarts=-1", "--max_restarts=-1: use 0")])
def test_launchers_refuse_bad_ports_and_restart_counts(script, flag, message):
  lead = (("--name=n", "--accelerator=v5p-8", "--image=r/x:1") if "render" in script else
          ("up", "--name=n", "--zone=z", "--accelerator=v5p-8"))
  out = _script(script, *lead, flag, "--dry-run", "--", "--config=configs/spell.py",
                "--workdir=/tmp/w")
  assert out.returncode == 2 and message in out.stderr, out.stderr
