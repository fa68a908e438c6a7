"""Slow: every paper preset compiles for the TPU slice launch/README.md recommends, and fits."""

import importlib

import pytest

from scope_jax.core import runner
from scope_jax.plan import recommended, report, topology


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(recommended.SLICES))
def test_every_paper_preset_fits_its_slice(spec):
  method, preset = spec.split(":")
  name, mesh = recommended.SLICES[spec]
  config = importlib.import_module(f"configs.{method}").get_config(preset)
  config.mesh.shape = tuple(int(x) for x in mesh.strip("()").split(","))
  s = topology.parse(name)
  runner.validate(config, devices=topology.devices(s), data=False)
  plan = report.build(config, s)
  assert not [c.program.name for c in plan.compiled if c.error]
  assert plan.fits, report.render(plan, config)
