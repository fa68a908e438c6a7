"""Copy QA: the smallest complete method on scope_jax's core, in one file.

One policy answers "which words come right after these?" about a bundled Wikipedia lead; the
reward is 1 for the right words; advantages are z-scored within each group of G answers; one
GRPO update per step. Everything else — loading, the loop, resume, checkpoints, metrics, the KL
reference, the sampler or engine — comes from the core.

    python -m scope_jax.main --config=examples/copy_qa_config.py --workdir=runs/copy_qa
"""

import numpy as np

from scope_jax.core.method import Method, Players, PolicyPlan, RolePlan
from scope_jax.retrieval import demo_corpus
from scope_jax.rewards import match
from scope_jax.rl import advantages as adv_lib

PROMPT = ('{text}\n\nWhich two words come right after "{cue}" in this text? '
          "Reply with <answer>the two words</answer>.")


def copy_task(text: str, rng: np.random.Generator) -> tuple[str, str]:
  """(cue, gold): three words of `text` and the two that follow them."""
  words = text.split()
  i = int(rng.integers(len(words) - 5))
  return " ".join(words[i:i + 3]), " ".join(words[i + 3:i + 5])


class CopyQA(Method):
  name = "copy_qa"  # the config section it reads
  at_least_one = ("batch", "group_size")

  @classmethod
  def players(cls, c) -> Players:
    """One policy, updated on batch × G rows, plays the answerer."""
    return Players({"policy": PolicyPlan(c.copy_qa.batch * c.copy_qa.group_size)},
                   roles={"answerer": RolePlan("policy", final=("answer",))})

  def __init__(self, rt):
    super().__init__(rt)  # builds the players: rt.policies["policy"], self.roles["answerer"]
    self.passages = demo_corpus.demo_passages()

  def step(self, step: int) -> dict[str, float]:
    rng = np.random.default_rng([self.rt.config.seed, step])
    docs = [self.passages[int(i)] for i in rng.integers(len(self.passages), size=self.cfg.batch)]
    tasks = [copy_task(d.text, rng) for d in docs]
    answerer = self.roles["answerer"]
    prompts = [answerer.prompt(PROMPT.format(text=d.text, cue=cue))
               for d, (cue, _) in zip(docs, tasks)]
    trajs = answerer.generate(prompts, num_samples=self.cfg.group_size)
    rewards = np.array([match.exact_match(t.final("answer") or "", tasks[t.prompt_index][1])
                        for t in trajs])
    advantages = adv_lib.group_zscore(rewards.reshape(self.cfg.batch, -1)).reshape(-1)
    return {"answerer/reward": float(rewards.mean()),
            **self.rt.train("policy", trajs, advantages)}


METHOD = CopyQA


def make_method(rt) -> CopyQA:
  return CopyQA(rt)
