"""The sampler and the engine on blockwise cache attention (`ops.attend_cached`, the default on
a single CPU device; this process has 8 devices, so it is forced here): log-probs equal a direct
forward over contexts of several key blocks, and greedy rows stay identical between the two."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax.models import init_params, ops, tiny_config
from scope_jax.sampling import Engine, Sampler
from tests.sampling.test_engine import _direct_logprobs, _same_rows


@pytest.fixture
def blockwise(monkeypatch):
  monkeypatch.setenv(ops.CACHE_ATTENTION_ENV, "blockwise")
  jax.clear_caches()  # programs are traced again, now with the blockwise path
  assert ops.blockwise_cache_attention()
  yield
  jax.clear_caches()


def _prompts(vocab: int):
  rng = np.random.default_rng(0)
  # 700 and 530 tokens: more than one 512-key block, a last block overlapping the one before
  return [rng.integers(3, vocab, n).tolist() for n in (700, 530, 40)]


@pytest.mark.parametrize("family", ["qwen2", "gemma2"])  # gemma2: sliding windows, soft-caps
def test_blockwise_logprobs_equal_a_direct_forward(blockwise, family):
  cfg = tiny_config(family)
  params = init_params(cfg, jax.random.key(1))
  prompts = _prompts(cfg.vocab_size)
  kw = dict(max_new_tokens=8, temperature=0.8, num_samples=2, seed=3, eos_ids=())
  sampled = Sampler(cfg, params, max_context=1024).generate(prompts, **kw)
  engine = Engine(cfg, params, num_slots=4, chunk=4, prefill_rows=2, max_context=1024)
  sampled += engine.generate(prompts, **kw)
  for r in sampled:
    prompt = prompts[r.prompt_index]
    want = _direct_logprobs(cfg, params, prompt + r.tokens.tolist(), 0.8)[len(prompt) - 1:]
    chex.assert_trees_all_close(r.logprobs, want, atol=1e-5, rtol=1e-7)


def test_blockwise_greedy_continuations_match_the_sampler(blockwise):
  """A second turn appended to parked slots (prefill at an offset into the cache) decodes the
  same tokens as the sampler's prefill of the whole context."""
  cfg = tiny_config("qwen2")
  params = init_params(cfg, jax.random.key(2))
  prompts = _prompts(cfg.vocab_size)
  engine = Engine(cfg, params, num_slots=4, chunk=4, prefill_rows=2, max_context=1024)
  first = engine.generate(prompts, max_new_tokens=6, eos_ids=())
  contexts = [p + r.tokens.tolist() + [5, 6, 7] * 60 for p, r in zip(prompts, first)]
  ref = Sampler(cfg, params, max_context=1024).generate(contexts, max_new_tokens=10, eos_ids=())
  ours = engine.generate(contexts, max_new_tokens=10, eos_ids=())
  _same_rows(ours, ref)
  assert engine.stats["prefill_tokens"] < sum(map(len, prompts)) + sum(map(len, contexts))


def test_cache_attention_choice_is_checked(monkeypatch):
  monkeypatch.setenv(ops.CACHE_ATTENTION_ENV, "flash")
  with pytest.raises(ValueError, match="SCOPE_JAX_CACHE_ATTENTION='flash'"):
    ops.blockwise_cache_attention()
  monkeypatch.setenv(ops.CACHE_ATTENTION_ENV, "dense")
  assert not ops.blockwise_cache_attention()
  monkeypatch.delenv(ops.CACHE_ATTENTION_ENV)
  assert ops.blockwise_cache_attention() == (jax.default_backend() == "cpu"
                                             and jax.device_count() == 1)
