"""The evaluator end to end: metrics through the real scorers (hand-computed pass@k and maj@k),
the judge, greedy predictions equal to transformers' `generate`, and the CLI's errors."""

import dataclasses
import json
import os
import subprocess
import sys

import chex
import jax.numpy as jnp
import pytest

from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import driver
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.evaluation import export as export_lib
from scope_jax.evaluation import models
from tests.rollout.fakes import ScriptedSampler

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# n = 5 samples, c = 2 correct (the 2nd and 3rd), answers in the order 7, 12, 12, 5, 7:
#   pass@1 = 2/5 = 0.4; pass@2 = 1 − C(3,2)/C(5,2) = 1 − 3/10 = 0.7; pass@4 = pass@5 = 1 (n − c < k)
#   maj@1: {7} → 7, wrong → 0;   maj@2: {7, 12} tie → the first, 7 → 0
#   maj@4: {7, 12, 12, 5} → 12 → 1;   maj@5: 7 ×2, 12 ×2 tie → the first, 7 → 0
EXPECTED = {"pass@1": 0.4, "pass@2": 0.7, "pass@4": 1.0, "pass@5": 1.0,
            "maj@1": 0.0, "maj@2": 0.0, "maj@4": 1.0, "maj@5": 0.0}


def _metrics(bench, texts, **kwargs):
  tok = tok_lib.ByteTokenizer()
  ev = eval_lib.Evaluator(tok, eval_lib.Settings(num_samples=len(texts), temperature=1.0),
                          progress=False, **kwargs)
  metrics, records = ev.evaluate(ScriptedSampler([[t] for t in texts], tok), bench)
  return metrics, records


def test_pass_and_maj_at_k_through_the_math_scorer():
  bench = bench_lib.Benchmark("m", "math", (bench_lib.Example("0", "What is 5 + 7?", ("12",)),))
  texts = ["So \\boxed{7}", "\\boxed{12}", "It is \\boxed{12.0}", "\\boxed{5}", "\\boxed{7}"]
  metrics, records = _metrics(bench, texts)
  chex.assert_trees_all_close({k: metrics[k] for k in EXPECTED}, EXPECTED)
  assert metrics["mean@n/acc"] == pytest.approx(0.4)
  assert records[0]["scores"] == [0.0, 1.0, 1.0, 0.0, 0.0]


def test_math_answers_in_words_and_powers_and_what_was_not_checked():
  """Golds the old screen rejected (every prediction, the gold itself included, scored 0) score
  right; an answer too large to check scores 0 and is counted, never silently."""
  bench = bench_lib.Benchmark("m", "math", (
      bench_lib.Example("0", "Parity of 4?", ("\\text{even}",)),
      bench_lib.Example("1", "Expand.", ("x^4+x^3+x^2+x+1",))))
  texts = ["\\boxed{Even}", "\\boxed{9^{9^{9}}}", "\\boxed{9^{9^{9}}}", "\\boxed{1+x+x^2+x^3+x^4}"]
  tok = tok_lib.ByteTokenizer()
  ev = eval_lib.Evaluator(tok, eval_lib.Settings(num_samples=2, temperature=1.0), progress=False)
  metrics, records = ev.evaluate(ScriptedSampler([[t] for t in texts], tok), bench)
  assert [r["scores"] for r in records] == [[1.0, 0.0], [0.0, 1.0]]
  assert metrics["math/unchecked"] == 2.0  # each sample counts, the repeated one too


def test_pass_and_maj_at_k_through_the_qa_scorer():
  bench = bench_lib.Benchmark("q", "qa", (bench_lib.Example("0", "Capital of France?",
                                                            ("Paris", "Paris, France")),))
  texts = ["<answer>London</answer>", "<answer>Paris</answer>", "I think <answer>paris.</answer>",
           "<answer>Rome</answer>", "<answer> london </answer>"]
  metrics, records = _metrics(bench, texts)
  chex.assert_trees_all_close({k: metrics[k] for k in EXPECTED}, EXPECTED)
  assert metrics["mean@n/em"] == pytest.approx(0.4)
  assert records[0]["answers"][2] == "paris."


