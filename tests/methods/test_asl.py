"""ASL end to end: configs, prompts, topics, scripted phases through the real update and the real
index, malformed output, the phase schedule, state, resume, and the CLI demo."""

import json
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from configs import asl as asl_config
from scope_jax import metrics as metrics_lib
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.methods.asl import algorithm as asl
from scope_jax.methods.asl import demos as asl_demos
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.methods.asl import prompts as P
from scope_jax.methods.asl import rewards as R
from tests.methods import bundled
from tests.methods.cli import kill_once_exists
from tests.methods.scripted import ScriptedAslSampler, play_all_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TITLES = {p.title for p in demo.demo_passages()}


def small_config(**overrides):
  c = asl_config.get_config("demo")
  c.warmup.steps = 0  # the scripted policy needs no warm-up
  c.progress = False
  c.asl.pg_batch = 2
  c.asl.grm_batch = 2
  c.asl.pm_batch = 2
  c.asl.pm_samples = 4
  c.asl.validity_samples = 3
  c.asl.pm_target_first = 2
  c.asl.pm_target = 2
  for role in ("pg", "pm", "grm"):
    c.asl.roles[role].max_new_tokens = 40
  c.update_from_flattened_dict(overrides)
  return c


def scripted(rt, **kw):
  method = asl.Asl(rt)
  play_all_roles(rt, ScriptedAslSampler(rt.tokenizer, **kw))
  return method


def leaves(params):
  return [np.asarray(x).copy() for x in jax.tree.leaves(params)]


# ---------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("preset", asl_config.PRESETS)
def test_every_preset_loads(preset):
  c = asl_config.get_config(preset)
  a = c.asl
  assert c.method == "asl" and c.preset == preset
  assert (a.validity_threshold, a.pg_reward, a.grm_mode, a.slope_threshold) == (
      0.8, "entropy", "frozen" if preset == "learn_frozen_grm" else "co_trained", 0.05)
  if preset == "paper":
    assert (a.pg_batch, a.grm_batch, a.pm_batch, a.group_size) == (32, 32, 32, 4)  # 128 rows
    assert (a.phase_end, tuple(a.plateau_window.values()), a.plateau_tolerance) == (
        "plateau", (200, 400), 0.005)
    assert a.validity_inclusive and a.filter_pm and a.balance_grm and a.format_reward
    assert (c.loss.kl_beta, c.loss.entropy_coef, a.roles.pg.max_turns) == (0.0, 1e-3, 8)
    assert (a.roles.pm.max_new_tokens, c.rollout.max_context) == (2048, 12288)
    assert (a.validity_samples, a.pm_samples, c.seed) == (5, 10, 37)
    assert (a.pm_target_first, a.pm_target) == (2000, 4000)
    assert (a.syntax, a.prompt_style, a.topics) == ("qwen", "paper", "")
    assert c.model.source == "preset:qwen2.5-7b" and c.retrieval.topk == 3
    assert c.retrieval.encoder == "" and c.model.tokenizer == ""  # paths supplied by the user
    # The released actor: micro-batches of one sequence (seq-mean of token means), the flag
    # at s̄ = 0.5 HARDER (`score >= 0.5`), and the released verdict scorer and GRM reward.
    assert (c.loss.agg_mode, a.harder_at_half, a.verdict_rule) == (
        "seq-mean-token-mean", True, "released")
  elif preset == "demo":
    assert (a.topics, a.syntax, a.prompt_style, c.warmup.steps) == ("corpus", "xml", "compact",
                                                                      3000)


