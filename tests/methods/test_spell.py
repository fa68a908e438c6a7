"""SPELL end to end: configs, one scripted step through the real update, CLI, resume."""

import json
import os
import subprocess
import sys

import chex
import numpy as np
import pytest

from configs import spell as spell_config
from scope_jax import metrics as metrics_lib
from scope_jax.methods.spell import clusters as clusters_lib
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.methods.spell import algorithm as spell
from tests.methods.cli import kill_once_exists
from tests.methods.scripted import ScriptedSpellSampler, play_all_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_config(**overrides):
  c = spell_config.get_config("demo")
  c.spell.prompt_style = "paper"  # the scripted sampler reads the paper's prompts
  c.warmup.steps = 0
  c.spell.questions_per_step = 3
  c.spell.group_size = 3
  c.data.num_clusters = 20
  c.spell.roles.questioner.max_new_tokens = 128
  c.spell.roles.responder.max_new_tokens = 64
  c.spell.roles.verifier.max_new_tokens = 32
  c.update_from_flattened_dict(overrides)
  return c


@pytest.mark.parametrize("preset", spell_config.PRESETS)
def test_every_preset_loads(preset):
  c = spell_config.get_config(preset)
  assert c.method == "spell" and c.preset == preset
  if preset == "paper_qwen3_moe":
    assert c.model.source == "preset:qwen3-30b-a3b" and len(c.mesh.shape) == 4
  if preset.startswith("paper"):
    assert (c.spell.group_size, c.spell.history_size, c.spell.docs_per_question) == (8, 3, 5)
    assert (c.spell.questions_per_step, c.optim.lr, c.optim.schedule) == (128, 2e-6, "constant")
    assert (c.spell.roles.responder.temperature, c.spell.roles.responder.top_p) == (0.7, 0.95)
    assert (c.rollout.max_prompt_tokens, c.spell.roles.responder.max_new_tokens) == (16384, 4096)
    assert (c.loss.kl_beta, c.loss.agg_mode) == (0.0, "token-mean")


def test_unknown_preset_lists_choices():
  with pytest.raises(ValueError, match="valid presets: demo, learn, learn_extractive, paper, small"):
    spell_config.get_config("huge")


