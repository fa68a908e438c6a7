"""The shared method core: roles (prompt limits, seed streams, rollout metrics), the sampling
layout of role samplers, the generic demo warm-up, and the package's import layering."""

import ast
import importlib
import json
import pathlib
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from absl import flags as absl_flags
from ml_collections import config_flags

from configs import scope as scope_config
from configs import spell as spell_config
from scope_jax import prompts
from scope_jax.core import runner
from scope_jax.core import runtime
from scope_jax.methods.scope import algorithm as scope
from scope_jax.methods.spell import algorithm as spell
from scope_jax.core import warmup
from scope_jax.models import load
from scope_jax.rewards import judges
from tests.methods.scripted import ScriptedSpellSampler, play_all_roles

ROOT = pathlib.Path(__file__).resolve().parents[2]


def spell_config_small(**overrides):
  c = spell_config.get_config("demo")
  c.warmup.steps = 0
  c.progress = False
  c.update_from_flattened_dict(overrides)
  return c


# ------------------------------------------------------------------------------- prompts

def test_render_leaves_placeholders_inside_values_alone():
  out = prompts.render("Q: {question}\nA: {answer}", question="what is {answer}?", answer="42")
  assert out == "Q: what is {answer}?\nA: 42"


def test_fit_cuts_inserted_content_never_the_template():
  template = "Grade the response.\nTask: {task}\nCriterion: {criterion}\nResponse:\n{response}\nEnd."
  p = prompts.Prompt(template, dict(task="Name the river.", criterion="Names the Nile.",
                                    response="word " * 500), fit=("response", "task"))
  count = lambda text: len(text.split())
  text, cut = prompts.fit_prompt(p, 60, count)
  assert cut and count(text) <= 60
  assert text.startswith("Grade the response.\nTask: Name the river.\nCriterion: Names the Nile.")
  assert text.endswith(prompts.ELLIPSIS + "\nEnd.")
  short = prompts.Prompt(template, dict(task="t", criterion="c", response="r"), fit=("response",))
  assert prompts.fit_prompt(short, 60, count) == (short.text(), False)
  with pytest.raises(ValueError, match="raise the role's max_prompt_tokens"):
    prompts.fit_prompt(p, 5, count)


def test_judge_grader_prompt_keeps_its_instructions_with_a_long_answer(tmp_path):
  """A long Solver answer is cut inside the grader prompt; the instructions, the task and the
  criterion stay (before, the prompt's last tokens were kept and the instructions went)."""
  c = scope_config.get_config("demo")
  c.warmup.steps, c.scope.prompt_style = 0, "paper"
  c.scope.roles.grader.max_prompt_tokens = 400
  rt = runtime.Runtime(c, str(tmp_path))
  method = scope.Scope(rt)
  grader = method.roles["grader"]
  long_answer = "The river flows north. " * 400
  ids = grader.prompt(method.prompts.grader("Which river is longest?", "Names the Nile.",
                                             long_answer))
  text = rt.tokenizer.decode(ids)
  assert len(ids) <= 400
  head = judges.template(judges.CRITERION_GRADE, "paper").split("{")[0]
  assert head.strip() and head.strip() in text
  assert "Which river is longest?" in text and "Names the Nile." in text
  assert text.count("The river flows north.") < 400
  assert grader.metrics() == {}  # nothing generated yet; cut prompts are reported with rollouts


# ------------------------------------------------------------------------------- roles

def test_roles_record_rollout_metrics_and_repeat_their_seeds(tmp_path):
  rt = runtime.Runtime(spell_config_small(), str(tmp_path))
  method = spell.Spell(rt)
  rt.begin_step(3)
  prompt = method.roles["questioner"].prompt("Write a question.")
  first = method.roles["questioner"].generate([prompt], num_samples=2)
  m = rt.role_metrics()
  assert m["questioner/rollout/rows"] == 2.0
  assert m["questioner/rollout/tokens"] == sum(float(t.loss_mask.sum()) for t in first)
  assert m["questioner/rollout/tokens_per_s"] > 0
  assert sum(m[f"questioner/rollout/finish_{r}"] for r in ("eos", "length", "stop")) == 1.0
  assert "responder/rollout/rows" not in m  # a role that did not play reports nothing
  rt.begin_step(3)  # a resumed run replays step 3 with the same seeds
  again = method.roles["questioner"].generate([prompt], num_samples=2)
  for a, b in zip(first, again):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
  rt.begin_step(4)
  other = method.roles["questioner"].generate([prompt], num_samples=2)
  with pytest.raises(AssertionError):  # the next step samples other tokens
    chex.assert_trees_all_equal([a.tokens for a in first], [b.tokens for b in other])


