"""A machine without a TPU never loads the TPU runtime: the entrypoints name JAX's platforms from
the devices that are there, and respect an explicit JAX_PLATFORMS."""

import os
import subprocess
import sys

import chex
import pytest

from scope_jax import platforms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TPU_NOISE = ("TPU_WORKER_HOSTNAMES", "host bounds", "E0000", "libtpu", "InitGoogle")


def _fake_fs(files: dict[str, str]):
  import fnmatch

  def glob_fn(pattern):
    return [p for p in files if fnmatch.fnmatch(p, pattern)]
  return glob_fn, lambda p: files.get(p, "")


@pytest.mark.parametrize("files,attached", [
    ({}, False),
    ({"/sys/bus/pci/devices/0000:00:04.0/vendor": "0x1ae0",  # gVNIC: Google's, not a TPU
      "/sys/bus/pci/devices/0000:00:04.0/device": "0x0042"}, False),
    ({"/sys/bus/pci/devices/0000:00:05.0/vendor": "0x1ae0",
      "/sys/bus/pci/devices/0000:00:05.0/device": "0x0063"}, True),  # a v5e chip
    ({"/dev/accel0": ""}, True),
    ({"/dev/vfio/vfio": ""}, False),  # the vfio control file alone is no device
    ({"/dev/vfio/0": "", "/dev/vfio/vfio": ""}, True),
])
def test_tpu_attached_reads_the_file_system(files, attached):
  glob_fn, read = _fake_fs(files)
  chex.assert_equal(platforms.tpu_attached(glob_fn, read), attached)


def test_platforms_without_an_absent_tpu():
  chex.assert_equal(platforms.without_absent_tpu({}, tpu=False, gpus=()), "cpu")
  chex.assert_equal(platforms.without_absent_tpu({}, tpu=False, gpus=("cuda",)), "cuda,cpu")
  chex.assert_equal(platforms.without_absent_tpu({}, tpu=True, gpus=()), None)
  chex.assert_equal(platforms.without_absent_tpu({"JAX_PLATFORMS": "tpu"}, tpu=False), None)
  chex.assert_equal(platforms.without_absent_tpu({"JAX_PLATFORM_NAME": "cpu"}, tpu=False), None)
  chex.assert_equal(platforms.gpu_platforms(lambda p: p == "/dev/nvidia0", lambda m: True),
                    ("cuda",))
  chex.assert_equal(platforms.gpu_platforms(lambda p: p == "/dev/nvidia0", lambda m: False), ())
  chex.assert_equal(platforms.gpu_platforms(lambda p: False, lambda m: True), ())
  chex.assert_equal(platforms.gpu_platforms(lambda p: p == "/dev/kfd", lambda m: "rocm" in m),
                    ("rocm",))


def _python(code: str, **env):
  clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                        timeout=120, env=dict(clean, PYTHONPATH=ROOT, **env))


@pytest.mark.skipif(platforms.tpu_attached(), reason="this machine has a TPU")
@pytest.mark.parametrize("first", ["scope_jax", "jax", "bench"])
def test_a_cpu_machine_never_starts_libtpu(first):
  """Whichever is imported first (the package, JAX, or a bench script's package), JAX starts on
  the CPU with no TPU runtime message, and the processes it starts inherit the choice."""
  out = _python(f"import {first}; import scope_jax, jax, os; "
                "print(jax.devices()[0].platform, os.environ['JAX_PLATFORMS'])")
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == ["cpu", "cpu"], out.stdout
  assert not [ln for ln in out.stderr.splitlines() if any(n in ln for n in TPU_NOISE)], out.stderr


def test_explicit_platforms_are_respected():
  out = _python("import scope_jax, os; print(os.environ['JAX_PLATFORMS'])", JAX_PLATFORMS="cpu,x")
  assert out.returncode == 0, out.stderr
  chex.assert_equal(out.stdout.strip(), "cpu,x")


def test_plan_still_compiles_for_tpus_on_a_cpu_machine():
  """libtpu's compile-only topology devices need no TPU backend."""
  pytest.importorskip("libtpu")
  out = _python("import scope_jax, jax\nfrom scope_jax.plan import topology as t\n"
                "d = t.devices(t.parse('v5e-4'))\nprint(len(d), d[0].platform, "
                "jax.devices()[0].platform)")
  assert out.returncode == 0, out.stderr
  chex.assert_equal(out.stdout.split(), ["4", "tpu", "cpu"])
