"""The rollout engine against the sampler (greedy, token for token), against a direct forward
(log-probs), against itself under other schedules (sampled rows), and sharded vs unsharded."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import init_params, tiny_config
from scope_jax.models.transformer import forward_jit
from scope_jax.rollout import RolloutConfig, run_rollout
from scope_jax.sampling import Engine, Request, Sampler
from scope_jax.sampling import engine as engine_lib
from tests.rollout.fakes import ActionTokenizer, CharTokenizer, DictTool, action_model

PROMPTS = [[3, 17, 42, 9, 100, 7, 8, 11, 250], [5], [60, 61, 62, 63], [9, 9, 9, 9, 9, 9, 9]]
TOK = ActionTokenizer()
DOCS = DictTool({"a": "Doc 1 (Title: Alpha) alpha is the first letter",
                 "b": "Doc 2 (Title: Beta) beta comes after alpha", "c": "nothing"})
QUESTIONS = [TOK.encode(q) for q in ["Who wrote it?", "Where is x", "What?", "Name the river"]]


@pytest.fixture(scope="module")
def model():
  cfg = tiny_config("qwen2", eos_token_id=2)
  return cfg, init_params(cfg, jax.random.key(0))


def _rollout_engine(cfg, params):
  """One engine shape for every multi-turn test, so they share compiled programs."""
  return Engine(cfg, params, num_slots=3, chunk=4, prefill_rows=2, decode=TOK.decode,
                max_context=512)


def _same_rows(ours, ref, *, atol=1e-5):
  assert len(ours) == len(ref)
  for a, b in zip(ours, ref):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
    assert a.finish_reason == b.finish_reason
    chex.assert_trees_all_close(a.logprobs, b.logprobs, atol=atol, rtol=1e-7)


def _direct_logprobs(cfg, params, seq, temperature=1.0):
  seq = jnp.asarray(np.asarray(seq, np.int32)[None])
  logits = forward_jit(cfg, params, seq, jnp.ones_like(seq))[0, :-1] / temperature
  logp = jax.nn.log_softmax(logits, axis=-1)
  return np.asarray(jnp.take_along_axis(logp, seq[0, 1:, None], -1)[:, 0])


@pytest.mark.parametrize("slots,chunk", [(2, 3), (8, 16)])
def test_greedy_generate_matches_the_sampler(model, slots, chunk):
  """More rows than slots (continuous batching) and rows ending at different steps on EOS."""
  cfg, params = model
  ref = Sampler(cfg, params).generate(PROMPTS, max_new_tokens=24, num_samples=2, eos_ids=(166,))
  engine = Engine(cfg, params, num_slots=slots, chunk=chunk, prefill_rows=2, max_context=256)
  ours = engine.generate(PROMPTS, max_new_tokens=24, num_samples=2, eos_ids=(166,))
  _same_rows(ours, ref)
  assert {r.finish_reason for r in ref} == {"eos", "length"}  # rows end at different times
  assert engine.stats["forked_rows"] == len(PROMPTS)  # G samples share their prompt's prefill


def test_greedy_stop_strings_match_the_sampler(model):
  cfg, params = model
  tok = CharTokenizer()
  ref = Sampler(cfg, params, decode=tok.decode).generate(PROMPTS, max_new_tokens=30,
                                                         stop=["\\¦", "H"], eos_ids=())
  engine = Engine(cfg, params, num_slots=4, chunk=4, decode=tok.decode, max_context=256)
  ours = engine.generate(PROMPTS, max_new_tokens=30, stop=["\\¦", "H"], eos_ids=())
  _same_rows(ours, ref)
  assert any(r.finish_reason == "stop" for r in ours)
  assert [r.text for r in ours] == [r.text for r in ref]


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_logprobs_equal_a_direct_forward(model, temperature, top_k, top_p):
  cfg, params = model
  engine = Engine(cfg, params, num_slots=4, chunk=4, max_context=256)
  out = engine.generate(PROMPTS, max_new_tokens=12, temperature=temperature, top_k=top_k,
                        top_p=top_p, num_samples=2, seed=1, eos_ids=())
  for r in out:
    prompt = PROMPTS[r.prompt_index]
    ref = _direct_logprobs(cfg, params, prompt + r.tokens.tolist(), temperature or 1.0)
    chex.assert_trees_all_close(r.logprobs, ref[len(prompt) - 1:], atol=1e-5, rtol=1e-7)


def test_sampled_rows_do_not_depend_on_slots_or_chunks(model):
  """A row's draws depend on (seed, turn, token index): any number of slots, any chunk size and
  any admission order give the same samples."""
  cfg, params = model
  runs = []
  for slots, chunk in [(1, 1), (4, 4), (8, 16)]:
    engine = Engine(cfg, params, num_slots=slots, chunk=chunk, max_context=256)
    runs.append(engine.generate(PROMPTS, max_new_tokens=16, temperature=1.0, num_samples=3, seed=7))
  for other in runs[1:]:
    _same_rows(other, runs[0], atol=2e-6)
  assert len({tuple(r.tokens.tolist()) for r in runs[0][:3]}) > 1  # samples of a prompt differ


def test_continuation_reuses_the_cache_and_matches_a_fresh_prefill(model):
  """A continuation prefills only its new tokens; one that rewrites part of the slot's history
  (a thinking model's stripped turn) is truncated to the shared prefix. Both equal a fresh run."""
  cfg, params = model
  engine = Engine(cfg, params, num_slots=4, chunk=4, max_context=256)
  sampler = Sampler(cfg, params)
  engine.add(Request("row", PROMPTS[0], 10, spec=engine_lib.SamplingSpec(eos_ids=())))
  (first,) = _drain(engine)
  context = PROMPTS[0] + first.tokens.tolist()
  for new_context in (context + [33, 34, 35], context[:len(PROMPTS[0]) + 3] + [77, 78]):
    before = engine.stats["prefill_tokens"]
    engine.add(Request("row", new_context, 10, turn=1, spec=engine_lib.SamplingSpec(eos_ids=())))
    (nxt,) = _drain(engine)
    (ref,) = sampler.generate([new_context], max_new_tokens=10, eos_ids=())
    _same_rows([nxt], [ref])
    shared = engine_lib.common_prefix(np.asarray(context), np.asarray(new_context))
    assert engine.stats["prefill_tokens"] - before == len(new_context) - shared
    context = new_context + nxt.tokens.tolist()


def test_long_inputs_prefill_in_pieces_without_short_tails(model):
  """`prefill_chunk` tokens a block, or the whole rest when at most a quarter more: 40 tokens
  (chunk 32) take one block, 70 take 32 + 38; either way equal to the sampler."""
  cfg, params = model
  engine = Engine(cfg, params, num_slots=2, chunk=4, prefill_chunk=32, max_context=256)
  assert [engine._piece(n) for n in (20, 32, 40, 41, 70)] == [20, 32, 40, 32, 32]
  sampler = Sampler(cfg, params)
  rng = np.random.default_rng(3)
  for n, calls in ((40, 1), (70, 2)):
    prompt = rng.integers(3, cfg.vocab_size, n).tolist()
    before = engine.stats["prefill_calls"]
    ours = engine.generate([prompt], max_new_tokens=6, eos_ids=())
    assert engine.stats["prefill_calls"] - before == calls
    _same_rows(ours, sampler.generate([prompt], max_new_tokens=6, eos_ids=()))


def _drain(engine):
  out = []
  while engine.busy():
    out += engine.step()
  return out


@pytest.mark.parametrize("seed,boost", [(0, 2.5), (1, 2.0)])
def test_greedy_multi_turn_rollouts_match_the_turn_by_turn_sampler(seed, boost):
  """Rows search 0 to 3 times and end at different turns; every trajectory is identical."""
  cfg, params = action_model(seed, boost)
  rc = RolloutConfig(max_turns=3, max_turn_tokens=16, temperature=0.0)
  ref = run_rollout(Sampler(cfg, params, decode=TOK.decode), TOK, QUESTIONS, DOCS, rc,
                    num_samples=2)
  engine = _rollout_engine(cfg, params)
  ours = run_rollout(engine, TOK, QUESTIONS, DOCS, rc, num_samples=2)
  assert len({t.num_searches for t in ref}) > 1  # rows end after different numbers of turns
  for a, b in zip(ours, ref):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
    chex.assert_trees_all_equal(a.loss_mask, b.loss_mask)
    chex.assert_trees_all_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-7)
    assert (a.finish_reason, a.answer, a.spans) == (b.finish_reason, b.answer, b.spans)
    assert [(c.turn, c.queries, c.result) for c in a.tool_calls] == \
        [(c.turn, c.queries, c.result) for c in b.tool_calls]
  assert not engine.busy()


