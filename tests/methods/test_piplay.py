"""π-Play end to end: configs, prompts, scripted steps through the real updates and the real
index, the teacher batch and its privileged prompt, the λ schedule, the EMA teacher across
resumes, and the CLI demo."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import zlib

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import piplay as piplay_config
from scope_jax import checkpoint as ckpt_lib
from scope_jax import metrics as metrics_lib
from scope_jax import run_record
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.methods.piplay import algorithm as piplay
from scope_jax.methods.piplay import demos as piplay_demos
from scope_jax.core import evals
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.methods.piplay import prompts as P
from scope_jax.methods.piplay import rewards as R
from scope_jax.rl import learner as learner_lib
from scope_jax.rollout.types import Trajectory
from scope_jax.world import World
from scope_jax.world import entities as E
from tests.helpers import compiled_steps
from tests.methods import bundled
from tests.methods import optimizers
from tests.methods.cli import kill_once_exists
from tests.methods.scripted import ScriptedPiPlaySampler, play_all_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLES = {p.title for p in demo.demo_passages()}


def small_config(**overrides):
  c = piplay_config.get_config("demo")
  c.warmup.steps = 0  # the scripted policy needs no warm-up
  c.learner.micro_batch_rows = 1  # 8 rows on the 8-device mesh, not 64
  c.piplay.examiner_steps = 2
  c.piplay.student_steps = 2
  c.piplay.examiner_batch = 6
  c.piplay.student_batch = 2
  c.piplay.group_size = 3
  c.piplay.attempts = 3
  c.piplay.hop_choices, c.piplay.hop_ratio = (1, 2, 3), (1, 1, 1)
  c.piplay.data.candidates_per_round = 4
  c.piplay.roles.examiner.max_turns = 2
  for role in ("examiner", "student", "teacher"):
    c.piplay.roles[role].max_new_tokens = 80
    c.piplay.roles[role].max_obs_tokens = 48
  c.progress = False
  c.update_from_flattened_dict(overrides)
  return c


def scripted(rt, **kw):
  method = piplay.PiPlay(rt)
  play_all_roles(rt, ScriptedPiPlaySampler(rt.tokenizer, **kw))
  return method


def leaves(params):
  return [np.asarray(x).copy() for x in jax.tree.leaves(params)]


# ---------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("preset", piplay_config.PRESETS)
def test_every_preset_loads(preset):
  c = piplay_config.get_config(preset)
  if preset != "demo":
    c.model.tokenizer, c.retrieval.encoder, c.retrieval.index = "/tmp", "/tmp/e5", "/tmp/idx"
    c.retrieval.corpus = "/tmp/corpus.jsonl"
  runner.validate(c)
  if preset == "paper":
    assert tuple(c.piplay.lambdas) == (0.03, 0.003, 0.002) and c.piplay.variant == "thinking"
    assert c.total_steps == 300 and c.piplay.examiner_batch == c.piplay.student_batch == 256
    assert c.piplay.roles.student.max_turns == 4 and c.piplay.tau == 0.05  # 5 turns in all
    # Dr.Zero's tool output cap, max_tool_response_length 512, in verl's character unit
    assert all(c.piplay.roles[r].max_obs_chars == 512 for r in ("examiner", "student", "teacher"))
    assert dict(c.piplay.examiner_optim) == {"lr": 5e-7, "grad_clip": 0.1}
    assert dict(c.piplay.student_optim) == {"grad_clip": 0.1, "warmup_steps": 2}
    assert tuple(c.piplay.restart_optimizer) == ("student",) and c.piplay.adv_std == "unbiased"
    assert c.piplay.student_loss.distill_topk == 50 and c.piplay.group_size == 5
  if preset == "paper_instruct":
    assert tuple(c.piplay.lambdas) == (0.1, 0.03, 0.03) and c.piplay.variant == "instruct"


def test_validation_names_the_fix():
  for key, value, needle in [("piplay.teacher", "all", "piplay.teacher"),
                             ("piplay.hop_choices", (1, 5), "piplay.hop_choices"),
                             ("piplay.hop_ratio", (1,), "one weight per entry"),
                             ("piplay.lambdas", (0.1, -1.0), "none negative"),
                             ("piplay.tau", 0.0, "(0, 1]"),
                             ("piplay.attempts", 1, "at least 2"),
                             ("piplay.roles.examiner.max_turns", 1, "largest hop count"),
                             ("piplay.restart_optimizer", ("teacher",), "the policies are"),
                             ("piplay.adv_std", "sample", "piplay.adv_std"),
                             ("warmup.world_seed", 0, "includes the run's world.seed=0"),
                             ("eval.prompt", "question", "eval.prompt='question'")]:
    c = small_config(**{"warmup.steps": 5, "eval.every": 1, "eval.benchmarks": "world:hop1"})
    c.update_from_flattened_dict({key: value})
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("]", r"\]")):
      runner.validate(c)


def test_optimizer_settings_go_to_the_optimizer_overrides():
  c = small_config()
  c.piplay.examiner_loss.lr = 5e-7  # a TypeError deep in LossConfig before
  with pytest.raises(ValueError, match="policy 'examiner': lr is not a loss setting .*optimizer"):
    runner.validate(c)
  c = small_config()
  c.piplay.student_optim.learning_rate = 1e-6
  with pytest.raises(ValueError, match="policy 'student' optimizer overrides: learning_rate is not an optimizer"):
    runner.validate(c)


def _moments(opt_state):
  return sum(float(np.abs(np.asarray(x, np.float64)).sum()) for x in jax.tree.leaves(opt_state))


def test_each_policy_trains_with_its_own_optimizer_and_the_student_restarts(tmp_path, monkeypatch):
  """Table 5's examiner lr beside the student's; `restart_optimizer` gives the named policy fresh
  AdamW moments and schedule at each later iteration (Dr.Zero's new solver trainer), its params
  and step count kept, and leaves the other policy's state alone."""
  c = small_config()
  c.piplay.examiner_optim = ml_collections.ConfigDict(dict(lr=5e-3))
  c.piplay.restart_optimizer = ("student",)
  m = piplay.PiPlay(runtime.Runtime(c, str(tmp_path)))
  u_exam, exam_state = optimizers.adam_first_update(m.rt.policies["examiner"])
  u_stud, stud_state = optimizers.adam_first_update(m.rt.policies["student"])
  chex.assert_trees_all_close(u_exam, np.full_like(u_exam, -5e-3), rtol=1e-4)
  chex.assert_trees_all_close(u_stud, np.full_like(u_stud, -c.optim.lr), rtol=1e-4)
  m.rt.policies["examiner"].state = m.rt.policies["examiner"].state.replace(opt_state=exam_state)
  m.rt.policies["student"].state = m.rt.policies["student"].state.replace(opt_state=stud_state, step=jnp.asarray(3, jnp.int32))
  params = leaves(m.rt.policies["student"].state.params)
  monkeypatch.setattr(m, "examiner_step", lambda it, k, step: {})
  monkeypatch.setattr(m, "student_step", lambda it, k, step: {})
  m.step(2)  # iteration 0's first student step: nothing to restart
  assert _moments(m.rt.policies["student"].state.opt_state) > 0
  m.step(6)  # iteration 1's first student step
  assert _moments(m.rt.policies["student"].state.opt_state) == 0 and int(m.rt.policies["student"].state.step) == 3
  chex.assert_trees_all_equal(leaves(m.rt.policies["student"].state.params), params)
  assert _moments(m.rt.policies["examiner"].state.opt_state) > 0  # the examiner's trainer goes on
  m.step(4)  # an examiner phase start: not named, not restarted
  assert _moments(m.rt.policies["examiner"].state.opt_state) > 0


def test_teacher_inputs_fit_the_teacher_context(tmp_path):
  """Table 7: the teacher reads at most 8,192 tokens, its prompt (with the QCP) and the student's
  response; the privileged text is what gets cut."""
  c = small_config()
  c.piplay.roles.teacher.max_context = 300
  m = piplay.PiPlay(runtime.Runtime(c, str(tmp_path)))
  role = m.roles["teacher"]
  long = "A fact about the document. " * 200
  records = [{"privileged": long, "question": "Who?"}, {"privileged": "short", "question": "Who?"}]
  full = m.teacher_prompts(records)
  assert len(full[0]) > 200
  resp = lambda i: Trajectory(np.zeros(170, np.int32), np.zeros(170, np.int32),
                              np.zeros(170, np.float32), 20, [], [], None, None, "eos",
                              prompt_index=i)
  trajs = [resp(0), resp(1)]  # 150 response tokens each
  ids = m.teacher_inputs(records, trajs)
  assert len(ids[0]) + 150 <= role.max_context and len(ids[0]) < len(full[0])
  assert ids[1] == full[1]  # it already fits: unchanged


def test_teacher_inputs_survive_a_response_longer_than_the_template_leaves(tmp_path):
  """A student response that leaves less room than the teacher template and question alone must
  not stop the run: the QCP goes, then the prompt is cut from the left (verl's truncation='left'),
  keeping the question and the assistant header next to the response; both cuts are counted."""
  c = small_config()
  c.piplay.roles.teacher.max_context = 300
  m = piplay.PiPlay(runtime.Runtime(c, str(tmp_path)))
  role = m.roles["teacher"]
  records = [{"privileged": "A fact about the document. " * 50, "question": "Who wrote it?"},
             {"privileged": "short", "question": "Who?"}]
  bare = role.prompt(m.prompts.teacher("", records[0]["question"]))
  assert len(bare) > 12  # the template alone is longer than the room below
  resp = lambda i, n: Trajectory(np.zeros(n + 20, np.int32), np.zeros(n + 20, np.int32),
                                 np.zeros(n + 20, np.float32), 20, [], [], None, None, "eos",
                                 prompt_index=i)
  metrics = {}
  ids = m.teacher_inputs(records, [resp(0, 288), resp(1, 10)], metrics)
  assert ids[0] == bare[-12:]  # 300 - 288 tokens: the right end of the prompt without a QCP
  assert ids[1] == m.teacher_prompts(records)[1]
  assert metrics == {"teacher/truncated_rows": 1.0, "teacher/left_truncated_rows": 1.0}


@pytest.mark.parametrize("style", sorted(P.STYLES))
@pytest.mark.parametrize("variant", P.VARIANTS)
@pytest.mark.parametrize("syntax", ["xml", "qwen"])
def test_prompts_carry_the_same_fields_in_every_style(style, variant, syntax):
  prompts = P.Prompts(style, variant, syntax, max_doc_chars=40)
  doc = demo.demo_passages()[0]
  examiner = prompts.examiner(doc, 3).text()
  assert "n = 3" in examiner and doc.title in examiner and doc.text[:10] in examiner
  assert doc.text[30:80] not in examiner  # the document is cut to max_doc_chars
  teacher = prompts.teacher("THE-PATH", "THE-QUESTION").text()
  assert "THE-PATH" in teacher and teacher.rstrip().endswith("THE-QUESTION")
  student = prompts.student("THE-QUESTION").text()
  assert "THE-QUESTION" in student and "THE-PATH" not in student
  for text in (examiner, teacher, student):
    if syntax == "xml":
      assert "<search>" in text and "tool_call" not in text and "tool_response" not in text
    else:
      assert "<tool_call>" in text and "<search>" not in text
  assert (prompts.system() is not None) == (style == "paper" and syntax == "qwen")


def test_xml_syntax_rewrites_the_papers_example_calls():
  text = ('<tool_call>\\n{"name": "search", "arguments": {"query_list": ["1988 AFL"]}}\\n'
          '</tool_call> <tool_response> ...... </tool_response> by <tool_call> query </tool_call>')
  assert P.xml_syntax(text) == ("<search> 1988 AFL </search> <information> ...... </information> "
                                "by <search> query </search>")


# ---------------------------------------------------------------------------------- steps

def test_schedule_and_lambda(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = piplay.PiPlay(rt)
  assert [m.locate(s) for s in range(5)] == [(0, "examiner", 0), (0, "examiner", 1),
                                             (0, "student", 0), (0, "student", 1),
                                             (1, "examiner", 0)]
  assert [m.distill_coef(i) for i in range(4)] == [0.3, 0.1, 0.1, 0.1]
  m.cfg.teacher = "none"
  assert m.distill_coef(0) == 0.0
  picks = m.examiner_prompts(0)
  assert sorted(h for _, h in picks) == [1] * 4 + [2] * 4 + [3] * 4  # stratified 1:1:1
  assert not {d.id for d, _ in picks} & {d.id for d, _ in m.data_prompts(0)}


def test_examiner_step_rewards_and_hop_keyed_update(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt)
  student_before = leaves(m.rt.policies["student"].state.params)
  examiner_before = leaves(m.rt.policies["examiner"].state.params)
  seen = {}
  train = rt.train

  def spy(policy, trajs, advs, **kw):
    seen["advs"] = np.asarray(advs)
    return train(policy, trajs, advs, **kw)

  rt.train = spy
  propose = m.propose
  m.propose = lambda picks: seen.setdefault("qs", propose(picks))
  rt.begin_step(0)
  metrics = m.step(0)
  qs = seen["qs"]
  assert metrics["stage"] == 0 and metrics["examiner/train/applied"] == 1.0
  for q in qs:  # the scripted examiner searched as asked and its answer is in the sources
    if q.valid:
      assert q.traj.num_searches == min(q.hops - 1, 2) and q.parts["ans"] == 1.0
  assert metrics["examiner/valid_rate"] < 1.0  # some rows leave out the <question>
  assert metrics["examiner/malformed_no_question"] >= 1
  assert "examiner/hop2/searches" in metrics and metrics["examiner/hop2/required_searches"] == 1
  assert "examiner/student_solve_rate/mean" in metrics
  hops = [h for _, h in m.examiner_prompts(0)[:6]]
  for h in set(hops):  # advantages are z-scored within each hop group
    group = seen["advs"][np.asarray(hops) == h]
    assert abs(group.sum()) < 1e-4
  chex.assert_trees_all_equal(student_before, leaves(m.rt.policies["student"].state.params))
  with pytest.raises(AssertionError):
    chex.assert_trees_all_equal(examiner_before, leaves(m.rt.policies["examiner"].state.params))


def test_student_step_teacher_sees_the_qcp_and_the_student_does_not(tmp_path, monkeypatch):
  rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1}), str(tmp_path))
  m = scripted(rt, malformed_every=0)
  batches = []
  make_batch = learner_lib.Learner.make_batch

  def spy(self, trajs, advs, teacher_prompts=None):
    out = make_batch(self, trajs, advs, teacher_prompts)
    batches.append(out[0])
    return out

  monkeypatch.setattr(learner_lib.Learner, "make_batch", spy)
  teacher_before = leaves(rt.frozen["teacher"])
  rt.begin_step(1)
  metrics = m.step(1)  # the first student step: builds the data set, then trains
  assert metrics["stage"] == 1 and metrics["data/size"] >= 2
  assert metrics["student/lambda"] == 0.3 and metrics["student/train/distill_loss"] > 0
  assert "student/train/teacher_logprob_gap" in metrics and "teacher/em" in metrics
  assert metrics["teacher/em"] > metrics["student/outcome/mean"]  # the QCP helps (scripted)
  batch = batches[-1]
  decode = lambda row: rt.tokenizer.decode([int(t) for t in row if t != rt.pad_id])
  resp = batch.loss_mask.sum(1) > 0
  for i in np.flatnonzero(resp):
    cols = np.flatnonzero(batch.mask[i])
    p_end = np.flatnonzero(batch.loss_mask[i])[0]
    chex.assert_trees_all_equal(batch.tokens[i, p_end:], batch.teacher_tokens[i, p_end:])
    student_prompt = decode(batch.tokens[i, cols[0]:p_end])
    teacher_prompt = decode(batch.teacher_tokens[i, :p_end])
    assert "Document:" not in student_prompt and "=====" not in student_prompt
    assert "n = " in teacher_prompt and "Document:" in teacher_prompt  # the QCP ...
    assert "<answer>" in teacher_prompt.split("=====")[1]  # ... down to the examiner's answer
  record = m.sets["0"][0]
  assert record["privileged"].startswith("n = ")
  # the teacher moved by τ towards the updated student: ψ = 0.95 ψ0 + 0.05 θ
  expect = [0.95 * a + 0.05 * b for a, b in zip(teacher_before, leaves(m.rt.policies["student"].state.params))]
  chex.assert_trees_all_close(leaves(rt.frozen["teacher"]), expect, atol=1e-6, rtol=1e-6)


