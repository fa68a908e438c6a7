"""Gemma-2 and OLMo-2/3 block by block against transformers (PyTorch, float32), the sampler
against the direct forward across sliding windows, and a train step on every family."""

import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from scope_jax.models import init_params, tiny_config
from scope_jax.models import ops
from scope_jax.models.config import get_preset
from scope_jax.rl import sft
from scope_jax.rollout.types import Span, Trajectory
from scope_jax.sampling import generate
from tests.sampling.test_sampler import _direct_logprobs

FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "olmo2", "olmo3", "qwen3_moe"]


def _torch(x):
  import torch
  return torch.tensor(np.asarray(x))


def test_gemma_rms_norm_scales_by_one_plus_w():
  from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
  rng = np.random.default_rng(0)
  x, w = rng.normal(size=(2, 5, 64)).astype(np.float32), rng.normal(size=64).astype(np.float32)
  ref = Gemma2RMSNorm(64, eps=1e-6)
  ref.weight.data = _torch(w)
  chex.assert_trees_all_close(np.asarray(ops.rms_norm(x, w, 1e-6, plus_one=True)),
                              ref(_torch(x)).detach().numpy(), rtol=0, atol=1e-5)


def test_olmo_qk_norm_spans_the_whole_projection():
  from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm
  rng = np.random.default_rng(1)
  x, w = rng.normal(size=(2, 5, 4, 16)).astype(np.float32), rng.normal(size=(4, 16)).astype(np.float32)
  ref = Olmo2RMSNorm(64, eps=1e-6)
  ref.weight.data = _torch(w.reshape(-1))
  want = ref(_torch(x.reshape(2, 5, 64))).detach().numpy().reshape(x.shape)
  chex.assert_trees_all_close(np.asarray(ops.rms_norm(x, w, 1e-6, axes=2)), want, rtol=0, atol=1e-5)


def test_geglu_mlp_matches_gemma2():
  from flax import nnx
  from transformers import Gemma2Config
  from transformers.models.gemma2.modeling_gemma2 import Gemma2MLP
  from scope_jax.models import modules
  cfg = tiny_config("gemma2")
  ours = modules.MLP(cfg, rngs=nnx.Rngs(0))
  ref = Gemma2MLP(Gemma2Config(**cfg.to_hf_config()))
  ref.gate_proj.weight.data = _torch(np.asarray(ours.gate[...]).T)
  ref.up_proj.weight.data = _torch(np.asarray(ours.up[...]).T)
  ref.down_proj.weight.data = _torch(np.asarray(ours.down[...]).T)
  x = np.random.default_rng(2).normal(size=(2, 5, cfg.hidden_size)).astype(np.float32)
  chex.assert_trees_all_close(np.asarray(ours(jnp.asarray(x))), ref(_torch(x)).detach().numpy(),
                              rtol=0, atol=1e-5)


