"""Settings per run stay countable: each preset's resolved config has at most the number of
settings (leaf paths) recorded beside it, with the reason for that many. A preset that grows past
its budget fails here until the budget is raised with a reason, or a setting goes."""

import importlib

import pytest

from scope_jax import configs_base

SHARED = 129  # configs_base.base_config(): 43 mesh (shape and 42 sharding rules), 18 model
# (moe_capacity_factor among them; 11 of the tiny architecture), 7 warm-up (max_tokens among
# them), 14 loss (3 of the rollout correction: mode, level, threshold), 10 eval, 9 rollout (the
# samplers' dtype among them), 6 optim, 4 lora (rank, alpha, targets, dropout: adapters for
# every policy), 2 learner, 3 world and 13 of the run (method, preset, seed, steps, checkpoints,
# control, smoke, smoke_warmup, ...). Every preset's budget below rose by 4 with the rollout
# correction and the samplers' dtype, by 4 more with the lora section, spell's by 1 with
# world.heldout_entities, and every one by 1 with warmup.max_tokens and by 1 with
# model.moe_capacity_factor.

# preset -> (budget, why that many). Each is SHARED plus the method's own section.
BUDGETS = {
    "spell:demo": (176, "shared + 7 data (corpus clustering) + 35 spell: 20 knobs, 3 roles × 5"),
    "spell:learn": (176, "as spell:demo"),
    "spell:learn_extractive": (176, "as spell:demo"),
    "spell:paper": (176, "as spell:demo"),
    "spell:small": (176, "as spell:demo"),
    "spell:paper_qwen3_moe": (176, "as spell:demo"),
    "scope:demo": (203, "shared + 6 retrieval + 64 scope: 35 knobs (8 of the task-set filter, "
                        "2 per-policy loss overrides), 5 roles × 5 and turn limits for the 2 that search"),
    "scope:learn": (203, "as scope:demo"),
    "scope:learn_slow_challenger": (203, "as scope:demo"),
    "scope:paper": (203, "as scope:demo"),
    "scope:paper_qwen3": (203, "as scope:demo"),
    "scope:paper_olmo3": (203, "as scope:demo"),
    "opensir:demo": (170, "shared + 37 opensir: 27 knobs (6 of the initial pool, 4 teacher and 2 "
                          "selection weights), 2 roles × 5"),
    "opensir:learn": (170, "as opensir:demo"),
    "opensir:learn_planted_guess": (170, "as opensir:demo"),
    "opensir:paper": (170, "as opensir:demo"),
    "opensir:paper_gemma2": (170, "as opensir:demo"),
    "asl:demo": (202, "shared + 6 retrieval + 63 asl: 42 knobs (6 phase limits, 3 stores, 2 plateau "
                      "windows), 3 roles × 7"),
    "asl:learn": (202, "as asl:demo"),
    "asl:learn_frozen_grm": (202, "as asl:demo"),
    "asl:paper": (202, "as asl:demo"),
    "piplay:demo": (192, "shared + 6 retrieval + 53 piplay: 32 knobs (8 distillation loss "
                         "overrides: K, tail, support, renormalisation, cap among them; 3 data "
                         "generation), 3 roles × 7"),
    "piplay:learn": (192, "as piplay:demo"),
    "piplay:learn_lambda10x": (192, "as piplay:demo"),
    "piplay:paper": (200, "piplay:demo + Dr.Zero's per-policy optimizer overrides (examiner lr "
                          "and clip, student clip and warm-up), tool output in characters per "
                          "role (3) and the examiner's own 4K context"),
    "piplay:paper_instruct": (200, "as piplay:paper"),
}


def leaf_paths(tree: dict, prefix: str = "") -> list[str]:
  """Every setting's dotted path (a tuple is one setting; an empty section holds none)."""
  out = []
  for key, value in tree.items():
    if isinstance(value, dict):
      out += leaf_paths(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


def _presets():
  methods = sorted(p.stem for p in configs_base.PACKAGED.glob("[!_]*.py"))
  return [(m, p) for m in methods
          for p in importlib.import_module(f"scope_jax.configs.{m}").PRESETS]


def test_the_shared_base_is_counted():
  assert len(leaf_paths(configs_base.base_config().to_dict())) == SHARED


def test_leaf_paths_counts_by_hand():
  assert leaf_paths({"a": 1, "b": {"c": (1, 2), "d": {}, "e": {"f": ""}}}) == ["a", "b.c", "b.e.f"]


@pytest.mark.parametrize("method,preset", _presets())
def test_preset_stays_within_its_settings_budget(method, preset):
  name = f"{method}:{preset}"
  assert name in BUDGETS, (f"{name} has no settings budget: add it to BUDGETS with its count and "
                           "the reason for that many.")
  budget, why = BUDGETS[name]
  config = importlib.import_module(f"scope_jax.configs.{method}").get_config(preset)
  count = len(leaf_paths(config.to_dict()))
  assert count <= budget, (f"{name} has {count} settings, over its budget of {budget} ({why}): "
                           "drop a setting, or raise the budget with the reason beside it.")


def test_every_budget_names_a_preset():
  stale = sorted(set(BUDGETS) - {f"{m}:{p}" for m, p in _presets()})
  assert not stale, f"budgets for presets that no longer exist: {stale}"