def test_role_samplers_use_the_sampling_layout(tmp_path):
  """On an 8-device fsdp mesh the policy trains with embed over fsdp, and its role's sampler
  holds the weights whole along fsdp (SAMPLING_RULES)."""
  rt = runtime.Runtime(spell_config_small(**{"mesh.shape": (1, 8, 1)}), str(tmp_path))
  method = spell.Spell(rt)
  train_spec = method.rt.policies["policy"].state.params["layers"]["q"].sharding.spec
  sample_spec = method.roles["questioner"].sampler.params["layers"]["q"].sharding.spec
  assert "fsdp" in jax.tree.leaves(tuple(train_spec))
  assert "fsdp" not in jax.tree.leaves(tuple(sample_spec))


def test_mesh_rules_on_the_command_line_change_the_sharding(tmp_path):
  """`--config.mesh.rules.<train|sampling>.<axis>=...` flags, parsed as the CLI parses them,
  move the MLP weights on an 8-device fsdp mesh: in training and in the role samplers."""
  def gate_specs(*flags):
    argv = ["main", f"--config={ROOT}/configs/spell.py:demo", "--config.warmup.steps=0",
            "--config.mesh.shape=(1,8,1)", *flags]
    values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, sys_argv=argv)
    values(argv)
    rt = runtime.Runtime(values.config, str(tmp_path / str(len(flags))))
    method = spell.Spell(rt)
    return (tuple(method.rt.policies["policy"].state.params["layers"]["gate"].sharding.spec),
            tuple(method.roles["questioner"].sampler.params["layers"]["gate"].sharding.spec))

  assert gate_specs() == ((None, "fsdp", None), (None, None, None))
  assert gate_specs("--config.mesh.rules.train.embed=", "--config.mesh.rules.train.mlp=fsdp",
                    "--config.mesh.rules.sampling.mlp=fsdp") == (
                        (None, None, "fsdp"), (None, None, "fsdp"))


def test_spell_one_step_through_the_core(tmp_path):
  rt = runtime.Runtime(spell_config_small(**{"spell.prompt_style": "paper"}), str(tmp_path))
  method = spell.Spell(rt)
  play_all_roles(rt, ScriptedSpellSampler(rt.tokenizer))
  rt.begin_step(0)
  m = method.step(0)
  m.update(rt.role_metrics())
  for role in ("questioner", "responder", "verifier"):
    assert m[f"{role}/rollout/rows"] > 0
  assert m["questioner/parsed"] == m["questioner/proposals"]
  assert m["verifier/votes"] == m["responder/groups"] * rt.config.spell.group_size


# ------------------------------------------------------------------------------- warm-up

def test_generic_warm_up_fits_caches_and_reloads(tmp_path, monkeypatch):
  monkeypatch.setenv("SCOPE_JAX_CACHE", str(tmp_path / "cache"))
  c = spell_config_small(**{"warmup.steps": 2, "warmup.documents": 2, "warmup.batch_rows": 2})
  rt, method = runner.build(c, str(tmp_path / "a"))
  assert (tmp_path / "a" / "warm_start" / "model.safetensors").exists()
  assert len(list((tmp_path / "cache" / "warm_start").iterdir())) == 1
  warmed = jax.tree.map(np.asarray, method.rt.policies["policy"].state.params)
  assert rt.base_params is None  # released: no frozen role or KL reference reads M0 here
  chex.assert_trees_all_equal(warmed, jax.tree.map(np.asarray, method.roles["questioner"].sampler.params))
  for workdir, source in (("a", "warmup/source_run"), ("b", "warmup/source_cache")):
    rt2 = runtime.Runtime(c, str(tmp_path / workdir))
    info = warmup.warm_start(rt2, spell.Spell(rt2))
    assert info.get(source) == 1.0 and "warmup/seconds" not in info
    chex.assert_trees_all_equal(warmed, jax.tree.map(np.asarray, rt2.base_params))


def test_a_warm_up_under_another_key_is_not_reused(tmp_path, monkeypatch):
  """A workdir's warm-up is reused only under the settings and demonstrations it was fitted
  on (its stamp); another one, or one saved without a stamp, is replaced."""
  monkeypatch.setenv("SCOPE_JAX_CACHE", str(tmp_path / "cache"))
  c = spell_config_small(**{"warmup.steps": 2, "warmup.documents": 2, "warmup.batch_rows": 2})
  runner.build(c, str(tmp_path / "a"))
  local = tmp_path / "a" / "warm_start"
  stamp = warmup.stamp_of(local)
  assert stamp and stamp.startswith(warmup.settings_key(c, load.model_config(c.model)))
  for other in ("another-fit", None):  # a fit under other settings; an unstamped one
    if other is None:
      (local / warmup.STAMP).unlink()
    else:
      (local / warmup.STAMP).write_text(other)
    rt = runtime.Runtime(c, str(tmp_path / "a"))
    info = warmup.warm_start(rt, spell.Spell(rt))
    assert "warmup/source_run" not in info and info.get("warmup/source_cache") == 1.0, info
    assert warmup.stamp_of(local) == stamp
  (local / warmup.STAMP).unlink()  # saved before stamps, by a run with a checkpoint: its own
  (tmp_path / "a" / "checkpoints" / "3").mkdir(parents=True)
  rt = runtime.Runtime(c, str(tmp_path / "a"))
  assert warmup.warm_start(rt, spell.Spell(rt)).get("warmup/source_run") == 1.0


