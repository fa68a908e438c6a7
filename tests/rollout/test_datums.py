"""Per-turn datums: earlier turns lose their <think>, the trained turn keeps its sampled tokens."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from scope_jax.models import tiny_config, transformer
from scope_jax.rl import train_step
from scope_jax.rl.batch import make_batch
from scope_jax.rollout import RolloutConfig, render_chat, run_rollout
from scope_jax.rollout.datums import per_turn_datums, strip_think
from scope_jax.sampling import SampleResult
from scope_jax.tokenizer import load_tokenizer
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
  chex.assert_trees_all_equal(second.tokens[second.loss_mask == 1], t.tokens[turn2.start:turn2.end])
  chex.assert_trees_all_equal(second.logprobs[second.loss_mask == 1],
                              t.logprobs[turn2.start:turn2.end])
  assert second.prompt_len == len(second.tokens) - (turn2.end - turn2.start)
  assert first.loss_mask.sum() + second.loss_mask.sum() == t.loss_mask.sum()


class ForcedSampler:
  """Emits scripted turns, scoring each token with the real model on the context it was fed (as
  a sampler does), so a datum whose context differs from the rollout's shows up as a log-prob gap."""

  def __init__(self, config, params, tokenizer, turns):
    self.config, self.params, self.tok, self.turns = config, params, tokenizer, list(turns)

  def generate(self, prompts, *, num_samples=1, temperature=1.0, **_):
    out = []
    for i, prompt in enumerate(prompts):
      text = self.turns.pop(0)
      ids = list(self.tok.encode(text, add_special_tokens=False))
      seq = jnp.asarray([list(prompt) + ids], jnp.int32)
      logits = transformer.forward_jit(self.config, self.params, seq)[0, len(prompt) - 1:-1]
      logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
      picked = np.asarray(jnp.take_along_axis(logp, jnp.asarray(ids)[:, None], axis=-1)[:, 0])
      for _ in range(num_samples):
        out.append(SampleResult(np.asarray(ids, np.int32), picked, "stop", i, text=text))
    return out


def test_thinking_rollouts_feed_later_turns_the_datum_context():
  """With strip_think, turn k is generated after the earlier turns with their <think> removed, so
  each per-turn datum's recomputed log-probs equal the sampler's (before, the rollout kept the
  earlier reasoning in context and the datum did not)."""
  tok = load_tokenizer("demo")
  config = tiny_config(vocab_size=len(tok))
  params = transformer.init_params(config, jax.random.key(0))
  turns = ['<think>I should look up the river first.</think>\n<tool_call>{"name": "search", '
           '"arguments": {"query": "Nile"}}</tool_call>',
           "<think>The documents say it is the Nile.</think>\n<answer>The Nile</answer>"]
  prompt = render_chat(tok, [{"role": "user", "content": "Which river is longest?"}])
  rc = RolloutConfig(syntax="qwen", max_turns=1, max_obs_tokens=32, strip_think=True,
                     final_tags=("answer",))
  (traj,) = run_rollout(ForcedSampler(config, params, tok, turns), tok, [prompt],
                        DictTool({"Nile": "Doc 1(Title: Nile) The Nile is a river."}), rc)
  datums = per_turn_datums(traj, tok)
  assert len(datums) == 2 and traj.final_tag == "answer"
  batch = make_batch(datums, [0.0, 0.0])
  logp = train_step.compute_logprobs(config, params, jax.tree.map(jnp.asarray, batch))
  chex.assert_trees_all_close(np.asarray(logp) * batch.loss_mask, batch.old_logp, atol=1e-5)


def test_strip_think_is_linear_on_unclosed_tags():
  text = "<think>" * 50_000
  assert strip_think(text) == text
  assert strip_think("a<think>x</think>  b<think>y</think>\nc<think>z") == "ab" + "c<think>z"