@pytest.mark.parametrize("override, message", [
    ({"asl.validity_threshold": 1.0, "asl.validity_inclusive": False},
     "validity_threshold=1.0 must be in"),
    ({"asl.phase_end": "never"}, "asl.phase_end='never' is not valid"),
    ({"asl.plateau_window.pm": 3}, "asl.plateau_window.pm=3"),
    ({"asl.stores.pm": 1}, "asl.stores.pm=1 is below the PG phase's target"),
    ({"asl.phases.grm.min_steps": 5}, "asl.phases.grm: need 1 <= min_steps <= max_steps"),
    ({"asl.grm_mode": "off"}, "asl.grm_mode='off' is not valid"),
    ({"asl.pg_reward": "gauss"}, "asl.pg_reward='gauss' is not valid"),
    ({"asl.topics": "/nonexistent/topics.txt"}, "no such file"),
    ({"asl.verification_share": 0.1}, "needs asl.verification_data"),
    ({"asl.slope_window": 1}, "slope_window=1 must be at least 2"),
    ({"asl.slope_ema": 1.0}, "slope_ema=1.0 must be in"),
    ({"asl.roles.grm.max_turns": 0}, "every ASL role searches"),
])
def test_validation_names_the_fix(override, message):
  with pytest.raises(ValueError, match=message):
    runner.validate(small_config(**override))


@pytest.mark.parametrize("style", tuple(P.STYLES))
@pytest.mark.parametrize("syntax", P.SYNTAXES)
def test_prompt_styles_carry_the_same_fields_and_tags(style, syntax):
  p = P.Prompts(style, syntax)
  meta = {"question": "Which city is holy?", "answer": "Jerusalem", "flag": R.HARDER}
  texts = {"topic": p.pg({"topic": "Geography"}, 0).text(), "followup": p.pg(meta, 1).text(),
           "hop": p.pg(dict(meta, flag=R.EASIER), 2).text(), "pm": p.pm("Which city?").text(),
           "grm": p.grm("Which city?", "Haifa").text()}
  search = "<search>" if syntax == "xml" else "<tool_call>"
  role = {"topic": "pg", "followup": "pg", "hop": "pg", "pm": "pm", "grm": "grm"}
  for name, text in texts.items():
    system = p.system(role[name])
    assert (system is None) == (style == "compact"), name  # the paper's go in the system turn
    assert search in (system or "") + text, name
    assert "{" + "tools}" not in (system or "") and "## Tools" not in text
    assert "{" + "tools}" not in text and "{header}" not in text
  assert "Geography" in texts["topic"] and "<question>" in texts["topic"]
  assert "CORRECTLY" in texts["followup"] and "HARDER" in texts["followup"]
  assert "Jerusalem" in texts["followup"] and "Which city is holy?" in texts["followup"]
  assert "WRONGLY" in texts["hop"] and "EASIER" in texts["hop"] and "removing" in texts["hop"]
  assert "Which city?" in texts["pm"] and "<answer>" in (p.system("pm") or "") + texts["pm"]
  assert "Haifa" in texts["grm"] and "conclusion: correct" in texts["grm"]


# The released run's retrieval system prompt (asl3.py's RETRIEVAL_SYS), verbatim.
RELEASED_RETRIEVAL_SYS = """You are Qwen, created by Alibaba Cloud. You are a helpful assistant.
## Tools
You are provided with function signatures within <tools></tools> tags:
<tools>
Name:retrieve
Description: Retrieve relevant information from the locally deployed knowledge base based on the provided list of search terms.
Input:{'query': {'Optional/Required': 'required', 'Parameter Description': 'search terms', 'Parameter Type': 'str'}}
</tools>
For each function call, you should call and then include the json format inputs within <tool_call></tool_call> tags, for example:
<tool_call>{
  "name": tool['name'],
  "arguments": tool['arguments']
}</tool_call>
For each function call, the result will be returned in the <tool_response></tool_response> tags.
## Formats
Your output should be a combination of the following formats:
1. <think>your reasoning thoughts</think>
2. <tool_call>
{
    "name": "retrieve",
    "arguments": {
        "query": "Beijing cuisine"
    }
}
</tool_call>
3. <answer>YOUR ANSWER</answer>
## Tasks
Answer the user's question.
You can use <think></think> and <tool_call></tool_call> as many times as you want, but you must use <answer></answer> once and only once at the end of your response.
Your answer should be concise and to the point, without detailed illustrations. For example, <answer>Beijing</answer>."""