@pytest.mark.parametrize("window", [0, 3])
def test_soft_capped_windowed_attention_matches_eager(window):
  """ops.attend (scale, soft-cap, window by position) against HF's eager attention with the
  same mask, on a GQA block of 9 queries."""
  from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward
  rng = np.random.default_rng(3)
  b, t, n, k, h = 2, 9, 4, 2, 16
  q = rng.normal(size=(b, t, n, h)).astype(np.float32)
  kk, v = (rng.normal(size=(b, t, k, h)).astype(np.float32) for _ in range(2))
  pos = np.broadcast_to(np.arange(t), (b, t)).astype(np.int32)
  ours = ops.attend(jnp.asarray(q), jnp.asarray(kk), jnp.asarray(v), jnp.asarray(pos),
                    jnp.ones((b, t), bool), q_pos_BT=jnp.asarray(pos), k_pos_BS=jnp.asarray(pos),
                    window=jnp.int32(window), scale=24 ** -0.5, cap=0.5)
  allowed = np.tril(np.ones((t, t), bool))
  if window:
    allowed &= (np.arange(t)[:, None] - np.arange(t)[None, :]) < window
  mask = np.where(allowed, 0.0, -np.inf).astype(np.float32)[None, None]
  module = types.SimpleNamespace(num_key_value_groups=n // k, training=False, head_dim=h)
  tr = lambda x: _torch(x).transpose(1, 2)
  ref, _ = eager_attention_forward(module, tr(q), tr(kk), tr(v), _torch(mask), scaling=24 ** -0.5,
                                   softcap=0.5)
  chex.assert_trees_all_close(np.asarray(ours), ref.numpy(), rtol=0, atol=1e-5)


def test_softcap_bounds_and_identity():
  x = jnp.linspace(-100.0, 100.0, 11)
  assert float(jnp.abs(ops.softcap(x, 30.0)).max()) < 30.0
  chex.assert_trees_all_equal(ops.softcap(x, 0.0), x)


@pytest.mark.parametrize("model_type", ["gemma2", "olmo3", "qwen3_moe"])
def test_sampler_logprobs_equal_direct_forward_across_windows(model_type):
  """16 decode steps from prompts of 1–9 tokens cross the 4-position window many times; the
  final soft-cap is applied in the sampler exactly as in the forward."""
  cfg = tiny_config(model_type, eos_token_id=None)
  params = init_params(cfg, jax.random.key(5))
  prompts = [[3, 17, 42, 9, 100, 7, 8, 11, 250], [5], [60, 61, 62, 63]]
  for temperature in (0.0, 1.0):
    for r in generate(cfg, params, prompts, max_new_tokens=16, temperature=temperature, seed=1):
      ref = _direct_logprobs(cfg, params, prompts[r.prompt_index], r.tokens, temperature)
      chex.assert_trees_all_close(r.logprobs, ref, atol=1e-5, rtol=0)


def _random_rows(cfg, lengths, seed, logprob=0.0):
  """Trajectories of random tokens: a 3-token prompt, then a response of the rest."""
  rng = np.random.default_rng(seed)
  rows = []
  for n in lengths:
    tokens = rng.integers(0, cfg.vocab_size, n).astype(np.int32)
    mask = np.r_[np.zeros(3), np.ones(n - 3)].astype(np.int32)
    rows.append(Trajectory(tokens, mask, (logprob * mask).astype(np.float32), 3,
                           [Span(0, 3, "prompt")], [], None, None, "eos"))
  return rows


@pytest.mark.parametrize("model_type", FAMILIES)
def test_train_step_lowers_the_loss_with_finite_gradients(model_type):
  cfg = tiny_config(model_type)
  params = init_params(cfg, jax.random.key(6))
  batch = sft.pack(_random_rows(cfg, (12, 9, 14, 6), seed=7), 16)
  for chunk in (0, 8):  # whole logits, and the chunked log-prob path the RL step uses
    grads = jax.grad(lambda p: sft.nll_loss(cfg, p, batch, dtype=jnp.float32, chunk=chunk))(params)
    chex.assert_tree_all_finite(grads)
  opt = optax.adam(1e-2)
  step = sft.make_sft_step(cfg, opt, chunk=8)
  p, state = jax.tree.map(jnp.copy, params), opt.init(params)
  losses = []
  for _ in range(8):
    p, state, loss = step(p, state, batch)
    losses.append(float(loss))
  assert losses[-1] < 0.7 * losses[0], losses


def test_gemma2_and_olmo_presets_match_the_published_shapes():
  g2, g9, o3 = get_preset("gemma2-2b"), get_preset("gemma2-9b"), get_preset("olmo3-7b")
  assert (g2.num_layers, g2.hidden_size, g2.num_heads, g2.num_kv_heads, g2.head_dim) == (26, 2304, 8, 4, 256)
  assert (g2.attn_softcap, g2.final_softcap, g2.sliding_window) == (50.0, 30.0, 4096)
  assert g2.windows[:2] == (4096, 0) and g9.num_layers == 42 and g9.tie_embeddings
  assert o3.windows[:4] == (4096, 4096, 4096, 0) and o3.norm_layout == "post" and o3.qk_norm_full


def _moe_block(cfg):
  """Our MoE block and HF's, sharing weights chosen so that expert 7 never wins and the other
  experts' loads are uneven: inputs are positive, expert 7's router column is negative."""
  import torch
  from flax import nnx
  from transformers import Qwen3MoeConfig
  from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
  from scope_jax.models import modules
  ours = modules.MoE(cfg, rngs=nnx.Rngs(0))
  router = np.abs(np.asarray(ours.router[...])) * np.linspace(0.2, 2.0, cfg.num_experts)
  router[:, 7] = -1.0
  ours.router[...] = jnp.asarray(router, jnp.float32)
  ref = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(**cfg.to_hf_config()))
  with torch.no_grad():
    ref.gate.weight.copy_(_torch(router.T))
    gate, up, down = (np.asarray(x[...]) for x in (ours.expert_gate, ours.expert_up, ours.expert_down))
    ref.experts.gate_up_proj.copy_(_torch(np.concatenate([gate, up], -1).transpose(0, 2, 1)))
    ref.experts.down_proj.copy_(_torch(down.transpose(0, 2, 1)))
  return ours, ref


def test_moe_block_with_uneven_loads_and_an_idle_expert_matches_hf():
  cfg = tiny_config("qwen3_moe")
  ours, ref = _moe_block(cfg)
  x = np.abs(np.random.default_rng(8).normal(size=(2, 7, cfg.hidden_size))).astype(np.float32)
  y, stats = ours(jnp.asarray(x))
  chex.assert_trees_all_close(np.asarray(y), ref(_torch(x)).detach().numpy(), rtol=0, atol=1e-5)
  load = np.asarray(stats["load"])
  assert load[7] == 0 and load.sum() == 2 * 7 * cfg.num_experts_per_tok
  assert load.max() > 2 * load[load > 0].min()  # uneven
  assert float(stats["computed"]) == load.sum()  # dropless: every (token, expert) pair computed


