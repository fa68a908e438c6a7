"""The SPELL and SCOPE demos on the rollout engine and on the turn-by-turn sampler: with greedy
roles both give the same metrics, step for step (only timings may differ)."""

import os
import subprocess
import sys

import pytest

from scope_jax import metrics as metrics_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ROLES = {"spell": ("questioner", "responder", "verifier"),
         "scope": ("challenger", "solver", "gate", "rubric", "grader")}


def _demo(workdir, method: str, engine: bool):
  greedy = [f"--config.{method}.roles.{r}.temperature=0" for r in ROLES[method]]
  cmd = [sys.executable, "-m", "scope_jax.main", f"--config=configs/{method}.py",
         f"--workdir={workdir}", f"--config.rollout.engine={engine}", "--config.progress=False",
         *greedy]
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=900,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-3000:]
  return metrics_lib.read_jsonl(workdir / "metrics.jsonl")


def _comparable(rec):
  return {k: v for k, v in rec.items() if not k.startswith("time/") and "per_s" not in k
          and "seconds" not in k and "logprob_gap" not in k}


def _gaps(rec):
  """The sampler-vs-trainer log-prob gaps: sampled log-probs agree to 1e-5 across the two."""
  return {k: v for k, v in rec.items() if "logprob_gap" in k}


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spell", "scope"])
def test_greedy_demo_metrics_equal_on_engine_and_sampler(tmp_path, method):
  engine = _demo(tmp_path / "engine", method, True)
  sampler = _demo(tmp_path / "sampler", method, False)
  assert [r["step"] for r in engine] == [r["step"] for r in sampler] and engine
  for a, b in zip(engine, sampler):
    assert _comparable(a) == _comparable(b), a["step"]
    assert _gaps(a).keys() == _gaps(b).keys()
    for k, v in _gaps(a).items():
      assert abs(v - _gaps(b)[k]) <= 1e-5, (a["step"], k)
  rollout = lambda recs: sum(r["time/rollout"] for r in recs)
  print(f"{method}: rollout {rollout(engine):.1f} s on the engine, {rollout(sampler):.1f} s on "
        "the sampler")
