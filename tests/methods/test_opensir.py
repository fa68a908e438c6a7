"""OpenSIR end to end: configs, one scripted step through the real update, state, CLI, resume."""

import base64
import collections
import json
import os
import re
import subprocess
import sys

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from configs import opensir as opensir_config
from scope_jax import checkpoint as ckpt_lib
from scope_jax import metrics as metrics_lib
from scope_jax.methods.opensir import algorithm as opensir
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.data import COUNTER_MODEL, SOLVER_MODEL
from tests.methods.cli import kill_once_exists
from tests.methods.scripted import ScriptedOpenSirSampler, play_all_roles

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def small_config(**overrides):
  c = opensir_config.get_config("demo")
  c.warmup.steps = 0
  c.progress = False
  c.opensir.roles.teacher.max_new_tokens = 64
  c.opensir.roles.student.max_new_tokens = 48
  c.update_from_flattened_dict(overrides)
  return c


@pytest.mark.parametrize("preset", opensir_config.PRESETS)
def test_every_preset_loads(preset):
  c = opensir_config.get_config(preset)
  assert c.method == "opensir" and c.preset == preset
  o = c.opensir
  assert o.seed_problem == "What is 1+1?" and tuple(o.solve_rate_band) == (0.5, 0.9)
  assert (o.diversity_top_k, o.adv_eps, o.student_format_weight) == (5, 1e-4, 0.1)
  if preset.startswith("paper"):
    assert (o.units_per_step * (o.group_size + o.num_solutions), o.groups_per_unit) == (256, 4)
    assert (o.group_size, o.num_solutions, o.length_cap, o.length_baseline) == (8, 8, 1000, 1000)
    assert (c.optim.lr, c.optim.warmup_steps, c.optim.grad_clip) == (3e-7, 25, 0.5)
    assert (c.loss.kl_beta, c.loss.kl_kind, c.loss.agg_mode) == (1e-4, "k3", "token-mean")
    assert o.loss_unit == "unit"  # ... taken per TRL micro-batch (a unit's 8 + 8 rows)
    assert (c.opensir.roles.student.temperature, c.opensir.roles.student.max_new_tokens) == (1.0, 2048)
    assert (c.rollout.max_prompt_tokens, c.total_steps) == (1024, 200)
    assert c.learner.recompute_old_logp  # TRL with one iteration: the trainer's own log-probs
    # math-verify 0.5.2 (the released pin) parses under its default 3 s
    assert (o.math_timeout, o.initial_pool.size, tuple(o.initial_pool.solve_rate_band)) == (
        3, 512, (0.5, 0.9))
    assert c.model.source == {"paper": "preset:llama3.2-3b",
                              "paper_gemma2": "preset:gemma2-2b"}[preset]


def test_validation_names_the_fix():
  with pytest.raises(ValueError, match="solve_rate_band=.*0 <= low < high <= 1"):
    runner.validate(small_config(**{"opensir.solve_rate_band": (0.9, 0.5)}))
  with pytest.raises(ValueError, match="num_solutions must be at least 2"):
    runner.validate(small_config(**{"opensir.num_solutions": 1}))
  paper = opensir_config.get_config("paper")
  paper.model.tokenizer = "demo"
  with pytest.raises(ValueError, match="opensir.encoder is empty"):
    runner.validate(paper)
  runner.validate(paper, data=False)  # planning reads no encoder


@pytest.fixture(scope="module")
def stepped(tmp_path_factory):
  """One scripted step; the trajectories and advantages handed to the learner are kept."""
  # With the paper's KL (β = 1e-4, k3) to the initial model.
  rt = runtime.Runtime(small_config(**{"loss.kl_beta": 1e-4}),
                       str(tmp_path_factory.mktemp("opensir")))
  method = opensir.OpenSir(rt)
  play_all_roles(rt, ScriptedOpenSirSampler(rt.tokenizer))
  seen = {}
  train = rt.train

  def spy(policy, trajs, advs, **kw):
    seen["trajs"], seen["advs"] = list(trajs), list(advs)
    return train(policy, trajs, advs, **kw)

  rt.train = spy
  before = np.asarray(method.rt.policies["policy"].state.params["embed"]).copy()
  rt.begin_step(0)
  metrics = method.step(0)
  return rt, method, metrics, seen, before


