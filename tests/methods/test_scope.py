"""SCOPE end to end: configs, schedule, scripted steps through the real updates and the real
index, the frozen Judge, resume inside and between stages, and the CLI demo."""

import collections
import json
import os
import subprocess
import sys

import chex
import jax
import ml_collections
import numpy as np
import pytest

from configs import scope as scope_config
from scope_jax import metrics as metrics_lib
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.methods.scope import algorithm as scope
from scope_jax.methods.scope import demos as scope_demos
from scope_jax.methods.scope import prompts as P
from scope_jax.methods.scope import rewards as R
from scope_jax.rollout import search_agent
from tests.methods import bundled
from tests.methods import optimizers
from tests.methods.cli import kill_once_exists
from tests.methods.scripted import ScriptedScopeSampler, play_all_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLES = {p.title for p in demo.demo_passages()}


def small_config(**overrides):
  c = scope_config.get_config("demo")
  c.warmup.steps = 0  # the scripted policy needs no warm-up
  c.scope.prompt_style = "paper"  # the scripted policy reads the App. H prompts
  c.scope.iterations = 2
  c.scope.challenger_steps = 2
  c.scope.solver_steps = 2
  c.scope.challenger_batch = 3
  c.scope.solver_batch = 2
  c.scope.group_size = 2
  c.scope.task_set.candidates_per_round = 6
  c.scope.search_choices, c.scope.search_ratio = (1, 2, 3), (4, 3, 2)
  c.scope.roles.challenger.max_turns = 4
  c.scope.roles.solver.max_turns = 2
  c.scope.roles.challenger.max_new_tokens = 200
  c.scope.roles.solver.max_new_tokens = 200
  c.scope.roles.rubric.max_new_tokens = 200
  c.scope.roles.grader.max_new_tokens = 40
  c.scope.roles.gate.max_new_tokens = 40
  c.progress = False
  c.update_from_flattened_dict(overrides)
  return c


def scripted(rt, **kw):
  method = scope.Scope(rt)
  play_all_roles(rt, ScriptedScopeSampler(rt.tokenizer, **kw))
  return method


def leaves(params):
  return [np.asarray(x).copy() for x in jax.tree.leaves(params)]


# ---------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("preset", scope_config.PRESETS)
def test_every_preset_loads(preset):
  c = scope_config.get_config(preset)
  assert c.method == "scope" and c.preset == preset
  if preset.startswith("paper"):
    s = c.scope
    assert (s.iterations, s.challenger_steps, s.solver_steps) == (3, 20, 20)
    assert (s.challenger_batch, s.solver_batch, s.group_size) == (64, 256, 8)
    assert (s.solver_rollouts_train, s.task_set.solver_rollouts, s.task_set.window) == (8, 4, (0.2, 0.8))
    assert (c.optim.lr, c.optim.warmup_steps, c.optim.total_steps, c.optim.grad_clip) == (1e-6, 0, 60, 1.0)
    assert (c.optim.weight_decay, s.adv_std, s.max_criteria, s.stage1_grader_temperature) == (
        0.01, "unbiased", 10, 0.0)
    assert (s.task_set.candidates_per_round, s.task_set.max_rounds, s.roles.gate.max_new_tokens) \
        == (2000, 20, 256)
    assert (c.loss.kl_beta, c.loss.kl_kind, c.loss.agg_mode) == (1e-3, "k3", "token-mean")
    assert (s.roles.rubric.temperature, s.roles.grader.temperature) == (0.0, 0.6)
    assert (s.roles.solver.max_obs_tokens, c.retrieval.topk, c.rollout.max_context) == (500, 3, 16384)
    assert s.roles.solver.max_turns == 4  # released: 5 assistant turns, "search up to 4 times"
    assert s.search_ratio == (4, 3, 2) and s.search_choices == (1, 2, 3)
    assert c.total_steps == 120 and c.warmup.steps == 0
    assert (s.task_form, s.rubric_sees_searches, s.stage1_solver_sampling,
            s.task_set.samples_per_document) == ("plain", True, (0.7, 0.9), 4)
    assert (s.syntax, s.per_turn_datums) == {"paper": ("xml", False), "paper_qwen3": ("qwen", True),
                                             "paper_olmo3": ("function_calls", False)}[preset]
    assert c.model.source == {"paper": "preset:qwen2.5-7b", "paper_qwen3": "preset:qwen3-8b",
                              "paper_olmo3": "preset:olmo3-7b"}[preset]


