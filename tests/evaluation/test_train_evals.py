"""Held-out evaluation during training (config.eval) on a two-step run of the example method, and
the shuffled-rewards control: the same advantages, permuted across an update's rows."""

import json
import re

import numpy as np
import pytest

from scope_jax import world as world_lib
from scope_jax import report
from scope_jax.core import evals, runner, runtime
from scope_jax.rl import learner as learner_lib
from scope_jax.world import World
from tests.methods.scripted import ScriptedSampler, play_all_roles
from tests.methods.test_adding_a_method import config  # the example method, Copy QA


class FirstNumber(ScriptedSampler):
  """Copy QA: two words by a coin. Evaluation: the first number of a math question (right when
  the gold answer happens to be it), and 'nobody' between answer tags for a QA question."""

  def _answer(self, text, rng):
    cue = re.search(r'come right after "(.*?)" in this text', text)
    if cue:
      tail = text.split(cue.group(1), 1)[1].split()
      return "<answer>" + (" ".join(tail[:2]) if rng.random() < 0.5 else "wrong") + "</answer>"
    if "\\boxed{}" in text:
      return "So \\boxed{" + re.search(r"\d+", text).group(0) + "}."
    return "<answer>nobody</answer>"


def _run(tmp_path, monkeypatch, sampler_cls=FirstNumber, **overrides):
  module = runner.load_method(config())

  def make(rt):
    method = module.CopyQA(rt)
    play_all_roles(rt, sampler_cls(rt.tokenizer))
    return method

  monkeypatch.setattr(module, "make_method", make)
  return runner.run(config(**overrides), str(tmp_path))


