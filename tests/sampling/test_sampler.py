"""The sampler against a direct forward, against transformers.generate, and statistically."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from scope_jax import sharding as shd
from scope_jax.models import init_params, save_hf, tiny_config
from scope_jax.models.transformer import forward_jit
from scope_jax.sampling import (Sampler, SamplingSpec, compile_counts, generate, select_tokens,
                                truncate_logits)
from scope_jax.sampling import sampler as sampler_lib
from scope_jax.sampling.engine import Engine
from scope_jax.sampling.stops import find_stop
from scope_jax.shapes import length_bucket

PROMPTS = [[3, 17, 42, 9, 100, 7, 8, 11, 250], [5], [60, 61, 62, 63]]


@pytest.fixture(scope="module")
def model():
  cfg = tiny_config("qwen2", eos_token_id=2)
  return cfg, init_params(cfg, jax.random.key(0))


def _direct_logprobs(cfg, params, prompt, tokens, temperature):
  seq = np.asarray([list(prompt) + list(tokens)], np.int32)
  logits = np.asarray(forward_jit(cfg, params, jnp.asarray(seq), jnp.ones_like(jnp.asarray(seq))))
  logits = logits[0, len(prompt) - 1:-1] / (temperature or 1.0)
  logp = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)
  return np.asarray(jnp.take_along_axis(logp, jnp.asarray(tokens)[:, None], -1)[:, 0])


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_logprobs_equal_direct_forward(model, temperature, top_k, top_p):
  cfg, params = model
  results = generate(cfg, params, PROMPTS, max_new_tokens=10, temperature=temperature,
                     top_k=top_k, top_p=top_p, seed=3, num_samples=2)
  assert [r.prompt_index for r in results] == [0, 0, 1, 1, 2, 2]
  for r in results:
    assert len(r.tokens) > 0 and r.logprobs.dtype == np.float32
    ref = _direct_logprobs(cfg, params, PROMPTS[r.prompt_index], r.tokens, temperature)
    chex.assert_trees_all_close(r.logprobs, ref, atol=1e-5, rtol=0)


def test_greedy_matches_transformers_generate(model, tmp_path):
  import torch
  from tests.hf_reference import hf_model
  cfg, params = model
  save_hf(cfg, params, tmp_path)
  hf = hf_model(tmp_path)
  ours = generate(cfg, params, PROMPTS, max_new_tokens=12)
  for p, r in zip(PROMPTS, ours):
    with torch.no_grad():
      out = hf.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                        do_sample=False, max_new_tokens=12, eos_token_id=2, pad_token_id=0)
    ref = out[0, len(p):].numpy()
    chex.assert_trees_all_equal(r.tokens, ref)
    assert r.finish_reason == ("eos" if ref[-1] == 2 else "length")


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (0, 0.8), (8, 0.6)])
def test_top_k_top_p_frequencies(top_k, top_p):
  """Chi-square goodness of fit to the truncated, renormalised distribution.

  The p-value threshold 1e-4 is the false-alarm rate of each case; tokens outside the support
  must never be drawn.
  """
  v, n, temperature = 24, 40_000, 0.9
  logits = jnp.asarray(np.random.default_rng(0).normal(0, 1.5, (v,)), jnp.float32)
  spec = SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p)
  keys = jax.random.split(jax.random.key(7), n)
  draw = jax.jit(jax.vmap(lambda k: select_tokens(logits[None], k, spec)[0][0]))
  counts = np.bincount(np.asarray(draw(keys)), minlength=v)

  probs = np.asarray(jax.nn.softmax(logits / temperature), np.float64)
  order = np.argsort(-probs)
  support = np.zeros(v, bool)
  support[order[:top_k or v]] = True
  sorted_p = probs[order] * support[order] / (probs[order] * support[order]).sum()
  if top_p < 1:
    keep = (np.cumsum(sorted_p) - sorted_p) < top_p
    support[order[~keep]] = False
  expected = probs * support / (probs * support).sum()
  assert counts[~support].sum() == 0
  _, pvalue = stats.chisquare(counts[support], n * expected[support])
  assert pvalue > 1e-4, (counts, n * expected)


PROBS = np.array([0.1, 0.2, 0.3, 0.4])


class TokenSelectionTest(chex.TestCase):
  """Token selection on a hand-built distribution p = (.1, .2, .3, .4), eagerly and under jit (the
  spec static, as in the decode): which tokens may be drawn, and each drawn token's log-prob under
  the temperature-scaled full distribution."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_truncation_masks_outside_top_k_and_top_p(self):
    truncate = self.variant(truncate_logits, static_argnames=("top_k", "top_p"))
    logits = jnp.log(jnp.asarray(PROBS, jnp.float32))[None]
    top2 = np.where(PROBS >= 0.3, np.asarray(logits[0]), sampler_lib.NEG)[None]
    chex.assert_trees_all_equal(truncate(logits, 2, 1.0), top2)
    chex.assert_trees_all_equal(truncate(logits, 0, 0.5), top2)  # mass before .3 is .4 < .5
    chex.assert_trees_all_equal(truncate(logits, 3, 0.5), top2)
    chex.assert_trees_all_equal(truncate(logits, 0, 1.0), logits)

  @chex.variants(with_jit=True, without_jit=True)
  def test_greedy_takes_the_argmax_with_its_untempered_logprob(self):
    select = self.variant(select_tokens, static_argnames=("spec",))
    logits = jnp.log(jnp.asarray([PROBS, PROBS[::-1]], jnp.float32))
    token, logp = select(logits, jax.random.key(0), SamplingSpec(temperature=0.0))
    chex.assert_trees_all_equal(token, np.array([3, 0], np.int32))
    chex.assert_trees_all_close(logp, np.log([0.4, 0.4]), rtol=1e-6, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_traced_temperature_scales_the_logprob(self):
    """Top-1 at T = 0.5: always token 3, with log-prob log(.4² / Σ p²) = log(.16 / .30), whether
    the temperature is traced (the decode's way) or in the spec."""
    select = self.variant(select_tokens, static_argnames=("spec",))
    logits = jnp.log(jnp.broadcast_to(jnp.asarray(PROBS, jnp.float32), (8, 4)))
    expected = np.full(8, np.log(0.16 / 0.30))
    token, logp = select(logits, jax.random.key(1), SamplingSpec(temperature=1.0, top_k=1),
                         jnp.float32(0.5))
    chex.assert_trees_all_equal(token, np.full(8, 3, np.int32))
    chex.assert_trees_all_close(logp, expected, rtol=1e-6, atol=0)
    token, logp = select(logits, jax.random.key(1), SamplingSpec(temperature=0.5, top_k=1))
    chex.assert_trees_all_equal(token, np.full(8, 3, np.int32))
    chex.assert_trees_all_close(logp, expected, rtol=1e-6, atol=0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sampling_draws_only_inside_the_truncated_support(self):
    """At T = 1, top-p .35 keeps token 3 alone, and top-k 2 keeps tokens 2 and 3 (both drawn over
    256 rows); top-k and top-p do not renormalise the log-prob: it stays log p."""
    select = self.variant(select_tokens, static_argnames=("spec",))
    logits = jnp.log(jnp.broadcast_to(jnp.asarray(PROBS, jnp.float32), (256, 4)))
    token, logp = select(logits, jax.random.key(2), SamplingSpec(temperature=1.0, top_p=0.35))
    chex.assert_trees_all_equal(token, np.full(256, 3, np.int32))
    chex.assert_trees_all_close(logp, np.full(256, np.log(0.4)), rtol=1e-6, atol=0)
    token, logp = select(logits, jax.random.key(3), SamplingSpec(temperature=1.0, top_k=2))
    assert set(np.asarray(token).tolist()) == {2, 3}
    chex.assert_trees_all_close(logp, np.log(PROBS[np.asarray(token)]), rtol=1e-6, atol=0)


def _char_decoder(vocab):
  table = [f"<t{i}>" if i % 7 == 0 else chr(ord("a") + i % 26) * (1 + i % 3) for i in range(vocab)]
  return lambda ids: "".join(table[i] for i in ids)


def test_stop_string_spanning_tokens_truncates_exactly(model):
  cfg, params = model
  decode = _char_decoder(cfg.vocab_size)
  sampler = Sampler(cfg, params, decode=decode, stop_check_interval=4)
  free = sampler.generate([PROMPTS[0]], max_new_tokens=24, eos_ids=())[0]
  toks = free.tokens.tolist()
  k = 9  # stop string = tail of token 7, all of token 8, head of token 9 → spans three tokens
  a, b, c = decode(toks[7:8]), decode(toks[8:9]), decode(toks[9:10])
  stop = a[-1:] + b + c[:1]
  full = decode(toks)
  first = full.find(stop)
  assert first >= 0
  stopped = sampler.generate([PROMPTS[0]], max_new_tokens=24, stop=[stop, "nevermatches"],
                             eos_ids=())[0]
  assert stopped.finish_reason == "stop" and stopped.stop == stop
  assert stopped.text == full[:first + len(stop)]
  n = stopped.tokens.size
  assert n <= k + 1 and decode(toks[:n]).find(stop) >= 0 and decode(toks[:n - 1]).find(stop) < 0
  chex.assert_trees_all_equal((stopped.tokens, stopped.logprobs),
                              (free.tokens[:n], free.logprobs[:n]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(stop=[""]), "non-empty strings"), (dict(stop="</search>"), "non-empty strings"),
    (dict(temperature=float("nan")), "temperature=nan"), (dict(temperature=-1.0), "temperature=-1"),
    (dict(top_p=0.0, temperature=1.0), "top_p=0.0"), (dict(top_k=-1), "top_k=-1")])
def test_what_would_silently_sample_wrong_is_refused(model, kwargs, match):
  """An empty stop string once ended every row after one token; a NaN temperature ran greedy."""
  cfg, params = model
  for player in (Sampler(cfg, params, decode=_char_decoder(cfg.vocab_size)),
                 Engine(cfg, params, num_slots=2, decode=_char_decoder(cfg.vocab_size))):
    with pytest.raises(ValueError, match=match):
      player.generate([PROMPTS[0]], max_new_tokens=4, **kwargs)


def test_find_stop_unit():
  decode = lambda ids: "".join(["</", "search", ">", "x", "</se", "arch>tail"][i] for i in ids)
  m = find_stop([3, 0, 1, 2, 3], ["</search>"], decode)
  assert (m.num_tokens, m.text) == (4, "x</search>")
  m = find_stop([3, 4, 5], ["</search>"], decode)
  assert (m.num_tokens, m.text) == (3, "x</search>")  # the completing token also carries "tail"
  assert find_stop([3, 3], ["</search>"], decode) is None


def test_fork_prefills_each_prompt_once(model):
  cfg, params = model
  sampler = Sampler(cfg, params)
  results = sampler.generate(PROMPTS[:2], max_new_tokens=6, temperature=1.0, num_samples=8, seed=1)
  assert len(results) == 16
  assert sampler.stats["prefill_calls"] == 1 and sampler.stats["prefill_rows"] == 2
  distinct = {tuple(r.tokens) for r in results if r.prompt_index == 0}
  assert len(distinct) > 1  # the forked rows sample independently


def test_budgets_and_compiles_are_bounded(model):
  cfg, params = model
  sampler = Sampler(cfg, params, max_context=14)
  before = compile_counts()
  r = sampler.generate([[1] * 10, [1] * 12], max_new_tokens=8, eos_ids=())
  assert [len(x.tokens) for x in r] == [4, 2]  # context budget 14
  assert all(x.finish_reason == "length" for x in r)
  mid = compile_counts()
  sampler.generate([[1] * 9, [1] * 15], max_new_tokens=8, eos_ids=())  # same buckets
  assert compile_counts() == mid and mid["prefill"] - before["prefill"] <= 1
  assert length_bucket(1) == 16 and length_bucket(17) == 32 and length_bucket(3000) == 3072


def test_temperatures_share_one_decode_program(model):
  """Roles that differ only in temperature reuse the compiled decode; the traced temperature
  samples exactly what a spec with that temperature baked in does."""
  cfg, params = model
  sampler = Sampler(cfg, params)
  sampler.generate(PROMPTS[:2], max_new_tokens=6, temperature=0.7, seed=3)
  before = compile_counts()
  hot = sampler.generate(PROMPTS[:2], max_new_tokens=6, temperature=1.3, seed=3)
  assert compile_counts() == before
  logits = jax.random.normal(jax.random.key(0), (4, cfg.vocab_size))
  key = jax.random.key(1)
  baked = select_tokens(logits, key, SamplingSpec(temperature=1.3))
  traced = jax.jit(lambda t: select_tokens(logits, key, SamplingSpec(temperature=1.0), t))(
      jnp.float32(1.3))
  chex.assert_trees_all_equal(baked[0], traced[0])
  chex.assert_trees_all_close(baked[1], traced[1], rtol=1e-6, atol=0)
  assert len(hot) == 2


def test_sharded_sampler_matches_single_device(model):
  cfg, _ = model
  cfg = cfg.replace(num_heads=8, num_kv_heads=4, head_dim=8)
  params = init_params(cfg, jax.random.key(1))
  single = generate(cfg, params, PROMPTS, max_new_tokens=8, temperature=0.8, seed=5, num_samples=2)
  mesh = shd.make_mesh((2, 1, 4))
  sharded = generate(cfg, params, PROMPTS, max_new_tokens=8, temperature=0.8, seed=5,
                     num_samples=2, mesh=mesh)
  for a, b in zip(single, sharded):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
    chex.assert_trees_all_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-7)


def test_bad_prompts_are_reported(model):
  cfg, params = model
  with pytest.raises(ValueError, match="Prompt 1 is empty"):
    generate(cfg, params, [[1], []], max_new_tokens=2)
  with pytest.raises(ValueError, match=r"Prompt 0 has token ids outside \[0, 256\): \[999\]"):
    generate(cfg, params, [[999]], max_new_tokens=2)
  with pytest.raises(ValueError, match="Stop strings need a tokenizer"):
    generate(cfg, params, [[1]], max_new_tokens=2, stop=["</a>"])