def test_lambda_change_between_iterations_changes_the_loss(tmp_path):
  """The same student batch under iteration 0's λ and iteration 1's: the loss differs by
  Δλ · D_distill (the step cache compiles one program per λ)."""
  rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1}), str(tmp_path))
  m = scripted(rt, malformed_every=0)
  rt.begin_step(1)
  data = m.build_set(0, {})[:2]
  trajs = m.solve([r["question"] for r in data], 3)
  teacher = m.teacher_prompts(data)
  advs = np.zeros(len(trajs), np.float32)
  out, saved = {}, jax.tree.map(jnp.copy, m.rt.policies["student"].state)
  for it in (0, 1):
    m.rt.policies["student"].state = jax.tree.map(jnp.copy, saved)  # the same params for both (steps donate)
    loss = dataclasses.replace(m.rt.policies["student"].loss, distill_coef=m.distill_coef(it))
    out[it] = rt.learner.train(m.rt.policies["student"], trajs, advs, loss=loss,
                               teacher_params=rt.frozen["teacher"],
                               teacher_prompts=[teacher[t.prompt_index] for t in trajs])
  d = out[0]["distill_loss"]
  assert d > 0 and out[0]["distill_loss"] == pytest.approx(out[1]["distill_loss"], rel=1e-5)
  assert out[0]["loss"] - out[1]["loss"] == pytest.approx((0.3 - 0.1) * d, rel=1e-4)
  assert compiled_steps(rt.learner) == 2


