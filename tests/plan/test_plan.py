"""`scope_jax.plan`: programs compiled for TPU slices from this CPU host (libtpu's compile-only
devices), their per-chip bytes against an independent count under the sharding rules, loop trip
counts applied to the compiler's once-per-body costs, and collectives read from the HLO."""

import importlib
import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from scope_jax import sharding as shd
from scope_jax.core import runner
from scope_jax.models import transformer
from scope_jax.plan import analysis, programs, report, topology

GIB = 2 ** 30


def _config(method="spell", preset="paper", **overrides):
  config = importlib.import_module(f"configs.{method}").get_config(preset)
  for dotted, value in overrides.items():
    *path, last = dotted.split(".")
    section = config
    for part in path:
      section = section[part]
    section[last] = value
  return config


def _small_spell():
  """SPELL's paper preset on Qwen2.5-0.5B's architecture, with a short context and few rows."""
  return _config(**{"model.source": "preset:qwen2.5-0.5b", "spell.questions_per_step": 2,
                    "spell.group_size": 2, "rollout.max_context": 2048,
                    "rollout.max_prompt_tokens": 1024, "rollout.slots": 8})


def analytic_param_bytes(model, mesh_shape, rules, itemsize=4) -> int:
  """Bytes per chip of one params tree: each dimension divided by the mesh axes its logical
  name maps to, where they divide it (counted here from the rules, not from any sharding)."""
  total = 0
  axes = jax.tree.leaves(transformer.param_logical_axes(model), is_leaf=lambda x: isinstance(x, tuple))
  shapes = jax.tree.leaves(transformer.param_shapes(model), is_leaf=lambda x: isinstance(x, tuple))
  for names, shape in zip(axes, shapes):
    n = itemsize
    for dim, name in zip(shape, names):
      target = rules.get(name) if name else None
      size = math.prod(mesh_shape[a] for a in ((target,) if isinstance(target, str) else target or ()))
      n *= dim // size if dim % size == 0 else dim
    total += n
  return total


def test_a_small_preset_compiled_for_a_v5e_4_holds_the_bytes_its_rules_give():
  """The train step's per-chip arguments are the params and both Adam moments at the analytic
  per-chip size (plus the batch and three counters): moments sharded like their params."""
  config = _small_spell()
  s = topology.parse("v5e-4")
  runner.validate(config, devices=topology.devices(s), data=False)
  plan = report.build(config, s, programs="train_step")
  (step,) = plan.compiled
  assert plan.mesh == {"data": 1, "fsdp": 4, "tensor": 1, "expert": 1}
  params = analytic_param_bytes(plan.model, plan.mesh, shd.TRAIN_RULES)
  assert 0.45 * GIB < params < 0.47 * GIB  # 0.49B float32 parameters over 4 chips
  rows, cols = 16, 2048  # 2·(1 + 2 + 4) = 14 rows, padded to micro-batches of 4 on 4 chips
  batch = rows * cols * 4 * 5 // 4  # tokens, mask, loss mask, advantages, old log-probs
  counts = 4 * 4  # the schedule's and Adam's counts, the step, the skipped updates (int32)
  assert step.argument_logical == 3 * params + batch + counts
  assert plan.resident.items["policy: params + optimizer state"] == 3 * params + counts
  # On chip every array is padded to (8, 128) tiles (a scalar to 128 elements): 1.3% more here.
  assert step.argument == step.argument_tiled
  assert step.argument_logical < step.argument < 1.02 * step.argument_logical
  assert step.alias >= 3 * params  # the new state takes the old one's buffers
  assert plan.update_peak == plan.resident.total + step.peak - step.program.resident_inputs
  assert plan.fits and plan.peak < 16 * GIB


def _scan_program(mesh, layers=8):
  """x ← tanh(x · W_l) over `layers` weights sharded on their input dim and gathered whole."""
  w = jax.ShapeDtypeStruct((layers, 512, 512), jnp.bfloat16,
                           sharding=NamedSharding(mesh, P(None, "fsdp", None)))
  x = jax.ShapeDtypeStruct((64, 512), jnp.bfloat16, sharding=NamedSharding(mesh, P()))
  whole = NamedSharding(mesh, P())

  def f(w, x):
    body = lambda x, wl: (jnp.tanh(x @ jax.lax.with_sharding_constraint(wl, whole)), None)
    return jax.lax.scan(body, x, w)[0]
  return programs.Program("scan", "decode", lambda: jax.jit(f).trace(w, x))