def test_paper_system_prompts_are_the_released_text():
  p = P.Prompts("paper", "qwen")
  assert p.system("pm") == p.system("grm") == RELEASED_RETRIEVAL_SYS
  pg = p.system("pg")
  assert pg.startswith("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n")
  assert pg.endswith("4. <answer>THE ANSWER TO THE GENERATED QUESTION</answer>")
  assert RELEASED_RETRIEVAL_SYS.split("## Formats")[0] in pg  # the same identity and tools


def test_topics_shipped_corpus_and_file(tmp_path):
  shipped = P.load_topics("")
  assert len(shipped) >= 50 and "Olympic Games" in shipped
  assert P.load_topics("corpus") == demo.demo_categories()
  assert "Geography" in P.load_topics("corpus") and "Uncategorized" not in P.load_topics("corpus")
  f = tmp_path / "topics.txt"
  f.write_text("# mine\nvolcanoes\n\nrivers  # big ones\nvolcanoes\n")
  assert P.load_topics(str(f)) == ["volcanoes", "rivers"]
  f.write_text("# nothing\n")
  with pytest.raises(ValueError, match="holds no topic"):
    P.load_topics(str(f))


# ------------------------------------------------------------------------------- the phases

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
  """One runtime for the phase tests (one compiled update); each test starts from a fresh state."""
  workdir = tmp_path_factory.mktemp("asl")
  rt = runtime.Runtime(small_config(), str(workdir))
  m = scripted(rt)
  rt.metrics.start(None, overwrite=True)
  return rt, m, m.host_state(), workdir


@pytest.fixture
def method(shared):
  rt, m, fresh, workdir = shared
  m.load_host_state(json.loads(json.dumps(fresh)))
  play_all_roles(rt, ScriptedAslSampler(rt.tokenizer))
  m.cfg.group_size = 2
  seen = []

  real_train = type(rt).train.__get__(rt)  # the runtime's own (earlier uses replaced it)

  def train(policy, trajs, advs, **kw):  # recorded; the real update runs in the PG-step test
    seen.append((list(trajs), list(advs)))
    return real_train(policy, trajs, advs, **kw) if real["train"] else {"train/loss": 0.0}

  real = {"train": False}
  rt.train = train
  return rt, m, seen, workdir, real


def _step(rt, m, step=0):
  rt.begin_step(step)
  metrics = m.step(step)
  rt.metrics.write(step, metrics)  # writes samples.log too
  return metrics


def test_pg_step_gates_scores_and_stores(method):
  rt, m, seen, workdir, real = method
  real["train"] = True
  before = leaves(m.rt.policies["policy"].state.params)
  metrics = _step(rt, m)
  a = rt.config.asl
  n = a.pg_batch * a.group_size
  assert metrics["phase"] == 0 and metrics["pg/proposals"] == n and metrics["pg/well_formed"] == 1
  assert 0 < metrics["pg/validity_rate"] <= 1 and metrics["grm/malformed"] == 0
  # K judgments per pair, then one per PM answer of every well-formed question (as released).
  assert metrics["grm/verdicts"] == n * a.validity_samples + n * a.pm_samples
  assert len(m.d_pm) == metrics["pg/new_pairs"] >= 1
  assert all(len(x["question"]) > 20 and x["question"].endswith("?") for x in m.d_pm)
  # D_GRM: per question, as many answers judged 1 as judged 0 (unanimous questions dropped).
  assert m.d_grm and {t["score"] for t in m.d_grm} == {0, 1}
  for q in {t["question"] for t in m.d_grm}:
    scores = [t["score"] for t in m.d_grm if t["question"] == q]
    assert scores.count(0) == scores.count(1)
  trajs, advs = seen[0]
  assert len(trajs) == n  # only the PG's rollouts train in its phase
  assert np.allclose(np.asarray(advs).reshape(a.pg_batch, a.group_size).mean(axis=1), 0.0,
                     atol=1e-5)  # GRPO: z-scored per meta prompt
  assert metrics["pg/reward/max"] <= np.log(2) + 1e-9
  for call in trajs[0].tool_calls:  # observations come from the bundled index
    assert call.error is None and call.result.startswith("Doc 1(Title: ")
  with pytest.raises(AssertionError):  # the policy trained
    chex.assert_trees_all_equal(before, leaves(m.rt.policies["policy"].state.params))
  samples = (workdir / "samples.log").read_text()
  assert "validity judgments" in samples and "PM answers (GRM score)" in samples