@pytest.mark.parametrize("style,verdicts,expected", [
    ("answer_match", ["Decision: [[YES]]", "Decision: [[NO]]"], [1.0, 0.0]),
    ("criterion_grade", ["<think>.</think><score>0</score>", "<score>1</score>"], [0.0, 1.0]),
])
def test_the_judge_scores_each_sample(style, verdicts, expected):
  bench = bench_lib.Benchmark("j", "judge", (bench_lib.Example("0", "Why is the sky blue?",
                                                               ("Rayleigh scattering",)),))
  tok = tok_lib.ByteTokenizer()
  judge = ScriptedSampler([[v] for v in verdicts], tok)
  ev = eval_lib.Evaluator(tok, eval_lib.Settings(num_samples=2, temperature=1.0,
                                                 judge_style=style), judge=judge, progress=False)
  answers = ScriptedSampler([["<answer>scattering</answer>"], ["<answer>the sea</answer>"]], tok)
  metrics, records = ev.evaluate(answers, bench)
  assert records[0]["scores"] == expected
  assert metrics["mean@n/acc"] == 0.5 and metrics["judge/invalid"] == 0.0


def test_an_unknown_judge_style_names_the_formats():
  with pytest.raises(ValueError, match="choose one of \\('answer_match', 'criterion_grade'\\)"):
    eval_lib.Settings(judge_style="verifier").validate()


@pytest.fixture(scope="module")
def demo_hf(tmp_path_factory):
  """The bundled demo model exported as a HF checkpoint (weights, tokenizer, generation config)."""
  out = tmp_path_factory.mktemp("demo_hf")
  model = models.load_spec("demo", shd.make_mesh((1, -1, 1)), shd.SAMPLING_RULES, jnp.float32)
  export_lib.export(model, out)
  return out