def test_no_teacher_ablation_skips_distillation(tmp_path):
  rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1, "piplay.teacher": "none"}),
                       str(tmp_path))
  m = scripted(rt, malformed_every=0)
  teacher_before = leaves(rt.frozen["teacher"])
  rt.begin_step(1)
  metrics = m.step(1)
  assert "student/train/distill_loss" not in metrics and "teacher/em" not in metrics
  assert metrics["student/lambda"] == 0.0
  chex.assert_trees_all_equal(teacher_before, leaves(rt.frozen["teacher"]))


# --------------------------------------------------------------------- runs and resume

def _run_scripted(config, workdir, monkeypatch, holder=None):
  def make(rt):
    method = scripted(rt)
    if holder is not None:
      holder["method"] = method
    return method
  monkeypatch.setattr(piplay, "make_method", make)
  return runner.run(config, str(workdir))


def _comparable(rec):
  return {k: v for k, v in rec.items() if not k.startswith("time/") and "per_s" not in k}


@pytest.mark.slow  # eight scripted steps; the default suite checks the checkpoint round trip
def test_resume_in_both_phases_matches_an_uninterrupted_run(tmp_path, monkeypatch):
  """Stops after step 0 (inside the examiner phase) and step 2 (inside the student phase, after
  the data set was built and the teacher moved); every step's metrics and the final teacher
  equal the uninterrupted run's, bit for bit."""
  def config(steps=None):
    c = small_config(**{"piplay.iterations": 1})
    if steps is not None:
      c.total_steps = steps
    return c
  full, cut = {}, {}
  _run_scripted(config(), tmp_path / "full", monkeypatch, full)
  for steps in (1, 3, None):
    _run_scripted(config(steps), tmp_path / "cut", monkeypatch, cut)
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert sorted(a) == sorted(b) == [0, 1, 2, 3]
  for step in range(4):
    assert _comparable(a[step]) == _comparable(b[step]), step
  bits = lambda ps: [x.view(np.uint8) for x in leaves(ps)]
  chex.assert_trees_all_equal(bits(full["method"].rt.frozen["teacher"]),
                              bits(cut["method"].rt.frozen["teacher"]))
  assert full["method"].sets == cut["method"].sets
  record = run_record.read(str(tmp_path / "cut"))  # the teacher is saved and can be evaluated
  assert record.policies == ("examiner", "student", "teacher")
  assert record.roles["teacher"] == "teacher"