def test_the_compiler_counts_a_loop_body_once_and_the_plan_every_trip():
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5e-4")))
  c = analysis.compile_program(_scan_program(mesh))
  body = 2 * 64 * 512 * 512  # one layer's matmul, replicated on every chip
  assert body <= c.flops < 1.1 * body  # the compiler: one trip
  assert c.loop_factor == 8 and c.model_matmul_flops == 8 * body
  chex.assert_trees_all_close(c.call_flops, 8 * c.flops)
  gathers = c.collectives["all-gather"]
  assert (gathers.count, gathers.in_loop) == (8, 8), gathers
  assert gathers.bytes == 8 * 512 * 512 * 2  # each gathers one whole bf16 layer
  assert c.loop_gathers and c.loop_gathers[0][1] == 512 * 512 * 2


def test_a_program_the_compiler_cannot_fit_is_reported_not_raised():
  """XLA refuses a program whose temporaries exceed the chip's HBM; the plan keeps its number."""
  mesh = shd.make_mesh((1, -1, 1), topology.devices(topology.parse("v5e-1")))
  x = jax.ShapeDtypeStruct((4, 4), jnp.float32, sharding=NamedSharding(mesh, P()))
  big = lambda x: jnp.broadcast_to(x[:1, :1], (96 * 1024, 64 * 1024)).cumsum(0).sum() + x
  c = analysis.compile_program(programs.Program("big", "train", lambda: jax.jit(big).trace(x)))
  assert c.error and "HBM" in c.error, c.error
  assert c.temp > 16 * GIB and c.extra() == c.temp


HLO = """\
HloModule m

%cond (p: (s32[], f32[4,8])) -> pred[] {
  %p = (s32[], f32[4,8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]) parameter(0)
  %x = f32[4,8] get-tuple-element(%p), index=1
  %ag = (f32[4,2], f32[4,8]) all-gather-start(f32[4,2] %x), dimensions={1}
  %agd = f32[4,8] all-gather-done(%ag)
  ROOT %t = (s32[], f32[4,8]) tuple(%i, %agd)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8] parameter(0)
  %ar = bf16[16,16] all-reduce(%a), to_apply=%add
  %w = (s32[], f32[4,8]) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[4,8] get-tuple-element(%w), index=1
}
"""


def test_collectives_of_a_written_module_by_hand():
  """A while of 5 trips around an async all-gather (start counted, done not), one all-reduce."""
  out, gathers = analysis.hlo_collectives(HLO)
  assert (out["all-gather"].count, out["all-gather"].bytes, out["all-gather"].in_loop) == (
      5, 5 * 4 * 8 * 4, 5)
  assert (out["all-reduce"].count, out["all-reduce"].bytes, out["all-reduce"].in_loop) == (
      1, 16 * 16 * 2, 0)
  assert gathers == [("f32[4,2]", 4 * 8 * 4)]


def test_matmul_flops_by_hand():
  """[2,3]·[3,4]: 2·(2·4)·3 = 48 FLOPs; a 5-step scan of it 240 (48 counted once); a cond costs
  its costlier branch."""
  a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
  one = jax.make_jaxpr(lambda a, b: a @ b)(a, b).jaxpr
  assert analysis.matmul_flops(one) == 48
  scan = jax.make_jaxpr(lambda a, b: jax.lax.scan(lambda c, _: (c, c @ b), a, None, length=5))(a, b)
  assert analysis.matmul_flops(scan.jaxpr) == 240
  assert analysis.matmul_flops(scan.jaxpr, trips=False) == 48
  assert analysis.loop_factor(scan.jaxpr) == 5
  cond = jax.make_jaxpr(lambda p, a, b: jax.lax.cond(p, lambda: (a @ b).sum(),
                                                      lambda: (a @ b @ b.T).sum()))(True, a, b)
  assert analysis.matmul_flops(cond.jaxpr) == 48 + 2 * 2 * 3 * 4
  # 6 rows of 3 against 2 groups' [3, 4] weights: each row meets its own group's only.
  x, w = jnp.ones((6, 3)), jnp.ones((2, 3, 4))
  ragged = jax.make_jaxpr(lambda x, w: jax.lax.ragged_dot(x, w, jnp.array([2, 4], jnp.int32)))(x, w)
  assert analysis.matmul_flops(ragged.jaxpr) == 2 * 6 * 3 * 4