def test_loss_unit_weights_each_units_rows_as_trl_does(tmp_path):
  """`opensir.loss_unit='unit'`: each row's advantage carries (T / U) / T_u, so the learner's
  token-mean becomes TRL's mean over micro-batches (units) of their token-means."""
  rt = runtime.Runtime(small_config(), str(tmp_path))
  method = opensir.OpenSir(rt)
  play_all_roles(rt, ScriptedOpenSirSampler(rt.tokenizer))
  cands = method.generate_problems()
  method.solve(cands)
  method.score(cands)
  trajs, advs, *_ = method.select(cands)
  method.cfg.loss_unit = "unit"
  trajs_u, advs_u, *_ = method.select(cands)
  tokens = np.asarray([t.loss_mask[t.prompt_len:].sum() for t in trajs], np.float64)
  trained = {id(t) for t in trajs}
  per_row_unit = []  # each unit adds its teacher group, then its picked problem's solutions
  for u in range(method.cfg.units_per_step):
    picked = [c for c in cands if c.unit == u and c.solutions and id(c.solutions[0]) in trained]
    per_row_unit += [u] * (method.cfg.group_size + sum(len(c.solutions) for c in picked))
  assert len(per_row_unit) == len(trajs) and len(set(per_row_unit)) > 1
  sums = {u: tokens[np.asarray(per_row_unit) == u].sum() for u in set(per_row_unit)}
  want = np.asarray(advs) * np.asarray([tokens.sum() / len(sums) / sums[u]
                                        for u in per_row_unit])
  chex.assert_trees_all_close(np.asarray(advs_u), want, rtol=1e-6)
  assert not np.allclose(advs_u, advs)


def test_scripted_step_runs_every_phase(stepped):
  rt, method, m, seen, before = stepped
  o = rt.config.opensir
  assert m["teacher/problems"] == o.units_per_step * o.groups_per_unit * o.group_size
  assert 0 < m["teacher/legal_rate"] < 1  # a fifth of the problems lack concepts
  assert m["student/rated_problems"] > 0 and m["student/valid_answer_rate"] == 1.0
  assert m["student/format"] == 1.0 and m["teacher/solv/max"] > 0
  assert m["train/teacher_rows"] == o.units_per_step * o.group_size
  assert m["train/student_rows"] == o.units_per_step * o.num_solutions
  assert m["pool/size"] == 1 + round(m["teacher/legal_rate"] * m["teacher/problems"])
  assert m["pool/distinct_concepts"] == 1  # 'integer addition'
  chex.assert_tree_all_finite((m["train/loss"], m["train/kl"]))
  with pytest.raises(AssertionError):  # the policy trained
    chex.assert_trees_all_close(before, np.asarray(method.rt.policies["policy"].state.params["embed"]),
                                rtol=1e-5, atol=1e-8)
  assert len(seen["trajs"]) == len(seen["advs"]) == m["train/teacher_rows"] + m["train/student_rows"]


def test_teacher_rows_have_concepts_masked_and_group_advantages(stepped):
  rt, method, m, seen, _ = stepped
  o = rt.config.opensir
  decode = lambda ids: rt.tokenizer.decode(list(ids), skip_special_tokens=False)
  teacher = seen["trajs"][:o.group_size]
  for t in teacher:
    trained = decode(t.tokens[t.loss_mask.astype(bool)])
    assert "<concepts>" not in trained and "integer addition" not in trained
    assert "<problem>" in trained
  # Per unit: g teacher rows, then n student rows; each group z-scored on its own with the
  # unbiased std (and eps 1e-4).
  sizes = [o.group_size, o.num_solutions] * o.units_per_step
  starts = np.cumsum([0] + sizes)
  for start, size in zip(starts, sizes):
    a = np.asarray(seen["advs"][start:start + size], np.float64)
    np.testing.assert_allclose(a.mean(), 0.0, rtol=0, atol=1e-5)
    if np.any(a != 0):
      np.testing.assert_allclose(a.std(ddof=1), 1.0, rtol=0, atol=1e-3)


