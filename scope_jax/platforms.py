"""Keeps JAX off the TPU runtime on machines without a TPU.

With libtpu installed (the `tpu` and `test` extras), JAX's first backend call loads it even on a
CPU machine: libtpu then prints its initialisation errors (`E0000 ... TPU_WORKER_HOSTNAMES`,
"Failed to find host bounds"), takes its lock file and writes /tmp/tpu_logs. Unless the user set
JAX_PLATFORMS, every entrypoint (the package's `__init__`, which `python -m scope_jax.<cli>` and
`python -m bench.<script>` import first) names the platforms this machine has, without the TPU
when no TPU chip is attached. Planning still compiles for TPUs: libtpu's compile-only topology
devices need no TPU backend (scope_jax/plan/topology.py).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from typing import Callable, Iterable, MutableMapping

_GOOGLE_PCI_VENDOR = "0x1ae0"
# PCI device ids of TPU chips (v3, v4, v5p, v5e, v6e, 7x); Google's other PCI devices (gVNIC) are
# not TPUs.
_TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f",
                              "0x0076"})
# A GPU platform: the device files that show its GPU, and the names its JAX plugin goes by.
_GPUS = {"cuda": (("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg"),
                  ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13", "jax_cuda12_plugin",
                   "jax_cuda13_plugin")),
         "rocm": (("/dev/kfd",),
                  ("jax_plugins.xla_rocm6", "jax_plugins.xla_rocm7", "jax_rocm6_plugin",
                   "jax_rocm7_plugin"))}


def _read(path: str) -> str:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return ""


def tpu_attached(glob_fn: Callable[[str], Iterable[str]] = glob.glob,
                 read: Callable[[str], str] = _read) -> bool:
  """Whether a TPU chip is attached, from the file system alone (libtpu is not loaded): a TPU
  PCI device, or the device files TPU VMs expose (/dev/accel*, /dev/vfio/<group>)."""
  for vendor in glob_fn("/sys/bus/pci/devices/*/vendor"):
    if read(vendor) == _GOOGLE_PCI_VENDOR and read(
        os.path.join(os.path.dirname(vendor), "device")) in _TPU_PCI_DEVICES:
      return True
  return any(True for _ in glob_fn("/dev/accel[0-9]*")) or any(
      os.path.basename(p).isdigit() for p in glob_fn("/dev/vfio/*"))


def gpu_platforms(exists: Callable[[str], bool] = os.path.exists,
                  has_module: Callable[[str], bool] | None = None) -> tuple[str, ...]:
  """The GPU platforms ('cuda', 'rocm') whose GPU is visible and whose JAX plugin is installed."""
  if has_module is None:
    def has_module(name):
      try:
        return importlib.util.find_spec(name) is not None
      except (ImportError, ValueError):
        return False
  return tuple(name for name, (devices, plugins) in _GPUS.items()
               if any(exists(d) for d in devices) and any(has_module(p) for p in plugins))


def without_absent_tpu(environ: MutableMapping[str, str], tpu: bool | None = None,
                       gpus: tuple[str, ...] | None = None) -> str | None:
  """The JAX_PLATFORMS this process should use, or None to leave JAX's choice alone: an explicit
  JAX_PLATFORMS (or the older JAX_PLATFORM_NAME) is respected, and so is a machine with a TPU."""
  if environ.get("JAX_PLATFORMS") or environ.get("JAX_PLATFORM_NAME"):
    return None
  if tpu_attached() if tpu is None else tpu:
    return None
  return ",".join((*(gpu_platforms() if gpus is None else gpus), "cpu"))


def exclude_absent_tpu(environ: MutableMapping[str, str] = os.environ) -> str | None:
  """Sets JAX_PLATFORMS (see `without_absent_tpu`) before JAX starts its backends; if JAX was
  imported already and has no backend yet, its config too. Returns the value set, or None."""
  value = without_absent_tpu(environ)
  if value is None:
    return None
  jax = sys.modules.get("jax")
  if jax is not None:  # JAX read the variable at import: tell its config, if still in time
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    if xla_bridge.backends_are_initialized():
      return None
    jax.config.update("jax_platforms", value)
  environ["JAX_PLATFORMS"] = value  # and the processes this one starts
  return value
