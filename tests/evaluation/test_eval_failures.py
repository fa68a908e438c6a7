"""The evaluator refuses what it cannot do before it starts, in one line, and survives what a
real run leaves behind: a corrupt step, a results file cut short, a checkpoint of another model."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import ml_collections
import pytest

from scope_jax import checkpoint as ckpt_lib
from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import driver
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.evaluation import models
from scope_jax.models import tiny_config, transformer
from scope_jax import tokenizer as tok_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETTINGS = eval_lib.Settings(max_new_tokens=4, batch_size=4, max_context=256,
                             max_prompt_tokens=128)


MODEL = dataclasses.replace(tiny_config(), vocab_size=2048)  # the demo tokenizer's vocabulary


def _run(path, steps=(0, 1), model_config=MODEL, tokenizer="demo"):
  """A run on disk without training: run.json (describing MODEL) and committed checkpoints of
  `model_config`'s params for one policy."""
  config = ml_collections.ConfigDict(dict(
      method="spell", total_steps=max(steps) + 1, seed=0, mesh=dict(shape=(1, -1, 1)),
      rollout=dict(max_context=256, max_prompt_tokens=128), spell=dict(),
      model=dict(param_dtype="float32")))
  config.mesh.rules = dict(train=shd.rules_to_config(shd.TRAIN_RULES),
                           sampling=shd.rules_to_config(shd.SAMPLING_RULES))
  record = {"version": 1, "method": "spell", "preset": "demo",
            "model": MODEL.to_hf_config("float32"), "policies": ["policy"],
            "roles": {"questioner": "policy"}, "tokenizer": tokenizer, "config": config.to_dict()}
  path.mkdir(parents=True, exist_ok=True)
  (path / "run.json").write_text(json.dumps(record))
  saver = ckpt_lib.Checkpointer(path / "checkpoints", async_save=False)
  for step in steps:
    params = transformer.init_params(model_config, jax.random.key(step))
    saver.save(step, {"policy": {"params": params}}, {"step": step})
  return path


def _data(tmp_path):
  path = tmp_path / "set.jsonl"
  path.write_text("".join(json.dumps({"question": f"Q{i}?", "gold": "a"}) + "\n" for i in range(2)))
  return path


def _opts(tmp_path, **kw):
  return driver.Options(**{"benchmarks": f"file:{_data(tmp_path)}:qa", "run": str(tmp_path / "run"),
                           "role": "questioner", "step": "all", "out": str(tmp_path / "out"),
                           "progress": False, "settings": SETTINGS, **kw})


def _corrupt(run, step):
  """Truncates every array file of `step` (what a crash mid-copy leaves)."""
  for f in (run / "checkpoints" / str(step) / "state").rglob("*"):
    if f.is_file() and f.name not in ("_METADATA", "_CHECKPOINT_METADATA", "manifest.ocdbt"):
      f.write_bytes(f.read_bytes()[:7])


def test_a_corrupt_step_is_named_up_front_and_skipped_under_watch(tmp_path):
  run = _run(tmp_path / "run")
  for f in (run / "checkpoints" / "1" / "state").rglob("*"):
    if f.is_file():
      f.write_bytes(b"{garbage")
  with pytest.raises(run_record.UnreadableCheckpoint, match="Checkpoint step 1 of .* cannot be read"):
    driver.Session(_opts(tmp_path))  # before any model loads
  rows = driver.run(_opts(tmp_path, watch=True, poll_seconds=0.01, watch_timeout=5))
  assert [r["model"] for r in rows] == ["step_0"]  # step 1 skipped, as training does


def test_a_checkpoint_of_another_model_is_one_line_before_loading(tmp_path):
  other = dataclasses.replace(MODEL, hidden_size=2 * MODEL.hidden_size)
  _run(tmp_path / "run", steps=(0,), model_config=other)
  with pytest.raises(ValueError, match=r"Checkpoint step 0 of .* does not hold the model its "
                                       r"run.json describes: params\['.*'\] is \("):
    driver.Session(_opts(tmp_path))


def test_a_run_without_its_saved_tokenizer(tmp_path):
  _run(tmp_path / "run", steps=(0,), tokenizer=run_record.SAVED_TOKENIZER)
  with pytest.raises(ValueError, match="says the tokenizer is saved in .*tokenizer, which is missing"):
    driver.Session(_opts(tmp_path))


