"""run.json: step selection, role → policy resolution, and errors that name the path."""

import json

import ml_collections
import pytest

from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax.evaluation import driver
from scope_jax.models import tiny_config


def _record(path="/runs/scope"):
  return run_record.RunRecord(
      path=path, method="scope", preset="demo", config=ml_collections.ConfigDict(),
      model_config=tiny_config(), policies=("challenger", "solver"),
      roles={"challenger": "challenger", "solver": "solver", "judge_entity": None},
      tokenizer="demo")


@pytest.mark.parametrize("spec,expected", [("latest", [7]), ("all", [0, 3, 7]), ("3", [3]),
                                           ("0, 7", [0, 7])])
def test_select_steps(spec, expected):
  assert run_record.select_steps([0, 3, 7], spec) == expected


def test_select_steps_errors_list_what_there_is():
  with pytest.raises(ValueError, match=r"step\(s\) \[5\].*\[0, 3, 7\]"):
    run_record.select_steps([0, 3, 7], "3,5")
  with pytest.raises(ValueError, match="latest, all, or step numbers"):
    run_record.select_steps([0], "newest")
  assert run_record.select_steps([], "latest") == []


def test_roles_resolve_to_their_trained_policy():
  record = _record()
  assert run_record.policy_for(record, "solver") == "solver"
  with pytest.raises(ValueError, match="frozen params.*challenger, solver"):
    run_record.policy_for(record, "judge_entity")
  with pytest.raises(ValueError, match="no role 'policy'.*challenger, solver"):
    run_record.policy_for(record, "policy")


def test_a_corrupt_or_missing_record_names_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match=f"No run.json in {tmp_path}"):
    run_record.read(str(tmp_path))
  (tmp_path / "checkpoints").mkdir()
  with pytest.raises(FileNotFoundError, match="older version"):
    run_record.read(str(tmp_path))
  (tmp_path / "run.json").write_text("{not json")
  with pytest.raises(ValueError, match=f"{tmp_path}/run.json is not a valid run record"):
    run_record.read(str(tmp_path))


def test_a_run_with_several_policies_keeps_each_policys_results_apart(tmp_path):
  """SCOPE trains a challenger and a solver: their results live under eval/<policy>/."""
  config = ml_collections.ConfigDict(dict(
      method="scope", total_steps=2, seed=0, mesh=dict(shape=(1, -1, 1)),
      rollout=dict(max_context=2048, max_prompt_tokens=1536), scope=dict(syntax="qwen"),
      model=dict(param_dtype="float32")))
  config.mesh.rules = dict(train=shd.rules_to_config(shd.TRAIN_RULES),
                           sampling=shd.rules_to_config(shd.SAMPLING_RULES))
  record = {"version": 1, "method": "scope", "preset": "demo",
            "model": tiny_config().to_hf_config("float32"), "policies": ["challenger", "solver"],
            "roles": {"challenger": "challenger", "solver": "solver", "judge_entity": None},
            "tokenizer": "demo", "config": config.to_dict()}
  (tmp_path / "run.json").write_text(json.dumps(record))
  opts = driver.Options(benchmarks="gsm8k", run=str(tmp_path), role="solver", watch=True, limit=1)
  session = driver.Session(opts)
  assert str(session.root) == f"{tmp_path}/eval/solver"
  assert session.settings.syntax == "qwen"  # the run's search syntax
  assert session.settings.max_prompt_tokens == 1536  # and its prompt budget