def test_total_steps_follow_the_schedule_unless_set():
  c = scope_config.get_config("demo")
  assert c.total_steps == c.scope.iterations * (c.scope.challenger_steps + c.scope.solver_steps)
  c.scope.iterations = 5
  assert c.total_steps == 5 * (c.scope.challenger_steps + c.scope.solver_steps)
  c.total_steps = 3
  assert c.total_steps == 3


def test_validation_names_the_fix(tmp_path):
  with pytest.raises(ValueError, match="scope.syntax='json' is not valid; choose one of: xml, qwen"):
    runner.validate(small_config(**{"scope.syntax": "json"}))
  with pytest.raises(ValueError, match="scope.task_types='poetry' is not valid"):
    runner.validate(small_config(**{"scope.task_types": ("poetry",)}))
  with pytest.raises(ValueError, match="needs one weight per entry"):
    runner.validate(small_config(**{"scope.search_ratio": (1, 1)}))
  with pytest.raises(ValueError, match="window"):
    runner.validate(small_config(**{"scope.task_set.window": (0.8, 0.2)}))
  with pytest.raises(ValueError, match="scope.prompt_style='short' is not valid"):
    runner.validate(small_config(**{"scope.prompt_style": "short"}))
  with pytest.raises(ValueError, match="max_turns=1 is below the largest required search count 3"):
    runner.validate(small_config(**{"scope.roles.challenger.max_turns": 1}))
  with pytest.raises(ValueError, match="policy 'solver' optimizer overrides: learning_rate is not an optimizer"):
    runner.validate(small_config(**{"scope.solver_optim": {"learning_rate": 1e-6}}))
  paper = scope_config.get_config("paper")
  paper.model.tokenizer = str(tmp_path)
  with pytest.raises(ValueError, match="retrieval.encoder is empty"):
    runner.validate(paper)
  paper.retrieval.encoder = str(tmp_path)
  with pytest.raises(ValueError, match="Searching needs an index"):
    runner.validate(paper)


@pytest.mark.parametrize("style", sorted(P.STYLES))
@pytest.mark.parametrize("syntax", ["xml", "qwen", "function_calls"])
def test_prompt_styles_carry_the_same_fields_and_tags(style, syntax):
  doc = demo.demo_passages()[0]
  p = P.Prompts(style, syntax, max_doc_chars=50)
  challenger = p.challenger(doc, "planning", 2).text()
  for part in (doc.title, doc.text[:50], "exactly 2 search turn(s)", "<task>", "<question>",
               search_agent.search_instructions(syntax), P.TASK_TYPES["planning"]):
    assert part in challenger
  assert doc.text[:51] not in challenger  # the document is cut to max_doc_chars
  solver = p.solver("Plan a trip.", 3).text()
  assert "up to 3" in solver and "<answer>" in solver
  entity, source = (q.text() for q in p.gates("Plan a trip.", doc))
  assert "<score>1</score>" in entity and doc.title in source and "Plan a trip." in source
  rubric = p.rubric("Plan a trip.", doc).text()
  assert "<rubric>" in rubric and "[critical]" in rubric
  grader = p.grader("Plan a trip.", "Names a city.", "Oslo.").text()
  assert "Names a city." in grader and "Oslo." in grader and "<score>1</score>" in grader
  with pytest.raises(ValueError, match="Unknown prompt style 'long'"):
    P.Prompts("long")


# ------------------------------------------------------------------------------- schedule

def test_stratified_search_counts_and_task_types():
  rng = np.random.default_rng(0)
  assert sorted(collections.Counter(search_agent.stratified(9, (4, 3, 2), rng)).values()) == [2, 3, 4]
  counts = collections.Counter(search_agent.stratified(18, (4, 3, 2), rng))
  assert (counts[0], counts[1], counts[2]) == (8, 6, 4)
  assert collections.Counter(search_agent.stratified(2, (4, 3, 2), rng)) == {0: 1, 1: 1}  # largest remainders
  with pytest.raises(ValueError, match="non-negative weights"):
    search_agent.stratified(3, (1, -1), rng)