def test_checkpoint_restores_the_teacher_and_the_data_bit_identically(tmp_path):
  rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1}), str(tmp_path / "a"))
  m = scripted(rt, malformed_every=0)
  rt.begin_step(1)
  m.step(1)  # builds the data set, trains the student, moves the teacher
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt", async_save=False)
  ckpt.save(1, rt.device_state(), m.host_state())
  fresh_rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1}), str(tmp_path / "a"))
  fresh = piplay.PiPlay(fresh_rt)
  step, state, host = ckpt.restore_latest(fresh_rt.device_state())
  fresh_rt.load_device_state(state)
  fresh.load_host_state(host)
  bits = lambda ps: [x.view(np.uint8) for x in leaves(ps)]
  assert step == 1 and fresh.sets == m.sets  # read back from data/iteration_0.jsonl
  assert len(json.dumps(host)) < 2000  # the checkpoint keeps a digest, not the data set
  chex.assert_trees_all_equal(bits(rt.frozen["teacher"]), bits(fresh_rt.frozen["teacher"]))
  with pytest.raises(AssertionError):  # the restored teacher is not the base model
    chex.assert_trees_all_equal(bits(fresh_rt.base_params), bits(fresh_rt.frozen["teacher"]))
  (tmp_path / "a" / "data" / "iteration_0.jsonl").write_text("{}\n")
  with pytest.raises(ValueError, match="missing or changed"):
    fresh.load_host_state(host)
  # the teacher role plays the restored params
  assert fresh.roles["teacher"].sampler is fresh_rt._frozen_samplers["teacher"]
  chex.assert_trees_all_equal(bits(fresh_rt.frozen["teacher"]),
                              bits(fresh.roles["teacher"].sampler.params))


