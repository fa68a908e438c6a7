"""Multi-turn rollouts: exact token layout, masks, turn rules, and robustness to bad actions."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import init_params, tiny_config
from scope_jax.models.transformer import forward_jit
from scope_jax.rollout import RolloutConfig, run_rollout
from scope_jax.rollout.agent import (INVALID_ACTION_FUNCTION_CALLS, INVALID_ACTION_QWEN,
                                    INVALID_ACTION_XML, TOOL_ERROR)
from scope_jax.sampling import Sampler
from tests.rollout.fakes import CharTokenizer, DictTool, ScriptedSampler

TOK = CharTokenizer()
DOC = "Doc 1(Title: Paris) Paris is the capital of France."


def _layout(traj):
  return [(s.kind, s.text) for s in traj.spans]


def test_scripted_episode_token_layout():
  cfg = RolloutConfig(max_turns=2, max_obs_tokens=20)
  prompt = TOK.encode("Q?")
  scripts = [["<think>hm</think><search>capital of France</search>IGNORED", "<answer>Paris</answer>"],
             ["<answer>Rome</answer>"]]
  sampler = ScriptedSampler(scripts, TOK)
  tool = DictTool({"capital of France": DOC})
  t0, t1 = run_rollout(sampler, TOK, [prompt], tool, cfg, num_samples=2)

  obs = "\n\n<information>" + DOC[:20] + "</information>\n\n"
  assert _layout(t0) == [("prompt", ""),
                         ("generated", "<think>hm</think><search>capital of France</search>"),
                         ("observation", obs), ("generated", "<answer>Paris</answer>")]
  assert TOK.decode(t0.tokens.tolist()) == "Q?" + "".join(text for _, text in _layout(t0))
  # loss mask: 1 on every generated token, 0 on prompt and observation
  expected = np.concatenate([np.zeros(2), np.ones(51), np.zeros(len(obs)), np.ones(22)])
  chex.assert_trees_all_equal(t0.loss_mask, expected)
  unscored = t0.logprobs[t0.loss_mask == 0]
  chex.assert_trees_all_equal(unscored, np.zeros_like(unscored))
  assert np.all(t0.logprobs[t0.loss_mask == 1] < 0)
  assert (t0.finish_reason, t0.final_tag, t0.answer, t0.num_searches) == ("final", "answer", "Paris", 1)
  assert (t1.answer, t1.finish_reason, t1.num_searches, t1.sample_index) == ("Rome", "final", 0, 1)
  assert tool.calls == [["capital of France"]]
  assert t0.tool_calls[0].result == DOC
  assert sampler.calls[0] == {"n": 2, "stop": ["</answer>", "</search>"]}


def test_max_turns_then_final_turn_without_search():
  cfg = RolloutConfig(max_turns=2)
  scripts = [["<search>a</search>", "<search>b</search>", "<search>c</search>"]]
  sampler = ScriptedSampler(scripts, TOK)
  tool = DictTool({})
  (t,) = run_rollout(sampler, TOK, [TOK.encode("Q")], tool, cfg)
  assert len(sampler.calls) == 3  # max_turns generations + one final turn
  assert sampler.calls[-1]["stop"] == ["</answer>"]  # search disabled in the final turn
  assert t.num_searches == 2 and tool.calls == [["a"], ["b"]]
  assert t.finish_reason == "max_turns" and t.answer is None


def test_malformed_actions_and_tool_errors_become_observations():
  cfg = RolloutConfig(syntax="qwen", max_turns=3)
  scripts = [['<tool_call>{"name": "search", "arguments": {"query": </tool_call>',
              '<tool_call>{"name": "search", "arguments": {"query_list": ["x", "y"]}}</tool_call>',
              "<answer>done</answer>"]]
  tool = DictTool({}, fail=True)
  (t,) = run_rollout(ScriptedSampler(scripts, TOK), TOK, [TOK.encode("Q")], tool, cfg)
  kinds = [s.kind for s in t.spans]
  assert kinds == ["prompt", "generated", "observation", "generated", "observation", "generated"]
  assert t.spans[2].text == INVALID_ACTION_QWEN
  assert TOOL_ERROR.split("(")[0] in t.spans[4].text and "index offline" in t.spans[4].text
  assert t.tool_calls[0].queries == ["x", "y"] and t.tool_calls[0].error is not None
  assert t.num_searches == 0 and t.num_invalid == 1 and t.answer == "done"
  for s in t.spans:
    assert set(t.loss_mask[s.start:s.end]) <= ({1} if s.kind == "generated" else {0})


def test_function_calls_episode():
  """OLMo-3's <function_calls>search(query=…): the turn stops at </function_calls>, results come
  back inside <information>, a malformed call gets the syntax's own correction, <task> ends it."""
  cfg = RolloutConfig(syntax="function_calls", max_turns=3, max_obs_tokens=20,
                      final_tags=("task",))
  scripts = [['<think>a</think><function_calls>search(query="capital of France")</function_calls>',
              "<function_calls>task(x)</function_calls>", "<task>Compare them.</task>"]]
  tool = DictTool({"capital of France": DOC})
  sampler = ScriptedSampler(scripts, TOK)
  (t,) = run_rollout(sampler, TOK, [TOK.encode("Q")], tool, cfg)
  assert sampler.calls[0]["stop"] == ["</task>", "</function_calls>"]
  assert _layout(t)[2] == ("observation", "\n\n<information>" + DOC[:20] + "</information>\n\n")
  assert _layout(t)[4] == ("observation", INVALID_ACTION_FUNCTION_CALLS)
  assert (t.num_searches, t.num_invalid, t.final_tag, t.answer) == (1, 1, "task", "Compare them.")
  assert tool.calls == [["capital of France"]]