def test_locate_and_documents(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt)
  assert [m.locate(s) for s in range(5)] == [(0, "challenger", 0), (0, "challenger", 1),
                                             (0, "solver", 0), (0, "solver", 1),
                                             (1, "challenger", 0)]
  s1, cands = m.stage1_prompts(0), m.candidate_prompts(0)
  assert len(s1) == 6 and {k for _, _, k in s1} <= {1, 2, 3}
  ids0 = [d.id for d, _, _ in s1] + [d.id for d, _, _ in cands]
  ids1 = [d.id for d, _, _ in m.stage1_prompts(1)] + [d.id for d, _, _ in m.candidate_prompts(1)]
  assert len(set(ids0)) == len(ids0) and not set(ids0) & set(ids1)  # fresh documents
  assert m.stage1_prompts(0) == s1  # deterministic: resume rebuilds the same prompts


# ------------------------------------------------------------------------------ the stages

def test_challenger_step_uses_the_index_judge_and_solver(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt)
  judge_before = leaves(m.rt.frozen["judge"])
  challenger_before = leaves(m.rt.policies["challenger"].state.params)
  b, g = 3, 2
  picks = m.stage1_prompts(0)[:b]
  cands = m.propose(picks, g)
  assert len(cands) == b * g
  for c in cands:
    assert c.traj.num_searches == c.required  # as many searches as the prompt asked for
    for call in c.traj.tool_calls:  # observations are documents of the bundled index
      assert call.error is None and call.result.startswith("Doc 1(Title: ")
      assert all(t in TITLES for t in _titles(call.result))
    assert c.fmt == pytest.approx((1 / 1 + 1.0 + 1.0) / 3)  # every turn thinks; tool; structure
  stats = scope.GradeStats()
  m.evaluate(cands, 2, stats=stats)
  for c in cands:
    assert c.gate and len(c.criteria) == 3 and len(c.grades) == 2
    assert all(t.num_searches >= 1 for t in c.rollouts)
    assert c.g_bar == pytest.approx(np.mean(c.grades))
  metrics = m.step(0)
  assert metrics["stage"] == 0 and metrics["iteration"] == 0
  assert metrics["challenger/share_gate_passed"] == 1.0
  assert 0 <= metrics["challenger/g_bar/mean"] <= 1
  assert metrics["challenger/reward/mean"] == pytest.approx(
      0.5 * metrics["challenger/format/mean"] + metrics["challenger/difficulty/mean"])
  chex.assert_tree_all_finite(metrics["challenger/train/loss"])
  assert metrics["challenger/train/kl"] >= 0
  with pytest.raises(AssertionError):  # the challenger trained
    chex.assert_trees_all_equal(challenger_before, leaves(m.rt.policies["challenger"].state.params))
  chex.assert_trees_all_equal(judge_before, leaves(m.rt.frozen["judge"]))


class RecordingScopeSampler(ScriptedScopeSampler):
  """The scripted SCOPE roles, recording each call's prompts and sampling settings."""

  def __init__(self, tokenizer):
    super().__init__(tokenizer)
    self.log = []

  def generate(self, prompts, **kw):
    texts = [self.tok.decode(p) for p in prompts]
    self.log.append((texts, kw.get("temperature"), kw.get("top_p")))
    return super().generate(prompts, **kw)


def test_task_set_filter_samples_the_solver_as_released(tmp_path):
  """The task-set filter's Solver rollouts (which ḡ lands in the window) sample at T 0.7, top-p
  0.9 as the released Stage B does (`BatchMultiTurnRollout` defaults), not at the Solver role's
  own 1.0/1.0; `scope.task_set.solver_sampling=()` keeps the role's settings."""
  assert scope_config.get_config("paper").scope.task_set.solver_sampling == (0.7, 0.9)
  for sampling, want in (((0.7, 0.9), (0.7, 0.9)), ((), (1.0, 1.0))):
    c = small_config(**{"scope.task_set.solver_sampling": sampling,
                        "scope.task_set.max_rounds": 1, "scope.task_set.candidates_per_round": 2,
                        "scope.task_set.samples_per_document": 1})
    c.scope.roles.solver.temperature = c.scope.roles.solver.top_p = 1.0
    rt = runtime.Runtime(c, str(tmp_path / str(len(sampling))))
    m = scope.Scope(rt)
    sampler = RecordingScopeSampler(rt.tokenizer)
    play_all_roles(rt, sampler)
    m.build_set(0, {})
    solver_calls = [(t, p) for texts, t, p in sampler.log if "Complete the task" in texts[0]]
    assert solver_calls and all(s == want for s in solver_calls), solver_calls


