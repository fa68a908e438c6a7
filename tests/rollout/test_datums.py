"""Per-turn datums: earlier turns lose their <think>, the trained turn keeps its sampled tokens."""

import numpy as np

from scope_jax.rollout import RolloutConfig, run_rollout
from scope_jax.rollout.datums import per_turn_datums, strip_think
from tests.rollout.fakes import CharTokenizer, DictTool, ScriptedSampler

TOK = CharTokenizer()


def test_per_turn_datums():
  assert strip_think("<think>a\nb</think> <search>x</search>") == "<search>x</search>"
  scripts = [["<think>plan</think><search>q</search>", "<think>done</think><answer>A</answer>"]]
  (t,) = run_rollout(ScriptedSampler(scripts, TOK), TOK, [TOK.encode("Q?")], DictTool({"q": "D"}),
                     RolloutConfig(max_turns=2, max_obs_tokens=10))
  first, second = per_turn_datums(t, TOK)
  assert TOK.decode(first.tokens.tolist()) == "Q?<think>plan</think><search>q</search>"
  obs = "\n\n<information>D</information>\n\n"
  assert TOK.decode(second.tokens.tolist()) == (
      "Q?<search>q</search>" + obs + "<think>done</think><answer>A</answer>")
  # Only the current turn is trained, with exactly its sampled tokens and log-probs.
  turn2 = t.spans[3]
  np.testing.assert_array_equal(second.tokens[second.loss_mask == 1], t.tokens[turn2.start:turn2.end])
  np.testing.assert_array_equal(second.logprobs[second.loss_mask == 1],
                                t.logprobs[turn2.start:turn2.end])
  assert second.prompt_len == len(second.tokens) - (turn2.end - turn2.start)
  assert first.loss_mask.sum() + second.loss_mask.sum() == t.loss_mask.sum()