def test_pg_rewards_equal_the_entropy_of_the_judged_answers(method):
  rt, m, _, _, _ = method
  rt.begin_step(0)
  props = m.propose(m.meta_prompts(2))
  assert all(p.task is not None and p.task.answer in TITLES for p in props)
  for p, v in zip(props, m.judge([(p.task.question, p.task.answer) for p in props], 3)):
    p.validity, p.valid = v, R.is_valid(v, 0.8)
  valid = [p for p in props if p.valid]
  assert valid
  rollouts = m.answer([p.task.question for p in valid], 4)
  for t, (_, s) in zip(rollouts, m.score_answers([(valid[t.prompt_index].task.question, t)
                                                  for t in rollouts])):
    valid[t.prompt_index].scores.append(s)
  h = {0: 0.0, 1: 0.5623351446188083, 2: np.log(2), 3: 0.5623351446188083, 4: 0.0}  # H(k/4)
  for p in valid:
    assert R.pg_reward(p.scores) == pytest.approx(h[sum(p.scores)])


def test_grm_phase_rewards_agreement_with_stored_scores(method):
  rt, m, seen, _, _ = method
  play_all_roles(rt, ScriptedAslSampler(rt.tokenizer, grm_flip=0.0))  # an exact GRM
  q = "Which entity does the search for Geography return first?"
  first = m.tool.retrieve(["Geography"])[0][0][0].title
  m.d_grm = [{"question": q, "response": first, "score": 1},  # right, stored right: agrees
             {"question": q, "response": "nothing", "score": 1},  # wrong, stored right
             {"question": q, "response": "nothing", "score": 0}]  # wrong, stored wrong
  m.cfg.grm_batch = 3
  m.phase = "grm"
  try:
    metrics = _step(rt, m)
  finally:
    m.cfg.grm_batch = 2
  trajs, advs = seen[0]
  assert metrics["phase"] == 1 and len(trajs) == 3 * m.cfg.group_size
  # Drawn without replacement: all three; agreement 2 of 3 (1 on score 1 items, 1 of 1 on 0).
  assert metrics["grm/agreement"] == pytest.approx(2 / 3)
  assert metrics["grm/agreement_on_1"] == pytest.approx(0.5)
  assert metrics["grm/agreement_on_0"] == pytest.approx(1.0)
  assert np.allclose(np.asarray(advs), 0.0)  # each item's G verdicts agree: no signal


def test_pm_phase_flags_questions_for_the_next_iteration(method):
  rt, m, _, _, _ = method
  m.d_pm = [{"question": f"Which entity does the search for {t} return first?",
             "answer": m.tool.retrieve([t])[0][0][0].title} for t in ("Geography", "Mathematics")]
  m.phase = "pm"
  metrics = _step(rt, m)
  assert metrics["phase"] == 2 and 0 <= metrics["pm/accuracy"] <= 1
  assert metrics["pm/flags_harder"] + metrics["pm/flags_easier"] == 2
  assert sorted(e["question"] for e in m.d_pg_next) == sorted(x["question"] for x in m.d_pm)
  assert {e["flag"] for e in m.d_pg_next} <= {R.HARDER, R.EASIER}
  assert metrics["pm/accuracy"] == pytest.approx(metrics["pm/reward/mean"])
  # The same question judged again takes its newest flag (no duplicate).
  m.upsert_pg([dict(m.d_pg_next[0], flag=R.EASIER), dict(m.d_pg_next[0], flag=R.HARDER)])
  assert len(m.d_pg_next) == 2 and m.d_pg_next[-1]["flag"] == R.HARDER