def test_pool_and_rng_round_trip_exactly_through_a_checkpoint(stepped, tmp_path):
  """The pool's embeddings are stored as a float32 array in the orbax checkpoint, not as JSON
  (base64 JSON made a paper run's checkpoints grow by about 440 MB each)."""
  rt, method, _, _, _ = stepped
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt", async_save=False)
  ckpt.save(0, {"x": jnp.zeros(2)}, method.host_state())
  ckpt.wait()
  _, _, state = ckpt.restore_latest({"x": jnp.zeros(2)})
  ckpt.close()
  host_json = next((tmp_path / "ckpt" / "0" / "host").glob("*")).read_text()
  assert '"embeddings"' not in host_json and len(host_json) < 20_000  # shape and dtype only
  fresh = opensir.OpenSir.__new__(opensir.OpenSir)
  fresh.cfg, fresh.encoder, fresh.rng = method.cfg, method.encoder, np.random.default_rng(123)
  fresh.load_host_state(state)
  assert fresh.pool.problems == method.pool.problems
  assert fresh.pool.concepts == method.pool.concepts
  assert len(method.pool) > 1
  chex.assert_trees_all_equal(fresh.pool.embeddings, method.pool.embeddings)
  assert fresh.rng.bit_generator.state == method.rng.bit_generator.state
  # A checkpoint of the earlier format (embeddings as base64 float32 bytes) still restores.
  old = dict(json.loads(json.dumps(method.host_state(), default=lambda a: None)))
  old["pool"]["embeddings"] = base64.b64encode(method.pool.embeddings.astype("<f4").tobytes()).decode()
  del old["pool_embeddings"]
  fresh.load_host_state(old)
  chex.assert_trees_all_equal(fresh.pool.embeddings, method.pool.embeddings)


def _run(workdir, steps, wait=True):
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/opensir.py",
         f"--workdir={workdir}", f"--config.total_steps={steps}"]
  env = dict(os.environ, PYTHONPATH=ROOT)
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=900)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


@pytest.mark.slow  # minutes on a 2-core CPU; SPELL's (the README's command) runs by default
def test_cli_default_demo_runs_every_phase_on_the_models_own_output(tmp_path):
  """The README's OpenSIR command: the bundled demo model writes legal problems, its students
  answer them in the boxed sentence, and both roles train."""
  out = _run(tmp_path / "run", 2)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "Using the bundled warmed-up demo model" in out.stderr
  records = metrics_lib.read_jsonl(tmp_path / "run" / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1]
  total = lambda key: sum(r.get(key, 0) for r in records)
  assert total("teacher/legal_rate") > 0 and total("student/rated_problems") > 0
  assert total("student/format") > 0 and total("train/student_rows") > 0
  assert total("train/teacher_rows") > 0 and all("train/loss" in r for r in records)
  assert records[-1]["pool/size"] > 1
  samples = (tmp_path / "run" / "samples.log").read_text()
  assert "solve rate" in samples and "concepts" in samples
  assert list((tmp_path / "run" / "tb").iterdir())
  assert (tmp_path / "run" / "checkpoints" / "1").exists()


@pytest.mark.slow
def test_sigkill_and_resume_reach_the_same_pool(tmp_path):
  full = _run(tmp_path / "full", 3)
  assert full.returncode == 0, full.stderr[-2000:]
  proc = _run(tmp_path / "cut", 3, wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / "0", timeout=600)
  resumed = _run(tmp_path / "cut", 3)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  keep = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "mathcheck/"))
                    and "per_s" not in k}
  for step in (1, 2):
    assert keep(a[step]) == keep(b[step]), step


