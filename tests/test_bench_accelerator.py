"""`bench.accelerator`: its FLOP and byte arithmetic by hand, and its tiny dry mode end to end on
the CPU (the table it prints on an accelerator comes from the same code)."""

import chex
import pytest

from bench import accelerator
from scope_jax.models import config as model_config


def test_train_flops_are_six_n_plus_causal_attention_by_hand():
  cfg = model_config.get_preset("qwen2.5-0.5b")  # tied: the embedding is the lm_head, counted once
  n = accelerator.count_params(cfg)
  assert accelerator.matmul_params(cfg) == n
  attn = 6 * 24 * 14 * 64 * 1024  # 6 · L · N · H · T
  assert accelerator.train_flops_per_token(cfg, 1024) == 6 * n + attn
  untied = model_config.get_preset("qwen2.5-7b")  # the input embedding is a lookup, not a matmul
  assert (accelerator.matmul_params(untied)
          == accelerator.count_params(untied) - 152064 * 3584)


def test_decode_bytes_are_the_weights_once_and_each_rows_cache():
  cfg = model_config.get_preset("qwen2.5-0.5b")
  weights, kv = accelerator.decode_step_bytes(cfg, 100, "bfloat16")
  assert weights == accelerator.count_params(cfg) * 2
  assert kv == 2 * 24 * 2 * 64 * 2 * 100  # K and V · L · kv heads · head dim · bytes · positions


def test_device_peaks_match_device_kinds():
  chex.assert_trees_all_close(accelerator.device_peak("NVIDIA H200").hbm_bandwidth, 4.8e12)
  assert accelerator.device_peak("NVIDIA H100 80GB HBM3").bf16_flops == 989e12
  assert accelerator.device_peak("TPU v5p").bf16_flops == 459e12
  assert accelerator.device_peak("cpu") is None


def test_arguments_are_checked():
  with pytest.raises(SystemExit):
    accelerator.parse(["--short=64", "--long=32"])


def test_dry_mode_prints_one_table_on_the_cpu(capsys):
  assert accelerator.main(["--dry"]) == 0
  out = capsys.readouterr().out
  table = [l for l in out.splitlines() if l.startswith("| tiny")]
  assert [l.split(" | ")[2] for l in table] == ["decode, batch 1", "decode, batch 4",
                                                "train, 2×64"]
  assert all("tok/s" in l for l in table)