def _assert_greedy_equals_generate(hf_dir, out, benchmarks, limit, max_new_tokens, batch_size=4):
  """Evaluates `hf:<hf_dir>` greedily, then checks every sample against HF's greedy
  `generate` on the same prompt ids: equal token for token (as text, special tokens kept), up
  to our stop string `</answer>` when the rollout stopped there. Returns how many stopped."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  settings = eval_lib.Settings(max_new_tokens=max_new_tokens, batch_size=batch_size)
  opts = driver.Options(benchmarks=",".join(b for b, _ in benchmarks), model=f"hf:{hf_dir}",
                        out=str(out), limit=limit, progress=False, settings=settings)
  driver.run(opts)
  tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
  ev = eval_lib.Evaluator(tok, settings, progress=False)
  stopped = 0
  for bench, kind in benchmarks:
    lines = (out / bench / "base" / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == limit
    for rec in map(json.loads, lines):
      ids = ev.prompt(ev.template(kind), question=rec["question"])
      with torch.no_grad():
        gen = hf.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                          attention_mask=torch.ones(1, len(ids), dtype=torch.long))
      ref = tok.decode(gen[0, len(ids):].tolist(), skip_special_tokens=False)
      ours = rec["samples"][0]
      if ours.endswith("</answer>") and ours != ref:  # our rollout stops at the final tag
        assert ref.startswith(ours) and "</answer>" not in ref[:len(ours) - len("</answer>")]
        stopped += 1
      else:
        assert ours == ref, (rec["id"], ours, ref)
  return stopped


def test_greedy_predictions_equal_transformers_generate(demo_hf, tmp_path):
  """Base-model evaluation of a HF checkpoint (the bundled demo model, exported) on real
  questions: 6 FanOutQA sub-questions and 6 GSM8K problems, 40 new tokens each."""
  _assert_greedy_equals_generate(demo_hf, tmp_path, [("fanoutqa", "qa"), ("gsm8k", "math")],
                                 limit=6, max_new_tokens=40)
  results = json.loads((tmp_path / "gsm8k" / "base" / "results.json").read_text())
  assert results["num_examples"] == 6 and results["step"] is None


@pytest.mark.slow
def test_greedy_predictions_of_the_real_gguf_model_equal_transformers_generate(tmp_path):
  """The same on the real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantised and exported to
  HF): the first 5 GSM8K problems, 96 new tokens each, and 5 FanOutQA sub-questions."""
  model = models.load_spec("gguf:qwen2.5-0.5b-gguf", shd.make_mesh((1, -1, 1)),
                           shd.SAMPLING_RULES, jnp.float32)
  export_lib.export(model, tmp_path / "hf")
  del model
  _assert_greedy_equals_generate(tmp_path / "hf", tmp_path / "out",
                                 [("gsm8k", "math"), ("fanoutqa", "qa")], limit=5,
                                 max_new_tokens=96, batch_size=5)


def _cli(*args):
  return subprocess.run([sys.executable, "-m", "scope_jax.evaluate", *args], cwd=ROOT, text=True,
                        capture_output=True, env=dict(os.environ, PYTHONPATH=ROOT), timeout=300)


def test_cli_errors_are_one_line_and_name_the_path(tmp_path):
  out = _cli(f"--run={tmp_path}/nowhere", "--role=policy", "--benchmarks=gsm8k")
  assert out.returncode == 2 and f"No run.json in {tmp_path}/nowhere" in out.stderr
  assert "Traceback" not in out.stderr
  out = _cli("--model=demo", f"--out={tmp_path}", "--benchmarks=file:/no/such.jsonl:qa")
  assert out.returncode == 2 and "/no/such.jsonl" in out.stderr
  out = _cli("--model=demo", f"--out={tmp_path}", "--benchmarks=gsm8k,mmlu")
  assert out.returncode == 2 and "mmlu" in out.stderr and "fanoutqa_search" in out.stderr


def test_export_cli_writes_a_loadable_checkpoint_and_names_mistakes(tmp_path):
  run = lambda *a: subprocess.run([sys.executable, "-m", "scope_jax.export", *a], cwd=ROOT,
                                  text=True, capture_output=True, timeout=300,
                                  env=dict(os.environ, PYTHONPATH=ROOT))
  out = run("--model=demo", f"--out={tmp_path}/hf", "--dtype=bfloat16")
  assert out.returncode == 0, out.stderr[-2000:]
  names = {p.name for p in (tmp_path / "hf").iterdir()}
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json"} <= names
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert config["torch_dtype"] == "bfloat16" and config["model_type"] == "qwen2"
  out = run(f"--run={tmp_path}", f"--out={tmp_path}/x")
  assert out.returncode == 2 and "--run needs --role" in out.stderr
  out = run("--model=demo")
  assert out.returncode == 2 and "--out is required" in out.stderr


def _tiny_set(path, n=3):
  path.write_text("".join(json.dumps({"question": f"Question {i}?", "gold": "a"}) + "\n"
                          for i in range(n)))
  return path


def test_results_of_fewer_examples_or_other_settings_are_never_reused(tmp_path):
  """A finished base model (or step) is recognised by its model, settings and number of
  examples, on every benchmark: a --limit smoke test never stands in for the full set, and a
  benchmark whose results came from other settings is an error even after a missing one."""
  first, second = _tiny_set(tmp_path / "first.jsonl"), _tiny_set(tmp_path / "second.jsonl")
  settings = eval_lib.Settings(max_new_tokens=4, batch_size=4)
  opts = driver.Options(benchmarks=f"file:{first}:qa", model="demo", out=str(tmp_path / "out"),
                        limit=2, progress=False, settings=settings)
  driver.run(opts)
  with pytest.raises(ValueError,
                     match="another evaluation \\(its examples_sha256, num_examples differ"):
    driver.run(dataclasses.replace(opts, limit=None))
  other = dataclasses.replace(opts, benchmarks=f"file:{second}:qa,file:{first}:qa",
                              settings=dataclasses.replace(settings, max_new_tokens=5))
  with pytest.raises(ValueError, match=f"{tmp_path}/out/first/base/results.json holds results "
                                       "of another evaluation \\(its settings differ"):
    driver.run(other)
  assert not (tmp_path / "out" / "second").exists()  # checked before anything is evaluated


def test_results_of_another_benchmark_file_or_type_are_never_reused(tmp_path):
  """A changed file under the same name, or the same file as another type, is another
  evaluation: its results are an error, never skipped as done."""
  data = _tiny_set(tmp_path / "set.jsonl")
  opts = driver.Options(benchmarks=f"file:{data}:qa", model="demo", out=str(tmp_path / "out"),
                        progress=False, settings=eval_lib.Settings(max_new_tokens=4, batch_size=4))
  driver.run(opts)
  driver.run(opts)  # the same evaluation again: done, skipped
  data.write_text(data.read_text().replace("Question 1?", "Question one?"))
  with pytest.raises(ValueError, match="another evaluation \\(its examples_sha256 differ"):
    driver.run(opts)
  with pytest.raises(ValueError, match="another evaluation \\(its type"):
    driver.run(dataclasses.replace(opts, benchmarks=f"file:{data}:math"))


def test_the_identity_names_the_run_judge_and_retrieval():
  """Evaluating another run into the same --out is another evaluation (it once printed the
  first run's numbers as the second's), and so is another judge or retrieval setting."""
  def identity(bench, **opts):
    session = driver.Session.__new__(driver.Session)
    session.opts = driver.Options(benchmarks="x", **{"out": "/o", **opts})
    session.settings, session.policy = eval_lib.Settings(), "policy"
    return session.identity("step_1", bench)

  qa = bench_lib.Benchmark("b", "qa_search", (bench_lib.Example("0", "Q?", ("a",)),))
  judged = bench_lib.Benchmark("b", "judge", qa.examples)
  assert identity(qa, run="/runs/spell") != identity(qa, run="/runs/opensir")
  assert identity(qa, run="/r", topk=3) != identity(qa, run="/r", topk=5)
  assert identity(judged, run="/r", judge="gguf:a") != identity(judged, run="/r", judge="gguf:b")
  assert identity(qa, run="/r") != identity(judged, run="/r")
  assert identity(qa, run="/r") == identity(qa, run="/r")


def test_the_table_shows_the_largest_chosen_k(tmp_path):
  bench = _tiny_set(tmp_path / "tiny.jsonl")
  opts = driver.Options(benchmarks=f"file:{bench}:qa", model="demo", progress=False,
                        settings=eval_lib.Settings(num_samples=4, temperature=1.0, ks=(1, 3)))
  session = driver.Session(opts)
  rows = [{"model": "base", "tiny": {"mean@n/em": 0.5, "pass@1": 0.5, "maj@1": 0.25,
                                      "pass@3": 0.75, "maj@3": 0.5}}]
  head, line = driver.format_table(rows, session).splitlines()
  assert head.split("  ")[1:] == ["tiny mean@n/em", "tiny pass@3", "tiny maj@3"]
  assert line.split() == ["base", "0.500", "0.750", "0.500"]


def test_model_and_judge_specs_are_checked_before_any_model_loads(tmp_path):
  bench = _tiny_set(tmp_path / "tiny.jsonl")
  session = lambda **kw: driver.Session(driver.Options(benchmarks=f"file:{bench}:judge", **kw))
  with pytest.raises(ValueError, match="Unknown model spec 'bogus'"):
    session(model="bogus")
  with pytest.raises(FileNotFoundError, match=f"No config.json in {tmp_path}/nothing"):
    session(model=f"hf:{tmp_path}/nothing")
  with pytest.raises(FileNotFoundError, match=f"No config.json in {tmp_path}/judge"):
    session(model="demo", judge=f"hf:{tmp_path}/judge")
  with pytest.raises(ValueError, match="no tokenizer; pass --tokenizer"):
    session(model="preset:qwen2.5-0.5b")