def test_a_results_file_cut_short_is_evaluated_again(tmp_path):
  _run(tmp_path / "run", steps=(0,))
  driver.run(_opts(tmp_path))
  results = tmp_path / "out" / "set" / "step_0" / "results.json"
  full = results.read_text()
  results.write_text(full[:len(full) // 2])  # a write cut short (before results were atomic)
  rows = driver.run(_opts(tmp_path))
  assert rows[0]["model"] == "step_0" and json.loads(results.read_text())["metrics"]
  assert not list(results.parent.glob("*.tmp"))


def test_out_that_is_a_file_and_bad_settings_are_refused_up_front(tmp_path):
  _run(tmp_path / "run", steps=(0,))
  (tmp_path / "file").write_text("x")
  with pytest.raises(ValueError, match="--out=.*/file is a file"):
    driver.Session(_opts(tmp_path, out=str(tmp_path / "file")))
  for bad, message in [(dict(temperature=-1.0), "--temperature=-1.0"),
                       (dict(temperature=float("nan")), "--temperature=nan"),
                       (dict(top_p=0.0), "--top_p=0.0"), (dict(max_turns=-1), "--max_turns=-1")]:
    with pytest.raises(ValueError, match=message):
      driver.Session(_opts(tmp_path, settings=dataclasses.replace(SETTINGS, **bad)))
  for step in ("", ",,"):
    with pytest.raises(ValueError, match="use latest, all, or step numbers"):
      driver.Session(_opts(tmp_path, step=step))


def test_benchmark_names_stay_inside_out_and_nesting_is_one_line(tmp_path):
  for name in ("...jsonl", "tb.jsonl"):
    with pytest.raises(ValueError, match="cannot be a results folder"):
      bench_lib.parse_specs(f"file:{tmp_path / name}:qa")
  deep = tmp_path / "deep.json"
  deep.write_text("[" * 100_000 + "]" * 100_000)
  with pytest.raises(ValueError, match="nested too deeply"):
    bench_lib.load_file(str(deep), "qa")
  nested = tmp_path / "nested.jsonl"
  nested.write_text(json.dumps({"question": "q", "gold": "a", "x": [[[[[[[]]]]]]]})[:-1]
                    .replace("[[[[[[[]]]]]]]", "[" * 5000 + "]" * 5000) + "}\n")
  with pytest.raises(ValueError, match="line 1.*nested too deeply"):
    bench_lib.load_file(str(nested), "qa")


def test_a_tokenizer_larger_than_the_models_vocabulary():
  small = dataclasses.replace(tiny_config(), vocab_size=100)
  with pytest.raises(ValueError, match="has 259 tokens but the model's vocabulary is 100"):
    models.Model("base", None, small, None, tok_lib.ByteTokenizer())


def test_the_cli_says_a_corrupt_step_in_one_line_and_orbax_stays_quiet(tmp_path):
  run = _run(tmp_path / "run", steps=(0,))
  _corrupt(run, 0)
  out = subprocess.run([sys.executable, "-m", "scope_jax.evaluate", f"--run={run}",
                        "--role=questioner", f"--benchmarks=file:{_data(tmp_path)}:qa",
                        f"--out={tmp_path}/out", "--max_new_tokens=4", "--max_context=256",
                        "--max_prompt_tokens=128"],
                       cwd=ROOT, text=True, capture_output=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2, out.stderr[-3000:]
  assert "Traceback" not in out.stderr
  errors = [ln for ln in out.stderr.splitlines() if ln.startswith("Error:")]
  assert len(errors) == 1 and "Checkpoint step 0" in errors[0], out.stderr[-3000:]
  assert "orbax" not in out.stderr.replace("orbax_", ""), out.stderr[-3000:]


def test_overwrite_leaves_one_set_of_tensorboard_scalars_per_step(tmp_path):
  """--overwrite once appended a second value at the same step (TensorBoard showed both)."""
  tb = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
  _run(tmp_path / "run", steps=(0, 1))
  driver.run(_opts(tmp_path))
  driver.run(_opts(tmp_path, overwrite=True, step="1"))
  acc = tb.EventAccumulator(str(tmp_path / "out" / "tb"))
  acc.Reload()
  assert [e.step for e in acc.Scalars("eval/set/mean@n/em")] == [0, 1]


@pytest.mark.parametrize("overwrite", [False, True])
def test_the_runs_own_evaluation_during_training_is_never_replaced(tmp_path, overwrite):
  """In-training evaluation writes where the CLI would (`<run>/eval/<bench>/step_N`); the CLI
  asks for --out instead of offering --overwrite, which would leave metrics.jsonl's numbers
  without their predictions."""
  _run(tmp_path / "run")
  session = driver.Session(_opts(tmp_path, overwrite=overwrite))
  done = tmp_path / "out" / "set" / "step_1"
  done.mkdir(parents=True)
  (done / "results.json").write_text(json.dumps({"benchmark": "set", "updates": 2, "metrics": {}}))
  with pytest.raises(ValueError, match="the run's own evaluation during training .* --out=<dir>"):
    session.done("step_1")
  assert not session.done("step_0")


def test_world_benchmarks_name_the_runs_own_world(tmp_path):
  from scope_jax.world import World
  _run(tmp_path / "run")
  session = driver.Session(_opts(tmp_path, benchmarks="world:doc"))
  assert [b.name for b in session.benches] == ["doc"]
  assert session.benches[0].examples[0].question == World(0).gold["doc"][0]["question"]
  with pytest.raises(ValueError, match="world:<set> names a run's world; pass --run"):
    driver.Session(_opts(tmp_path, benchmarks="world:doc", run="", role="", model="demo"))