def test_each_row_gets_its_own_budget_on_both_paths():
  """Under a tight max_total_tokens each row's budget is its own remaining room (13-, 10-, 5- and
  14-token prompts get up to 11, 14, 16 and 10 tokens), on the turn-by-turn sampler as on the engine,
  so results do not depend on which rows share a batch."""
  cfg, params = action_model(0, 0.0)
  rc = RolloutConfig(max_turns=2, max_turn_tokens=16, max_total_tokens=24, temperature=0.0)
  ref = run_rollout(Sampler(cfg, params, decode=TOK.decode), TOK, QUESTIONS, DOCS, rc)
  alone = [run_rollout(Sampler(cfg, params, decode=TOK.decode), TOK, [q], DOCS, rc)[0]
           for q in QUESTIONS]
  ours = run_rollout(_rollout_engine(cfg, params), TOK, QUESTIONS, DOCS, rc)
  first_turn = [t.spans[1].end - t.spans[1].start for t in ref]
  assert all(n <= b for n, b in zip(first_turn, [11, 14, 16, 10])), first_turn
  assert max(first_turn) > 10, first_turn  # a shared budget gave every row the longest's 10
  for a, b, c in zip(ours, ref, alone):
    chex.assert_trees_all_equal(a.tokens, b.tokens)
    chex.assert_trees_all_equal(b.tokens, c.tokens)
    assert a.finish_reason == b.finish_reason == c.finish_reason