def test_evaluation_before_during_and_after_training(tmp_path, monkeypatch):
  _run(tmp_path, monkeypatch, total_steps=2, **{
      "eval.every": 1, "eval.benchmarks": "world:arith,world:doc,world:hop1", "eval.limit": 12,
      "eval.role": "answerer", "eval.max_new_tokens": 16, "world.seed": 3})
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  evals_ = [r for r in rows if "eval/updates" in r]
  assert [(r["step"], r["eval/updates"]) for r in evals_] == [(0, 0.0), (1, 1.0), (2, 2.0)]
  gold = World(3).gold["arith"][:12]
  expected = np.mean([g["gold"][0] == re.search(r"\d+", g["question"]).group(0) for g in gold])
  for r in evals_:
    assert r["eval/arith/pass@1"] == pytest.approx(expected)
    assert r["eval/doc/pass@1"] == 0.0 and r["eval/doc/num_examples"] == 12.0
    assert r["eval/hop1/num_examples"] == 12.0  # searches the world (the run has no tool)
  for label in ("base", "step_0", "step_1"):
    result = json.loads((tmp_path / "eval" / "arith" / label / "results.json").read_text())
    assert result["num_examples"] == 12 and result["role"] == "answerer"
    assert result["metrics"]["pass@1"] == pytest.approx(expected)
  assert (tmp_path / "world" / "gold" / "hop2.jsonl").exists()
  assert [r["step"] for r in rows if "train/loss" in r] == [0, 1]
  assert (tmp_path / "learning.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  text = report.summary(tmp_path, control=tmp_path)
  assert f"arith: {100 * expected:.1f} → {100 * expected:.1f} (control" in text


def test_the_same_command_on_a_finished_run_keeps_its_last_evaluation(tmp_path, monkeypatch):
  """Run again once finished, a run changes nothing: the evaluation after its last update (the
  row past its last checkpoint's step) stays, and so do the curve's end and its picture."""
  settings = {"eval.every": 1, "eval.benchmarks": "world:arith", "eval.limit": 4,
              "eval.role": "answerer", "eval.max_new_tokens": 16, "world.seed": 3}
  _run(tmp_path, monkeypatch, total_steps=2, **settings)
  before = (tmp_path / "metrics.jsonl").read_text()
  assert '"eval/updates": 2.0' in before
  _run(tmp_path, monkeypatch, total_steps=2, **settings)
  assert (tmp_path / "metrics.jsonl").read_text() == before


def test_a_final_evaluation_cut_short_runs_on_resume(tmp_path, monkeypatch):
  """A kill during the evaluation after the last update (the last checkpoint is saved before
  it) leaves no row for it: run again, the run scores it, and the curve ends there."""
  settings = {"eval.every": 1, "eval.benchmarks": "world:arith", "eval.limit": 4,
              "eval.role": "answerer", "eval.max_new_tokens": 16, "world.seed": 3}
  _run(tmp_path, monkeypatch, total_steps=2, **settings)
  whole = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert json.loads(whole[-1])["eval/updates"] == 2.0
  (tmp_path / "metrics.jsonl").write_text("".join(x + "\n" for x in whole[:-1]))  # as a kill
  import shutil
  shutil.rmtree(tmp_path / "eval" / "arith" / "step_1")
  _run(tmp_path, monkeypatch, total_steps=2, **settings)
  again = (tmp_path / "metrics.jsonl").read_text().splitlines()
  assert again[:-1] == whole[:-1]
  row, before = json.loads(again[-1]), json.loads(whole[-1])
  assert (row["step"], row["eval/updates"]) == (2, 2.0)
  assert row["eval/arith/pass@1"] == before["eval/arith/pass@1"]
  assert (tmp_path / "eval" / "arith" / "step_1" / "results.json").exists()
  assert report.held_out(report.curves(report.read(tmp_path)))["arith"][1] == (
      before["eval/arith/pass@1"])


def test_sampled_evaluation_scores_every_sample(tmp_path, monkeypatch):
  """`eval.temperature` and `eval.num_samples` reach the evaluator: n samples per question, and
  the expected score (pass@1: the mean over samples) over all of them."""
  _run(tmp_path, monkeypatch, total_steps=1, **{
      "eval.every": 1, "eval.benchmarks": "world:arith", "eval.limit": 6, "eval.role": "answerer",
      "eval.max_new_tokens": 16, "eval.temperature": 1.0, "eval.num_samples": 3, "world.seed": 3})
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  gold = World(3).gold["arith"][:6]
  expected = np.mean([g["gold"][0] == re.search(r"\d+", g["question"]).group(0) for g in gold])
  for r in (r for r in rows if "eval/updates" in r):
    assert r["eval/arith/num_samples"] == 18.0 and r["eval/arith/num_examples"] == 6.0
    assert r["eval/arith/pass@1"] == pytest.approx(expected)  # the mean over all samples
  records = (tmp_path / "eval" / "arith" / "base" / "predictions.jsonl").read_text().splitlines()
  assert {len(json.loads(x)["samples"]) for x in records} == {3}


def test_curves_by_hand():
  rows = [{"step": 0, "eval/updates": 0.0, "eval/hop1/pass@1": 0.1, "eval/hop1/pass@2": 0.3},
          {"step": 0, "questioner/reward/mean": 0.5, "responder/reward/mean": 0.2},
          {"step": 1, "questioner/reward/mean": 0.7, "eval/x": 1.0, "student/outcome/mean": 0.25},
          {"step": 1, "eval/updates": 2.0, "eval/hop1/pass@1": 0.4}]
  c = report.curves(rows)
  assert c["accuracy"] == {"hop1": [(0.0, 0.1), (2.0, 0.4)]}
  assert c["reward"] == {"questioner": [(0, 0.5), (1, 0.7)], "responder": [(0, 0.2)],
                         "student": [(1, 0.25)]}
  assert report.held_out(c) == {"hop1": (0.1, 0.4)}
  assert report.top_share(rows, "hop1") is None
  rows[-1]["eval/hop1/answers/top_share"] = 0.72
  assert report.top_share(rows, "hop1") == 0.72


def test_the_summary_says_how_alike_the_final_answers_are(tmp_path):
  rows = [{"step": 0, "eval/updates": 0.0, "eval/attr/pass@1": 0.037,
           "eval/attr/answers/top_share": 0.13},
          {"step": 80, "eval/updates": 80.0, "eval/attr/pass@1": 0.117,
           "eval/attr/answers/top_share": 0.72}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert report.summary(tmp_path) == (
      "attr: 3.7 → 11.7; most common final answer: 72% of samples")


@pytest.mark.parametrize("overrides, message", [
    ({"eval.every": 2}, "eval.every=2 needs eval.benchmarks"),
    ({"eval.every": 1, "eval.benchmarks": "world:hop3"}, "'world:hop3' is not a world gold set"),
    ({"eval.every": 1, "eval.benchmarks": "world:doc", "eval.role": "judge"},
     "eval.role='judge' is not a role of copy_qa"),
    ({"eval.every": 1, "eval.benchmarks": "world:doc"}, "eval.role='' is not a role"),
    ({"control": "shuffle"},
     "control='shuffle' is not valid; choose one of: '', shuffled_rewards, "
     "shuffled_rewards_and_teacher."),
    ({"eval.every": 1, "eval.benchmarks": "world:doc", "eval.prompt": "mine"},
     "eval.prompt='mine': choose 'benchmark'"),
    ({"warmup.steps": 5, "warmup.world_seed": 3}, "copy_qa's warm-up has no demonstrations "
     "from other worlds"),
    ({"eval.every": 1, "eval.benchmarks": "world:hop1", "eval.prompt": "role"},
     "copy_qa has no answering prompt of its own"),
    ({"eval.every": 1, "eval.benchmarks": "world:doc,world:doc", "eval.role": "answerer"},
     "'world:doc' and 'world:doc' are both named 'doc'"),
    ({"eval.every": 1, "eval.benchmarks": "world:doc,file:/runs/x/world/gold/doc.jsonl:qa",
      "eval.role": "answerer"}, "are both named 'doc'"),
    ({"eval.every": 1, "eval.benchmarks": "file:/nonexistent/q.jsonl:qa", "eval.role": "answerer"},
     "the file /nonexistent/q.jsonl does not exist"),
])
def test_bad_eval_or_control_settings_name_the_fix(overrides, message):
  with pytest.raises(ValueError, match=re.escape(message)):
    runner.validate(config(**overrides))


@pytest.mark.parametrize("method, role, frozen", [
    ("scope", "grader", True), ("scope", "gate", True), ("scope", "solver", False),
    ("piplay", "teacher", True), ("piplay", "student", False), ("spell", "verifier", False),
    ("asl", "grm", False)])
def test_a_frozen_eval_role_fails_before_anything_loads(method, role, frozen):
  """A role that frozen params play never changes in training: refused in validation, in one
  line naming the trained roles, not after the model loads."""
  from configs import asl, piplay, scope, spell  # pylint: disable=import-outside-toplevel
  c = {"asl": asl, "piplay": piplay, "scope": scope, "spell": spell}[method].get_config("demo")
  c.eval.every, c.eval.benchmarks, c.eval.role = 1, "world:doc", role
  if not frozen:
    runner.validate(c, data=False)
    return
  with pytest.raises(ValueError, match=re.escape(f"eval.role={role!r} is played by frozen params")):
    runner.validate(c, data=False)


def test_the_frozen_grm_ablation_freezes_its_role():
  from configs import asl  # pylint: disable=import-outside-toplevel
  c = asl.get_config("demo")
  c.asl.grm_mode = "frozen"
  assert evals.frozen_roles(runner.load_method(c).METHOD, c) == {"grm"}


def test_world_questions_search_their_own_worlds_documents():
  """A world gold set is searched over its world's documents alone: the run's tool only when it
  is exactly that corpus (not a prebuilt index, not one with other worlds' pages, not the
  trained entity half alone, where a held-out entity's page could not be found)."""
  from configs import scope as scope_config  # pylint: disable=import-outside-toplevel
  learn = scope_config.get_config("learn")
  assert learn.world.corpus_seeds and not evals.searches_own_world(learn)
  learn.world.corpus_seeds = ()
  assert learn.world.heldout_entities and not evals.searches_own_world(learn)
  learn.world.heldout_entities = False
  assert evals.searches_own_world(learn)
  assert not evals.searches_own_world(scope_config.get_config("demo"))  # the Wikipedia corpus
  assert not evals.searches_own_world(config())  # no retrieval section at all


def test_world_specs_become_files(tmp_path):
  spec = world_lib.world_specs("gsm8k,world:hop1", 0, tmp_path)
  assert spec == f"gsm8k,file:{tmp_path}/gold/hop1.jsonl:qa_search"
  assert world_lib.world_specs("gsm8k", 0, tmp_path / "none") == "gsm8k"
  assert not (tmp_path / "none").exists()


def test_shuffled_is_a_seeded_permutation():
  a = [0.5, -1.0, 2.0, 0.0, -1.5]
  s = runtime.shuffled(a, [0, 1, 2])
  assert sorted(s) == sorted(a) and s != a and s == runtime.shuffled(a, [0, 1, 2])
  assert runtime.shuffled(a, [0, 1, 3]) != s


def test_the_control_trains_on_permuted_advantages(tmp_path, monkeypatch):
  seen = []
  train = learner_lib.Learner.train

  def spy(self, policy, trajectories, advantages, **kw):
    seen.append((list(advantages), [t.final("answer") for t in trajectories]))
    return train(self, policy, trajectories, advantages, **kw)

  monkeypatch.setattr(learner_lib.Learner, "train", spy)
  _run(tmp_path / "plain", monkeypatch, total_steps=1)
  _run(tmp_path / "control", monkeypatch, total_steps=1, control="shuffled_rewards")
  (plain, answers), (control, answers2) = seen
  assert answers == answers2  # the same rollouts (same seeds)
  assert sorted(plain) == sorted(control) and plain != control
  assert control == runtime.shuffled(plain, [0, 0, __import__("zlib").crc32(b"policy")])


def _timing(key: str) -> bool:
  return key.startswith("time/") or "/time/" in key or key.endswith("_per_s")


# Sampled on the model itself, the run takes minutes on a 2-core CPU: slow; scripted, by default.
@pytest.mark.parametrize("players", [pytest.param("own model", marks=pytest.mark.slow), "scripted"])
def test_the_same_run_twice_gives_the_same_curve(tmp_path, monkeypatch, players):
  """CPU determinism: two updates with greedy held-out evaluation before, between and after,
  run twice with the same seeds, write the same metrics (timings and throughputs aside). On the
  example's own tiny model the rollouts are sampled at temperature 1 (its rewards are all 0, so
  the updates are empty); with scripted players the rewards vary and the updates are real."""
  overrides = {"total_steps": 2, "eval.every": 1, "eval.benchmarks": "world:arith,world:doc",
               "eval.limit": 8, "eval.role": "answerer", "eval.max_new_tokens": 16,
               "world.seed": 5}
  runs = []
  for name in ("a", "b"):
    if players == "scripted":
      _run(tmp_path / name, monkeypatch, **overrides)
    else:
      runner.run(config(**overrides), str(tmp_path / name))
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    runs.append([{k: v for k, v in r.items() if not _timing(k)} for r in rows])
  a, b = runs
  assert sum("eval/updates" in r for r in a) == 3 and sum("train/loss" in r for r in a) == 2
  if players == "scripted":
    assert all(0.0 < r["answerer/reward"] < 1.0 for r in a if "answerer/reward" in r)
    assert all(r["train/grad_norm"] > 0.0 for r in a if "train/loss" in r)
  assert a == b


def test_provenance_of_worlds_and_questions(tmp_path, monkeypatch):
  """An export records the worlds its params saw; a run loading it warns that its world:<set>
  evaluations of such a world are not held out; a benchmark whose questions changed between
  sessions of a run is named."""
  from configs import spell  # pylint: disable=import-outside-toplevel
  from scope_jax import run_record  # pylint: disable=import-outside-toplevel
  learn = spell.get_config("learn")
  assert run_record.worlds(learn) == {
      "seed": 0, "corpus_seeds": [], "warmup_seeds": list(range(1000, 1000 + learn.warmup.worlds))}
  assert run_record.worlds(spell.get_config("demo"))["seed"] is None  # Wikipedia leads, no world
  warned = []
  monkeypatch.setattr(runner.logging, "warning", lambda msg, *a: warned.append(msg % a))
  monkeypatch.setattr(evals.logging, "warning", lambda msg, *a: warned.append(msg % a))
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "scope_jax_export.json").write_text(
      json.dumps({"worlds": run_record.worlds(learn)}))
  learn.model.source = f"hf:{tmp_path / 'hf'}"
  runner.warn_trained_on_this_world(learn)
  assert len(warned) == 1 and "trained on world 0" in warned[0], warned
  learn.world.seed = 7  # another world: held out from it
  runner.warn_trained_on_this_world(learn)
  assert len(warned) == 1
  base = tmp_path / "eval" / "doc" / "base"
  base.mkdir(parents=True)
  (base / "results.json").write_text(json.dumps({"examples_sha256": "a" * 64, "metrics": {}}))
  evals.check_same_questions(tmp_path / "eval" / "doc", "a" * 64)
  assert len(warned) == 1
  evals.check_same_questions(tmp_path / "eval" / "doc", "b" * 64)
  assert len(warned) == 2 and "mixes two question sets" in warned[1], warned


def test_control_signal_permutes_what_each_control_names():
  """No control: as given; 'shuffled_rewards': the advantages permuted, the teacher's inputs
  untouched; 'shuffled_rewards_and_teacher': both, the teacher's under another seed."""
  a, p, seed = [0.5, -1.0, 2.0, 0.0, -1.5], [[1], [2], [3], [4], [5]], [0, 1, 2]
  assert runtime.control_signal("", a, p, seed) == (a, p)
  assert runtime.control_signal("shuffled_rewards", a, p, seed) == (runtime.shuffled(a, seed), p)
  wide = runtime.control_signal("shuffled_rewards_and_teacher", a, p, seed)
  assert wide == (runtime.shuffled(a, seed), runtime.shuffled(p, seed + [1])) and wide[1] != p
  assert runtime.control_signal("shuffled_rewards_and_teacher", a, None, seed)[1] is None
  with pytest.raises(ValueError, match="control='shuffle': choose one of"):
    runtime.control_signal("shuffle", a, p, seed)
