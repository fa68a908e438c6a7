"""A demo run on gs:// end to end, against a local fake-gcs-server: it saves its checkpoints to
the bucket, is SIGKILLed and resumed from gs://, is evaluated from gs:// with the results written
back to gs://, and is exported from gs:// to a Hugging Face checkpoint that transformers loads
with the same logits."""

import dataclasses
import json
import os
import subprocess
import sys

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from scope_jax import metrics as metrics_lib
from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax.evaluation import driver
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.evaluation import export as export_lib
from scope_jax.evaluation import models
from scope_jax.models import transformer
from tests.gcs import BUCKET, fake_gcs
from tests.methods.cli import kill_once_exists

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = f"gs://{BUCKET}/runs/spell"


def _main(env, wait=True):
  cmd = [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py", f"--workdir={RUN}",
         "--config.progress=false", "--config.total_steps=2",
         "--config.spell.questions_per_step=2", "--config.spell.group_size=2"]
  kwargs = dict(cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  if not wait:
    return subprocess.Popen(cmd, **kwargs)
  return subprocess.run(cmd, **kwargs, timeout=900)


@pytest.fixture(scope="module")
def gcs_run(tmp_path_factory):
  """The bucket's local root, after a demo run was killed after its first checkpoint and then
  resumed to the end, both on gs://."""
  root = tmp_path_factory.mktemp("gcs") / "root"
  with fake_gcs(root):
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = _main(env, wait=False)
    kill_once_exists(proc, root / BUCKET / "runs/spell/checkpoints/0/commit_success.txt",
                     timeout=600)
    resumed = _main(env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Resuming from checkpoint step 0" in resumed.stderr
    yield root


def test_a_run_on_gcs_checkpoints_and_resumes(gcs_run):
  record = run_record.read(RUN)
  assert record.method == "spell" and record.policies == ("policy",)
  assert run_record.committed_steps(record) == [0, 1]
  records = metrics_lib.read_jsonl(epath.Path(RUN) / "metrics.jsonl")
  assert [r["step"] for r in records] == [0, 1]  # step 1 ran once, after the resume
  assert (gcs_run / BUCKET / "runs/spell/checkpoints/1/commit_success.txt").exists()


def test_evaluate_from_gcs_writes_results_to_gcs(gcs_run, monkeypatch):
  settings = eval_lib.Settings(num_samples=2, temperature=0.7, max_new_tokens=24, max_turns=1,
                               batch_size=4)
  opts = driver.Options(benchmarks="gsm8k,fanoutqa_search", run=RUN, role="responder",
                        step="all", limit=3, progress=False, settings=settings)
  rows = driver.run(opts)
  assert [r["model"] for r in rows] == ["step_0", "step_1"]
  for bench in ("gsm8k", "fanoutqa_search"):
    for step in (0, 1):
      out = epath.Path(RUN) / "eval" / bench / f"step_{step}"
      results = json.loads((out / "results.json").read_text())
      assert results["benchmark"] == bench and results["step"] == step
      assert results["num_examples"] == 3 and results["metrics"]["num_samples"] == 6
      lines = (out / "predictions.jsonl").read_text().splitlines()
      preds = [json.loads(x) for x in lines]
      assert len(preds) == 3 and all(len(p["samples"]) == len(p["scores"]) == 2 for p in preds)
      assert {"id", "question", "gold", "samples", "scores"} <= set(preds[0])
  assert list((epath.Path(RUN) / "eval" / "tb").iterdir())
  # A restarted evaluator finds every step done and evaluates nothing.
  monkeypatch.setattr(eval_lib.Evaluator, "evaluate",
                      lambda *a, **k: pytest.fail("a finished step was evaluated again"))
  again = driver.run(opts)
  assert [r["model"] for r in again] == ["step_0", "step_1"]
  # Results of other settings are never taken for this evaluation's.
  other = dataclasses.replace(opts, settings=dataclasses.replace(settings, max_new_tokens=25))
  with pytest.raises(ValueError, match="holds results of another evaluation .*settings"):
    driver.run(other)


def test_export_from_gcs_loads_in_transformers_with_equal_logits(gcs_run, tmp_path):
  record = run_record.read(RUN)
  mesh = shd.make_mesh((1, -1, 1))
  model = models.load_step(record, 1, "responder", mesh, shd.SAMPLING_RULES, jnp.float32)
  export_lib.export(model, f"{RUN}/export", info={"step": 1})
  local = tmp_path / "hf"
  local.mkdir()
  for f in (epath.Path(RUN) / "export").iterdir():  # what a user copies down from the bucket
    (local / f.name).write_bytes(f.read_bytes())
  tok = transformers.AutoTokenizer.from_pretrained(str(local))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(local), dtype=torch.float32).eval()
  chat = [{"role": "user", "content": "Which river flows through Paris?"}]
  text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
  assert text == model.tokenizer.apply_chat_template(chat, add_generation_prompt=True)
  ids = tok.encode(text, add_special_tokens=False)
  assert ids == model.tokenizer.encode(text)
  with torch.no_grad():
    ref = hf(torch.tensor([ids])).logits.numpy()
  ours = np.asarray(transformer.forward(model.config, model.params, jnp.asarray([ids]))[0])
  chex.assert_trees_all_close(ours, ref, atol=1e-4, rtol=0)


def test_missing_bucket_and_bad_paths_name_the_path(gcs_run):
  with pytest.raises(FileNotFoundError, match="bucket gs://no-such-bucket .*does not exist"):
    run_record.read("gs://no-such-bucket/runs/x")
  with pytest.raises(FileNotFoundError, match=f"No run.json in gs://{BUCKET}/runs/nothing"):
    run_record.read(f"gs://{BUCKET}/runs/nothing")
  with pytest.raises(ValueError, match="no role 'solver'.*policy"):
    driver.Session(driver.Options(benchmarks="gsm8k", run=RUN, role="solver"))
  with pytest.raises(FileNotFoundError, match=f"gs://{BUCKET}/sets/missing.jsonl"):
    driver.Session(driver.Options(benchmarks=f"file:gs://{BUCKET}/sets/missing.jsonl:qa",
                                  run=RUN, role="policy"))


def test_watch_evaluates_each_new_checkpoint_once(gcs_run, monkeypatch):
  """A sidecar on a run in progress: step 0 is committed first, step 1 later; each is evaluated
  once, and the watch ends after the run's last step (total_steps − 1 = 1)."""
  real = run_record.committed_steps
  polls = []

  def committed(record):
    polls.append(1)
    return [s for s in real(record) if s == 0 or len(polls) > 3]

  evaluated = []
  original = eval_lib.Evaluator.evaluate

  def evaluate(self, sampler, bench, desc=""):
    evaluated.append(desc)
    return original(self, sampler, bench, desc=desc)

  monkeypatch.setattr(run_record, "committed_steps", committed)
  monkeypatch.setattr(eval_lib.Evaluator, "evaluate", evaluate)
  settings = eval_lib.Settings(max_new_tokens=8, batch_size=2)
  opts = driver.Options(benchmarks="gsm8k", run=RUN, role="policy", watch=True, poll_seconds=0.05,
                        limit=2, out=f"gs://{BUCKET}/watch", progress=False, settings=settings)
  rows = driver.run(opts)
  assert evaluated == ["gsm8k step_0", "gsm8k step_1"] and len(polls) >= 4
  assert [r["model"] for r in rows] == ["step_0", "step_1"]
  # --overwrite evaluates each step again, once, and the watch still ends.
  evaluated.clear()
  driver.run(dataclasses.replace(opts, overwrite=True))
  assert evaluated == ["gsm8k step_0", "gsm8k step_1"]
  # A watch that sees no new checkpoint gives up after watch_timeout.
  monkeypatch.setattr(run_record, "committed_steps", lambda record: [0])
  evaluated.clear()
  driver.run(dataclasses.replace(opts, out=f"gs://{BUCKET}/watch2", watch_timeout=0.3))
  assert evaluated == ["gsm8k step_0"]