def test_stage1_as_released(tmp_path):
  """The released Stage 1: a plain <task> is the task, the rubric Judge reads the Challenger's
  search results after the document, and the Solver rollouts behind ḡ sample at T 0.7, top-p
  0.9 (the Solver role's own 1.0/1.0 trains); the paper's text does none of these."""
  c = small_config(**{"scope.task_form": "plain", "scope.rubric_sees_searches": True,
                      "scope.stage1_solver_sampling": (0.7, 0.9)})
  c.scope.roles.solver.temperature = c.scope.roles.solver.top_p = 1.0
  rt = runtime.Runtime(c, str(tmp_path))
  m = scope.Scope(rt)
  sampler = RecordingScopeSampler(rt.tokenizer)
  play_all_roles(rt, sampler)
  cands = m.propose(m.stage1_prompts(0)[:2], 2)
  for cand in cands:
    assert cand.question.startswith("Explain how ") and "<question>" not in cand.question
    assert cand.fmt == pytest.approx(1.0)
  m.evaluate(cands, 2, scope.GradeStats(), c.scope.stage1_solver_sampling)
  rubric_calls = [t for texts, *_ in sampler.log for t in texts if "writing the grading rubric" in t]
  assert len(rubric_calls) == len(cands)
  for cand, text in zip(cands, rubric_calls):
    for call in cand.traj.tool_calls:
      assert call.result.strip()[:80] in text  # each search result the Challenger read
  solver_calls = [(t, p) for texts, t, p in sampler.log if "Complete the task" in texts[0]]
  assert solver_calls and all(s == (0.7, 0.9) for s in solver_calls)
  plain = small_config()  # the paper's text: <question> required, document only, role sampling
  rt2 = runtime.Runtime(plain, str(tmp_path / "text"))
  m2 = scope.Scope(rt2)
  sampler2 = RecordingScopeSampler(rt2.tokenizer)
  play_all_roles(rt2, sampler2)
  cands2 = m2.propose(m2.stage1_prompts(0)[:2], 2)
  assert all(R.task_question([x.traj.turn_texts()[-1].replace("<question>", "")], "question")
             is None for x in cands2)  # a plain task is not a task in that form
  m2.evaluate(cands2, 2, scope.GradeStats())
  rubric2 = [t for texts, *_ in sampler2.log for t in texts if "writing the grading rubric" in t]
  assert rubric2 and not any("Doc 1(Title: " in t for t in rubric2)
  assert {(t, p) for texts, t, p in sampler2.log if "Complete the task" in texts[0]} == {
      (plain.scope.roles.solver.temperature, plain.scope.roles.solver.top_p)}


def test_task_set_and_solver_step(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt)
  solver_before = leaves(m.rt.policies["solver"].state.params)
  metrics = m.step(2)  # the first Stage-2 step builds the task set
  tasks = m.sets["0"]
  assert 1 <= len(tasks) <= 4 and metrics["taskset/size"] == len(tasks)
  assert "taskset/share_found_source" not in metrics  # reported only where it is checked
  assert all(0.2 <= t["g_bar"] <= 0.8 for t in tasks)
  assert len({t["doc_id"] for t in tasks}) == len(tasks)  # at most one task per document
  written = [json.loads(x) for x in (tmp_path / "tasks" / "iteration_0.jsonl").read_text().splitlines()]
  assert written == tasks
  assert metrics["solver/searches/mean"] >= 1 and 0 <= metrics["solver/rubric/mean"] <= 1
  assert metrics["solver/reward/mean"] == pytest.approx(
      metrics["solver/rubric/mean"] * 1.0 + 0.5 * metrics["solver/format/mean"]
      + 0.1 * metrics["solver/search/mean"], abs=1e-6)  # short answers: L = 1
  chex.assert_tree_all_finite(metrics["solver/train/loss"])
  with pytest.raises(AssertionError):  # the solver trained
    chex.assert_trees_all_equal(solver_before, leaves(m.rt.policies["solver"].state.params))
  m.step(3)  # same iteration: reuses the set
  assert m.sets["0"] == tasks