def test_demonstrations_cover_every_role_with_real_search_results(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = piplay.PiPlay(rt)
  demos = piplay_demos._Demos(method, np.random.default_rng(0)).build(4)
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  assert sum("You are the examiner" in t for t in text) >= 6
  assert sum("You are the teacher" in t for t in text) >= 4
  assert sum("Answer the question." in t for t in text) >= 4
  for d, t in zip(demos, text):
    for s in d.spans:
      if s.kind == "observation":
        assert not d.loss_mask[s.start:s.end].any()
        assert all(x in TITLES for x in _titles(s.text))
    final = d.spans[-1].text
    assert "</answer>" in final and d.loss_mask[-1] == 1
    if "You are the examiner" in t:
      assert R.parse_examiner(final).malformed is None


def test_world_demonstrations_come_from_other_worlds(tmp_path):
  """A `learn` warm-up demonstrates on other worlds: each question is one of theirs (never the
  run's world's), asked by the examiner about its entity's document, searched by name and
  answered with that world's fact from that world's own search results. Its held-out questions
  are asked in the student's own prompt (eval.prompt='role')."""
  c = small_config(**{"retrieval.corpus": "world", "retrieval.topk": 2, "warmup.world_seed": 7,
                      "warmup.worlds": 2, "warmup.documents": 3, "piplay.syntax": "qwen",
                      "piplay.hop_choices": (1,), "piplay.hop_ratio": (1,), "eval.every": 1,
                      "eval.benchmarks": "world:hop1", "eval.prompt": "role", "eval.limit": 2})
  rt = runtime.Runtime(c, str(tmp_path))
  method = piplay.PiPlay(rt)
  # eval.prompt='role': a held-out question is asked exactly as the student is asked.
  ev = evals.Evaluations(rt, method)
  question = "Who founded Migra Guild?"
  assert ev.evaluators[ev.benches[0].name].role_prompt("qa_search", question) == \
      rt.roles["student"].prompt(method.prompts.student(question))
  assert ev.evaluators[ev.benches[0].name].role_prompt("qa", question) is None  # never asked so
  demos = piplay_demos.demonstrations(method, np.random.default_rng(0))
  worlds = [World(7), World(8)]
  answers = {q["question"]: q["gold"][0] for w in worlds for q in w.questions(10 ** 4,
                                                                          np.random.default_rng(0))}
  titles = {d.title for w in worlds for d in w.documents}
  own = {q["question"] for q in World(0).questions(10 ** 4, np.random.default_rng(0))}
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  assert sum("You are the examiner" in t for t in text) == 6
  assert sum("You are the teacher" in t for t in text) >= 4
  students = [(d, t) for d, t in zip(demos, text) if t.count("Answer the question.")]
  assert len(students) >= 4
  for d, t in students:
    question = re.search(r"Question: (.*?\?)", t).group(1)
    assert question in answers and question not in own, question
    call = d.spans[1].text
    assert '{"name": "search", "arguments": {"query": "' in call
    entity = re.search(r'"query": "(.*?)"', call).group(1)
    assert entity in question and entity in titles
    obs = [s.text for s in d.spans if s.kind == "observation"][0]
    assert all(x in titles for x in _titles(obs)) and entity == _titles(obs)[0]
    assert f"<answer>{answers[question]}</answer>" in d.spans[-1].text


def test_closed_class_demonstrations_read_only_sometimes(tmp_path):
  """`piplay.warmup.skill='attr'`: the examiner asks other worlds' closed-class facts; the
  student searches the entity and answers right in about `piplay.warmup.right_share` of its
  answers (otherwise another member of the fact's class); the teacher, told the answer, always
  gives it."""
  c = small_config(**{"retrieval.corpus": "world", "retrieval.topk": 2, "warmup.world_seed": 7,
                      "warmup.worlds": 2, "warmup.documents": 60, "piplay.warmup.skill": "attr",
                      "piplay.warmup.right_share": 0.5, "piplay.hop_choices": (1,),
                      "piplay.hop_ratio": (1,)})
  rt = runtime.Runtime(c, str(tmp_path))
  demos = piplay_demos.demonstrations(piplay.PiPlay(rt), np.random.default_rng(0))
  answers = {q["question"]: q["gold"][0] for w in (World(7), World(8))
             for q in w.questions(10 ** 4, np.random.default_rng(0), "attr")}
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  right = {"student": [], "teacher": []}
  for t in text:
    role = "teacher" if "You are the teacher" in t else "student" if t.count(
        "Answer the question.") else None
    if role is None:
      continue
    question = re.search(r"Question: (.*?\?)", t).group(1)
    gold = answers[question]
    reply = re.findall(r"<answer>(.*?)</answer>", t)[-1]
    assert reply == gold or reply in E.other_members(gold), (reply, gold)
    right[role].append(reply == gold)
  assert len(right["student"]) >= 40 and all(right["teacher"])
  assert 0.3 < np.mean(right["student"]) < 0.7


def _titles(text):
  import re
  return re.findall(r"Doc \d+\(Title: (.*?)\)", text)


# ------------------------------------------------------------------------------- the CLI demo

def _cli(workdir, *extra, wait=True):
  env = dict(os.environ, PYTHONPATH=ROOT)
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/piplay.py",
         f"--workdir={workdir}", *extra]
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