@pytest.mark.parametrize("mode", ["no_question", "empty_answer", "answer_in_question"])
def test_malformed_pg_output_is_counted_and_scores_zero(method, mode):
  rt, m, _, workdir, _ = method
  play_all_roles(rt, ScriptedAslSampler(rt.tokenizer, pg_mode=mode))
  metrics = _step(rt, m)
  n = rt.config.asl.pg_batch * rt.config.asl.group_size
  assert metrics[f"pg/malformed/{mode}"] == n and metrics["pg/well_formed"] == 0
  assert metrics["pg/reward/max"] == 0.0 and metrics["grm/verdicts"] == 0
  assert not m.d_pm and not m.d_grm and "train/loss" in metrics
  assert f"[malformed]\n{mode}" in (workdir / "samples.log").read_text()


def test_malformed_grm_output_is_counted_and_never_raises(method):
  rt, m, _, _, _ = method
  play_all_roles(rt, ScriptedAslSampler(rt.tokenizer, grm_garbage=True))
  metrics = _step(rt, m)
  assert metrics["grm/malformed"] == metrics["grm/verdicts"] > 0
  assert metrics["pg/validity_rate"] == 0 and not m.d_pm  # nothing passes an unparsable gate
  m.d_grm = [{"question": "Which entity does the search for Arts return first?",
              "response": "Arts", "score": 0}]
  m.phase = "grm"
  metrics = _step(rt, m, 1)
  assert metrics["grm/reward/max"] == 0.0 and metrics["grm/malformed"] == metrics["grm/verdicts"]


def test_empty_stores_skip_their_phase(method):
  rt, m, _, _, _ = method
  m.phase = "grm"  # no D_GRM and no D_PM: both skipped, iteration 1 starts from topics
  metrics = _step(rt, m)
  assert metrics["grm/skipped"] == 1 and metrics["pm/skipped"] == 1
  assert metrics["phase"] == 0 and metrics["iteration"] == 1 and metrics["pg/meta_topic"] == 2
  assert [h["end"] for h in m.history[:2]] == ["empty_store", "empty_store"]


def test_host_state_round_trips_exactly(method):
  rt, m, _, _, _ = method
  _step(rt, m)
  state = json.loads(json.dumps(m.host_state()))  # what the checkpoint stores
  fresh = asl.Asl.__new__(asl.Asl)
  fresh.rng = np.random.default_rng(123)
  fresh.load_host_state(state)
  for key in ("iteration", "phase", "rewards", "history", "d_pg", "d_pg_next", "d_pm", "d_grm"):
    assert getattr(fresh, key) == getattr(m, key), key
  assert fresh.rng.bit_generator.state == m.rng.bit_generator.state


# --------------------------------------------------------------------------- the schedule

def _run_scripted(config, workdir, monkeypatch, holder=None, **kw):
  def make(rt):
    method = scripted(rt, **kw)
    if holder is not None:
      holder["method"] = method
    return method
  monkeypatch.setattr(asl, "make_method", make)
  return runner.run(config, str(workdir))


def _comparable(rec):
  return {k: v for k, v in rec.items() if not k.startswith("time/") and "per_s" not in k}


def schedule_config(**kw):
  return small_config(**{"total_steps": 9, "asl.phases.grm.min_steps": 2,
                         "asl.phases.grm.max_steps": 3, "asl.phases.pm.min_steps": 2,
                         "asl.phases.pm.max_steps": 3, **kw})


