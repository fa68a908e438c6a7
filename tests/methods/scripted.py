"""A scripted policy for method tests: answers each SPELL role by reading its prompt."""

import re

import numpy as np

from scope_jax.sampling import SampleResult


class ScriptedSpellSampler:
  """Questioner: a valid proposal about the first document; responder: right or wrong by a
  per-row coin; verifier: a noisy comparison. Deterministic given the seed."""

  def __init__(self, tokenizer):
    self.tok = tokenizer

  def update_params(self, params):
    del params

  def _answer(self, text, rng):
    if "propose" in text or "generate a multiple choice" in text or "ONE new" in text:
      title = re.search(r"<text>\n(.*?)\n", text).group(1)
      if '"options"' in text:
        letter = re.search(r"The correct answer must be option ([A-D])", text).group(1)
        return ('Reasoning... {"question": "Which one?", "options": {"A": "w", "B": "x", '
                f'"C": "y", "D": "z"}}, "answer": "{letter}"}}')
      if "numerical answer" in text:
        return '{"question": "How many?", "answer": "42"}'
      return f'{{"question": "Which topic is first?", "answer": "{title}"}}'
    if "You are an expert in verifying" in text:
      a1 = re.search(r"Answer 1: (.*)", text).group(1)
      a2 = re.search(r"Answer 2: (.*)", text).group(1)
      same = a1.strip().lower() in a2.strip().lower()
      if rng.random() < 0.2:
        same = not same
      return "Decision: " + ("[[YES]]" if same else "[[NO]]")
    if "<text>\nEmpty\n</text>" in text:
      return "The correct answer is unknown."
    gold = re.search(r"<text>\n(.*?)\n", text).group(1)
    right = rng.random() < 0.5
    if "Choices:" in text:
      return "The correct answer is (" + ("ABCD"[rng.integers(4)]) + ")."
    if "numeric reasoning" in text:
      return "Therefore, the answer is " + ("42" if right else "7") + "."
    return "The correct answer is " + (gold if right else "something else") + "."

  def generate(self, prompts, *, max_new_tokens, num_samples=1, seed=0, stop=(), **_):
    rng = np.random.default_rng(seed)
    out = []
    for i, p in enumerate(prompts):
      text = self.tok.decode(p)
      for _ in range(num_samples):
        ids = self.tok.encode(self._answer(text, rng))[:max_new_tokens - 1] + [self.tok.eos_token_id]
        out.append(SampleResult(np.asarray(ids, np.int32), np.full(len(ids), -2.0, np.float32),
                                "eos", i, text=self.tok.decode(ids)))
    return out
