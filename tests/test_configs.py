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


# The `learn` presets: the headline is the method as published; helpers are named ablations.

ABLATIONS = {  # ablation preset -> (method, the settings it changes from `learn`)
    ("spell", "learn_extractive"): {"spell.extractive_labels": True},
    ("piplay", "learn_lambda10x"): {"piplay.lambdas": (0.3,)},
    ("asl", "learn_frozen_grm"): {"asl.grm_mode": "frozen", "asl.phases.grm.min_steps": 1,
                                  "asl.phases.grm.max_steps": 1, "asl.phases.pm.min_steps": 30,
                                  "asl.phases.pm.max_steps": 30, "asl.roles.grm.temperature": 0.5},
    ("scope", "learn_slow_challenger"): {"scope.challenger_optim.warmup_steps": None},
    ("opensir", "learn_planted_guess"): {"opensir.warmup.guess_share": 0.4,
                                         "opensir.warmup.worked_ways": 4},
}


def _flat(config) -> dict:
  out = {}
  for k, v in config.items():
    if isinstance(v, dict):
      out.update({f"{k}.{kk}": vv for kk, vv in _flat(v).items()})
    else:
      out[k] = v
  return out


def test_the_learn_presets_run_the_methods_as_published():
  """SPELL without the extractive label check, π-Play at the paper's λ for its first iteration,
  ASL with its GRM co-trained, SCOPE's Challenger at a rate above zero from its first update,
  OpenSIR from a start with no planted guess; and every one trains on the trained entity half."""
  get = lambda m, p="learn": _module(m).get_config(p)
  assert not get("spell").spell.extractive_labels
  assert get("piplay").piplay.lambdas[0] == _module("piplay").paper_base().piplay.lambdas[0] == 0.03
  assert get("asl").asl.grm_mode == _module("asl").paper_base().asl.grm_mode == "co_trained"
  scope = get("scope")
  first = runtime.optim_settings(scope, scope.scope.challenger_optim)
  assert first["warmup_steps"] == 0 and first["lr"] > 0  # the Challenger's first update moves it
  solver = runtime.optim_settings(scope, scope.scope.solver_optim)
  assert solver["warmup_steps"] == 10  # only the Solver's rate rises
  slow = get("scope", "learn_slow_challenger")
  assert runtime.optim_settings(slow, slow.scope.challenger_optim)["warmup_steps"] == 10
  assert get("opensir").opensir.warmup.guess_share == 0.0
  for m in METHODS:
    assert get(m).world.heldout_entities, m


@pytest.mark.parametrize("method, preset", sorted(ABLATIONS))
def test_each_ablation_is_learn_with_named_changes_and_says_so(method, preset):
  learn, ablation = (_flat(_module(method).get_config(p).to_dict()) for p in ("learn", preset))
  changed = {k: ablation.get(k) for k in set(learn) | set(ablation)
             if k != "preset" and learn.get(k) != ablation.get(k)}
  assert changed == ABLATIONS[method, preset]
  doc = _module(method).PRESETS[preset].__doc__
  assert "an ablation (not the method as published)" in doc or "an ablation (not a fair start)" in doc
  assert "ablation" not in _module(method).PRESETS["learn"].__doc__.split("\n")[0]
  assert set(p for m, p in ABLATIONS if m == method) == {
      p for p in _module(method).PRESETS if p.startswith("learn_")}