@pytest.mark.slow  # a scripted 9-step run through the real updates
def test_phases_cycle_pg_grm_pm_and_the_next_iteration_uses_flags(tmp_path, monkeypatch):
  holder = {}
  _run_scripted(schedule_config(), tmp_path, monkeypatch, holder)
  m = holder["method"]
  records = metrics_lib.read_jsonl(tmp_path / "metrics.jsonl")
  phases = [int(r["phase"]) for r in records]
  # PG until |D_PM| ≥ 2, then GRM and PM for 2–3 steps each, then iteration 1's PG.
  first_grm, first_pm = phases.index(1), phases.index(2)
  assert set(phases[:first_grm]) == {0} and first_grm < first_pm
  assert set(phases[first_grm:first_pm]) == {1} and 2 <= first_pm - first_grm <= 3
  assert [h["phase"] for h in m.history[:3]] == ["pg", "grm", "pm"]
  for h in m.history[1:3]:
    assert 2 <= h["steps"] <= 3 and h["end"] in ("slope", "max_steps")
  later = [r for r in records if r["iteration"] == 1]
  assert later and later[0]["phase"] == 0
  assert later[0]["pg/meta_harder"] + later[0]["pg/meta_easier"] == m.cfg.pg_batch
  assert later[0]["pg/meta_topic"] == 0
  assert any("grm/slope" in r for r in records) and any("pm/slope" in r for r in records)
  assert any("grm/phase_length" in r for r in records)
  assert all("store/d_grm" in r for r in records)
  text = (tmp_path / "samples.log").read_text()
  assert "[flag]" in text and "[stored score]" in text and "[validity judgments]" in text


@pytest.mark.slow  # a scripted 5-step run through the real updates
def test_frozen_grm_ablation_skips_the_grm_phase_and_keeps_m0(tmp_path, monkeypatch):
  holder = {}
  _run_scripted(schedule_config(**{"asl.grm_mode": "frozen", "total_steps": 5}), tmp_path,
                monkeypatch, holder)
  m = holder["method"]
  assert m.roles["grm"].policy is None and m.rt.frozen["grm"] is m.rt.base_params
  phases = [int(r["phase"]) for r in metrics_lib.read_jsonl(tmp_path / "metrics.jsonl")]
  assert 1 not in phases and 2 in phases  # PG → PM
  with pytest.raises(AssertionError):  # the shared policy trained; the judge did not
    chex.assert_trees_all_equal(leaves(m.rt.frozen["grm"]), leaves(m.rt.policies["policy"].state.params))


@pytest.mark.slow  # two scripted runs of 9 steps
def test_resume_inside_each_phase_matches_an_uninterrupted_run(tmp_path, monkeypatch):
  _run_scripted(schedule_config(), tmp_path / "full", monkeypatch)
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  cuts = sorted({s for s in a if a[s].get("phase/step", 0) >= 1})  # inside a phase
  for steps in [c + 1 for c in cuts[:3]] + [None]:
    c = schedule_config()
    if steps is not None:
      c.total_steps = steps
    _run_scripted(c, tmp_path / "cut", monkeypatch)
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert sorted(a) == sorted(b)
  for step in a:
    assert _comparable(a[step]) == _comparable(b[step]), step


# ------------------------------------------------------------------------- demonstrations

def test_demonstrations_cover_every_role_with_real_search_results(shared):
  rt, m, _, _ = shared
  demos = asl_demos._Demos(m, np.random.default_rng(0)).build(3)
  assert len(demos) == 15  # per topic: PG, PM, two GRM verdicts, PG on the flagged question
  decode = lambda d: rt.tokenizer.decode(list(d.tokens), skip_special_tokens=False)
  texts = [decode(d) for d in demos]
  assert "<question>" in texts[0] and "<answer>" in texts[1]
  assert "conclusion: correct" in texts[2] and "conclusion: wrong" in texts[3]
  assert "Students answer" in texts[4]
  for d in demos:
    obs = [s for s in d.spans if s.kind == "observation"]
    assert len(obs) == 1 and not d.loss_mask[obs[0].start:obs[0].end].any()
    assert d.loss_mask[-1] == 1
  task, err = R.parse_task(demos[0].spans[-1].text)
  assert err is None and task.answer in texts[0].split("</information>")[0]  # copied from it


