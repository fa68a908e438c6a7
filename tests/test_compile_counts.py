"""Compile counts, checked with chex.assert_max_traces on the Python functions the jitted programs
trace.

The sampler's `_decode` is jitted when its module is imported, so the guard goes on
`select_tokens`: the decode loop's body looks it up in the sampler module while it is traced, once
per trace of `_decode`. The train step is jitted inside `make_train_step`, which binds
`train_step._micro_loss` when it builds the step, so wrapping that function before the step is
built puts the guard inside the traced step. Each test also shows that its guard can trip.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params, tiny_config
from scope_jax.rl import learner as learner_lib
from scope_jax.rl import optim, train_step
from scope_jax.sampling import sampler as sampler_lib
from tests.helpers import compiled_steps
from tests.rollout.fakes import random_trajectory

CFG = tiny_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
                  head_dim=16)
PROMPTS = [[3, 17, 42, 9], [5], [60, 61, 62]]


@pytest.fixture(autouse=True)
def _clear_trace_counter():
  chex.clear_trace_counter()


@pytest.fixture(scope="module")
def params():
  return init_params(CFG, jax.random.key(0))


def _guard_decode(monkeypatch, n: int):
  """From here on the decode program may be traced at most `n` times: its compiled cache is
  emptied, so the next call traces, and `select_tokens` counts the traces."""
  sampler_lib._decode.clear_cache()
  monkeypatch.setattr(sampler_lib, "select_tokens",
                      chex.assert_max_traces(sampler_lib.select_tokens, n=n))


def _decode_traces():
  return sampler_lib.compile_counts()["decode"]


def test_decode_traces_once_across_calls_and_chunks(params, monkeypatch):
  """Calls with the same buckets reuse one decode program: other prompts, seeds and budgets, and
  the chunks between stop-string checks (the step limit is traced)."""
  _guard_decode(monkeypatch, n=1)
  sampler = sampler_lib.Sampler(CFG, params, decode=lambda ids: "", stop_check_interval=2)
  before = _decode_traces()
  sampler.generate(PROMPTS[:2], max_new_tokens=8, temperature=1.0, stop=["never"], seed=0,
                   eos_ids=())
  sampler.generate(PROMPTS[1:], max_new_tokens=7, temperature=1.0, stop=["never"], seed=1,
                   eos_ids=())
  assert sampler.stats["decode_calls"] == 8  # 4 chunks of 2 steps per call
  assert _decode_traces() == before + 1  # the guarded trace did happen
  with pytest.raises(AssertionError, match="traced > 1 times"):  # a new budget bucket retraces
    sampler.generate(PROMPTS[:2], max_new_tokens=9, temperature=1.0, seed=0, eos_ids=())


def test_sharded_decode_traces_once_across_chunks(params, monkeypatch):
  """On the 8-device mesh the later chunks of a call (stop strings) reuse the first's program."""
  _guard_decode(monkeypatch, n=1)
  sampler = sampler_lib.Sampler(CFG, params, mesh=shd.make_mesh((1, -1, 1)),
                                decode=lambda ids: "", stop_check_interval=2)
  sampler.generate(PROMPTS[:2], max_new_tokens=8, temperature=1.0, stop=["never"], seed=0,
                   eos_ids=())


def test_roles_differing_only_in_temperature_share_one_decode(params, monkeypatch):
  """The temperature-sharing rule: temperature is a traced argument of the decode, so roles that
  differ only in temperature run one program; a spec that baked the temperature in (what
  `SamplingSpec.compiled()` prevents) would retrace and trips the guard."""
  _guard_decode(monkeypatch, n=1)
  sampler = sampler_lib.Sampler(CFG, params)
  before = _decode_traces()
  for temperature in (0.7, 1.0, 1.3):
    sampler.generate(PROMPTS, max_new_tokens=6, temperature=temperature, top_p=0.9, seed=3)
  assert _decode_traces() == before + 1
  monkeypatch.setattr(sampler_lib.SamplingSpec, "compiled", lambda spec: spec)
  with pytest.raises(AssertionError, match="traced > 1 times"):
    sampler.generate(PROMPTS, max_new_tokens=6, temperature=0.5, top_p=0.9, seed=3)


def _traj(rng, prompt_len, response_len):
  return random_trajectory(rng, CFG.vocab_size, prompt_len, response_len)


def test_train_step_traces_once_across_updates(params, monkeypatch):
  """Updates with batches in the same buckets reuse one compiled step, fed the state it returned.
  `_micro_loss` is traced twice per trace of the step (by jax.eval_shape for the accumulators, and
  under value_and_grad in the micro-batch scan), so n=2 allows exactly one; a batch in a wider
  length bucket compiles a new step and trips the guard."""
  monkeypatch.setattr(train_step, "_micro_loss",
                      chex.assert_max_traces(train_step._micro_loss, n=2))
  learner = learner_lib.Learner(CFG, optim.make_optimizer(1e-3, grad_clip=None), None,
                                micro_batch_rows=2)
  policy = learner.init_policy("p", jax.tree.map(jnp.copy, params),
                               train_step.LossConfig(chunk=8))
  rng = np.random.default_rng(0)
  for i in range(3):  # prompts of 3-5 and responses of 2-4 tokens: one 16 + 16 column bucket
    learner.train(policy, [_traj(rng, 3 + i, 2 + i), _traj(rng, 5, 4)], [1.0, -1.0])
  assert int(policy.state.step) == 3 and compiled_steps(learner) == 1
  with pytest.raises(AssertionError, match="traced > 2 times"):
    learner.train(policy, [_traj(rng, 4, 20), _traj(rng, 5, 4)], [1.0, -1.0])
