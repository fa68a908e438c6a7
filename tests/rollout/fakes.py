"""Deterministic stand-ins: a character tokenizer, a scripted sampler and an in-memory tool."""

import numpy as np

from scope_jax.rollout.types import Span, Trajectory
from scope_jax.sampling import SampleResult
from scope_jax.sampling.stops import find_stop


class CharTokenizer:
  """One token per character (ids = code points < 256)."""

  def encode(self, text, add_special_tokens=False, split_special_tokens=False):
    return [min(ord(c), 255) for c in text]

  def decode(self, ids, skip_special_tokens=False):
    return "".join(chr(i) for i in ids)


class ScriptedSampler:
  """Returns the next scripted text of each row, cut at the first stop string like the sampler."""

  def __init__(self, scripts, tokenizer):
    self.scripts = [list(s) for s in scripts]  # per row: list of turn texts
    self.tok = tokenizer
    self.calls = []

  def generate(self, prompts, *, max_new_tokens, stop=(), num_samples=1, seed=0, **_):
    self.calls.append({"n": len(prompts) * num_samples, "stop": list(stop)})
    rows = self._active_rows(len(prompts) * num_samples)
    out = []
    for k, r in enumerate(rows):
      text = self.scripts[r].pop(0)
      ids = self.tok.encode(text)[:max_new_tokens]
      match = find_stop(ids, stop, self.tok.decode)
      if match:
        ids, reason = ids[:match.num_tokens], "stop"
      else:
        reason = "length" if len(ids) == max_new_tokens else "eos"
      lp = -0.01 * (1 + np.arange(len(ids), dtype=np.float32))
      out.append(SampleResult(np.asarray(ids, np.int32), lp, reason, k // num_samples,
                              text=self.tok.decode(ids)))
    return out

  def _active_rows(self, n):
    rows = [i for i, s in enumerate(self.scripts) if s]
    assert len(rows) == n, (rows, n)
    return rows


class DictTool:
  def __init__(self, docs, fail=False):
    self.docs, self.fail, self.calls = docs, fail, []

  def __call__(self, queries):
    self.calls.append(list(queries))
    if self.fail:
      raise ConnectionError("index offline")
    return [self.docs.get(q, "Doc 1(Title: None) nothing found") for q in queries]


def random_trajectory(rng, vocab_size: int, prompt_len: int, response_len: int) -> Trajectory:
  """A one-turn trajectory of random tokens whose response has sampler log-prob −1 per token."""
  tokens = rng.integers(1, vocab_size, prompt_len + response_len).astype(np.int32)
  mask = np.r_[np.zeros(prompt_len), np.ones(response_len)].astype(np.int32)
  logp = np.where(mask > 0, -1.0, 0.0).astype(np.float32)
  return Trajectory(tokens, mask, logp, prompt_len, [Span(0, prompt_len, "prompt")], [], None,
                    None, "eos")


class ActionTokenizer(CharTokenizer):
  """CharTokenizer whose top ids decode to whole actions, so a random model searches and answers:
  ids 250-252 are searches for 'a', 'b', 'c'; 253-254 answer 'yes' / 'no'; text never encodes
  to them."""

  ACTIONS = {250: "<search>a</search>", 251: "<search>b</search>", 252: "<search>c</search>",
             253: "<answer>yes</answer>", 254: "<answer>no</answer>"}

  def encode(self, text, add_special_tokens=False, split_special_tokens=False):
    return [min(ord(c), 249) for c in text]

  def decode(self, ids, skip_special_tokens=False):
    return "".join(self.ACTIONS.get(i, chr(i)) for i in ids)


def action_model(seed: int = 0, boost: float = 0.0):
  """A tiny random model (vocab 256) whose action ids get `boost` added to their output rows'
  norm, so greedy rollouts search and answer at varied turns."""
  import jax
  from scope_jax.models import init_params, tiny_config
  cfg = tiny_config("qwen2", eos_token_id=None)
  params = init_params(cfg, jax.random.key(seed))
  if boost:
    ids = np.asarray(sorted(ActionTokenizer.ACTIONS))
    name = "embed" if cfg.tie_embeddings else "lm_head"
    out = np.array(params[name])
    out[ids] *= boost
    params = {**params, name: jax.numpy.asarray(out)}
  return cfg, params