def test_starting_pool_rules_by_hand():
  from scope_jax.methods.opensir import bootstrap
  ok = "A train travels 60 km in 1.5 hours. What is its speed?"
  band = (0.5, 0.9)
  assert bootstrap.rejection(ok, "40", 0.75, band, 30) is None
  assert bootstrap.rejection(ok, "40", 1.0, band, 30) == "solve_rate"  # too easy
  assert bootstrap.rejection(ok, "40", 0.25, band, 30) == "solve_rate"
  assert bootstrap.rejection(ok, "x", 0.75, band, 30) == "no_digit"
  assert bootstrap.rejection("What is 2+2?", "4", 0.75, band, 30) == "short"
  assert bootstrap.rejection(ok + " <think>", "40", 0.75, band, 30) == "xml"
  assert bootstrap.rejection(ok, "60", 0.75, band, 30) == "answer_in_problem"
  assert bootstrap.rejection(ok, None, None, band, 30) == "no_answer"


def test_starting_pool_from_a_file_and_its_errors(tmp_path):
  from scope_jax.methods.opensir import bootstrap
  f = tmp_path / "pool.jsonl"
  f.write_text('{"problem": "What is 3 + 4?", "concepts": ["integer addition"]}\n\n'
               '{"question": "Solve 2x = 6.", "concepts": "linear equations, division"}\n')
  got = bootstrap.load(str(f))
  assert [p.text for p in got] == ["What is 3 + 4?", "Solve 2x = 6."]
  assert got[1].concepts == ("linear equations", "division")
  f.write_text('{"answer": 3}\n')
  with pytest.raises(ValueError, match="pool.jsonl:1: each line needs"):
    bootstrap.load(str(f))
  c = small_config(**{"opensir.initial_pool.file": str(tmp_path / "missing.jsonl")})
  with pytest.raises(ValueError, match="initial_pool.file=.*no such file"):
    runner.validate(c)


def test_a_starting_pool_of_the_worlds_gold_questions_is_refused(tmp_path):
  """The world's own gold file (written by a run's evaluation, or a copy of it) as the problems
  OpenSIR trains on would score the run on what it trained on: refused in validation."""
  from scope_jax.world import World
  World(3).write(str(tmp_path / "world"))
  gold = tmp_path / "world" / "gold" / "arith.jsonl"
  c = small_config(**{"opensir.initial_pool.file": str(gold), "world.seed": 3})
  with pytest.raises(ValueError, match=r"holds 400 held-out gold questions of world 3 "
                                       r"\(world:arith\)"):
    runner.validate(c)
  c.world.seed = 4  # another world's gold problems are only problems to this one
  runner.validate(c)


def test_starting_pool_is_generated_rated_and_replaces_the_seed(tmp_path):
  """The released bootstrap: the policy writes problems from the pool so far, its students rate
  them, and those within the solve-rate band make the pool training starts from."""
  c = small_config(**{"opensir.initial_pool.size": 3, "opensir.initial_pool.candidates": 8,
                      "opensir.initial_pool.min_chars": 10, "opensir.num_solutions": 4})
  rt = runtime.Runtime(c, str(tmp_path))
  method = opensir.OpenSir(rt)
  play_all_roles(rt, ScriptedOpenSirSampler(rt.tokenizer))
  rt.begin_step(0)
  m = method.start_pool()
  assert len(method.pool) == 3 and c.opensir.seed_problem not in method.pool.problems
  assert all(re.fullmatch(r"What is \d+ \+ \d+\?", p) for p in method.pool.problems)
  assert method.pool.embeddings.shape == (3, method.encoder.dim)
  assert m["pool/initial_size"] == 3 and m["pool/bootstrap/candidates"] >= 8
  assert m["pool/bootstrap/illegal"] > 0  # a fifth of the scripted problems lack concepts
  assert method.host_state()["started"] is True