def test_eos_without_tag_and_text_after_stop():
  cfg = RolloutConfig(max_turns=1)
  scripts = [["I don't know"], ["<search>q</search> trailing", "no tag"]]
  trajs = run_rollout(ScriptedSampler(scripts, TOK), TOK, [TOK.encode("A"), TOK.encode("B")],
                      DictTool({}), cfg)
  assert trajs[0].finish_reason == "eos" and trajs[0].answer is None
  assert trajs[1].spans[1].text == "<search>q</search>"  # nothing after the tag is kept
  assert trajs[1].finish_reason == "max_turns"  # the final, search-free turn gave no answer


def test_invalid_action_message_xml():
  cfg = RolloutConfig(max_turns=2)
  scripts = [["</search> stray", "<answer>ok</answer>"]]
  (t,) = run_rollout(ScriptedSampler(scripts, TOK), TOK, [TOK.encode("Q")], DictTool({}), cfg)
  assert t.spans[2].text == INVALID_ACTION_XML and t.answer == "ok"


def test_real_sampler_rollout_logprobs_match_direct_forward():
  """With the real sampler, every generated token's log-prob equals a direct forward."""
  cfg = tiny_config("qwen2", eos_token_id=None)
  params = init_params(cfg, jax.random.key(0))
  sampler = Sampler(cfg, params, decode=TOK.decode)
  rc = RolloutConfig(max_turns=2, max_turn_tokens=12, temperature=1.0, final_tags=("answer",))
  trajs = run_rollout(sampler, TOK, [TOK.encode("Who?"), TOK.encode("Why not")], DictTool({}), rc,
                      num_samples=2, seed=3)
  assert len(trajs) == 4
  for t in trajs:
    seq = jnp.asarray(t.tokens[None])
    logits = forward_jit(cfg, params, seq, jnp.ones_like(seq))[0]
    logp = jax.nn.log_softmax(logits[:-1], axis=-1)
    ref = np.asarray(jnp.take_along_axis(logp, seq[0, 1:, None], -1)[:, 0])
    gen = t.loss_mask[1:] == 1
    assert gen.sum() > 0
    chex.assert_trees_all_close(t.logprobs[1:][gen], ref[gen], atol=1e-5, rtol=1e-7)