def test_each_policy_trains_with_its_own_optimizer(tmp_path):
  """`scope.solver_optim` warms the Solver up alone: its first AdamW update is at rate 0 (the
  linear warm-up's step 0) while the Challenger's is at the full rate, −lr on a unit gradient."""
  c = small_config(**{"optim.lr": 5e-3, "optim.weight_decay": 0.0})
  c.scope.solver_optim = ml_collections.ConfigDict(dict(warmup_steps=10))
  m = scope.Scope(runtime.Runtime(c, str(tmp_path)))
  for policy, rate in ((m.rt.policies["challenger"], -5e-3), (m.rt.policies["solver"], 0.0)):
    u, _ = optimizers.adam_first_update(policy)
    chex.assert_trees_all_close(u, np.full_like(u, rate), rtol=1e-4, atol=1e-12)


def test_retrievable_tasks_gate_before_the_judge(tmp_path):
  """`scope.retrievable_tasks`: a task whose question, searched, does not bring back its source
  document fails the gate, and the Judge is never asked about it."""
  c = small_config(**{"scope.retrievable_tasks": True, "retrieval.topk": 1})
  rt = runtime.Runtime(c, str(tmp_path))
  m = scope.Scope(rt)
  sampler = RecordingScopeSampler(rt.tokenizer)
  play_all_roles(rt, sampler)
  cands = m.propose(m.stage1_prompts(0)[:2], 2)
  own, other = cands[0], cands[1]
  assert own.doc.id != m.passages[-1].id
  own.question = f"{own.doc.title}: {own.doc.text}"  # names its document outright
  other.question = f"{m.passages[-1].title}: {m.passages[-1].text}"  # another document's page
  for x in cands[2:]:
    x.fmt = 0.0  # not well formed: never searched or judged
  sampler.log.clear()
  m.evaluate(cands, 2, scope.GradeStats())
  assert own.found_source is True and other.found_source is False
  assert all(x.found_source is None for x in cands[2:])
  assert own.gate and not other.gate and own.criteria
  gate_prompts = [t for texts, *_ in sampler.log for t in texts if other.question in t]
  assert not gate_prompts  # the Judge never saw the unretrievable task
  assert any(own.question in t for texts, *_ in sampler.log for t in texts)
  assert not scope_config.get_config("paper").scope.retrievable_tasks  # the Judge's gates alone
  metrics = {}
  m.build_set(0, metrics)
  assert 0 <= metrics["taskset/share_found_source"] <= 1


def test_task_set_samples_each_document_several_times(tmp_path):
  """As released (N_ROLLOUTS=4, MAX_TASKS_PER_PROMPT=1): k Challenger samples per document, at
  most one task kept per document."""
  c = small_config(**{"scope.task_set.samples_per_document": 3, "scope.task_set.max_rounds": 1})
  rt = runtime.Runtime(c, str(tmp_path))
  m = scripted(rt)
  metrics = {}
  tasks = m.build_set(0, metrics)
  assert metrics["taskset/candidates"] == 3 * c.scope.task_set.candidates_per_round
  assert len({t["doc_id"] for t in tasks}) == len(tasks)


def test_task_set_keeps_few_tasks_per_rubric(tmp_path, monkeypatch):
  """`scope.task_set.max_per_rubric`: no more than that many kept tasks share one rubric (here
  every rubric counts as the same one)."""
  monkeypatch.setattr(R, "rubric_key", lambda criteria: "the same")
  def build(cap):
    c = small_config(**{"scope.task_set.samples_per_document": 2,
                        "scope.task_set.max_per_rubric": cap})
    m = scripted(runtime.Runtime(c, str(tmp_path / f"cap{cap}")))
    return m.build_set(0, {})
  assert len(build(0)) > 2 and len(build(2)) == 2 and len(build(1)) == 1


def test_solver_reward_parts_by_hand(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt)
  traj = m.solve(["Explain how Paris relates to France."], 1)[0]
  parts = m.solver_parts(traj, 0.5)
  turns = traj.turn_texts()
  assert len(turns) == 2 and traj.num_searches == 1 and traj.final_tag == "answer"
  # think 2/2, tool 1 search / 1 non-final turn, answer 1 → format 1; search 1/3.
  assert parts["format"] == pytest.approx(1.0) and parts["search"] == pytest.approx(1 / 3)
  assert parts["reward"] == pytest.approx(1.0 * 0.5 + 0.5 * 1.0 + 0.1 / 3)


