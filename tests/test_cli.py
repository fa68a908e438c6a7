"""Command-line mistakes end with one line that says what was wrong, before anything loads."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(*args, workdir="/tmp/scope_jax_cli_test"):
  return subprocess.run([sys.executable, "-m", "scope_jax.main", *args, f"--workdir={workdir}"],
                        capture_output=True, text=True, cwd=ROOT, timeout=120,
                        env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.parametrize("args,message", [
    (("--config=configs/spell.py", "--config.spell.group_sise=3"),
     "Unknown config field in --config.spell.group_sise: did you mean 'group_size'"),
    (("--config=configs/spell.py", "--config.spell.nonexist=3"),
     "Unknown config field in --config.spell.nonexist: the config has no field 'nonexist' there"),
    (("--config=configs/spell.py", "--config.model.source=gguf:/nonexistent.gguf"),
     "model.source='gguf:/nonexistent.gguf': no file at /nonexistent.gguf, and no bundled asset"),
    (("--config=configs/nope.py",), "Config file configs/nope.py does not exist"),
    (("--config=configs/spell.py", "--config.loss.micro_batch_rows=2"),
     "loss.micro_batch_rows moved to learner.micro_batch_rows: set --config.learner.micro_batch_rows"),
    (("--config=configs/spell.py:huge",), "Unknown preset 'huge'; valid presets: demo, learn, "
     "learn_extractive, paper, small, paper_qwen3_moe."),
    (("--config=configs/spell.py", "--config.keep_checkpoints=0"),
     "keep_checkpoints=0 must be at least 1 (0 would keep no checkpoint"),
    (("--config=configs/spell.py", "--config.checkpoint_every=0"), "checkpoint_every=0 must be"),
    (("--config=configs/spell.py", "--config.total_steps=-1"), "total_steps=-1 must be at least 0"),
    (("--config=configs/spell.py", "--config.mesh.rules.train.mlp=fsdp,model"),
     "mesh.rules.train.mlp='fsdp,model' names mesh axes ['model'] that the mesh lacks"),
    (("--config=configs/spell.py", "--config.model.tokenizer=data/Qwen2.5-7B-Instruct"),
     "model.tokenizer='data/Qwen2.5-7B-Instruct' is not a directory here"),
])
def test_one_line_errors(args, message):
  out = _main(*args)
  assert out.returncode == 2
  lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith(("I1", "W1"))]
  assert lines == [lines[0]] and lines[0].startswith("Error: ") and message in lines[0], out.stderr


def test_unwritable_workdir_fails_before_loading():
  out = _main("--config=configs/spell.py", workdir="/proc/scope_jax_run")
  assert out.returncode == 2 and "is not writable" in out.stderr