def test_multi_turn_sampled_logprobs_equal_a_direct_forward():
  cfg, params = action_model(1, 2.5)
  rc = RolloutConfig(max_turns=3, max_turn_tokens=16, temperature=0.8, top_k=50)
  engine = _rollout_engine(cfg, params)
  trajs = run_rollout(engine, TOK, QUESTIONS, DOCS, rc, num_samples=2, seed=3)
  assert max(t.num_searches for t in trajs) >= 2
  for t in trajs:
    ref = _direct_logprobs(cfg, params, t.tokens, 0.8)
    gen = t.loss_mask[1:] == 1
    chex.assert_trees_all_close(t.logprobs[1:][gen], ref[gen], atol=1e-5, rtol=1e-7)


def test_engine_prefills_fewer_tokens_than_turn_by_turn():
  cfg, params = action_model(1, 2.5)
  rc = RolloutConfig(max_turns=3, max_turn_tokens=16, temperature=0.0)
  sampler = Sampler(cfg, params, decode=TOK.decode)
  run_rollout(sampler, TOK, QUESTIONS, DOCS, rc, num_samples=2)
  engine = _rollout_engine(cfg, params)
  run_rollout(engine, TOK, QUESTIONS, DOCS, rc, num_samples=2)
  assert engine.stats["prefill_tokens"] < sampler.stats["prefill_tokens"] / 2


def test_sharded_engine_matches_single_device(model):
  """Slots over the data axes of the 8-device mesh, weights in the sampling layout."""
  cfg, _ = model
  cfg = cfg.replace(num_heads=8, num_kv_heads=4, head_dim=8)
  params = init_params(cfg, jax.random.key(1))
  single = Engine(cfg, params, num_slots=8, chunk=4, max_context=128)
  mesh = shd.make_mesh((2, 2, 2))
  sharded = Engine(cfg, params, num_slots=8, chunk=4, max_context=128, mesh=mesh)
  a = single.generate(PROMPTS, max_new_tokens=10, temperature=0.8, seed=5, num_samples=3)
  b = sharded.generate(PROMPTS, max_new_tokens=10, temperature=0.8, seed=5, num_samples=3)
  _same_rows(b, a)
  sharded.add(Request("k", PROMPTS[0], 8))
  sharded.step()
  assert all(k.sharding.spec[0] == ("data", "fsdp") for k in sharded.cache.k)  # kept, donated
  sharded.cancel()
  odd = Engine(cfg, params, num_slots=8, chunk=4, max_context=128, mesh=shd.make_mesh((1, 1, 8)))
  _same_rows(odd.generate(PROMPTS, max_new_tokens=10, temperature=0.8, seed=5, num_samples=3), a)
  # 4 KV heads on tensor=8: the cache keeps its heads whole, as the sampler does