def test_held_out_problems_are_asked_in_the_students_prompt(tmp_path):
  """eval.prompt='role': a held-out math problem is asked exactly as the student is asked in
  training; any other question type is not (the student only ever solves problems)."""
  from scope_jax.core import evals
  c = small_config(**{"eval.every": 1, "eval.benchmarks": "world:arith", "eval.prompt": "role",
                      "eval.limit": 2})
  runner.validate(c)
  rt = runtime.Runtime(c, str(tmp_path))
  method = opensir.OpenSir(rt)
  ev = evals.Evaluations(rt, method)
  problem = "Jound Kribeas shares 52 coins equally among 4 friends. How many coins each?"
  ask = ev.evaluators[ev.benches[0].name].role_prompt
  assert ask("math", problem) == method.student_prompt(problem)
  assert ask("qa", problem) is None


def test_learn_preset_demonstrates_other_worlds_problems(tmp_path):
  """The `learn` preset warms both roles on other worlds' word problems (never the run's world,
  never a gold one): the teacher writes a problem of another template, the student guesses in
  `opensir.warmup.guess_share` of them (never right), else works one out, opened one of
  `opensir.warmup.worked_ways` ways, and boxes a result that is right in
  `opensir.warmup.right_share` of those
  and off by 1–10 otherwise; held-out `world:arith` problems are scored in the student's prompt
  from step 0."""
  from scope_jax.methods.opensir import demos as opensir_demos
  from scope_jax.world import World
  c = opensir_config.get_config("learn")
  assert (c.eval.benchmarks, c.eval.limit, c.eval.every, c.eval.prompt) == (
      "world:arith", 300, 10, "role")
  assert c.warmup.world_seed == 1000 and c.warmup.worlds == 4
  w = c.opensir.warmup
  assert (w.right_share, w.guess_share, w.worked_ways) == (0.9, 0.0, 1)
  g = opensir_config.get_config("learn_planted_guess").opensir.warmup
  assert (g.right_share, g.guess_share, g.worked_ways) == (0.9, 0.4, 4)
  c.opensir.warmup.guess_share, c.opensir.warmup.worked_ways = 0.4, 4  # the demonstrations below
  assert c.opensir.initial_pool.file == "world" and c.total_steps == 50
  assert c.model.source == f"hf:{COUNTER_MODEL}"
  runner.validate(c)
  c.model.source, c.model.tokenizer = "tiny", "demo"  # prompts and demonstrations only
  c.warmup.worlds, c.warmup.documents = 2, 200
  rt = runtime.Runtime(c, str(tmp_path))
  method = opensir.OpenSir(rt)
  demos = opensir_demos.demonstrations(method, np.random.default_rng(0))
  text = [rt.tokenizer.decode(list(d.tokens)) for d in demos]
  assert len(text) == 400
  worked = {q["question"]: q for s in (1000, 1001)
            for q in World(s).training_problems(200, worked=True)}
  gold = {q["question"] for q in World(0).gold["arith"]}
  right = guesses = 0
  openings = collections.Counter()
  for taught, solved in zip(text[::2], text[1::2]):
    problem = re.findall(r"<problem>(.*?)</problem>", taught)[-1]  # the reply's, not the prompt's
    assert problem in worked and problem not in gold
    reference = taught.split("You are given a math problem: ")[1].split("\n\nYour task")[0]
    if reference != opensir.SEED_PROBLEM:
      assert worked[reference]["form"] != worked[problem]["form"]
    asked = next(q for q in worked if q in solved)
    boxed = int(re.search(r"\\boxed\{(\d+)\}", solved).group(1))
    sums = re.findall(r"(\d+) [-+*/] (\d+) = (\d+)", solved)
    off = boxed - int(worked[asked]["gold"][0])
    if not sums:  # a guess, never right
      assert off != 0
      guesses += 1
      continue
    assert off == 0 or 1 <= abs(off) <= 10
    assert int(sums[-1][2]) == boxed  # the boxed answer is the last sum's result
    right += off == 0
    reply = solved[len(rt.tokenizer.decode(method.student_prompt(asked))):]
    openings[reply[:reply.index(f"{sums[0][0]} ")]] += 1
  assert 60 <= guesses <= 100  # about 40% of 200
  assert set(openings) == set(opensir_demos.OPENINGS)
  assert max(openings.values()) < guesses  # each way is rarer than the guess
  assert 0.8 <= right / (200 - guesses) <= 0.97  # about 90% of the worked ones