def test_malformed_judge_output_is_counted_not_raised(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  m = scripted(rt, garbage=True)
  metrics = m.step(0)
  assert metrics["challenger/share_gate_malformed"] == 1.0
  assert metrics["challenger/share_gate_passed"] == 0.0
  assert metrics["challenger/reward/mean"] == pytest.approx(0.5 * metrics["challenger/format/mean"])
  metrics = m.step(2)
  assert metrics["taskset/size"] == 0 and "solver/reward/mean" not in metrics


def test_per_turn_datums_for_thinking_models(tmp_path):
  rt = runtime.Runtime(small_config(**{"scope.per_turn_datums": True, "scope.syntax": "qwen"}),
                      str(tmp_path))
  m = scripted(rt)
  trajs = m.solve(["Explain how Paris relates to France."], 2)
  seen = []
  real_train = rt.train
  rt.train = lambda policy, ts, advs, **kw: seen.append(ts) or real_train(policy, ts, advs, **kw)
  m._train(m.rt.policies["solver"], trajs, np.asarray([1.0, -1.0]))
  assert len(seen[0]) == sum(len(t.generated_turns()) for t in trajs)  # one datum per turn


def _titles(text):
  import re
  return re.findall(r"Doc \d+\(Title: (.*?)\)", text)


# --------------------------------------------------------------------- runs, Judge, resume

def _run_scripted(config, workdir, monkeypatch, holder=None):
  def make(rt):
    method = scripted(rt)
    if holder is not None:
      holder["method"] = method
      holder["judge_start"] = leaves(method.rt.frozen["judge"])
    return method
  monkeypatch.setattr(scope, "make_method", make)
  return runner.run(config, str(workdir))


def _comparable(rec):
  return {k: v for k, v in rec.items() if not k.startswith("time/") and "per_s" not in k}


def test_judge_is_bit_identical_after_a_run(tmp_path, monkeypatch):
  holder = {}
  _run_scripted(small_config(**{"scope.iterations": 1}), tmp_path, monkeypatch, holder)
  m = holder["method"]
  end = leaves(m.rt.frozen["judge"])
  chex.assert_trees_all_equal([a.view(np.uint8) for a in holder["judge_start"]],
                              [b.view(np.uint8) for b in end])
  assert m.rt.frozen["judge"] is m.rt.base_params is m.rt.frozen["judge"]  # one M0: Judge and KL ref
  for policy in (m.rt.policies["challenger"], m.rt.policies["solver"]):  # both trained policies moved away from M0
    with pytest.raises(AssertionError):
      chex.assert_trees_all_equal(end, leaves(policy.state.params))


@pytest.mark.slow  # five scripted runs; the gs:// run test resumes a demo in the default suite
def test_resume_inside_and_between_stages_matches_an_uninterrupted_run(tmp_path, monkeypatch):
  """Stops after step 0 (inside Stage 1), 1 (between the stages), 2 (inside Stage 2, after the
  task set was built) and resumes each time; every step's metrics equal the uninterrupted run's."""
  def config(steps=None):
    c = small_config(**{"scope.iterations": 1, "scope.challenger_batch": 2})
    if steps is not None:
      c.total_steps = steps
    return c
  _run_scripted(config(), tmp_path / "full", monkeypatch)
  for steps in (1, 2, 3, None):
    _run_scripted(config(steps), tmp_path / "cut", monkeypatch)
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert sorted(a) == sorted(b) == [0, 1, 2, 3]
  for step in range(4):
    assert _comparable(a[step]) == _comparable(b[step]), step


# ------------------------------------------------------------------------------- the CLI demo

def _cli(workdir, *extra, wait=True):
  env = dict(os.environ, PYTHONPATH=ROOT)
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/scope.py",
         f"--workdir={workdir}", *extra]
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


QUICK_WARMUP = ("--config.warmup.steps=20", "--config.warmup.documents=8")


@pytest.mark.slow  # minutes on a 2-core CPU; SPELL's (the README's command) runs by default
def test_cli_demo_runs_with_real_retrieval(tmp_path):
  """The demo's whole pipeline: format warm-up (shortened here; the full one is the slow test
  below), two iterations of both stages on the CPU, checkpoints, metrics and the task sets."""
  out = _cli(tmp_path / "run", *QUICK_WARMUP)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Finished scope (demo)" in out.stdout and "wall time per stage" in out.stdout
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [r["stage"] for r in records] == [0, 1, 0, 1]
  assert "challenger/reward/mean" in records[0] and "taskset/size" in records[1]
  assert (tmp_path / "run" / "warm_start" / "model.safetensors").exists()
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints"))[-1] == "3"
  assert sorted(p.name for p in (tmp_path / "run" / "tasks").iterdir()) == [
      "iteration_0.jsonl", "iteration_1.jsonl"]
  titles = _titles((tmp_path / "run" / "samples.log").read_text())
  assert all(t in TITLES for t in titles)  # any observation comes from the bundled index
  again = _cli(tmp_path / "run", *QUICK_WARMUP)
  assert again.returncode == 0 and "Nothing to run" in again.stdout