def test_splash_kernel_flops_are_counted_from_the_blocks_it_visits():
  """The compiler counts nothing inside a Pallas call without a cost estimate (splash
  attention), so the plan counts it: T = 1,024 in 512-blocks is a 2 × 2 grid of which a causal
  mask visits 3 blocks; per block and head the forward runs 2 [512 × 512 × H] matmuls and the
  fused backward 5. Three layers in a scan, rematerialised: the forward runs twice."""
  from scope_jax.models import ops, splash
  b, t, n, k, h = 2, 1024, 4, 2, 128
  q, kv = jnp.zeros((b, t, n, h), jnp.bfloat16), jnp.zeros((b, t, k, h), jnp.bfloat16)
  valid = jnp.ones((b, t), bool)

  def layer(q_, _):
    out = splash.attend(q_, kv, kv, valid)
    return out, None

  def loss(q_):
    step = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable)
    return jax.lax.scan(step, q_, None, length=3)[0].astype(jnp.float32).sum()

  with ops.compiling_for("tpu", 1):
    jaxpr = jax.make_jaxpr(jax.grad(loss))(q).jaxpr
  block = 2 * 512 * 512 * h  # one [512 × 512] · [512 × H] matmul
  per_layer = b * n * 3 * (2 * 2 + 5) * block
  assert analysis.kernel_flops(jaxpr) == 3 * per_layer
  assert analysis.kernel_flops(jaxpr, trips=False) == per_layer
  # The kernels' bodies are not XLA's matmuls; XLA's one is the backward's row sums of o·do.
  assert analysis.matmul_flops(jaxpr) == 3 * 2 * b * n * t * h


def test_decode_collectives_of_the_training_layout_and_the_sampling_layout():
  """Sampling with the training layout (weights split along fsdp, rows pinned to the batch axes)
  makes every decode step gather weights, as FSDP does, once per layer and more; the sampling
  layout keeps the weights whole: a step needs one small all-reduce and gathers nothing."""
  s = topology.parse("v5e-4")
  steps, gathers = {}, {}
  for name, rules in (("train", shd.TRAIN_RULES), ("sampling", shd.SAMPLING_RULES)):
    config = _config("spell", "demo", **{"rollout.slots": 4, "rollout.chunk": 2})
    config.mesh.rules.sampling.update(dict(shd.rules_to_config(rules)))
    plan = report.build(config, s, programs="engine/decode_step")
    (c,) = plan.compiled
    steps[name] = sum(v.count for v in c.collectives.values())
    gathers[name] = report.loop_gathers(plan)
    assert plan.partial and report.verdict(plan).startswith("partial plan (programs: engine/decode_step)")
    assert "partial plan" in report.render(plan, config) and "**fits**" not in report.render(plan, config)
    (row,) = report.to_json(plan, config)["programs"]
    assert row["unit"] == "decode step" and all(
        isinstance(row[k], float) for k in report.ESTIMATE_FIELDS), row
    assert row["step_seconds_floor"] <= row["step_seconds_overlapped"] <= row["step_seconds_serial"]
  assert steps["sampling"] == 1 and not gathers["sampling"], (steps, gathers)
  assert steps["train"] > plan.model.num_layers and len(gathers["train"]) >= plan.model.num_layers


def test_model_flops_per_token_by_hand():
  """6N plus 6·L·heads·head_dim·T for a dense model (the input embedding lookup is no matmul)."""
  from scope_jax.models.config import tiny_config
  m = tiny_config("qwen2", num_layers=2, hidden_size=32, intermediate_size=64, num_heads=4,
                  num_kv_heads=2, head_dim=8, vocab_size=100, tie_embeddings=False)
  n = m.num_params() - 100 * 32
  assert report.model_flops_per_token(m, 10) == 6 * n + 6 * 2 * 4 * 8 * 10


def test_cpu_runs_stay_on_the_cpu():
  """Describing a TPU slice does not make JAX pick a TPU backend."""
  topology.devices(topology.parse("v5p-8"))
  assert {d.platform for d in jax.devices()} == {"cpu"}
  np.testing.assert_array_equal(jax.jit(lambda x: x + 1)(np.arange(3)), [1, 2, 3])


