"""Renders launch/gke/jobset.yaml for one TPU slice on GKE and applies it with kubectl.

    python launch/gke/render.py --name=spell-7b --accelerator=v5p-8 \
        --image=us-docker.pkg.dev/my-project/scope-jax/scope-jax:latest -- \
        --config=configs/spell.py:paper --workdir=gs://my-bucket/spell-7b ...

The image holds the project (installed with `jax[tpu]`) in `--workdir_in_image`. Each pod gets
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID, which scope_jax.main reads; a
failed or preempted pod restarts the JobSet (`--max_restarts`), and the run resumes from its gs://
workdir. `--dry-run` prints the manifest and the kubectl command instead of applying it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import string
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# This checkout's accelerators.py (standard library only), loaded by its path: the launcher runs
# with or without the package installed and never imports the package itself.
_SPEC = importlib.util.spec_from_file_location(
    "accelerators", os.path.join(os.path.dirname(os.path.dirname(HERE)), "scope_jax", "accelerators.py"))
accelerators = sys.modules[_SPEC.name] = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(accelerators)

TEMPLATE = os.path.join(HERE, "jobset.yaml")
SPOT = "              cloud.google.com/gke-spot: \"true\"\n"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")  # leaves room for JobSet's suffixes


def check_fields(name: str, image: str, workdir_in_image: str) -> None:
  """What the manifest takes from the command line, checked: a name that is a DNS label, and an
  image and directory of printable characters (they are quoted into the YAML as well)."""
  if not DNS_LABEL.match(name):
    raise ValueError(f"--name={name!r} must be a DNS label: lower-case letters, digits and '-', "
                     "at most 40 characters, starting and ending with a letter or digit.")
  for flag, value in (("--image", image), ("--workdir_in_image", workdir_in_image)):
    if not value or any(not c.isprintable() or c.isspace() for c in value):
      raise ValueError(f"--{flag.lstrip('-')}={value!r} must be non-empty, without spaces, "
                       "newlines or control characters.")


def render(name: str, accelerator: str, image: str, main_args: list[str], *, port: int = 12355,
           max_restarts: int = 3, spot: bool = False, workdir_in_image: str = "/app") -> str:
  """The JobSet manifest: one pod per host of the slice, each running scope_jax.main."""
  check_fields(name, image, workdir_in_image)
  s = accelerators.get(accelerator)
  command = ["python", "-m", "scope_jax.main", *main_args]
  fields = dict(name=name, hosts=s.hosts, gke_accelerator=s.gke_accelerator, topology=s.topology,
                chips_per_host=s.chips_per_host, image=json.dumps(image), port=port,
                max_restarts=max_restarts, workdir_in_image=json.dumps(workdir_in_image),
                command=json.dumps(command),  # a JSON list is a YAML flow sequence
                spot_selector=SPOT if spot else "")
  with open(TEMPLATE) as f:
    return string.Template(f.read()).substitute(fields)


def main(argv: list[str]) -> int:
  main_args: list[str] = []
  if "--" in argv:
    argv, main_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--name", required=True, help="JobSet name (a DNS label: a-z, 0-9, '-')")
  p.add_argument("--accelerator", default="v5p-8", help="e.g. v5p-8, v5e-16, v6e-64")
  p.add_argument("--image", required=True, help="container image with the project installed")
  p.add_argument("--workdir_in_image", default="/app", help="the project's directory in the image")
  p.add_argument("--port", type=int, default=12355, help="coordinator port")
  p.add_argument("--max_restarts", type=int, default=3, help="JobSet restarts after a failure")
  p.add_argument("--spot", action="store_true", help="schedule on spot TPU node pools")
  p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                 help="print the manifest and the kubectl command, apply nothing")
  a = p.parse_args(argv)
  try:
    check_fields(a.name, a.image, a.workdir_in_image)
    if not 1 <= a.port <= 65535:
      raise ValueError(f"--port={a.port}: use a TCP port from 1 to 65535.")
    if a.max_restarts < 0:
      raise ValueError(f"--max_restarts={a.max_restarts}: use 0 (no restart) or more.")
    s = accelerators.get(a.accelerator)
    if not main_args:
      raise ValueError("no scope_jax.main flags after '--' (at least --config and --workdir).")
    accelerators.check_shared_workdir(main_args, s.hosts)
    accelerators.check_mesh(accelerators.mesh_shape_arg(main_args), s.chips, s.name)
  except ValueError as e:
    p.error(str(e))
  manifest = render(a.name, a.accelerator, a.image, main_args, port=a.port,
                    max_restarts=a.max_restarts, spot=a.spot, workdir_in_image=a.workdir_in_image)
  apply = ["kubectl", "apply", "-f", "-"]
  if a.dry_run:
    print(manifest)
    print("# " + " ".join(apply) + "   (the manifest above on stdin)")
    print(f"# logs: kubectl logs -f -l jobset.sigs.k8s.io/jobset-name={a.name} --prefix")
    return 0
  return subprocess.run(apply, input=manifest, text=True).returncode


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