@pytest.mark.slow
def test_cli_default_demo_writes_tasks_the_judge_grades(tmp_path):
  """The default command end to end: the warmed model's own Challenger writes well-formed tasks
  that pass the gates, the Judge writes rubrics and grades the Solver, and Stage 2 trains."""
  out = _cli(tmp_path / "run")
  assert out.returncode == 0, out.stderr[-3000:]
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  stage1 = [r for r in records if r["stage"] == 0]
  assert np.mean([r["challenger/share_task"] for r in stage1]) >= 0.5
  assert any(r["challenger/share_gate_passed"] > 0 for r in stage1)
  assert any("challenger/g_bar/mean" in r for r in stage1)  # rubrics were written and graded
  stage2 = [r for r in records if r["stage"] == 1]
  assert any(r["taskset/size"] > 0 and "solver/train/loss" in r for r in stage2)
  tasks = [json.loads(line) for f in sorted((tmp_path / "run" / "tasks").iterdir())
           for line in f.read_text().splitlines()]
  assert tasks and all(len(t["criteria"]) >= 3 and 0.2 <= t["g_bar"] <= 0.8 for t in tasks)
  titles = _titles((tmp_path / "run" / "samples.log").read_text())
  assert titles and all(t in TITLES for t in titles)


@pytest.mark.slow
def test_cli_sigkill_and_resume(tmp_path):
  proc = _cli(tmp_path / "cut", wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / "1", timeout=1200)
  resumed = _cli(tmp_path / "cut")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  assert "Loading the warmed-up base model of this run" in resumed.stderr
  steps = [r["step"] for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")]
  assert set(steps) == {0, 1, 2, 3}


def test_demonstrations_cover_every_role_with_real_search_results(tmp_path):
  """Ten demonstrations per document: a Challenger and a Solver for two task types, a rubric,
  3 gate and 2 grade verdicts; observations are real results from the bundled index."""
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = scope.Scope(rt)
  demos = scope_demos._Demos(method, np.random.default_rng(0)).build(2)
  assert len(demos) == 20
  challenger = demos[0]
  obs = [s for s in challenger.spans if s.kind == "observation"]
  assert obs and all(t in TITLES for s in obs for t in _titles(s.text))  # from the index
  for s in obs:
    assert not challenger.loss_mask[s.start:s.end].any()
  assert "<task>" in challenger.spans[-1].text and challenger.loss_mask[-1] == 1


def test_paper_solver_clips_higher_as_released_and_schedule_follows_overrides():
  c = scope_config.get_config("paper")
  assert c.scope.solver_loss.eps_high == 0.28 and c.scope.challenger_loss.eps_high == 0.2
  assert (c.optim.total_steps, c.optim.warmup_steps) == (60, 0)
  c.update_from_flattened_dict({"scope.iterations": 5, "scope.challenger_steps": 30,
                                "scope.solver_steps": 30})
  assert (c.optim.total_steps, c.total_steps) == (150, 300)
  roles = c.scope.roles
  assert (roles.challenger.max_prompt_tokens, roles.solver.max_prompt_tokens) == (1024, 2048)


def test_the_judge_model_was_shown_the_learn_presets_own_prompts(tmp_path):
  """The bench that fits the `learn` preset's start (`tools/world_reading.py --format=scope`)
  shows each role exactly the prompt tokens the run builds with the preset's prompts and limits,
  and the Judge's rubric is one the run parses to the criterion the grader was shown."""
  from tools import world_reading  # pylint: disable=import-outside-toplevel
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  c = scope_config.get_config("learn")
  c.progress = False
  rt = runtime.Runtime(c, str(tmp_path))
  method = scope.Scope(rt)
  world = World(7)
  questions = world.questions(3, np.random.default_rng(0), "attr")
  demos = world_reading.scope_examples(rt.tokenizer, world, questions, reasoning="both")
  by_id = {d.id: d for d in world.documents}
  prompts, roles = method.prompts, method.roles
  for i, q in enumerate(questions):
    doc, gold = by_id[q["support"][0]], q["gold"][0]
    entity, source = prompts.gates(q["question"], doc)
    expected = {
        "challenger": [roles["challenger"].prompt(prompts.challenger(doc, "longform_qa", 1))],
        "solver": [roles["solver"].prompt(method.answer_prompt(q["question"], "qa_search"))],
        "gate": [roles["gate"].prompt(entity), roles["gate"].prompt(source)],
        "rubric": [roles["rubric"].prompt(prompts.rubric(q["question"], doc))],
        "grader": [roles["grader"].prompt(prompts.grader(q["question"],
                                                         scope_demos.criterion(gold), gold))]}
    gates = [d for d in demos["gate"] if q["question"] in rt.tokenizer.decode(d.tokens)]
    shown = {"challenger": [demos["challenger"][i]], "solver": [demos["solver"][i]],
             "gate": gates[:2], "rubric": [demos["rubric"][i]], "grader": [demos["grader"][2 * i]]}
    for role, ids in expected.items():
      for want, demo in zip(ids, shown[role], strict=True):
        assert list(demo.tokens[:len(want)]) == list(want), (role, q["question"])
    rubric = rt.tokenizer.decode(demos["rubric"][i].tokens[len(expected["rubric"][0]):])
    criteria = R.parse_rubrics(rubric, c.scope.min_criteria, c.scope.max_criteria)
    assert [x.text for x in criteria] == [scope_demos.criterion(gold)]
    for k, demo in enumerate(demos["grader"][2 * i:2 * i + 2]):  # a right and a wrong answer
      said = rt.tokenizer.decode(demo.tokens).rsplit("<|im_start|>assistant\n", 1)[-1]
      assert len(rt.tokenizer.encode(said, add_special_tokens=False)) <= \
          c.scope.roles.grader.max_new_tokens, said  # the whole turn fits the role's budget
      assert R.parse_binary_grade(said) == int(k == 0), said


def test_the_learn_preset_starts_from_the_shipped_grader_model():
  """The grader model ships with the package (a few MB, listed in setup.py's package data) and
  has the demo model's shape; the preset adds no warm-up and asks for a one-criterion rubric."""
  from scope_jax.data import GRADER_MODEL  # pylint: disable=import-outside-toplevel
  bundled.assert_learn_starts_from(scope_config.get_config("learn"), GRADER_MODEL)
  assert "one criterion" in P.Prompts("compact", max_criteria=1).rubric(
      "Q?", demo.demo_passages()[0]).text()


def test_the_rubric_prompt_asks_for_the_papers_three_to_five_criteria_by_default():
  for style in P.STYLES:
    text = P.Prompts(style).rubric("Q?", demo.demo_passages()[0]).text()
    assert "3 to 5 criteria" in text and "{rubric_size}" not in text


def test_world_demonstrations_show_each_role_its_share():
  """Per question: one Challenger and one Solver turn, two passing gates and one failing (two
  with `near_copies`), one rubric, and `grades` right and as many wrong answers graded."""
  from scope_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  world = World(3)
  questions = world.questions(3, np.random.default_rng(0), "attr")
  prompts = P.Prompts("compact", "qwen", 400, "plain", max_criteria=1)
  tok = load_tokenizer("demo")
  demos = scope_demos.world_demonstrations(tok, prompts, world, questions, grades=2,
                                           near_copies=True)
  assert {k: len(v) for k, v in demos.items()} == {
      "challenger": 3, "solver": 3, "gate": 12, "rubric": 3, "grader": 12}
  verdicts = [tok.decode(d.tokens).rsplit("<score>", 1)[1][0] for d in demos["grader"]]
  assert verdicts == ["1", "1", "0", "0"] * 3
  assert scope_demos.near_copy("Theal Thoukrio", "Pezux Holdings") == "Theal Toldings"


def test_the_grader_turn_names_the_fact_and_the_answer_side_by_side():
  """By hand: the one-word reason and the side-by-side one, each ending in the verdict the
  parser reads."""
  assert scope_demos.grade_turn("botanist", "botanist") == \
      "<think>Covered.</think>\n<score>1</score>"
  both = scope_demos.grade_turn("botanist", "surgeon", "both")
  assert both == ("<think>The criterion asks for botanist. The answer is surgeon.</think>\n"
                  "<score>0</score>")
  assert R.parse_binary_grade(both) == 0
  assert R.parse_binary_grade(scope_demos.grade_turn("rail transport", "rail transport",
                                                     "both")) == 1