def test_the_command_line_searches_the_meshes_of_a_slice(tmp_path):
  """`--search_mesh` plans the run under every candidate (data, fsdp, tensor) of the slice and
  lists those that fit, fastest update first; a bad topology is one line."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  cmd = [sys.executable, "-m", "scope_jax.plan", f"--config={root}/configs/spell.py:demo",
         "--topology=v5e-4", "--programs=train_step", "--search_mesh",
         f"--json={tmp_path / 'search.json'}"]
  proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads((tmp_path / "search.json").read_text())
  # Only the train step compiled: a partial plan, with no verdict for the whole run.
  assert [tuple(r["mesh"]) for r in rows] and all(r["partial"] and r["fits"] is None for r in rows)
  assert all(r["peak"] < 16 * GIB for r in rows)
  assert {tuple(r["mesh"]) for r in rows} == set(report.mesh_candidates(4))
  assert [r["update_s"] for r in rows] == sorted(r["update_s"] for r in rows)
  assert "| mesh | fits |" in proc.stdout and "partial plan" in proc.stdout
  bad = subprocess.run(cmd[:4] + ["--topology=v7-8"], cwd=root, env=env, capture_output=True,
                       text=True, timeout=300)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
      "Error: Unknown TPU topology 'v7-8'"), bad.stderr


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args):
  import subprocess
  import sys
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=300)


def test_bad_command_lines_fail_in_one_line_before_compiling(tmp_path):
  """Unknown program names (listing the valid ones), an empty item alone, an unwritable --json
  and a slice count of 0: each one `Error:` line, exit 2, nothing compiled."""
  base = ["-m", "scope_jax.plan", "--config=configs/spell.py:demo", "--topology=v5e-4"]
  for extra, message in (
      (["--programs=decode"], "Error: --programs='decode': decode matches none of this run's "
       "programs; choose from: all, train_step/policy, engine/prefill, engine/decode_step, "
       "engine/decode"),
      (["--programs=,"], "Error: --programs=',': no name matches none"),
      ([f"--json={tmp_path}/missing/plan.json"], f"Error: --json={tmp_path}/missing/plan.json: "
       "cannot write there"),
      (["--topology=0xv5p-8"], "Error: 0xv5p-8: a run spans at least one slice")):
    proc = _cli(*base, *extra)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and lines[-1].startswith(message), proc.stderr[-2000:]
    assert "Compiling" not in proc.stderr and not proc.stdout.strip(), proc.stdout[-500:]


def test_plan_presets_prints_no_stale_row_and_fails_when_a_plan_fails(tmp_path, monkeypatch, capsys):
  """An earlier run's JSON is removed before planning: a failed plan has no row, exit 1."""
  import importlib.util
  import json
  import subprocess
  import sys
  path = os.path.join(ROOT, "tools", "plan_presets.py")
  spec = importlib.util.spec_from_file_location("plan_presets", path)
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  (tmp_path / "asl_paper.json").write_text(json.dumps({"stale": True}))
  failed = subprocess.CompletedProcess([], 1, stdout="", stderr="Error: the compiler refused\n")
  monkeypatch.setattr(tool.subprocess, "run", lambda *a, **k: failed)
  monkeypatch.setattr(sys, "argv", ["plan_presets.py", f"--out={tmp_path}", "--presets=asl:paper"])
  with pytest.raises(SystemExit) as exit_:
    tool.main()
  out = capsys.readouterr().out
  assert exit_.value.code == 1
  assert "asl:paper: plan failed" in out and "| asl:paper |" not in out
  assert not (tmp_path / "asl_paper.json").exists()