QUICK_WARMUP = ("--config.warmup.steps=20", "--config.warmup.documents=8")


@pytest.mark.slow  # minutes on a 2-core CPU; SPELL's (the README's command) runs by default
def test_cli_demo_runs_every_phase(tmp_path):
  """The demo's pipeline with a short warm-up (the default command is the slow test below):
  both iterations of examiner and student steps, checkpoints with the teacher, metrics, samples,
  TensorBoard."""
  out = _cli(tmp_path / "run", *QUICK_WARMUP)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Finished piplay (demo)" in out.stdout and "wall time per stage" in out.stdout
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [r["stage"] for r in records] == [0, 1, 0, 1]
  assert "examiner/reward/mean" in records[0] and "data/size" in records[1]
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints"))[-1] == "3"
  assert (tmp_path / "run" / "samples.log").exists() and (tmp_path / "run" / "tb").exists()
  assert run_record.read(str(tmp_path / "run")).policies == ("examiner", "student", "teacher")


@pytest.mark.slow
def test_cli_default_demo_trains_every_phase_on_its_own_output(tmp_path):
  """The default command: the warmed model's own examiner writes questions the students answer,
  the student trains with distillation from the teacher, and the teacher's EM is logged."""
  out = _cli(tmp_path / "run")
  assert out.returncode == 0, out.stderr[-3000:]
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  examiner = [r for r in records if r["stage"] == 0]
  assert np.mean([r["examiner/valid_rate"] for r in examiner]) >= 0.5
  student = [r for r in records if r["stage"] == 1]
  assert all(r["data/size"] > 0 and r["student/train/distill_loss"] > 0 for r in student)
  assert all("teacher/em" in r for r in student)


