"""Every numeric field of every preset, swept with values out of its range: validation refuses
each in one line that names the field (a size of 0 once hung the engine, a NaN temperature ran
greedy, a group of one trained on zero advantages)."""

import importlib.util
import json
import math
import os
import re

import ml_collections
import pytest

from scope_jax.models import hf_io, load, tiny_config
from scope_jax.core import bounds, runner, smoke
from scope_jax.core import method as method_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METHODS = ("spell", "scope", "opensir", "asl", "piplay")


def _module(method):
  spec = importlib.util.spec_from_file_location(f"configs_{method}",
                                                os.path.join(ROOT, "configs", f"{method}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


PRESETS = [(m, p) for m in METHODS for p in _module(m).PRESETS]


def _set(config, path, value):
  *parents, last = path.split(".")
  section = config
  for part in parents:
    section = section[part]
  section[last] = value


def invalid_values(bound: bounds.Bound, value):
  """Values just outside `bound`, and NaN for a float field (an int field refuses NaN and
  fractions itself: the config is type-safe)."""
  whole = isinstance(value[0] if isinstance(value, tuple) else value, int)
  out = [] if whole else [math.nan]
  if math.isfinite(bound.low):
    out.append(bound.low if bound.open_low else bound.low - 1)
  if math.isfinite(bound.high):
    out.append(bound.high + 1)
  return [int(x) for x in out] if whole else [float(x) for x in out]


@pytest.mark.parametrize("method,preset", PRESETS)
def test_every_numeric_field_is_checked(method, preset):
  module = _module(method)
  fields = list(bounds.numeric_fields(module.get_config(preset)))
  assert len(fields) > 40
  own = bounds.of_method(runner.load_method(module.get_config(preset)).METHOD)
  swept = 0
  for path, value in fields:
    bound = bounds.rule(path, *own)
    assert bound is not None, (f"{method}:{preset} {path} has no range in bounds.RULES nor in "
                               f"the method's own bounds")
    assert bound.problem(value if not isinstance(value, tuple) else value[0]) is None, path
    for bad in invalid_values(bound, value):
      config = module.get_config(preset)
      _set(config, path, (bad,) + value[1:] if isinstance(value, tuple) else bad)
      with pytest.raises(ValueError) as e:
        runner.validate(config)
      message = str(e.value)
      assert path in message and "\n" not in message, (path, bad, message)
      swept += 1
  assert swept >= len(fields)  # at least one bad value per field


@pytest.mark.parametrize("path,value,match", [
    ("rollout.slots", 0, "rollout.slots=0 must be at least 1"),
    ("rollout.prefill_chunk", 0, "rollout.prefill_chunk=0"),
    ("rollout.chunk", 0, "rollout.chunk=0"),
    ("learner.micro_batch_rows", 0, "learner.micro_batch_rows=0"),
    ("optim.lr", -1.0, "optim.lr=-1.0 must be above 0"),
    ("optim.lr", math.nan, "optim.lr=nan is not finite"),
    ("optim.warmup_steps", -1, "optim.warmup_steps=-1"),
    ("loss.temperature", 0.0, "loss.temperature=0.0 must be above 0"),
    ("spell.roles.responder.max_new_tokens", 0, "spell.roles.responder.max_new_tokens=0"),
    ("spell.roles.responder.temperature", -1.0, "spell.roles.responder.temperature=-1.0"),
    ("spell.roles.responder.temperature", math.nan, "temperature=nan is not finite"),
    ("spell.roles.responder.top_p", 0.0, "spell.roles.responder.top_p=0.0"),
    ("spell.roles.responder.top_k", 10**7, "top_k=10000000 must be at most 1000000"),
    ("spell.group_size", 1, "spell.group_size=1 must be at least 2"),
    ("spell.group_size", 0, "spell.group_size=0"),
    ("spell.verifier_agreement", (0.9, 0.1), r"spell.verifier_agreement=\(0.9, 0.1\) must be"),
    ("model.source", "nonsense", "Unknown model.source 'nonsense'"),
    ("spell.warmup.skill", "hop3", "^spell.warmup.skill='hop3': use 'hop1' or 'attr'"),
    ("spell.warmup.answers", "right", "^spell.warmup.answers='right': use 'wrong' or 'chance'"),
    ("spell.warmup.right_share", 1.0, r"^spell.warmup.right_share=1.0: use a share in \[0, 1\)"),
    ("spell.warmup.right_share", -0.1, r"^spell.warmup.right_share=-0.1 must be at least 0"),
    ("eval.num_samples", 0, "eval.num_samples=0 must be at least 1"),
    ("model.param_dtype", "float17", "model.param_dtype='float17' is not valid"),
    ("eval.temperature", -0.5, "eval.temperature=-0.5 must be at least 0"),
    ("rollout.dtype", "float16", "^rollout.dtype='float16' is not valid"),
    ("loss.rollout_correction.mode", "clip", "^loss.rollout_correction.mode='clip' is not valid"),
    ("loss.rollout_correction.level", "geometric", "^loss.rollout_correction.level='geometric'"),
    ("loss.rollout_correction.threshold", 1.0,
     r"^loss.rollout_correction.threshold=1.0 must be above 1 \(weights are kept within"),
])
def test_the_values_a_careless_user_types(path, value, match):
  config = _module("spell").get_config("demo")
  _set(config, path, value)
  with pytest.raises(ValueError, match=match):
    runner.validate(config)


@pytest.mark.parametrize("method,path,value,match", [
    ("opensir", "opensir.warmup.right_share", 1.0,
     r"^opensir.warmup.right_share=1.0: use a share in \[0, 1\)"),
    ("opensir", "opensir.warmup.guess_share", 1.0,
     r"^opensir.warmup.guess_share=1.0: use a share in \[0, 1\)"),
    ("opensir", "opensir.warmup.worked_ways", 5,
     "^opensir.warmup.worked_ways=5: use 1 to 4 openings"),
    ("opensir", "opensir.warmup.worked_ways", 0,
     r"^opensir.warmup.worked_ways=0 must be at least 1 \(a size or count"),
    ("piplay", "piplay.warmup.skill", "hop2", "^piplay.warmup.skill='hop2': use 'hop1' or 'attr'"),
    ("piplay", "piplay.warmup.right_share", 1.0,
     r"^piplay.warmup.right_share=1.0: use a share in \[0, 1\)"),
    ("asl", "asl.slope_window", 1, r"^asl.slope_window=1 must be at least 2 \(a slope needs"),
    ("scope", "scope.stage1_grader_temperature", -1.0,
     r"^scope.stage1_grader_temperature=-1.0 must be at least 0 \(0 turns it off\)"),
])
def test_a_method_checks_its_own_settings(method, path, value, match):
  """Each method's own ranges and warm-up knobs live in its package and are checked as before."""
  config = _module(method).get_config("demo")
  _set(config, path, value)
  with pytest.raises(ValueError, match=match):
    runner.validate(config, data=False)


def test_a_method_of_your_own_declares_its_bounds():
  """`Method.bounds` rules come first; a field no rule names is the method's own `validate`'s."""
  config = _module("spell").get_config("demo")
  mine = (("spell.questions_per_step", bounds.Bound(100, why="mine")),)
  with pytest.raises(ValueError, match=r"spell.questions_per_step=\d+ must be at least 100 \(mine\)"):
    bounds.check(config, mine)
  config.unit_test = ml_collections.ConfigDict({"knob": -3})
  bounds.check(config)  # no rule names unit_test.knob: left to its method
  assert method_lib.Method.bounds == () and method_lib.Method.section_bound is None
  assert bounds.of_method(method_lib.Method) == ((), ())
  assert bounds.rule("spell.questions_per_step") is None  # the shared rules name no method
  spell = runner.load_method(config).METHOD
  assert bounds.rule("spell.questions_per_step", *bounds.of_method(spell)) == bounds.SIZE
  assert bounds.rule("spell.group_size", *bounds.of_method(spell)) == bounds.GROUP  # shared first


def test_a_smoke_run_is_checked_after_it_shrinks():
  config = _module("asl").get_config("paper")
  config.smoke = True
  config.asl.roles.pg.temperature = -1.0
  with pytest.raises(ValueError, match="asl.roles.pg.temperature=-1.0"):
    runner.validate(config)


def test_smoke_says_what_it_changed_and_refuses_a_bad_value_it_would_replace():
  config = _module("spell").get_config("paper")
  config.smoke, config.model.tokenizer = True, "demo"
  config.total_steps, config.rollout.max_prompt_tokens = 5, 9000
  module = runner.load_method(config)
  changed = smoke.shrink(config, module.METHOD.smoke)
  assert changed[0] == "total_steps 5 → 1", changed
  assert "rollout.max_prompt_tokens 9000 → 3072" in changed
  assert smoke.shrink(config, module.METHOD.smoke) == []  # shrinking twice changes nothing
  config = _module("spell").get_config("paper")
  config.smoke, config.model.tokenizer, config.warmup.steps = True, "demo", -3
  with pytest.raises(ValueError, match="warmup.steps=-3"):
    runner.validate(config, data=False)


def test_smoke_of_the_moe_preset_drops_the_experts_capacity_with_its_experts():
  """Smoke swaps Qwen3-30B-A3B for the dense real 0.5B model; a capacity factor left behind
  would refuse the dense model when it loads."""
  config = _module("spell").get_config("paper_qwen3_moe")
  assert config.model.moe_capacity_factor > 0
  config.smoke = True
  smoke.shrink(config, runner.load_method(config).METHOD.smoke)
  assert config.model.moe_capacity_factor == 0
  dense = tiny_config("qwen2")
  assert load.run_options(dense, config.model) == dense  # the real model loads as it is
  config.model.moe_capacity_factor = 1.25
  with pytest.raises(ValueError, match="only with a mixture of experts"):
    load.run_options(dense, config.model)


@pytest.mark.parametrize("method", ["asl", "piplay", "scope"])
def test_smoke_warmup_is_opt_in_and_sized_for_a_real_model(method):
  """Smoke turns the warm-up off, unless `smoke_warmup` asks for a format warm-up: then that
  many steps at a real model's rate on a few documents, and shrinking twice changes nothing."""
  config = _module(method).get_config("paper")
  config.smoke, config.model.tokenizer = True, "demo"
  config.warmup.steps = 7
  module = runner.load_method(config)
  smoke.shrink(config, module.METHOD.smoke)
  assert config.warmup.steps == 0
  config = _module(method).get_config("paper")
  config.smoke, config.model.tokenizer, config.smoke_warmup = True, "demo", 24
  changed = smoke.shrink(config, module.METHOD.smoke)
  w = config.warmup
  assert (w.steps, w.lr, w.batch_rows, w.documents) == (24, smoke.WARMUP_LR, 2, 16), w
  assert w.max_tokens == smoke.WARMUP_TOKENS, w  # bounded attention memory on a CPU
  assert "warmup.steps 0 → 24" in changed
  assert smoke.shrink(config, module.METHOD.smoke) == []
  config.smoke_warmup = -2
  with pytest.raises(ValueError, match="smoke_warmup=-2"):
    smoke.shrink(config, module.METHOD.smoke)


@pytest.mark.parametrize("method, preset",
                         [("spell", "demo"), ("spell", "learn"), ("asl", "learn")])
def test_smoke_refuses_the_presets_that_already_run_on_one_machine(method, preset):
  """Smoke on `demo`/`learn` would zero the warm-up that makes their model and train a random
  tiny one: refused in one line naming a paper preset."""
  config = _module(method).get_config(preset)
  config.smoke = True
  with pytest.raises(ValueError, match=re.escape(
      f"the '{preset}' preset already runs on one machine") + ".*" + re.escape(
          f"configs/{method}.py:paper")):
    runner.validate(config)


@pytest.mark.parametrize("method", ["piplay", "scope"])
def test_a_smoke_run_saves_one_checkpoint_at_the_end(method, tmp_path):
  config = _module(method).get_config("paper")
  config.smoke, config.model.tokenizer = True, "demo"
  config.retrieval.encoder = "minilm"
  runner.validate(config, data=False)
  assert config.checkpoint_every == config.total_steps == 2


@pytest.mark.parametrize("key, value, match", [
    ("num_attention_heads", 0, "num_attention_heads=0 must be a positive integer"),
    ("hidden_size", None, "hidden_size=None must be a positive integer"),
    ("hidden_size", -896, "hidden_size=-896 must be"),
    ("hidden_size", 896.7, "hidden_size=896.7 must be"),
    ("num_key_value_heads", 0, "num_key_value_heads=0 must be"),
    ("hidden_size", 900, "hidden_size=900 is not a multiple of num_attention_heads=14"),
])
def test_a_damaged_hf_config_is_one_line_before_loading(tmp_path, key, value, match):
  hf = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
        "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
        "num_key_value_heads": 2, "tie_word_embeddings": True}
  (tmp_path / "config.json").write_text(json.dumps({**hf, key: value}))
  config = _module("spell").get_config("demo")
  config.model.source = f"hf:{tmp_path}"
  with pytest.raises(ValueError, match=re.escape(match)):
    runner.validate(config, data=False)
  (tmp_path / "config.json").write_text(json.dumps(hf))
  hf_io.check_hf_config(config.model.source)  # the intact file passes


def test_the_evaluator_checks_a_damaged_hf_config_too(tmp_path):
  from scope_jax.evaluation import models  # pylint: disable=import-outside-toplevel
  (tmp_path / "config.json").write_text(json.dumps(
      {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
       "num_hidden_layers": 1, "num_attention_heads": 0}))
  with pytest.raises(ValueError, match="num_attention_heads=0 must be a positive integer"):
    models.check_spec(f"hf:{tmp_path}")