def test_plan_presets_lora_plans_adapters_on_their_own_slice(tmp_path, monkeypatch):
  """--lora plans rank-64 adapters with each preset's LORA_SLICES slice, mesh and overrides."""
  import importlib.util
  import subprocess
  import sys
  spec = importlib.util.spec_from_file_location(
      "plan_presets", os.path.join(ROOT, "tools", "plan_presets.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  calls = []
  monkeypatch.setattr(tool.subprocess, "run", lambda cmd, **k: calls.append(cmd) or
                      subprocess.CompletedProcess(cmd, 1, stdout="", stderr="stop"))
  monkeypatch.setattr(sys, "argv", ["plan_presets.py", f"--out={tmp_path}", "--lora",
                                    "--presets=spell:paper"])
  with pytest.raises(SystemExit):
    tool.main()
  (cmd,) = calls
  assert cmd[3:8] == ["--config=configs/spell.py:paper", "--topology=v6e-8",
                      "--config.mesh.shape=(1,2,4)", "--config.lora.rank=64",
                      "--config.learner.micro_batch_rows=2"], cmd


def test_plan_presets_targets_table_merges_partial_plans(tmp_path, monkeypatch, capsys):
  """--targets reads a train plan and a decode plan of one preset: the worst train step's
  ratios, its update time over the floor, the train plan's update peak, the decode ratio; and
  the memory row with each phase's larger peak."""
  import importlib.util
  import json
  import sys
  spec = importlib.util.spec_from_file_location(
      "plan_presets", os.path.join(ROOT, "tools", "plan_presets.py"))
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)

  def train(name, flops, ici):
    return {"name": name, "kind": "train", "flops": flops, "flops_minimum": 100.0,
            "ici_bytes_per_chip": ici, "ici_bytes_per_chip_minimum": 10.0,
            "step_seconds_overlapped": flops / 10, "step_seconds_floor": 10.0, "mfu": 0.5}

  (tmp_path / "t").mkdir()
  (tmp_path / "d").mkdir()
  memory = {"slice": "v5p-8", "mesh": {"data": 1, "fsdp": 4, "tensor": 1},
            "resident": {"policy": 25 * GIB, "sampler": 5 * GIB}, "kv_cache": 10 * GIB,
            "hbm_bytes": 95 * GIB}
  (tmp_path / "t" / "asl_paper.json").write_text(json.dumps(
      {**memory, "update_peak": 70 * GIB, "rollout_peak": 30 * GIB,
       "programs": [train("train_step/a", 120.0, 11.0), train("train_step/b", 130.0, 10.5)]}))
  decode = {"name": "engine/decode", "kind": "decode", "hbm_bytes": 103.0,
            "hbm_bytes_minimum": 100.0, "step_seconds_overlapped": 0.012}
  (tmp_path / "d" / "asl_paper.json").write_text(json.dumps(
      {**memory, "update_peak": 30 * GIB, "rollout_peak": 41 * GIB, "programs": [decode]}))
  monkeypatch.setattr(sys, "argv", ["plan_presets.py",
                                    f"--targets={tmp_path / 't'},{tmp_path / 'd'}"])
  tool.main()
  row, mem = [l for l in capsys.readouterr().out.splitlines() if l.startswith("| asl:paper |")]
  assert row == ("| asl:paper | v5p-8 | 1.30× | 1.10× | 13 s (1.30×) | 50% | 70.0 GiB | 1.03× | "
                 "12.0 ms |"), row
  assert mem == ("| asl:paper | v5p-8 `(1, 4, 1)` | 30.0 | 10.0 | 70.0 | 41.0 | 95 | "
                 "fits, 25.0 to spare |"), mem


def test_parameter_counts_read_as_people_write_them():
  assert [report.count(n) for n in (838_000, 494_032_768, 7_615_616_512, 999)] == [
      "838K", "494M", "7.62B", "999"]


def test_a_smoke_plan_reads_the_gguf_assets_architecture_without_downloading_it(monkeypatch):
  """Planning names no weights: an unfetched GGUF asset's architecture is its recorded preset,
  and where the asset is fetched its header gives the same architecture."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  from scope_jax import assets  # pylint: disable=import-outside-toplevel
  from scope_jax.models import gguf_io  # pylint: disable=import-outside-toplevel
  from scope_jax.models.config import get_preset  # pylint: disable=import-outside-toplevel
  name = "qwen2.5-0.5b-gguf"
  fetched = assets.is_fetched(name)
  if fetched:
    header, _ = gguf_io.open_gguf(assets.fetch(name))
    assert header.replace(tie_embeddings=True) == get_preset(programs.ASSET_PRESETS[name]).replace(
        tie_embeddings=True)
  monkeypatch.setattr(assets, "is_fetched", lambda _: False)
  monkeypatch.setattr(assets, "fetch", lambda _: pytest.fail("downloaded the weights to plan"))
  model = ml_collections.ConfigDict(dict(source=f"gguf:{name}", tie_embeddings="yes"))
  config = programs.model_config(model)
  assert (config.hidden_size, config.num_layers, config.vocab_size) == (896, 24, 151936)


def test_a_lora_plan_holds_one_base_and_adapter_states():
  """With LoRA the train step's resident arguments are the adapters and their two Adam moments
  (float32, rank axis whole) plus one base; the resident set counts the base once for every
  policy and frozen role, and per policy only its adapters' state."""
  config = _small_spell()
  config.lora.rank = 16
  s = topology.parse("v5e-4")
  runner.validate(config, devices=topology.devices(s), data=False)
  plan = report.build(config, s, programs="train_step")
  (step,) = plan.compiled
  params = analytic_param_bytes(plan.model, plan.mesh, shd.TRAIN_RULES)
  m = plan.model  # qwen2.5-0.5b: D 896, 14 heads × 64, 2 kv heads, F 4864, 24 layers
  d, nh, kh, f, r, L = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, \
      m.intermediate_size, 16, m.num_layers
  # a: [L, in, R] sharded on `embed` (fsdp 4) when in is D; b: [L, R, out], out on fsdp if D.
  a = L * r * (d // 4 * 3 + nh + d // 4 * 2 + f)  # q, k, v, gate, up read D; o reads N·H; down F
  b = L * r * (nh + 2 * kh + d // 4 + 2 * f + d // 4)
  adapters = 4 * (a + b)
  counts = 4 * 4
  state = plan.resident.items["policy: LoRA adapters + optimizer state"]
  assert state == 3 * adapters + counts
  assert plan.resident.items["base model (shared by every policy and frozen role)"] == params
  batch = 16 * 2048 * 4 * 5 // 4
  assert step.argument_logical == 3 * adapters + counts + params + batch
  assert step.alias >= 3 * adapters and step.alias < params  # only the adapters' state is donated


def test_a_tensor_parallel_train_step_meets_its_minimums(monkeypatch):
  """`scope:paper_olmo3`'s train step on its `(1, 4, 4)` mesh with OLMo-3's model cut to 2
  layers of width 1,024 (8 heads, 8 KV heads: no grouping) and a vocabulary of 4,099 tokens,
  which tensor 4 cannot divide, as it cannot OLMo-3's 100,278: FLOPs within 1.35x and interconnect within 1.3x of the minimums.
  A matmul per projection (an all-reduce of [rows, T, D] per weight in the backward), or a
  vocabulary formed whole on every tensor chip, fails it."""
  pytest.importorskip("libtpu")
  import dataclasses
  from configs import scope
  full = programs.model_config
  cut = lambda m: dataclasses.replace(full(m), hidden_size=1024, intermediate_size=2816,
                                      num_layers=4, num_heads=8, num_kv_heads=8, vocab_size=4099,
                                      layer_types=full(m).layer_types[:4])
  monkeypatch.setattr(programs, "model_config", cut)
  config = scope.get_config("paper_olmo3")
  config.mesh.shape = (1, 4, 4)
  config.rollout.max_context = 4096
  plan = report.build(config, topology.parse("v5p-32"), programs="train_step/solver")
  (e,) = plan.estimates()
  assert e.flops <= 1.35 * e.flops_minimum, (e.flops / e.flops_minimum)
  assert e.ici_bytes_per_chip <= 1.3 * e.ici_bytes_per_chip_minimum, (
      e.ici_bytes_per_chip / e.ici_bytes_per_chip_minimum, e.ici_by_kind)


def test_plan_names_the_mesh_launch_readme_plans_a_preset_on():
  """On the slice launch/README.md names for a preset, another mesh gets a note naming the
  README's; the README's own mesh, another slice or an unlisted preset get none."""
  from scope_jax.plan import recommended
  advice = lambda spec, name, shape, lora=False: recommended.mesh_advice(
      spec, topology.parse(name), shape, lora)
  assert advice("scope:paper_olmo3", "v5p-32", (1, -1, 1)) == (
      "Note: launch/README.md plans scope:paper_olmo3 on v5p-32 with "
      "--config.mesh.shape='(1,4,4)'; this plan uses (1, 16, 1).")
  assert advice("scope:paper_olmo3", "v5p-32", (1, 4, 4)) is None
  assert advice("scope:paper_olmo3", "v5p-32", (1, -1, 4)) is None
  assert advice("scope:paper_olmo3", "v5p-64", (1, -1, 1)) is None
  assert advice("spell:paper", "v6e-8", (1, -1, 1), True) == (
      "Note: docs/models.md plans spell:paper with LoRA on v6e-8 with "
      "--config.mesh.shape='(1,2,4)'; this plan uses (1, 8, 1).")
  assert advice("spell:demo", "v5p-8", (1, -1, 1)) is None
