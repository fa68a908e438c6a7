"""The method configs: one paper base per method with presets as small overrides, runner settings
in their own section (old paths refused by name), and the files installed with the package so
`--config=configs/<name>.py` works from a checkout and from any other directory."""

import ast
import importlib
import os
import pathlib
import subprocess
import sys

import ml_collections
import pytest
import setuptools

from scope_jax import configs_base
from scope_jax.core import runtime

ROOT = pathlib.Path(__file__).resolve().parent.parent
METHODS = ("spell", "scope", "opensir", "asl", "piplay")


def _module(method):
  return importlib.import_module(f"scope_jax.configs.{method}")


@pytest.mark.parametrize("method", METHODS)
def test_each_preset_is_its_overrides_on_the_paper_base(method):
  module = _module(method)
  for name, overrides in module.PRESETS.items():
    c = module.paper_base()
    c.preset = name
    overrides(c)
    assert c.to_dict() == module.get_config(name).to_dict(), name
  assert module.get_config().preset == "demo"


@pytest.mark.parametrize("method", METHODS)
def test_no_config_file_branches_on_the_preset(method):
  tree = ast.parse((configs_base.PACKAGED / f"{method}.py").read_text())
  names = {n.id for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp))
           for n in ast.walk(node.test) if isinstance(n, ast.Name)}
  assert "preset" not in names


def test_the_checkout_configs_folder_is_the_packaged_one():
  assert (ROOT / "configs").resolve() == configs_base.PACKAGED.resolve()
  assert sorted(p.name for p in configs_base.PACKAGED.glob("*.py")) == sorted(
      ["__init__.py"] + [f"{m}.py" for m in METHODS])


def test_the_package_build_lists_the_configs():
  """setup.py's packages (its own find_packages call, evaluated here) hold scope_jax.configs."""
  setup = ast.parse((ROOT / "setup.py").read_text())
  call = next(node for node in ast.walk(setup) if isinstance(node, ast.Call)
              and getattr(node.func, "id", "") == "find_packages")
  include = ast.literal_eval(next(k.value for k in call.keywords if k.arg == "include"))
  packages = setuptools.find_packages(where=str(ROOT), include=include)
  assert "scope_jax.configs" in packages


# Moved settings.

@pytest.mark.parametrize("old", sorted(configs_base.MOVED))
def test_a_moved_setting_is_refused_naming_its_new_path(old):
  config = _module("spell").get_config("demo")
  section, _, key = old.rpartition(".")
  config[section][key] = 2
  with pytest.raises(ValueError, match=f"^{old} moved to {configs_base.MOVED[old]}: set "):
    configs_base.check_moved(config)


def test_the_learner_settings_are_not_loss_settings():
  config = _module("spell").get_config("demo")
  assert "micro_batch_rows" not in config.loss and config.learner.micro_batch_rows == 8
  with pytest.raises(ValueError, match="learner.micro_batch_rows"):
    runtime.loss_config(config, {"micro_batch_rows": 2})


# Finding configs/<name>.py from another directory.

def test_config_path_keeps_existing_files_and_finds_packaged_ones(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  packaged = str(configs_base.PACKAGED / "spell.py")
  assert configs_base.config_path("configs/spell.py") == packaged
  assert configs_base.config_path("./configs/spell.py:paper") == packaged + ":paper"
  assert configs_base.config_path("configs/nope.py") == "configs/nope.py"
  assert configs_base.config_path("other/spell.py") == "other/spell.py"
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "spell.py").write_text("")
  assert configs_base.config_path("configs/spell.py:paper") == "configs/spell.py:paper"
  assert configs_base.resolve_config_flag(["x", "--config", "configs/asl.py", "--y=1"]) == [
      "x", "--config", str(configs_base.PACKAGED / "asl.py"), "--y=1"]


def test_load_file_from_another_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  config = configs_base.load_file("configs/scope.py", "paper")
  assert isinstance(config, ml_collections.ConfigDict)
  assert (config.method, config.preset) == ("scope", "paper")


def test_main_reads_configs_from_another_directory(tmp_path):
  """The entry point resolves `configs/spell.py:paper` outside a checkout: the config loads, and
  validation (after loading) refuses the bad value given with it."""
  out = subprocess.run(
      [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py:paper",
       "--config.total_steps=-1", f"--workdir={tmp_path / 'run'}"],
      capture_output=True, text=True, cwd=tmp_path, timeout=120,
      env=dict(os.environ, PYTHONPATH=str(ROOT)))
  assert out.returncode == 2 and "Error: total_steps=-1 must be at least 0" in out.stderr, out.stderr