def test_samples_spread_over_the_slot_shards(model):
  """4 prompts × 2 samples on 8 slot shards: one row per shard (each shard prefills its own
  copy in the same call), so decoding runs 8 rows, not 16 rows half of them padding."""
  cfg, params = model
  mesh = shd.make_mesh((1, 8, 1))
  engine = Engine(cfg, params, num_slots=16, chunk=16, max_context=128, mesh=mesh)
  rows = engine.generate(PROMPTS[:4], max_new_tokens=10, num_samples=2, eos_ids=())
  _same_rows(rows, Sampler(cfg, params).generate(PROMPTS[:4], max_new_tokens=10,
                                                 num_samples=2, eos_ids=()))
  assert engine.stats["decoded_row_steps"] == 8 * 10
  assert engine.stats["forked_rows"] == 0


def test_programs_compile_once_per_shape(model):
  cfg, params = model
  engine = Engine(cfg, params, num_slots=4, chunk=4, max_context=256)
  run = lambda t, seed=0: engine.generate(PROMPTS, max_new_tokens=8, num_samples=2, eos_ids=(),
                                          temperature=t, seed=seed)
  run(0.0), run(1.0)
  before = engine_lib.compile_counts()
  for seed in range(3):  # a temperature is traced: every positive one shares the program
    run(0.5 + seed / 10, seed)
  run(0.0)
  assert engine_lib.compile_counts() == before


def test_later_calls_reuse_the_cache_and_new_weights_empty_it(model):
  """The cache outlives a call: a prompt still held by a slot costs one token of prefill and
  gives the same rows. New weights empty every slot, so nothing the old ones computed is used."""
  cfg, params = model
  engine = Engine(cfg, params, num_slots=8, chunk=4, max_context=256)
  run = lambda: engine.generate(PROMPTS, max_new_tokens=12, num_samples=2, eos_ids=())
  first = run()
  prefilled = engine.stats["prefill_tokens"]
  _same_rows(run(), first)
  assert engine.stats["prefill_tokens"] == prefilled + len(PROMPTS)  # each prompt's last token
  other = init_params(cfg, jax.random.key(1))
  engine.update_params(other)
  ref = Sampler(cfg, other).generate(PROMPTS, max_new_tokens=12, num_samples=2, eos_ids=())
  _same_rows(run(), ref)
  assert engine.stats["prefill_tokens"] == 2 * prefilled + len(PROMPTS)
  engine_lib.free_caches()  # before training: the memory goes back; the next call allocates
  assert engine.cache is None
  _same_rows(run(), ref)
  assert engine.cache is not None
  judge = Engine(cfg, params, num_slots=8, chunk=4, max_context=256)  # a role on other weights
  judge.generate(PROMPTS[:1], max_new_tokens=2)
  assert engine.cache is None and judge.cache is not None  # one cache at a time


def test_an_error_mid_call_leaves_a_clean_engine(model):
  """A call cut off by an exception (here the tokenizer, mid stop-string check) drops what it
  was doing; the engine's next call is exact, with no half-written slot reused as a prefix."""
  cfg, params = model
  tok, calls = CharTokenizer(), []

  def flaky(ids):
    calls.append(1)
    if len(calls) == 1:
      raise RuntimeError("tokenizer failed")
    return tok.decode(ids)

  engine = Engine(cfg, params, num_slots=4, chunk=4, decode=flaky, max_context=256)
  run = lambda: engine.generate(PROMPTS, max_new_tokens=30, stop=["H"], eos_ids=())
  with pytest.raises(RuntimeError, match="tokenizer failed"):
    run()
  assert not engine.busy()
  ref = Sampler(cfg, params, decode=tok.decode).generate(PROMPTS, max_new_tokens=30, stop=["H"],
                                                         eos_ids=())
  _same_rows(run(), ref)


def test_bad_requests_are_reported(model):
  cfg, params = model
  engine = Engine(cfg, params, num_slots=2, chunk=2, max_context=64)
  with pytest.raises(ValueError, match="Prompt 1 is empty"):
    engine.generate([[1], []], max_new_tokens=2)
  engine.add(Request("k", [1, 2], 40, spec=engine_lib.SamplingSpec(eos_ids=())))
  with pytest.raises(ValueError, match="'k' is still generating"):
    engine.step()
    engine.add(Request("k", [1, 2, 3], 4))
  engine.cancel()
  assert not engine.busy()
  (r,) = engine.generate([list(range(1, 64))], max_new_tokens=8)  # one slot of room left
  assert len(r.tokens) == 1 and r.finish_reason in ("length", "eos")