def test_the_learn_preset_starts_from_a_shipped_model():
  """The solver model and the counter model (the solver model fitted further; the `learn`
  preset's start) ship with the package (a few MB each) and have the demo model's shape, so the
  `learn` preset's warm-up and the demo tokenizer fit them."""
  from scope_jax.data import DEMO_MODEL
  from scope_jax.models import hf_io
  demo, demo_params = hf_io.load_hf(DEMO_MODEL)
  for path in (SOLVER_MODEL, COUNTER_MODEL):
    assert (path / "model.safetensors").stat().st_size < 8 * 2**20
    solver, params = hf_io.load_hf(path)
    assert solver == demo
    chex.assert_trees_all_equal_shapes(params, demo_params)


def test_the_arithmetic_probe_asks_in_the_students_own_prompt(tmp_path):
  """`tools/world_reading.py --skill=arith --format=opensir` (how the learn preset's start is
  measured) asks a problem with the student's exact prompt tokens and targets the warm-up's
  worked solution, whose boxed answer the student's parser reads as the gold one."""
  from tools import world_reading
  from scope_jax.methods.opensir import demos as opensir_demos
  from scope_jax.world import World
  c = small_config()
  c.model.source, c.model.tokenizer = "tiny", "demo"
  rt = runtime.Runtime(c, str(tmp_path))
  method = opensir.OpenSir(rt)
  world = World(1000)
  q = world_reading.questions(world, "arith", 3, 1000)[2]
  demo, = world_reading.examples(rt.tokenizer, world, [q], "arith", "opensir")
  prompt = method.student_prompt(q["question"])
  assert list(demo.tokens[:len(prompt)]) == prompt
  target = rt.tokenizer.decode(list(demo.tokens[len(prompt):]), skip_special_tokens=False)
  assert target == opensir_demos.student_text(q["steps"], q["gold"][0]) + "<|im_end|>"
  assert method.checker.final(target) == q["gold"][0]
  held = world_reading.questions(World(0), "arith", 5, 1, held_out=True)
  assert [h["question"] for h in held] == [g["question"] for g in World(0).gold["arith"][:5]]


def test_the_arithmetic_probes_vote_by_hand(monkeypatch):
  """`tools/world_reading.py --vote=K`: greedy and sampled pass@1, maj@K and the majority's
  accuracy by agreement, from canned solutions (two problems, gold 7 and 12, K = 4)."""
  from types import SimpleNamespace
  from tools import world_reading
  from scope_jax.tokenizer import load_tokenizer
  boxed = lambda a: SimpleNamespace(text=f"x. Therefore, the final answer is: $\\boxed{{{a}}}$")
  canned = {False: [boxed(7), boxed(3)],  # greedy: right, wrong
            True: [boxed(a) for a in (7, 7, 7, 1)] + [boxed(a) for a in (12, 5, 5, 9)]}
  temperatures = []
  def generate(*a, num_samples=1, **kw):
    temperatures.append(kw.get("temperature"))
    return canned[num_samples > 1]
  monkeypatch.setattr(world_reading.sampling, "generate", generate)
  qs = [{"question": "A has 2 and 5 more. How many?", "gold": ["7"], "steps": ""},
        {"question": "B has 3 and 9 more. How many?", "gold": ["12"], "steps": ""}]
  got = world_reading.vote(None, None, load_tokenizer("demo"), qs, 4, temperature=0.7)
  assert temperatures == [None, 0.7]  # greedy, then the K samples at the vote's temperature
  chex.assert_trees_all_close(
      got, {"greedy": 0.5, "sampled": 4 / 8, "maj@4": 0.5,  # 7 (3 of 4) right; 5 (2 of 4) wrong
            "agree 0.00-0.50: n": 0, "agree 0.00-0.50: right": 0.0,
            "agree 0.50-0.75: n": 1, "agree 0.50-0.75: right": 0.0,
            "agree 0.75-1.00: n": 1, "agree 0.75-1.00: right": 1.0})