@pytest.mark.slow
@pytest.mark.parametrize("kill_after, phase", [("0", "examiner"), ("1", "student")])
def test_cli_sigkill_and_resume_in_each_phase(tmp_path, kill_after, phase):
  proc = _cli(tmp_path / "cut", wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / kill_after, timeout=1200)
  resumed = _cli(tmp_path / "cut")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  records = metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1, 2, 3]
  assert records[int(kill_after)]["stage"] == piplay.PiPlay.stages.index(phase)


def test_the_searcher_model_was_shown_the_learn_presets_own_tokens(tmp_path):
  """The bench that fits the `learn` preset's start (`tools/world_reading.py --skill=play`)
  shows each role exactly the tokens π-Play's own world warm-up builds with the preset's prompts,
  limits and one search result: what the start learned is what the run asks of it."""
  from tools import world_reading  # pylint: disable=import-outside-toplevel
  from scope_jax.world import search  # pylint: disable=import-outside-toplevel
  c = piplay_config.get_config("learn")
  c.warmup.world_seed = 7
  c.piplay.warmup.update(dict(skill="attr", right_share=1.0))
  c.progress = False
  rt = runtime.Runtime(c, str(tmp_path))
  method = piplay.PiPlay(rt)
  world = World(7)
  builder = piplay_demos._WorldDemos(method, np.random.default_rng(0))  # pylint: disable=protected-access
  builder.tool = search.from_config(ml_collections.ConfigDict(dict(
      url="", index="", corpus="world", max_documents=0, encoder="minilm", topk=1)), 7)[1]
  questions = world.questions(4, np.random.default_rng(0), "attr")
  ours = world_reading.play_examples(rt.tokenizer, world, questions,
                                     max_obs=c.piplay.roles.student.max_obs_tokens)
  by_id = {d.id: d for d in world.documents}
  for i, q in enumerate(questions):
    theirs = builder.question(by_id[q["support"][0]], q["question"], q["gold"][0])
    assert len(theirs) == 3, q  # the page came back first: all three roles are shown
    for role, demo in zip(world_reading.PLAY_ROLES, theirs):
      chex.assert_trees_all_equal((ours[role][i].tokens, ours[role][i].loss_mask),
                                  (demo.tokens, demo.loss_mask))


