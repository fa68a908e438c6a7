"""The staged skeleton two methods share (a task set, a data set): within each iteration, stages take turns (one
runner step per stage step, so checkpoints land inside and between stages); the first stage's
policy writes from the front of the iteration's document window; before the last stage's first
step, that policy writes a set in rounds from the rest of the window, of which each last-stage step trains on a seeded batch. The set is written once to
`<workdir>/<set_folder>/iteration_<t>.jsonl`; checkpoints keep its digest and the wall time
spent in each stage (this host's)."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Callable, Sequence

import jax
import numpy as np
from absl import logging
from etils import epath

from scope_jax.core.method import Method
from scope_jax.core.schedule import Schedule, StageClock, corpus_window


def build_in_rounds(pool: Sequence, per_round: int, max_rounds: int, target: int,
                    take: Callable[[Sequence, list], list]) -> tuple[list, list, int]:
  """(kept, candidates, rounds): each round `take(picks, kept)` proposes from the next
  `per_round` entries of `pool`, appends what passes to `kept` (at most `target`) and returns
  its candidates, until `target` are kept or `max_rounds` ran."""
  kept, cands, rounds = [], [], 0
  while len(kept) < target and rounds < max_rounds:
    cands += take(pool[rounds * per_round:(rounds + 1) * per_round], kept)
    rounds += 1
  return kept, cands, rounds


def jsonl(records: Sequence[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def digest(text: str) -> str:
  return hashlib.sha256(text.encode()).hexdigest()


class Staged(Method):
  """A method of stages. Subclasses declare `stages` (in order; `<stage>_steps` of the method's
  section per iteration; the first writes, the last trains on the set), the set's `set_section`
  (its `size`, `candidates_per_round`, `max_rounds`), `set_metrics` (its metrics prefix),
  `set_timer` (its `time/` key and clock entry), `set_folder` and `window_seed`, and define
  `<stage>_step(it, k, step)` and `build_set(it, metrics)`. Set records are JSON-able dicts."""

  stages: tuple[str, ...] = ()
  set_section, set_metrics, set_timer, set_folder = "", "", "", ""
  window_seed: int = 0
  host_local_keys = ("stage_seconds",)  # this host's wall times, not a decision

  def __init__(self, rt, prompts=None):
    super().__init__(rt, prompts)
    self.schedule = Schedule(tuple((s, self.cfg[f"{s}_steps"]) for s in self.stages))
    self.clock = StageClock()
    self.sets: dict[str, list[dict]] = {}  # iteration → its set (only the current one is kept)
    self.digests: dict[str, str] = {}  # iteration → sha256 of its file
    self.examples: list[dict] = []  # a few samples for the final summary

  # ------------------------------------------------------------------------------ schedule
  def locate(self, step: int) -> tuple[int, str, int]:
    """Global step → (iteration, stage, step within the stage)."""
    return self.schedule.locate(step)

  def step(self, step: int) -> dict[str, float]:
    """One step of the stage `step` falls in, timed (the set's building apart); a policy named in
    `<method>.restart_optimizer` gets fresh moments at its stage's first step of each iteration."""
    it, stage, k = self.locate(step)
    start = time.perf_counter()
    if k == 0 and it > 0 and stage in self.cfg.get("restart_optimizer", ()):
      self.rt.restart_optimizer(self.rt.policies[stage])  # a new trainer on the last weights
    metrics = getattr(self, f"{stage}_step")(it, k, step)
    dt = time.perf_counter() - start - metrics.get(f"time/{self.set_timer}", 0.0)
    self.clock.add(stage, dt)
    metrics.update({"iteration": it, "stage": self.stages.index(stage), f"time/{stage}_step": dt})
    return metrics

  def window(self, it: int) -> tuple[list, list]:
    """This iteration's documents (disjoint across iterations while the corpus lasts): the first
    stage's, then the set's."""
    first, s = self.stages[0], self.cfg[self.set_section]
    n = self.cfg[f"{first}_batch"] * self.cfg[f"{first}_steps"]
    idx = corpus_window(len(self.passages), n + s.candidates_per_round * s.max_rounds, it,
                        [self.rt.config.seed, self.window_seed])
    docs = [self.passages[i] for i in idx]
    return docs[:n], docs[n:]

  # ------------------------------------------------------------------------------ the set
  def set_target(self) -> int:
    last = self.stages[-1]
    return self.cfg[self.set_section].size or self.cfg[f"{last}_batch"] * self.cfg[f"{last}_steps"]

  def rounds(self, it: int, pool: Sequence, take) -> tuple[list, list, dict]:
    """`build_in_rounds` at the set's sizes: (kept, candidates, their counts as metrics)."""
    s, target = self.cfg[self.set_section], self.set_target()
    kept, cands, rounds = build_in_rounds(pool, s.candidates_per_round, s.max_rounds, target, take)
    if len(kept) < target:
      logging.warning("The set of iteration %d has %d of %d entries after %d rounds of %d "
                      "candidates (raise %s.%s.max_rounds to search longer).", it, len(kept),
                      target, rounds, s.candidates_per_round, self.name, self.set_section)
    return kept, cands, {f"{self.set_metrics}/candidates": len(cands),
                         f"{self.set_metrics}/rounds": rounds}

  def set_batch(self, it: int, k: int, step: int) -> tuple[dict, list[dict]]:
    """(metrics, the set's batch for last-stage step k): the iteration's set, built (and timed) at
    its first step; a seeded order over it, cycled. An empty set gives an empty batch."""
    metrics: dict[str, float] = {}
    if str(it) not in self.sets:
      records, metrics[f"time/{self.set_timer}"] = self.clock.timed(
          self.set_timer, self.build_set, it, metrics)
      self.sets = {str(it): records}
      self.digests = {str(it): self.write_set(it, records)}
    records = self.sets[str(it)]
    metrics[f"{self.set_metrics}/size"] = len(records)
    if not records:
      logging.warning("Iteration %d has an empty set: no %s update at step %d (see samples.log).",
                      it, self.stages[-1], step)
      return metrics, []
    b = self.cfg[f"{self.stages[-1]}_batch"]
    order = np.random.default_rng([self.rt.config.seed, it, 3]).permutation(len(records))
    return metrics, [records[order[(k * b + j) % len(records)]] for j in range(b)]

  def build_set(self, it: int, metrics: dict) -> list[dict]:
    raise NotImplementedError

  def set_file(self, it: int) -> epath.Path:
    return epath.Path(self.rt.workdir) / self.set_folder / f"iteration_{it}.jsonl"

  def write_set(self, it: int, records: Sequence[dict]) -> str:
    """Writes an iteration's set once (checkpoints keep only its digest); returns the digest."""
    text = jsonl(records)
    if jax.process_index() == 0:
      path = self.set_file(it)
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(text)
    return digest(text)

  # ------------------------------------------------------------------------------ state
  def host_state(self) -> dict:
    sets = {it: {"size": len(r), "sha256": self.digests[it]} for it, r in self.sets.items()}
    return {"data": sets, "stage_seconds": self.clock.seconds, "examples": self.examples}

  def load_host_state(self, state: dict) -> None:
    self.sets, self.digests = {}, {}
    for it, meta in state.get("data", {}).items():
      path = self.set_file(int(it))
      text = path.read_text() if path.exists() else None
      if text is None or digest(text) != meta["sha256"]:
        raise ValueError(f"The {self.name} set of iteration {it} ({path}) is missing or changed "
                         "since the checkpoint was written; restore the file, or start the run in "
                         "a new workdir.")
      self.sets[it] = [json.loads(line) for line in text.splitlines()]
      self.digests[it] = meta["sha256"]
    self.clock.seconds = state.get("stage_seconds", {})
    self.examples = state.get("examples", [])

  def set_sizes(self) -> str:
    lines = [self.clock.summary()]
    sizes = {k: len(v) for k, v in self.sets.items()}
    if sizes:
      lines.append(f"  {self.set_folder} (iteration: size): {sizes}")
    return "\n".join(lines)