def test_router_metrics_and_the_hf_load_balancing_loss(tmp_path):
  import torch
  from scope_jax.models import forward, save_hf, transformer
  from tests.hf_reference import hf_model, padded_batch
  from tests.helpers import router_metrics
  cfg = tiny_config("qwen3_moe")
  params = init_params(cfg, jax.random.key(9))
  tokens, mask = padded_batch(cfg.vocab_size, [9, 5], 9, left=False, seed=10)
  _, _, router = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask),
                         return_router=True)
  m = router_metrics(cfg, router)
  shares = np.array([float(m[f"router/load_expert_{e}"]) for e in range(cfg.num_experts)])
  np.testing.assert_allclose(shares.sum(), 1.0, rtol=0, atol=1e-6)
  assert float(m["router/dropped"]) == 0.0 and float(m["router/max_load"]) == shares.max()
  np.testing.assert_allclose(float(router["tokens"].sum()), cfg.num_layers * 14, rtol=0, atol=0)
  save_hf(cfg, params, tmp_path)
  model = hf_model(tmp_path)
  with torch.no_grad():
    out = model(input_ids=_torch(tokens).long(), attention_mask=_torch(mask).long(),
                output_router_logits=True)
  np.testing.assert_allclose(float(transformer.router_aux_loss(cfg, router)),
                             float(out.aux_loss), rtol=1e-5, atol=0)


@pytest.mark.parametrize("coef", [0.0, 0.01])
def test_moe_train_step_logs_loads_and_adds_the_balancing_loss_on_request(coef):
  from scope_jax.rl.batch import make_batch
  from scope_jax.rl.train_step import LossConfig, init_train_state, make_train_step
  cfg = tiny_config("qwen3_moe")
  params = init_params(cfg, jax.random.key(11))
  trajs = _random_rows(cfg, (10, 7, 12, 5), seed=12, logprob=-3.0)
  batch = make_batch(trajs, [1.0, -1.0, 0.5, -0.5])
  opt = optax.adam(1e-3)
  step = make_train_step(cfg, LossConfig(router_aux_coef=coef, chunk=8), opt, micro_batches=2)
  _, m = step(init_train_state(params, opt), jax.tree.map(jnp.asarray, batch))
  shares = [float(m[f"router/load_expert_{e}"]) for e in range(cfg.num_experts)]
  np.testing.assert_allclose(sum(shares), 1.0, rtol=0, atol=1e-6)
  assert float(m["router/dropped"]) == 0.0 and float(m["router_aux"]) > 0
  want = float(m["pg_loss"]) + coef * float(m["router_aux"])
  np.testing.assert_allclose(float(m["loss"]), want, rtol=1e-6, atol=1e-7)


def test_moe_checkpoint_streams_into_expert_shards(tmp_path):
  """save_hf writes one tensor per expert (the Hub layout); load_hf reads each device's experts
  straight into their shards on an `expert` mesh axis."""
  from scope_jax import sharding as shd
  from scope_jax.models import load_hf, save_hf
  cfg = tiny_config("qwen3_moe")
  params = init_params(cfg, jax.random.key(13))
  save_hf(cfg, params, tmp_path)
  mesh = shd.make_mesh((1, 2, 1, 4))
  loaded_cfg, loaded = load_hf(tmp_path, mesh=mesh)
  assert loaded_cfg == cfg
  gate = loaded["layers"]["expert_gate"]
  assert gate.sharding.spec[1] == "expert"
  assert gate.addressable_shards[0].data.shape[1] == cfg.num_experts // 4
  chex.assert_trees_all_equal(jax.tree.map(np.asarray, loaded), jax.tree.map(np.asarray, params))


def test_olmo3_yarn_on_full_attention_layers_matches_transformers(tmp_path):
  """OLMo-3's long-context rope: YaRN on the full-attention layers, plain rope on the sliding
  ones; the inverse frequencies and attention factor equal HF's, and so do the logits."""
  import transformers
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  from scope_jax.models import forward, save_hf
  from scope_jax.models.config import RopeScaling, rope_attention_scaling, rope_inv_freq
  from tests.hf_reference import hf_logits, hf_model, padded_batch
  cfg = tiny_config("olmo3", rope_full_only=True,
                    rope_scaling=RopeScaling("yarn", factor=4.0, original_max_position_embeddings=1024))
  hf_cfg = transformers.Olmo3Config(**cfg.to_hf_config())
  inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](hf_cfg, "cpu", layer_type="full_attention")
  chex.assert_trees_all_close(rope_inv_freq(cfg), inv_freq.numpy(), rtol=1e-6, atol=0)
  np.testing.assert_allclose(rope_attention_scaling(cfg), factor, rtol=1e-7)
  assert len(set(np.round(rope_inv_freq(cfg) / rope_inv_freq(cfg.replace(rope_scaling=None)), 4))) > 2
  params = init_params(cfg, jax.random.key(14))
  save_hf(cfg, params, tmp_path)
  from scope_jax.models import load_hf
  assert load_hf(tmp_path)[0] == cfg
  tokens, mask = padded_batch(cfg.vocab_size, [13, 7, 1], 13, left=True)
  ours, _ = forward(cfg, params, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
  ref = hf_logits(hf_model(tmp_path), tokens, mask)
  m = mask.astype(bool)
  chex.assert_trees_all_close(np.asarray(ours)[m], ref[m], rtol=0, atol=1e-4)