def test_overwrite_starts_over_without_the_old_world_or_warm_up(tmp_path):
  (tmp_path / "world" / "gold").mkdir(parents=True)
  (tmp_path / "world" / "gold" / "doc.jsonl").write_text("{}\n")
  (tmp_path / "warm_start").mkdir()
  (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')  # a run killed before a checkpoint
  with pytest.raises(ValueError, match="overwrite"):
    runner.build(spell_config_small(), str(tmp_path), warm_start=False)
  assert (tmp_path / "world").exists() and (tmp_path / "warm_start").exists()
  runner.build(spell_config_small(overwrite=True), str(tmp_path), warm_start=False)
  assert not (tmp_path / "world").exists() and not (tmp_path / "warm_start").exists()


def test_a_warm_start_from_other_weights_is_another_fit():
  """A warm-up that starts from a checkpoint (a `learn` preset starts from the demo model) is
  not the fit of a random init of the same shape; a random init's key is unchanged."""
  c = importlib.import_module("configs.piplay").get_config("demo")
  model_config = load.model_config(c.model)
  tiny = warmup.settings_key(c, model_config)
  c.model.source = "hf:/some/checkpoint"
  assert warmup.settings_key(c, model_config) != tiny
  c.model.source = f"hf:{warmup.BUNDLED}"
  bundled = warmup.settings_key(c, model_config)
  assert bundled != tiny
  c.model.source = f"hf:{warmup.BUNDLED}/../demo_model"  # the same weights by another path
  assert warmup.settings_key(c, model_config) == bundled
  c.model.source = "tiny"
  assert warmup.settings_key(c, model_config) == tiny


@pytest.mark.parametrize("method", runner.METHODS)
def test_the_bundled_demo_model_matches_every_demo(tmp_path, method):
  """The shipped weights were fitted on each demo's current demonstrations with its current
  settings (else the README's commands would warm up for minutes first)."""
  meta = json.loads((warmup.BUNDLED / "warmup.json").read_text())
  c = importlib.import_module(f"configs.{method}").get_config("demo")
  rt, m = runner.build(c, str(tmp_path), warm_start=False)
  assert meta["settings"] == warmup.settings_key(c, rt.model_config)
  assert meta["demos"][method] == warmup.demos_digest(warmup.demonstrations(m, c))
  assert (warmup.BUNDLED / "model.safetensors").stat().st_size < 8 * 2**20


# ------------------------------------------------------------------------------- layering

def test_no_package_imports_inside_functions():
  """Only optional heavy dependencies are imported lazily; the package's own modules at the top."""
  offenders = []
  for path in (ROOT / "scope_jax").rglob("*.py"):
    tree = ast.parse(path.read_text())
    for fn in ast.walk(tree):
      if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      for node in ast.walk(fn):
        names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                 else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        if any(n == "scope_jax" or n.startswith("scope_jax.") for n in names):
          offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
  assert not offenders, offenders


def test_sharding_does_not_import_the_models():
  code = "import sys, scope_jax.sharding; print('scope_jax.models' in sys.modules)"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
  assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_the_warm_up_of_a_real_vocabulary_takes_chunked_log_probs_and_remat():
  """A 151,936-token vocabulary never forms [B, T, V] logits in the warm-up (2 rows × 3K tokens
  of them are 3.7 GB in float32, and a 0.5B model's warm-up ran out of 23 GB): log-probs come in
  `loss.chunk` chunks and the layers are rematerialised as `model.remat` says; the bundled
  models' 2,048 keep whole logits (the fastest, and the fits they were cached under)."""
  import types  # pylint: disable=import-outside-toplevel
  c = spell_config_small()
  c.model.remat = "full"
  for vocab, chunk in ((2048, 0), (warmup.FULL_LOGITS_VOCAB, 0), (151_936, c.loss.chunk)):
    rt = types.SimpleNamespace(config=c, model_config=types.SimpleNamespace(vocab_size=vocab))
    assert warmup.fit_memory(rt) == {"chunk": chunk, "remat": "full"}, vocab
