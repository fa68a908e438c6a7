"""A role: who plays it (a trained policy's sampler or frozen params'), its prompt limit, its sampling settings, an optional tool, and a seed stream.

`Role.generate` is the one way a method rolls out. It records the role's rollout metrics once,
here, for every method: rows, tokens/s, response lengths, finish reasons, searches and invalid
actions, and prompts whose inserted content was cut to fit the limit.
"""

from __future__ import annotations

import collections
import time
import zlib
from typing import Sequence

import numpy as np
import ml_collections

from scope_jax import metrics as metrics_lib
from scope_jax import prompts as prompts_lib
from scope_jax.rollout import RolloutConfig, render_chat, run_rollout
from scope_jax.rollout.types import Trajectory

FINISH = ("final", "eos", "stop", "length", "max_turns", "context")


class Role:
  """One role of a method; build it with `Runtime.add_role`."""

  def __init__(self, name: str, settings: ml_collections.ConfigDict, *, sampler, tokenizer,
               max_prompt_tokens: int, max_context: int, seed: int = 0, tool=None,
               final_tags: Sequence[str] = (), policy=None, timer=None, progress: bool = False,
               strip_think: bool = False, system: str | None = None, frozen: str | None = None, syntax: str = "xml"):
    self.name, self.settings, self.sampler, self.tokenizer = name, settings, sampler, tokenizer
    self.max_prompt_tokens, self.max_context = max_prompt_tokens, max_context
    self.seed, self.tool, self.final_tags = seed, tool, tuple(final_tags)
    self.policy, self.timer, self.progress = policy, timer, progress
    self.strip_think, self.system = strip_think, system  # system: a system message, if any
    self.frozen = frozen  # the name of the frozen params that play the role (None: a policy)
    self.syntax = syntax  # the search action its prompts ask for (rollout.parsers.SYNTAXES)
    self._calls, self._step = 0, 0
    self._stats: dict[str, list[float]] = collections.defaultdict(list)
    self._finish: collections.Counter = collections.Counter()
    self._cut = 0
    self._seconds = 0.0

  # ---------------------------------------------------------------------------- prompts
  def prompt(self, prompt: prompts_lib.Prompt | str, limit: int | None = None) -> list[int]:
    """Chat-templated token ids of a user prompt, its `fit` fields cut to the role's limit (or
    to `limit` tokens, when a caller needs less)."""
    if isinstance(prompt, str):
      prompt = prompts_lib.Prompt("{text}", {"text": prompt})
    limit = self.max_prompt_tokens if limit is None else min(limit, self.max_prompt_tokens)
    text, cut = prompts_lib.fit_prompt(prompt, limit, self._count,
                                       role=f"role {self.name!r}")
    self._cut += cut
    return render_chat(self.tokenizer, self._messages(text))

  def _messages(self, text: str) -> list[dict]:
    system = [{"role": "system", "content": self.system}] if self.system else []
    return system + [{"role": "user", "content": text}]

  def _count(self, text: str) -> int:
    return len(render_chat(self.tokenizer, self._messages(text)))

  # ---------------------------------------------------------------------------- rollouts
  def rollout_config(self, temperature: float | None = None,
                     top_p: float | None = None) -> RolloutConfig:
    s = self.settings
    return RolloutConfig(syntax=self.syntax, final_tags=self.final_tags,
                         max_turns=s.get("max_turns", 0) if self.tool is not None else 0,
                         max_turn_tokens=s.max_new_tokens,
                         max_obs_tokens=s.get("max_obs_tokens", 500),
                         max_obs_chars=s.get("max_obs_chars", 0),
                         max_total_tokens=self.max_context,
                         temperature=s.temperature if temperature is None else temperature,
                         top_p=s.top_p if top_p is None else top_p, top_k=s.get("top_k", 0),
                         strip_think=self.strip_think)

  def next_seed(self) -> int:
    """Seeds differ per role, runner step and call, and repeat exactly on a resumed run."""
    self._calls += 1
    key = [self.seed, zlib.crc32(self.name.encode()), self._step, self._calls]
    return int(np.random.SeedSequence(key).generate_state(1)[0] % (2**31))

  def generate(self, prompts: Sequence[Sequence[int]], *, num_samples: int = 1,
               temperature: float | None = None, top_p: float | None = None) -> list[Trajectory]:
    """`num_samples` rollouts per prompt (prompt-major), single- or multi-turn with the tool; at
    the role's temperature and top-p unless a call needs others (a judge that grades
    greedily). Rollouts that train keep the role's: the loss reads the sampling temperature."""
    if not prompts:
      return []
    start = time.perf_counter()
    trajs = run_rollout(self.sampler, self.tokenizer, prompts, self.tool,
                        self.rollout_config(temperature, top_p),
                        num_samples=num_samples, seed=self.next_seed(), progress=self.progress)
    seconds = time.perf_counter() - start
    if self.timer is not None:
      self.timer.totals["rollout"] = self.timer.totals.get("rollout", 0.0) + seconds
    self._record(trajs, [len(p) for p in prompts], seconds)
    return trajs

  def texts(self, prompts: Sequence[Sequence[int]], *, num_samples: int = 1,
            temperature: float | None = None) -> list[str]:
    return [t.response_text() for t in self.generate(prompts, num_samples=num_samples,
                                                     temperature=temperature)]

  # ---------------------------------------------------------------------------- metrics
  def begin_step(self, step: int) -> None:
    self._step, self._calls = step, 0
    self._stats.clear()
    self._finish.clear()
    self._cut, self._seconds = 0, 0.0

  def _record(self, trajs: Sequence[Trajectory], prompt_lens, seconds: float) -> None:
    self._seconds += seconds
    self._stats["prompt_tokens"] += [float(n) for n in prompt_lens]
    for t in trajs:
      self._stats["length"].append(float(t.loss_mask.sum()))
      self._stats["searches"].append(float(t.num_searches))
      self._stats["invalid_actions"].append(float(t.num_invalid))
      self._finish[t.finish_reason] += 1

  def metrics(self) -> dict[str, float]:
    """This step's rollout metrics under `<role>/rollout/…` (empty if the role did not play)."""
    rows = len(self._stats["length"])
    if not rows:
      return {}
    p = f"{self.name}/rollout"
    tokens = sum(self._stats["length"])
    m = {f"{p}/rows": float(rows), f"{p}/tokens": tokens,
         f"{p}/tokens_per_s": tokens / max(self._seconds, 1e-9),
         f"{p}/prompts_cut": float(self._cut)}
    m.update(metrics_lib.summarize(self._stats["length"], f"{p}/length"))
    m.update(metrics_lib.summarize(self._stats["prompt_tokens"], f"{p}/prompt_tokens"))
    if self.tool is not None:
      m.update(metrics_lib.summarize(self._stats["searches"], f"{p}/searches"))
      m.update(metrics_lib.summarize(self._stats["invalid_actions"], f"{p}/invalid_actions"))
    for reason in FINISH:
      m[f"{p}/finish_{reason}"] = self._finish[reason] / rows
    return m