def test_scripted_step_runs_every_phase(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = spell.Spell(rt)
  play_all_roles(rt, ScriptedSpellSampler(rt.tokenizer))
  before = np.asarray(method.rt.policies["policy"].state.params["embed"]).copy()
  m = method.step(0)
  assert m["rounds"] >= 1 and m["questioner/share_bad_format"] == 0.0
  assert m["train/responder_groups"] > 0 and m["train/verifier_groups"] >= 0
  assert m["train/questioner_samples"] >= m["train/responder_groups"]  # positives + negatives
  chex.assert_tree_all_finite(m["train/loss"])
  assert m["train/loss_tokens"] > 0
  with pytest.raises(AssertionError):  # the policy trained (np.allclose's tolerances)
    chex.assert_trees_all_close(before, np.asarray(method.rt.policies["policy"].state.params["embed"]),
                                rtol=1e-5, atol=1e-8)
  assert m["memory/clusters_with_history"] >= 1  # solvable questions were remembered
  assert 0 <= m["verifier/agreement"] <= 1


def test_questioner_history_prompt_grows_context(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = spell.Spell(rt)
  c = 0
  ids = [method.passages[i].id for i in method.clusters[c][:2]]
  first = rt.tokenizer.decode(method.questioner_prompt(c, "doc_qa", ids))
  assert "Previous Examples" not in first
  assert all(method.by_id[d].title in first for d in ids)
  from scope_jax.methods.spell.clusters import HistoryEntry
  method.memory.push(str(c), HistoryEntry(["wiki-00001"], "Old question?", "Old answer"))
  second = rt.tokenizer.decode(method.questioner_prompt(c, "doc_qa", ids))
  assert "### Example 1:\nQuestion: Old question?\nAnswer: Old answer" in second
  assert second.index(method.by_id["wiki-00001"].title) < second.index(method.by_id[ids[0]].title)


def test_the_verifier_asks_in_the_shared_answer_match_format(tmp_path):
  """The verifier's template is `rewards.judges`' answer match (the one held-out evaluation's
  judge uses); the questioner and responder keep SPELL's own."""
  from scope_jax import prompts  # pylint: disable=import-outside-toplevel
  from scope_jax.rewards import judges  # pylint: disable=import-outside-toplevel
  method = spell.Spell(runtime.Runtime(small_config(), str(tmp_path)))
  verifier = method.prompts.verifier("P", "A1", "A2")
  assert verifier.template == judges.template(judges.ANSWER_MATCH, "paper")
  assert "[[YES]]" in verifier.template
  responder = method.prompts.template("responder_doc_qa")
  assert responder.template == prompts.load("spell", "responder_doc_qa")


def test_bad_override_and_empty_corpus(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT)
  bad = subprocess.run([sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py",
                        f"--workdir={tmp_path}", "--config.spell.group_size=eight"],
                       capture_output=True, text=True, cwd=ROOT, env=env)
  assert bad.returncode != 0 and "group_size" in bad.stderr
  (tmp_path / "empty.jsonl").write_text("")
  with pytest.raises(ValueError, match="empty"):
    clusters_lib.from_config(small_config(**{"data.corpus": str(tmp_path / "empty.jsonl")}).data)
  with pytest.raises(ValueError, match="is not valid; choose one of: gaussian, reverse, rzero"):
    c = small_config()
    c.spell.reward_mapping = "linear"
    runner.validate(c)
  with pytest.raises(ValueError, match="model.tokenizer is empty"):
    runner.validate(spell_config.get_config("paper"))
  with pytest.raises(ValueError, match="Unknown aggregation mode 'mean'; valid: "):
    runner.validate(small_config(**{"loss.agg_mode": "mean"}))
  bad_choice = subprocess.run(
      [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py", f"--workdir={tmp_path}",
       "--config.model.remat=sometimes"], capture_output=True, text=True, cwd=ROOT, env=env)
  assert bad_choice.returncode != 0
  assert "model.remat='sometimes' is not valid; choose one of: none, full, dots" in bad_choice.stderr


def _run(workdir, steps, env, wait=True):
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py",
         f"--workdir={workdir}", f"--config.total_steps={steps}"]
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


def _comparable(rec):
  return {k: v for k, v in rec.items() if not k.startswith("time/") and "per_s" not in k}


@pytest.mark.slow
def test_sigkill_and_resume_match_an_uninterrupted_run(tmp_path):
  env = dict(os.environ, PYTHONPATH=ROOT)
  full = _run(tmp_path / "full", 3, env)
  assert full.returncode == 0, full.stderr[-2000:]
  assert "Finished spell (demo)" in full.stdout
  proc = _run(tmp_path / "cut", 3, env, wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / "0", timeout=300)
  resumed = _run(tmp_path / "cut", 3, env)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert set(a) == {0, 1, 2} and set(b) >= {1, 2}
  for step in (1, 2):
    assert _comparable(a[step]) == _comparable(b[step]), step


def _traj():
  from scope_jax.rollout.types import Span, Trajectory
  return Trajectory(np.array([1, 2, 3, 4], np.int32), np.array([0, 0, 1, 1], np.int32),
                    np.array([0, 0, -1, -1], np.float32), 2, [Span(0, 2, "prompt")], [], None,
                    None, "eos")


def _question(res, rule, votes, ver, reward, status="ok"):
  """A Question with its outcomes filled in (no rollouts run)."""
  q = spell.Question(0, "doc_qa", [], _traj(), reward=reward, status=status)
  q.res_rewards, q.rule, q.votes, q.ver_rewards = res, rule, votes, ver
  q.responses = [_traj() for _ in res]
  q.verdicts = [[_traj() for _ in v] for v in ver]
  return q


def test_dynamic_sampling_counts(tmp_path):
  """Responder groups need reward variance; negatives match positives; verifier groups need
  agreement in [0.51, 0.99], conflicting ones capped at the number of questions."""
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = spell.Spell(rt)
  question = _question
  agree3 = [1.0, 1.0, 1.0, 0.0]  # 0.75 agreement: trainable
  unanimous = [1.0, 1.0, 1.0, 1.0]  # 1.0: too easy
  qs = [
      question([1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0], [agree3, agree3, unanimous, agree3], 1.0),
      question([1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [unanimous] * 4, 0.0, "zero_variance"),
      question([], [], [], [], -1.0, "bad_format"),
      question([], [], [], [], -0.5, "ungrounded"),
  ]
  qs[0].votes = [1, 1, 1, 0]  # response 1: vote 1 but rule 0 → a conflicting verifier group
  trajs, advs, counts = method.select_and_advantage(qs)
  assert counts["train/responder_groups"] == 1
  assert counts["train/questioner_samples"] == 2  # 1 positive + 1 negative
  assert counts["train/verifier_groups"] == 3  # responses 0, 1 (conflicting), 3 of question 0
  assert len(trajs) == len(advs) == 4 + 2 + 3 * 4
  chex.assert_trees_all_close(np.asarray(advs[:4]), np.array([1, -1, 1, -1]), atol=1e-5,
                              rtol=1e-7)  # group z-score


def test_released_verifier_selection_keeps_a_few_consistent_groups(tmp_path):
  """`spell.verifier_selection='released'`: only groups whose vote agrees with the rule check,
  agreement counted over valid judgments, and int(responder rows · ratio / G) of them; none
  when fewer are eligible (the released trainer then skips the verifier)."""
  agree3, one_invalid = [1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, -1.0]

  def batch():
    qs = [_question([1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0], [agree3] * 4, 1.0)
          for _ in range(8)]  # 32 responder rows, 32 consistent groups in the band
    for q in qs[:4]:
      q.votes = [1, 1, 1, 0]  # response 1 conflicts with the rule: never picked as released
      q.ver_rewards = [agree3, agree3, agree3, one_invalid]  # 3/3 valid agree: out of the band
    return qs

  paper = spell.Spell(runtime.Runtime(small_config(**{"spell.group_size": 4}),
                                      str(tmp_path / "p")))
  *_, counts = paper.select_and_advantage(batch())
  assert counts["train/verifier_groups"] == 32  # every group in the band, conflicting included
  for ratio, expect in ((0.125, 1), (0.5, 4), (1.0, 8)):  # int(32 · ratio / 4)
    c = small_config(**{"spell.group_size": 4, "spell.verifier_selection": "released",
                        "spell.verifier_update_ratio": ratio})
    m = spell.Spell(runtime.Runtime(c, str(tmp_path / str(ratio))))
    qs = batch()
    trajs, advs, counts = m.select_and_advantage(qs)
    assert counts["train/verifier_candidates"] == 32 - 4 - 4
    assert counts["train/verifier_groups"] == expect
    assert len(trajs) == len(advs) == 32 + counts["train/questioner_samples"] + 4 * expect
  chosen, eligible = spell.R.released_verifier_groups(
      [(True, agree3)] * 3, 32, 1.0, 4, (0.51, 0.99), np.random.default_rng(0))
  assert (chosen, eligible) == ([], 3)  # 8 wanted, 3 eligible: no verifier update


def test_variance_fill_rule_collects_n_groups_with_variance_and_cuts_to_n(tmp_path):
  """`spell.fill_rule='variance'` (released): rounds go on until N responder groups have reward
  variance, bounded by max_generation_rounds, and the update keeps exactly N of them; a step
  that cannot fill says so in `fill_shortfall`. 'grounded' stops at N grounded questions."""
  def run(rule, rounds, vary_every):
    c = small_config(**{"spell.questions_per_step": 4, "spell.group_size": 4,
                        "spell.fill_rule": rule, "spell.generation_batch": 3,
                        "spell.max_generation_rounds": rounds})
    m = spell.Spell(runtime.Runtime(c, str(tmp_path / f"{rule}{rounds}{vary_every}")))
    made = []

    def propose(n):  # every vary_every-th question has reward variance, the rest none
      out = []
      for _ in range(n):
        k = len(made)
        res = [1.0, 0.0, 1.0, 0.0] if k % vary_every == 0 else [1.0] * 4
        q = _question(res, res, [int(r) for r in res], [[1.0] * 4] * 4, 0.5 if res[1] == 0
                      else 0.0, "ok" if res[1] == 0 else "zero_variance")
        made.append(q)
        out.append(q)
      return out

    m.propose, m.grounding_filter, m.respond_and_verify = propose, lambda b: None, lambda b: None
    seen = {}
    m.rt.train = lambda policy, trajs, advs, **kw: seen.update(rows=len(trajs)) or {}
    return m.step(0), len(made)

  metrics, made = run("variance", 10, 2)  # 2 groups with variance per round of 3 ... 4, 5
  assert metrics["rounds"] == 3 and made == 9 and metrics["fill_shortfall"] == 0
  assert metrics["train/responder_groups"] == 4  # 5 had variance: cut to N
  metrics, made = run("variance", 2, 3)  # 1 per round, 2 rounds: short by 2
  assert metrics["rounds"] == 2 and metrics["fill_shortfall"] == 2
  assert metrics["train/responder_groups"] == 2
  metrics, made = run("grounded", 10, 2)  # 4 grounded questions after 2 rounds
  assert metrics["rounds"] == 2 and metrics["train/responder_groups"] == 3


def test_unbiased_std_in_every_roles_advantage(tmp_path):
  """`spell.adv_std='unbiased'` (the released torch.std): [1, 0, 1, 0] → ±0.5/√(1/3) = ±0.866,
  against ±1 with the population std."""
  c = small_config(**{"spell.adv_std": "unbiased"})
  m = spell.Spell(runtime.Runtime(c, str(tmp_path)))
  q = _question([1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0], [[1.0, 1.0, 1.0, 0.0]] * 4, 1.0)
  _, advs, _ = m.select_and_advantage([q])
  chex.assert_trees_all_close(np.asarray(advs[:4]), np.array([1, -1, 1, -1]) * 0.5 / np.sqrt(1 / 3),
                              rtol=1e-5)


class _SometimesSilentSampler(ScriptedSpellSampler):
  """The scripted roles, but half the responder's document answers state no final answer."""

  def _answer(self, text, rng):
    out = super()._answer(text, rng)
    if out.startswith("The correct answer is") and "Empty" not in text and rng.random() < 0.5:
      return "I am not sure what the documents say."
    return out


def test_a_response_with_no_answer_keeps_its_rule_score_unjudged(tmp_path):
  """Released: a response with no parsable final answer is not sent to the verifier; its reward
  is the rule score (0) and it has no verifier group. `spell.verify_unanswered=True` judges its
  last 300 characters instead."""
  rt = runtime.Runtime(small_config(**{"spell.tasks": ("doc_qa",)}), str(tmp_path / "a"))
  method = spell.Spell(rt)
  play_all_roles(rt, _SometimesSilentSampler(rt.tokenizer))
  asked = []
  real = method.roles["verifier"].generate
  method.roles["verifier"].generate = lambda prompts, **kw: asked.extend(prompts) or real(prompts, **kw)
  batch = method.propose(3)
  method.grounding_filter(batch)
  method.respond_and_verify(batch)
  silent = [(q, i) for q in batch for i, t in enumerate(q.responses)
            if spell.match.extract_final_answer(t.response_text()) is None]
  answered = sum(len(q.responses) for q in batch) - len(silent)
  assert silent and answered and len(asked) == answered
  for q, i in silent:
    assert q.res_rewards[i] == q.rule[i] == 0.0 and q.ver_rewards[i] == [] and q.votes[i] == 0
  m = spell.report.step_metrics(batch, {}, 1, method.memory)
  assert (m["verifier/votes"], m["verifier/skipped_unanswered"]) == (answered, len(silent))
  q, i = silent[0]
  c = small_config(**{"spell.verify_unanswered": True})
  on = spell.Spell(runtime.Runtime(c, str(tmp_path / "b")))
  text = rt.tokenizer.decode(on.verifier_prompt(q.proposal, q.responses[i]))
  assert "I am not sure what the documents say." in text
  assert method.verifier_prompt(q.proposal, q.responses[i]) is None


def test_paper_preset_matches_the_paper():
  c = spell_config.get_config("paper")
  assert c.spell.max_doc_chars == 0  # whole documents
  assert (c.data.num_clusters, c.data.cluster_size, c.data.max_cluster_size) == (0, 20, 0)
  assert c.spell.roles.verifier.max_new_tokens == 4096
  # the released trainer's batch: rounds of 480 (GEN_BS), up to 10, until 128 groups have reward
  # variance; 16 consistent verifier groups (VERIFIER_UPDATE_RATIO 0.125)
  assert (c.spell.fill_rule, c.spell.generation_batch, c.spell.max_generation_rounds) == \
      ("variance", 480, 10)
  assert (c.spell.verifier_selection, c.spell.verifier_update_ratio) == ("released", 0.125)
  assert (c.spell.adv_std, c.optim.weight_decay) == ("unbiased", 0.01)  # torch.std; verl's AdamW


def test_task_types_are_drawn_uniformly(tmp_path):
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = spell.Spell(rt)
  play_all_roles(rt, ScriptedSpellSampler(rt.tokenizer))
  method.respond_and_verify = lambda qs: None
  tasks = [q.task for _ in range(10) for q in method.propose(30)]
  counts = {t: tasks.count(t) / len(tasks) for t in method.tasks}
  assert set(counts) == {"doc_qa", "doc_mc", "doc_math"}  # every type has a cluster
  assert all(abs(v - 1 / 3) < 0.06 for v in counts.values()), counts


def test_cli_default_demo_runs_every_phase_on_the_models_own_output(tmp_path):
  """The README's first command: the bundled demo model proposes questions that parse and pass
  the grounding filter, responder groups are checked and voted on, and the policy trains."""
  out = _run(tmp_path / "run", 2, dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Using the bundled warmed-up demo model" in out.stderr
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1]
  total = lambda key: sum(r.get(key, 0) for r in records)
  assert total("questioner/parsed") >= total("questioner/proposals") / 2
  assert total("questioner/grounded") > 0 and total("responder/groups") > 0
  assert total("verifier/votes") > 0 and total("train/responder_groups") > 0
  assert any("train/loss" in r for r in records)
  for role in ("questioner", "responder", "verifier"):
    assert all(r[f"{role}/rollout/rows"] > 0 for r in records)


def test_the_vote_can_be_left_out_of_the_responders_reward(tmp_path, monkeypatch):
  """`spell.vote_in_reward=False`: the verifier still votes and trains, and the responder's
  reward is its rule check alone (max(R_rule, 0))."""
  rt = runtime.Runtime(small_config(**{"spell.vote_in_reward": False}), str(tmp_path))
  method = spell.Spell(rt)
  play_all_roles(rt, ScriptedSpellSampler(rt.tokenizer))
  real, calls = spell.R.responder_reward, []
  monkeypatch.setattr(spell.R, "responder_reward",
                      lambda rule, vote: calls.append(vote) or real(rule, vote))
  m = method.step(0)
  assert m["verifier/votes"] > 0 and calls and set(calls) == {0}


def test_extractive_labels_drop_an_answer_no_document_states(tmp_path):
  """`spell.extractive_labels=True`: a `doc_qa` label that is a phrase of its cluster's documents
  passes on to the responder check; one that is not (a made-up label) is ungrounded (−0.5) before
  the responder is asked; off (the paper), neither is dropped for it."""
  for on in (True, False):
    rt = runtime.Runtime(small_config(**{"spell.extractive_labels": on}), str(tmp_path / str(on)))
    method = spell.Spell(rt)
    asked = []
    method.roles["responder"].texts = lambda prompts: asked.extend(prompts) or ["I do not know."] * len(
        prompts)
    cluster = next(c for c, members in enumerate(method.clusters) if members)
    text = method.passages[method.clusters[cluster][0]].text
    words = [w.strip(".,") for w in text.split() if len(w.strip(".,")) > 3]
    stated, made_up = words[0], "Zyxwvut Qponm"
    qs = [spell.Question(cluster, "doc_qa", [], None, proposal=spell.R.Proposal("Q?", a))
          for a in (stated, made_up)]
    method.grounding_filter(qs)
    assert qs[0].status == "ok" and len(asked) == (1 if on else 2)
    assert (qs[1].status, qs[1].reward) == (("ungrounded", -0.5) if on else ("ok", 0.0))


def test_a_parser_exception_is_counted_not_raised(tmp_path, monkeypatch):
  """An unexpected exception in a parser of model output scores that sample as malformed, is
  counted in the step's metrics, and the run goes on."""
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = spell.Spell(rt)
  play_all_roles(rt, ScriptedSpellSampler(rt.tokenizer))
  real, calls = spell.R.rule_score, []

  def flaky(text, gold, task):
    calls.append(text)
    if len(calls) % 3 == 0:
      raise IndexError("list index out of range")
    return real(text, gold, task)

  monkeypatch.setattr(spell.R, "rule_score", flaky)
  m = method.step(0)
  assert method.guard.take() == len(calls) // 3 > 0  # the runner's parse_errors
  chex.assert_tree_all_finite(m["questioner/reward/mean"])


def test_wrong_answers_keep_the_form_of_the_right_one():
  """A closed-class fact's wrong answers are its class's other members; any other fact's are the
  entity's other facts its document states (a number written as the document writes it)."""
  from scope_jax.methods.spell import demos as spell_demos  # pylint: disable=import-outside-toplevel
  from scope_jax.world import entities as E  # pylint: disable=import-outside-toplevel
  p = E.Person("Ada Brook", 1931, "Stonehaven", "Velt Press", "chemist")
  text = "Ada Brook is a chemist. Ada Brook was born in 1931. Ada Brook works for Velt Press."
  assert spell_demos.wrong_answers(p, text, "chemist") == sorted(
      set(E.PROFESSIONS) - {"chemist"})
  assert spell_demos.wrong_answers(p, text, "Velt Press") == ["1931", "chemist"]
  c = E.City("Stonehaven", "Orrland", 1200, 45_000)
  assert spell_demos.wrong_answers(c, "Stonehaven lies in Orrland. About 45,000 people live "
                                   "there.", "Orrland") == ["45,000"]


def test_chance_answers_ignore_the_document():
  """`spell.warmup.answers='chance'`: a closed-class fact's answers are its whole class (the right
  one among them, as likely as any other); any other fact's are the wrong ones."""
  from scope_jax.methods.spell import demos as spell_demos  # pylint: disable=import-outside-toplevel
  from scope_jax.world import entities as E  # pylint: disable=import-outside-toplevel
  p = E.Person("Ada Brook", 1931, "Stonehaven", "Velt Press", "chemist")
  text = "Ada Brook is a chemist. Ada Brook was born in 1931. Ada Brook works for Velt Press."
  assert spell_demos.chance_answers(p, text, "chemist") == sorted(E.PROFESSIONS)
  assert spell_demos.chance_answers(p, text, "Velt Press") == ["1931", "chemist"]


def test_learn_preset_demonstrations_and_held_out_prompt(tmp_path):
  """The `learn` preset's warm-up demonstrates other worlds' closed-class document questions
  (right labels from the questioner, another member of the fact's class from the responder,
  never a name of the run's world), and a held-out `attr` question is asked in the responder's
  own prompt."""
  from scope_jax.core import evals  # pylint: disable=import-outside-toplevel
  from scope_jax.methods.spell import demos as spell_demos  # pylint: disable=import-outside-toplevel
  from scope_jax.world import World  # pylint: disable=import-outside-toplevel
  c = spell_config.get_config("learn")
  c.model.source, c.model.tokenizer = "tiny", "demo"  # prompts and demonstrations only
  c.warmup.worlds, c.warmup.documents, c.eval.limit = 2, 12, 2
  c.spell.warmup.right_share = 0.0  # every answer wrong here; the preset's share is tested below
  rt = runtime.Runtime(c, str(tmp_path))
  method = spell.Spell(rt)
  # A held-out question is asked exactly as the responder is asked about a document.
  record = World(0).gold["attr"][0]
  doc = next(d for d in World(0).documents if d.id == record["support"][0])
  context, question = spell.split_document_question(record["question"])
  assert context == clusters_lib.render_context([doc]) and question.endswith("?")
  ev = evals.Evaluations(rt, method)
  ask = ev.evaluators[ev.benches[0].name].role_prompt
  assert ask("qa", record["question"]) == method.responder_prompt(
      "doc_qa", spell.R.Proposal(question, ""), context)
  assert ask("qa", "Who founded Migra Guild?") is None and ask("qa_search", question) is None
  # Demonstrations: per question, the questioner's (right), the responder's (wrong), a verdict.
  demos = spell_demos.demonstrations(method, np.random.default_rng(0))
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  assert len(text) % 3 == 0 and len(text) >= 18
  answers = {q["question"]: q["gold"][0] for w in (World(1000), World(1001))
             for q in w.questions(10 ** 4, np.random.default_rng(0), "attr")}
  own = set(World(0).entities.by_name())
  for asked, answered, judged in zip(text[::3], text[1::3], text[2::3]):
    proposal = json.loads(asked[asked.rindex("{"):asked.rindex("}") + 1])
    assert answers[proposal["question"]] == proposal["answer"]  # the questioner is right
    reply = answered.split("The correct answer is ")[-1].split(".<")[0]
    wrong = next(m for m in spell_demos.CLASSES.values() if proposal["answer"] in m)
    assert reply != proposal["answer"] and reply in wrong  # wrong, of the right class
    decision = judged.split("Decision:")[-1]
    same = judged.split("Answer 1:")[-1].split("Answer 2:")
    assert ("[[YES]]" in decision) == (same[0].strip() == same[1].split("<|im_end|>")[0].strip())
    assert not {proposal["answer"], reply} & own  # nothing about the run's world is taught
    assert not any(f"{name}\n" in asked for name in own)  # no document of it is shown


def test_chance_answers_and_answer_first_demonstrations(tmp_path):
  """`spell.warmup.answers='chance'`: the responder names a member of the fact's class whatever the
  document says, and a [[NO]] verdict is never about the right answer; `spell.warmup.answer_first`:
  the questioner's JSON gives the answer before the question."""
  from scope_jax.methods.spell import demos as spell_demos  # pylint: disable=import-outside-toplevel
  c = spell_config.get_config("learn")
  c.model.source, c.model.tokenizer = "tiny", "demo"
  c.warmup.worlds, c.warmup.documents = 2, 40
  c.spell.warmup.answers, c.spell.warmup.answer_first = "chance", True
  rt = runtime.Runtime(c, str(tmp_path))
  demos = spell_demos.demonstrations(spell.Spell(rt), np.random.default_rng(0))
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  right = 0
  for asked, answered, judged in zip(text[::3], text[1::3], text[2::3]):
    blob = asked[asked.rindex("{"):asked.rindex("}") + 1]
    assert blob.startswith('{"answer": ')
    gold = json.loads(blob)["answer"]
    reply = answered.split("The correct answer is ")[-1].split(".<")[0]
    assert reply in next(m for m in spell_demos.CLASSES.values() if gold in m)
    right += reply == gold
    pair = judged.split("Answer 1:")[-1].split("Answer 2:")
    if "[[NO]]" in judged.split("Decision:")[-1]:
      assert pair[1].split("<|im_end|>")[0].strip() != gold
  assert 0 < right < len(text) // 6  # right by chance: some, far from all


def test_right_share_demonstrates_a_reader_that_reads_sometimes(tmp_path):
  """`spell.warmup.right_share`: that share of the responder's demonstrated answers is the
  document's own fact (the rest as `spell.warmup.answers`; at 0 none is right), and a [[NO]]
  verdict is still never about the right answer."""
  from scope_jax.methods.spell import demos as spell_demos  # pylint: disable=import-outside-toplevel

  def demos(share):
    c = spell_config.get_config("learn")
    c.model.source, c.model.tokenizer = "tiny", "demo"
    c.warmup.worlds, c.warmup.documents, c.spell.warmup.right_share = 2, 120, share
    rt = runtime.Runtime(c, str(tmp_path / str(share)))
    out = spell_demos.demonstrations(spell.Spell(rt), np.random.default_rng(0))
    return [rt.tokenizer.decode(list(d.tokens)) for d in out]

  def right(text):
    golds = [json.loads(a[a.rindex("{"):a.rindex("}") + 1])["answer"] for a in text[::3]]
    replies = [r.split("The correct answer is ")[-1].split(".<")[0] for r in text[1::3]]
    return sum(g == r for g, r in zip(golds, replies)) / len(golds)

  none, half = demos(0.0), demos(0.5)
  assert right(none) == 0.0
  assert 0.35 < right(half) < 0.65
  for asked, judged in zip(half[::3], half[2::3]):
    gold = json.loads(asked[asked.rindex("{"):asked.rindex("}") + 1])["answer"]
    if "[[NO]]" in judged.split("Decision:")[-1]:
      assert judged.split("Answer 2:")[-1].split("<|im_end|>")[0].strip() != gold


def test_the_learn_preset_starts_from_the_shipped_reader_model():
  """The reader model ships with the package (a few MB) and has the demo model's shape, so the
  `learn` preset's warm-up and the demo tokenizer fit it."""
  from scope_jax.data import DEMO_MODEL, READER_MODEL  # pylint: disable=import-outside-toplevel
  from scope_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  assert spell_config.get_config("learn").model.source == f"hf:{READER_MODEL}"
  assert (READER_MODEL / "model.safetensors").stat().st_size < 8 * 2**20
  reader, params = hf_io.load_hf(READER_MODEL)
  demo, demo_params = hf_io.load_hf(DEMO_MODEL)
  assert reader == demo
  chex.assert_trees_all_equal_shapes(params, demo_params)
