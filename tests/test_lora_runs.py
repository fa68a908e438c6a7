"""LoRA runs: every policy is the one shared base plus its adapters (the KL reference and frozen
roles are the base itself), checkpoints hold adapters only, every demo runs every phase with
`--config.lora.rank=8`, a run resumes after SIGKILL, and its export is the LoRA model."""

import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath

from configs import spell as spell_config
from scope_jax import metrics as metrics_lib
from scope_jax import run_record
from scope_jax import sharding as shd
from scope_jax.core import runtime
from scope_jax.evaluation import models
from scope_jax.models import lora, transformer
from tests.methods.cli import kill_once_exists

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("spell", "scope", "opensir", "asl", "piplay")


def _config(**overrides):
  c = spell_config.get_config("demo")
  c.warmup.steps = 0
  c.update_from_flattened_dict({"lora.rank": 4, "lora.alpha": 8.0, **overrides})
  return c


def test_policies_share_the_base_and_checkpoints_hold_adapters_only(tmp_path):
  rt = runtime.Runtime(_config(), str(tmp_path))
  a, b = rt.add_policy("a"), rt.add_policy("b")
  teacher = rt.add_tracked("teacher")
  base = rt.base_params
  for policy in (a, b):
    assert policy.base is base and isinstance(policy.state.params, lora.Adapters)
    played_base, _ = lora.split(policy.played())
    assert all(x is y for x, y in zip(jax.tree.leaves(played_base), jax.tree.leaves(base)))
  assert all(x is y for x, y in zip(jax.tree.leaves(lora.split(teacher)[0]),
                                    jax.tree.leaves(base)))
  assert rt.reference() is base and not rt.release_base()
  state = rt.device_state()
  assert isinstance(state["a"].params, lora.Adapters)
  assert isinstance(state["teacher"]["params"], lora.Adapters)
  saved = sum(x.nbytes for x in jax.tree.leaves(state))
  full = transformer.count_params(base) * 4 * 3 * 2 + transformer.count_params(base) * 4
  assert saved < 0.1 * full, (saved, full)  # two policies and a teacher, adapters only
  moved = jax.tree.map(lambda x: x + 1.0, state["teacher"]["params"])
  rt.load_device_state({"teacher": {"params": moved}})
  chex.assert_trees_all_equal(rt.trained_part("teacher"), moved)
  assert lora.split(rt.frozen["teacher"])[0]["embed"] is base["embed"]
  with pytest.raises(ValueError, match="starts from fresh adapters on the shared base"):
    rt.add_policy("c", params=base)


def test_rebase_gives_fresh_adapters_on_the_new_base(tmp_path):
  rt = runtime.Runtime(_config(), str(tmp_path))
  policy = rt.add_policy("a")
  rt.add_tracked("teacher")
  fresh = jax.tree.map(np.asarray, policy.state.params)
  policy.state = policy.state.replace(params=jax.tree.map(lambda x: x + 1.0,
                                                          policy.state.params))
  new_base = jax.tree.map(lambda x: x * 1.5, rt.base_params)
  rt.rebase(new_base)
  assert policy.base is new_base and rt.reference() is new_base
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, policy.state.params), fresh)
  assert lora.split(rt.frozen["teacher"])[0] is not None
  assert lora.split(rt.frozen["teacher"])[0]["embed"] is new_base["embed"]


def test_dropout_is_refused_before_anything_loads(tmp_path):
  out = subprocess.run(
      [sys.executable, "-m", "scope_jax.main", "--config=configs/spell.py",
       f"--workdir={tmp_path}", "--config.lora.rank=8", "--config.lora.dropout=0.1"],
      capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      timeout=300)
  assert out.returncode != 0
  assert "lora.dropout" in out.stderr and "not supported" in out.stderr


# ------------------------------------------------------------------------------- demo runs

def _main(method, workdir, *flags, wait=True, rank=8):
  """The method's demo with LoRA adapters (its own step count: every phase it demonstrates)."""
  cmd = [sys.executable, "-m", "scope_jax.main", f"--config=configs/{method}.py",
         f"--workdir={workdir}", f"--config.lora.rank={rank}", *flags]
  env = dict(os.environ, PYTHONPATH=ROOT)
  if wait:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=1500)
  return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT,
                          env=env)


def _full_state_bytes(workdir) -> int:
  """What a full-weights run's step holds (uncompressed): per checkpointed tree the params and
  two Adam moments in float32."""
  record = run_record.read(str(workdir))
  params = sum(int(np.prod(s)) for s in jax.tree.leaves(
      transformer.param_shapes(record.model_config), is_leaf=lambda x: isinstance(x, tuple)))
  return 3 * 4 * params * len(record.policies)


