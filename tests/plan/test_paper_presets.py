"""Slow: every paper preset compiles for the TPU slice launch/README.md recommends, and fits, in
full and with rank-64 LoRA adapters on the smaller slice `recommended.LORA_SLICES` names."""

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


@pytest.mark.slow
@pytest.mark.parametrize("spec", list(recommended.LORA_SLICES))
def test_every_paper_preset_with_lora_fits_its_lora_slice(spec):
  method, preset = spec.split(":")
  name, mesh, overrides = recommended.LORA_SLICES[spec]
  config = importlib.import_module(f"configs.{method}").get_config(preset)
  config.mesh.shape = tuple(int(x) for x in mesh.strip("()").split(","))
  config.lora.rank = recommended.LORA_RANK
  for key, value in overrides.items():
    section, field = key.split(".")
    config[section][field] = value
  s = topology.parse(name)
  runner.validate(config, devices=topology.devices(s), data=False)
  plan = report.build(config, s)
  assert not [c.program.name for c in plan.compiled if c.error]
  assert plan.fits, report.render(plan, config)
