"""Copy QA (examples/copy_qa.py) on the demo's tiny model and the bundled corpus."""

import ml_collections

from scope_jax import configs_base as base


def get_config(arg=None) -> ml_collections.ConfigDict:
  c = base.base_config()
  c.preset = base.parse_preset(arg, ("demo",))
  c.method = "copy_qa"
  c.method_module = "examples.copy_qa"  # a method outside the package: its module
  c.copy_qa = ml_collections.ConfigDict()
  c.copy_qa.batch = 4  # documents per step
  c.copy_qa.group_size = 4  # G answers per document
  c.copy_qa.roles = ml_collections.ConfigDict({"answerer": base.role(16, temperature=1.0)})
  c.rollout.max_context = 1024
  c.rollout.max_prompt_tokens = 768
  c.rollout.slots = 16
  base.demo_rollout(c)
  return c
