"""run.json: step selection, role → policy resolution, and errors that name the path."""

import ml_collections
import pytest

from scope_jax import run_record
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