def test_the_controls_permute_the_advantages_and_only_the_wide_one_the_teacher(tmp_path,
                                                                              monkeypatch):
  """`control=shuffled_rewards` on a distilling update permutes the advantages alone (the same
  rows, the same teacher inputs); `shuffled_rewards_and_teacher` also permutes the teacher's
  inputs, whose log-probs are the student's per-token reward (another seed), so that no row is
  pulled toward its own question's privileged answer."""
  seen = []
  train = learner_lib.Learner.train

  def spy(self, policy, trajectories, advantages, **kw):
    if kw.get("teacher_prompts") is not None:
      seen.append((list(advantages), [list(p) for p in kw["teacher_prompts"]]))
    return train(self, policy, trajectories, advantages, **kw)

  monkeypatch.setattr(learner_lib.Learner, "train", spy)
  for control in ("", "shuffled_rewards", "shuffled_rewards_and_teacher"):
    rt = runtime.Runtime(small_config(**{"piplay.examiner_steps": 1, "control": control}),
                         str(tmp_path / (control or "plain")))
    m = scripted(rt, malformed_every=0)
    rt.begin_step(1)
    m.step(1)  # the first student step
  (advs, prompts), (a_advs, a_prompts), (w_advs, w_prompts) = seen
  seed = [0, 1, zlib.crc32(b"student")]
  assert a_advs == runtime.shuffled(advs, seed) and a_prompts == prompts
  assert w_advs == a_advs
  assert w_prompts == runtime.shuffled(prompts, seed + [1]) and w_prompts != prompts


def test_the_learn_preset_starts_from_the_shipped_searcher_model():
  """The searcher model ships with the package (a few MB, listed in setup.py's package data) and
  has the demo model's shape, so the demo tokenizer fits it; the preset adds no warm-up."""
  from scope_jax.data import SEARCHER_MODEL  # pylint: disable=import-outside-toplevel
  bundled.assert_learn_starts_from(piplay_config.get_config("learn"), SEARCHER_MODEL)
