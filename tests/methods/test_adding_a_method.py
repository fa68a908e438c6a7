"""docs/adding_a_method.md: its example method (examples/copy_qa.py) runs on the core alone, and
every code block of the page is the tested code."""

import json
import pathlib
import re

import pytest

from scope_jax import configs_base
from scope_jax.core import runner
from tests.methods.scripted import ScriptedSampler, play_all_roles

ROOT = pathlib.Path(__file__).resolve().parents[2]


def config(**overrides):
  c = configs_base.load_file(ROOT / "examples" / "copy_qa_config.py")
  c.progress = False
  c.update_from_flattened_dict(overrides)
  return c


class ScriptedCopier(ScriptedSampler):
  """Copies the right two words on a per-row coin, else two wrong ones."""

  def _answer(self, text, rng):
    cue = re.search(r'come right after "(.*?)" in this text', text).group(1)
    tail = text.split(cue, 1)[1].split()
    words = " ".join(tail[:2]) if rng.random() < 0.5 else "wrong words"
    return f"<answer>{words}</answer>"


def test_every_code_block_is_the_example(tmp_path):
  doc = (ROOT / "docs" / "adding_a_method.md").read_text()
  code = (ROOT / "examples" / "copy_qa.py").read_text() + \
      (ROOT / "examples" / "copy_qa_config.py").read_text()
  blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
  assert len(blocks) >= 4
  for block in blocks:
    assert block in code, block


def test_the_example_trains_on_the_core(tmp_path, monkeypatch):
  module = runner.load_method(config())
  made = {}

  def make(rt):
    made["m"] = module.CopyQA(rt)
    play_all_roles(rt, ScriptedCopier(rt.tokenizer))
    return made["m"]

  monkeypatch.setattr(module, "make_method", make)
  runner.run(config(total_steps=2, **{"loss.kl_beta": 0.01}), str(tmp_path))
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [0, 1]
  for r in rows:
    assert 0.0 < r["answerer/reward"] < 1.0
    assert r["train/applied"] == 1.0 and r["answerer/rollout/rows"] == 16
  assert rows[0]["train/kl"] == 0.0 < rows[1]["train/kl"]  # the core's KL reference, M0
  # What it declares for `scope_jax.plan` is what it holds, and each update's rows.
  players = module.METHOD.players(config())
  rt = made["m"].rt
  assert (sorted(players.policies), players.frozen, players.tracked) == (
      sorted(rt.policies), tuple(set(rt.frozen) - {"reference"}), tuple(rt.tracked))
  assert players.policies["policy"].rows == rows[0]["answerer/rollout/rows"] == 16


def test_the_example_runs_its_own_model(tmp_path):
  last = runner.run(config(total_steps=1), str(tmp_path))
  assert "train/loss" in last and last["answerer/rollout/rows"] == 16


@pytest.mark.parametrize("override, message", [
    ({"copy_qa.batch": 0}, r"copy_qa.batch=0 must be at least 1"),
    ({"method_module": "examples.nowhere"}, r"method_module='examples.nowhere' cannot be imported"),
    ({"method": "other"}, r"defines no METHOD named 'other'"),
])
def test_its_declarations_are_checked(override, message):
  with pytest.raises(ValueError, match=message):
    runner.validate(config(**override))