def test_a_guessing_student_is_demonstrated_guessing_and_working_several_ways():
  """With `opensir.warmup.guess_share`, that share of the student's demonstrations box a guess with
  no sums, a wrong number drawn uniformly; the rest work the sums out, opened one of
  `opensir.warmup.worked_ways` ways, so the guess is the commonest opening (the greedy choice)
  while most samples work the problem out. With no guessing share the demonstrations are drawn
  as before, number for number."""
  from scope_jax.methods.opensir import demos as opensir_demos
  from scope_jax.world import World
  problems = World(1000).training_problems(400, worked=True)
  rng = np.random.default_rng(0)
  kinds, guesses = collections.Counter(), set()
  for q in problems:
    text = opensir_demos.student_solution(q, rng, right_share=0.8, guess_share=0.4, ways=4)
    boxed = int(re.search(r"\\boxed\{(\d+)\}", text).group(1))
    off = boxed - int(q["gold"][0])
    if text.startswith("Therefore, the final answer is: "):
      assert "=" not in text and off != 0 and 0 <= boxed < opensir_demos.GUESSES
      kinds["guess"] += 1
      guesses.add(boxed)
    else:
      opening = text[:text.index(q["steps"].split(" = ")[0])]
      assert opening in opensir_demos.OPENINGS, text
      kinds[opening] += 1
      kinds["right"] += off == 0
  assert 140 <= kinds["guess"] <= 180  # about 40% of 400
  assert len(guesses) >= 100  # spread: two guesses seldom agree
  assert len(opensir_demos.OPENINGS) == 4  # the most `opensir.warmup.worked_ways` allows
  worked = [kinds[o] for o in opensir_demos.OPENINGS]
  assert min(worked) >= 40 and max(worked) < kinds["guess"] * 0.6  # ~60 each against ~160
  assert 0.7 <= kinds["right"] / sum(worked) <= 0.9
  # Two ways are the two-way preset's draws, number for number: "First, " below one half.
  def two_ways(q, rng):
    steps, answer = q["steps"], int(q["gold"][0])
    if rng.random() < 0.4:
      guess = answer
      while guess == answer:
        guess = int(rng.integers(opensir_demos.GUESSES))
      return opensir_demos.student_text("", guess).lstrip("\n")
    if not rng.random() < 0.8:
      answer = opensir_demos._off(answer, rng)
      steps = f"{steps.rsplit(' = ', 1)[0]} = {answer}."
    return opensir_demos.student_text(("First, " if rng.random() < 0.5 else "") + steps, answer)
  a, b = np.random.default_rng(2), np.random.default_rng(2)
  for q in problems[:100]:
    assert opensir_demos.student_solution(q, a, 0.8, 0.4, ways=2) == two_ways(q, b)
  # guess_share = 0 keeps the earlier draws: a right last sum 80% of the time, one way of writing
  a, b = np.random.default_rng(1), np.random.default_rng(1)
  for q in problems[:50]:
    text = opensir_demos.student_solution(q, a, right_share=0.8)
    steps, answer = q["steps"], int(q["gold"][0])
    if not b.random() < 0.8:
      offsets = [d for d in range(-10, 11) if d and answer + d >= 0]
      answer += offsets[int(b.integers(len(offsets)))]
      steps = f"{steps.rsplit(' = ', 1)[0]} = {answer}."
    assert text == opensir_demos.student_text(steps, answer)
