"""A mixture of experts' train step compiled for a v5p slice (2 layers, 16 experts, top-4, short
rows, expert-parallel on 4 chips): under a capacity its exchange buffers hold 1.25x a shard's
pairs, and the plan's FLOPs (megablox's cost estimate follows the buffer's rows) and
interconnect bytes follow them; dropless, they hold the worst case, 4x."""

import importlib

import jax
import ml_collections
import pytest

from scope_jax.core import runner
from scope_jax.models import moe
from scope_jax.plan import report, topology

D, E, K, SHARDS = 256, 16, 4, 4


def _config(capacity: float) -> ml_collections.ConfigDict:
  """spell:paper_qwen3_moe on a small Qwen3-MoE whose experts carry most of its FLOPs, without
  remat (so the plan's ratio shows the experts' rows, not the recomputed forward)."""
  config = importlib.import_module("configs.spell").get_config("paper_qwen3_moe")
  config.model.source = "tiny"
  config.model.tiny = ml_collections.ConfigDict(dict(
      model_type="qwen3_moe", vocab_size=512, hidden_size=D, intermediate_size=4 * D,
      num_layers=2, num_heads=2, num_kv_heads=1, head_dim=128, qk_norm=True, num_experts=E,
      num_experts_per_tok=K, moe_intermediate_size=256))
  config.model.remat = "none"
  config.model.moe_capacity_factor = capacity
  config.spell.questions_per_step = 2
  config.spell.group_size = 2
  config.rollout.max_context = 256
  config.rollout.max_prompt_tokens = 128
  config.rollout.slots = 8
  config.mesh.shape = (1, 1, 1, SHARDS)
  return config


@pytest.mark.parametrize("capacity", [1.25, 0.0])
def test_the_exchange_buffers_and_the_train_flops_follow_the_capacity(capacity):
  pytest.importorskip("libtpu")
  config = _config(capacity)
  s = topology.parse("v5p-8")
  runner.validate(config, devices=topology.devices(s), data=False)
  # the tests' "highest" matmul precision asks bfloat16 kernels for float32 passes, which Mosaic
  # refuses; runs use the default
  with jax.default_matmul_precision("default"):
    plan = report.build(config, s, programs="train_step")
  (step,) = plan.compiled
  (est,) = [e for e in plan.estimates() if e.kind == "train"]
  p = step.program
  tokens = p.rows // p.micro_batches * p.columns // SHARDS  # a micro-batch's tokens on a chip
  pairs = tokens * K
  _, rows = moe.exchange_rows(tokens, SHARDS, K, E, capacity)
  assert rows == (5 * pairs // 4 if capacity else 4 * pairs)  # 4 experts a shard: 4x at worst
  # Each layer and micro-batch: a forward's dispatch (into the receive buffer) and combine
  # (back into the pairs), their transposes in the backward, and each frozen forward's pair,
  # bf16 rows of D; beside them a few int32 all-to-alls of offsets.
  exchanges = p.micro_batches * 2 * (2 + p.forwards) * (rows + pairs) * D * 2
  a2a = step.collectives["all-to-all"].bytes
  assert exchanges <= a2a < exchanges + 2 ** 16, (a2a, exchanges)
  ratio = est.flops / est.flops_minimum
  if capacity:
    assert ratio <= 1.5, ratio
    assert est.ici_bytes_per_chip <= 1.5 * est.ici_bytes_per_chip_minimum
  else:
    assert ratio > 2.5, ratio  # the worst-case buffers cost the experts 4x their routed rows
  assert plan.fits