# ------------------------------------------------------------------------------- the CLI

def _cli(workdir, *extra, wait=True):
  env = dict(os.environ, PYTHONPATH=ROOT)
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/asl.py",
         f"--workdir={workdir}", *extra]
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1800)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


@pytest.mark.slow
def test_cli_default_demo_reaches_every_phase(tmp_path):
  """The README's command: the warmed model plays all three roles and every phase trains."""
  out = _cli(tmp_path / "run")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Finished asl (demo)" in out.stdout and "phases (iteration:phase×steps)" in out.stdout
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert {int(r["phase"]) for r in records} == {0, 1, 2}
  assert all("train/loss" in r for r in records)
  assert any(r.get("pg/valid", 0) > 0 for r in records)
  assert list((tmp_path / "run" / "tb").iterdir())
  assert (tmp_path / "run" / "checkpoints").exists()
  text = (tmp_path / "run" / "samples.log").read_text()
  assert "[question]" in text and "[GRM output]" in text and "[flag]" in text


@pytest.mark.slow
def test_cli_sigkill_inside_a_phase_and_resume(tmp_path):
  full = _cli(tmp_path / "full")
  assert full.returncode == 0, full.stderr[-2000:]
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  inside = min(s for s, r in a.items() if r["phase"] == 1)  # the first GRM step
  proc = _cli(tmp_path / "cut", wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / str(inside), timeout=1500)
  resumed = _cli(tmp_path / "cut")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert sorted(a) == sorted(b)
  for step in a:
    assert _comparable(a[step]) == _comparable(b[step]), step


# ------------------------------------------------------------------------- the learn preset

def test_world_topics_are_the_entities_with_a_closed_class_fact():
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  world = World(5)
  topics = P.load_topics("world", 5)
  kinds = {d.title: d.id.split(":")[0] for d in world.documents}
  assert len(topics) == 160 + 60 + 8  # people, organisations, countries; no cities
  assert {kinds[t] for t in topics} == {"person", "organisation", "country"}
  assert topics != P.load_topics("world", 6)


def test_the_verifier_model_was_shown_the_learn_presets_own_prompts(tmp_path):
  """The bench that fits the `learn` preset's start (`tools/world_reading.py --format=asl`)
  shows each role exactly the prompt tokens the run builds with the preset's prompts, then the
  preset's search action, and its final tags parse as the run parses them."""
  from tools import world_reading  # pylint: disable=import-outside-toplevel
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  c = asl_config.get_config("learn")
  c.progress = False
  rt = runtime.Runtime(c, str(tmp_path))
  method = asl.Asl(rt)
  world = World(7)
  questions = world.questions(3, np.random.default_rng(0), "attr")
  demos = world_reading.asl_examples(rt.tokenizer, world, questions, grades=1)
  by_id = {d.id: d for d in world.documents}
  roles, prompts = method.roles, method.prompts
  for i, q in enumerate(questions):
    doc, gold = by_id[q["support"][0]], q["gold"][0]
    wrong = rt.tokenizer.decode(demos["grm"][2 * i + 1].tokens).split("Student's answer: ")[1]
    wrong = wrong.split("<|im_end|>")[0].strip()
    expected = {
        "pg": (roles["pg"].prompt(prompts.pg({"topic": doc.title}, 0)), demos["pg"][i]),
        "pm": (roles["pm"].prompt(method.answer_prompt(q["question"], "qa_search")),
               demos["pm"][i]),
        "grm_right": (roles["grm"].prompt(prompts.grm(q["question"], gold)), demos["grm"][2 * i]),
        "grm_wrong": (roles["grm"].prompt(prompts.grm(q["question"], wrong)),
                      demos["grm"][2 * i + 1])}
    for name, (want, demo) in expected.items():
      assert list(demo.tokens[:len(want)]) == list(want), (name, q["question"])
      turns = [s.text for s in demo.spans if s.kind == "generated"]
      assert turns[0] == asl_demos.search_action(doc.title, "qwen"), (name, turns[0])
    final = lambda demo: [s.text for s in demo.spans if s.kind == "generated"][-1]
    task, error = R.parse_task(final(demos["pg"][i]))
    assert error is None and (task.question, task.answer) == (q["question"], gold)
    assert R.parse_verdict(final(demos["grm"][2 * i])) == 1
    assert R.parse_verdict(final(demos["grm"][2 * i + 1])) == 0 and wrong != gold