def _state_dir(workdir) -> str:
  steps = sorted(int(p.name) for p in (epath.Path(workdir) / "checkpoints").iterdir()
                 if p.name.isdigit())
  return str(epath.Path(workdir) / "checkpoints" / str(steps[-1]) / "state")


def _state_bytes(workdir) -> int:
  """Bytes on disk of the newest checkpoint step's device state (policies and tracked trees;
  orbax's metadata and, while it merges, some data twice)."""
  root = _state_dir(workdir)
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs)


def _stored_array_bytes(workdir) -> tuple[int, set]:
  """(bytes of the arrays the newest step stores, the names of their leaves)."""
  import orbax.checkpoint as ocp
  reader = ocp.PyTreeCheckpointer()
  try:
    saved = reader.metadata(_state_dir(workdir)).item_metadata
  finally:
    reader.close()
  leaves = jax.tree_util.tree_flatten_with_path(saved)[0]
  total = sum(int(np.prod(m.shape)) * np.dtype(m.dtype).itemsize for _, m in leaves)
  return total, {str(getattr(path[-1], "key", path[-1])) for path, _ in leaves}


def _check_adapters_only(workdir) -> None:
  """The step stores adapters, their moments and counters only: under 5% of a full run's
  arrays at rank 8 (the demo model's adapters are 4.0% of its weights). The bytes on disk are
  not compared: orbax's OCDBT data files vary with how the asynchronous write was batched (the
  same step measured 0.4 MB and 1.5 MB)."""
  stored, names = _stored_array_bytes(workdir)
  assert names <= {"a", "b", "count", "step", "skipped"}, names
  full = _full_state_bytes(workdir)
  assert stored < 0.05 * full, (stored, full)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_every_demo_runs_with_lora(method, tmp_path):
  out = _main(method, tmp_path / "run")
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"Finished {method} (demo)" in out.stdout
  record = run_record.read(str(tmp_path / "run"))
  assert run_record.lora_of(record).rank == 8
  _check_adapters_only(tmp_path / "run")


@pytest.mark.slow
def test_a_lora_run_resumes_after_sigkill_like_an_uninterrupted_one(tmp_path):
  full = _main("spell", tmp_path / "full", "--config.total_steps=2")
  assert full.returncode == 0, full.stderr[-2000:]
  _check_adapters_only(tmp_path / "full")
  proc = _main("spell", tmp_path / "cut", "--config.total_steps=2", wait=False)
  kill_once_exists(proc, tmp_path / "cut" / "checkpoints" / "0", timeout=600)
  resumed = _main("spell", tmp_path / "cut", "--config.total_steps=2")
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert "Resuming from checkpoint step" in resumed.stderr
  comparable = lambda r: {k: v for k, v in r.items()
                          if not k.startswith("time/") and "per_s" not in k}
  a = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "full" / "metrics.jsonl")}
  b = {r["step"]: r for r in metrics_lib.read_jsonl(tmp_path / "cut" / "metrics.jsonl")}
  assert comparable(a[1]) == comparable(b[1])
  _check_export(tmp_path / "full", tmp_path / "hf")


def _check_export(workdir, out):
  """`python -m scope_jax.export` of the LoRA run: transformers' logits of the merged export
  equal the adapter forward's (base + adapters, never merged) within float tolerance."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  done = subprocess.run([sys.executable, "-m", "scope_jax.export", f"--run={workdir}",
                         "--step=latest", "--role=policy", f"--out={out}"], cwd=ROOT, text=True,
                        capture_output=True, timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
  assert done.returncode == 0, done.stderr[-2000:]
  record = run_record.read(str(workdir))
  step = run_record.committed_steps(record)[-1]
  model = models.load_step(record, step, "policy", shd.make_mesh((1, -1, 1)),
                           shd.SAMPLING_RULES, jnp.float32)
  base, adapters = lora.split(model.params)
  assert adapters is not None
  assert max(float(jnp.abs(w["b"]).max()) for w in adapters.weights.values()) > 0  # trained
  ids = np.array([[5, 17, 42, 99, 7, 3, 250, 11]], np.int32)
  ours = np.asarray(transformer.forward_jit(model.config, model.params, ids))
  plain = np.asarray(transformer.forward_jit(model.config, base, ids))
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  chex.assert_trees_all_close(theirs, ours, atol=1e-4, rtol=1e-4)
  assert np.abs(ours - plain).max() > 10 * np.abs(theirs - ours).max()  # the adapters show