def test_world_demonstrations_show_each_role_its_share():
  """Per question: one PG and one PM turn, and `grades` right and as many wrong answers judged;
  the PM's answers are right in `right_share` of them."""
  from scope_jax.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  world = World(3)
  questions = world.questions(40, np.random.default_rng(0), "attr")
  tok = load_tokenizer("demo")
  demos = asl_demos.world_demonstrations(tok, P.Prompts("compact", "qwen"), world, questions,
                                         right_share=0.0, grades=2)
  assert {k: len(v) for k, v in demos.items()} == {"pg": 40, "pm": 40, "grm": 160}
  assert asl_demos.verdict("surgeon", "botanist") == (
      "The page says surgeon. The answer is botanist.\n<answer>conclusion: wrong</answer>")
  assert R.parse_verdict(asl_demos.verdict("surgeon", "surgeon")) == 1
  last = lambda d: [s.text for s in d.spans if s.kind == "generated"][-1]
  assert [R.parse_verdict(last(d)) for d in demos["grm"]] == [1, 1, 0, 0] * 40
  assert last(demos["grm"][0]).startswith(f"The page says {questions[0]['gold'][0]}. The answer "
                                          f"is {questions[0]['gold'][0]}.\n<answer>")
  golds = [q["gold"][0] for q in questions]
  answers = [tok.decode(d.tokens).rsplit("<answer>", 1)[1].split("</answer>")[0]
             for d in demos["pm"]]
  assert not any(a == g for a, g in zip(answers, golds))  # right_share = 0: every one wrong
  right = asl_demos.world_demonstrations(tok, P.Prompts("compact", "qwen"), world, questions)
  assert [tok.decode(d.tokens).rsplit("<answer>", 1)[1].split("</answer>")[0]
          for d in right["pm"]] == golds


def test_the_learn_preset_starts_from_the_shipped_verifier_model():
  """The verifier model ships with the package (a few MB, listed in setup.py's package data)
  and has the demo model's shape; the preset adds no warm-up, co-trains the GRM as the paper
  does and runs one PG, one GRM and one PM phase of fixed lengths; its `learn_frozen_grm`
  ablation judges with the frozen start and has no GRM phase."""
  from scope_jax.data import VERIFIER_MODEL  # pylint: disable=import-outside-toplevel
  c = asl_config.get_config("learn")
  bundled.assert_learn_starts_from(c, VERIFIER_MODEL)
  a = c.asl
  assert (a.grm_mode, a.topics, a.phase_end) == ("co_trained", "world", "slope")
  assert a.grm_mode == asl_config.paper_base().asl.grm_mode
  limits = lambda p: (a.phases[p].min_steps, a.phases[p].max_steps)
  assert (limits("pg"), limits("grm"), limits("pm")) == ((4, 4), (4, 4), (26, 26))
  assert c.total_steps == 4 + 4 + 26
  f = asl_config.get_config("learn_frozen_grm")
  bundled.assert_learn_starts_from(f, VERIFIER_MODEL)
  assert f.asl.grm_mode == "frozen" and f.asl.roles.grm.temperature == 0.5
  assert (f.asl.phases.pm.min_steps, f.asl.phases.pm.max_steps) == (30, 30)
  assert f.total_steps == 4 + 30
