"""OpenSIR's starting pool (the released `generate_initial_problems.py`): before training, the
policy writes problems from the seed and keeps those its own students solve at a moderate rate,
until the pool holds `opensir.initial_pool.size` problems; training then draws its reference
problems from that pool. A JSONL file of problems can stand in for the generation.

Each round: `candidates` teacher samples, each from one problem drawn from the pool so far (the
seed at first) → legal problems → `num_solutions` student answers each → kept when the majority
answer's share of the parseable answers is within the band, the majority answer has a digit and
does not appear as a word in the problem, and the problem has at least `min_chars` characters
and no XML tag. Kept problems join the pool at once (they can seed the next round's prompts), in
order: the released script's concept-diversity score is computed but multiplied away, so its
selection is the first candidates that pass.
"""

from __future__ import annotations

import json
import re

from absl import logging
from etils import epath

from scope_jax.methods.opensir import rewards as R
from scope_jax.rewards import match
from scope_jax.world import World

_XML_TAG = re.compile(r"</?[A-Za-z_][\w-]{0,40}>")


def rejection(problem: str, majority: str | None, rate: float | None,
              band: tuple[float, float], min_chars: int) -> str | None:
  """Why a rated problem does not join the starting pool (None: it does)."""
  if rate is None or majority is None:
    return "no_answer"
  if not band[0] <= rate <= band[1]:
    return "solve_rate"
  if not any(ch.isdigit() for ch in majority):
    return "no_digit"
  if len(problem) < min_chars:
    return "short"
  if _XML_TAG.search(problem):
    return "xml"
  if match.contains_phrase(problem, majority):
    return "answer_in_problem"
  return None


WORLD = "world"  # initial_pool.file: the synthetic world's training problems (scope_jax.world)
WORLD_SIZE = 64  # problems taken from the world when initial_pool.size is 0


def from_world(seed: int, size: int, heldout_entities: bool = False) -> list[R.Problem]:
  """`size` arithmetic problems of world `seed` to train from, none of them a gold question nor
  sharing its (operands, answer); with `heldout_entities`, naming the trained half alone."""
  return [R.Problem(q["question"], ())
          for q in World(seed).training_problems(size, heldout_entities=heldout_entities)]


def load(path: str) -> list[R.Problem]:
  """Problems from a JSONL file: each line has 'problem' (or 'question') and optional
  'concepts' (a list, or a comma-separated string)."""
  out = []
  with epath.Path(path).open() as f:
    for i, line in enumerate(f):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
        text = str(row.get("problem", row.get("question", ""))).strip()
      except (ValueError, AttributeError):
        text = ""
      if not text:
        raise ValueError(f"{path}:{i + 1}: each line needs a JSON object with 'problem' (or "
                         "'question').")
      concepts = row.get("concepts", [])
      if isinstance(concepts, str):
        concepts = concepts.split(",")
      out.append(R.Problem(text, tuple(str(c).strip().lower() for c in concepts if str(c).strip())))
  if not out:
    raise ValueError(f"{path} holds no problem.")
  return out


def generate(method, size: int) -> tuple[list[R.Problem], dict[str, float]]:
  """Rounds of generation and rating until `size` problems are kept (or `max_rounds`): the
  kept problems and counts of why candidates were dropped."""
  cfg, init = method.cfg, method.cfg.initial_pool
  band, n = tuple(init.solve_rate_band), cfg.num_solutions
  kept: list[R.Problem] = []
  pool = [cfg.seed_problem]
  counts = {"rounds": 0.0, "candidates": 0.0, "illegal": 0.0}
  for _ in range(init.max_rounds):
    counts["rounds"] += 1
    refs = [pool[int(method.rng.integers(len(pool)))] for _ in range(init.candidates)]
    trajs = method.roles["teacher"].generate([method.teacher_prompt(r) for r in refs])
    problems = [method.guard(R.parse_problem, t.response_text(), malformed=None) for t in trajs]
    counts["candidates"] += len(problems)
    legal = [p for p in problems if p is not None]
    counts["illegal"] += len(problems) - len(legal)
    sols = method.roles["student"].generate([method.student_prompt(p.text) for p in legal], num_samples=n)
    for i, p in enumerate(legal):
      answers = [method.guard(method.checker.final, t.response_text(), malformed=None)
                 for t in sols[i * n:(i + 1) * n]]
      majority, rate = R.solve_rate(answers)
      why = rejection(p.text, majority, rate, band, init.min_chars)
      if why is not None:
        counts[why] = counts.get(why, 0.0) + 1
        continue
      if len(kept) < size:
        kept.append(p)
        pool.append(p.text)
    logging.info("OpenSIR starting pool: %d of %d problems after round %d.", len(kept), size,
                 int(counts["rounds"]))
    if len(kept) >= size:
      break
  if len(kept) < size:
    logging.warning("The starting pool has %d problems, below opensir.initial_pool.size=%d, "
                    "after %d rounds; training starts from them.", len(kept), size,
                    init.max_rounds)
  return kept, counts


def check_pool_file(config) -> None:
  """`opensir.initial_pool.file` (problems it trains on) holds none of world `world.seed`'s
  held-out gold questions: training on them would score the run on what it trained on."""
  path = config.opensir.initial_pool.file
  if not path or path == WORLD or not epath.Path(path).exists():
    return  # 'world' is the world's training problems; a missing file is the method's error
  words = lambda text: " ".join(str(text).split())
  gold = {words(q["question"]): name
          for name, qs in World(config.world.seed).gold.items() for q in qs}
  hits = []
  with epath.Path(path).open() as f:
    for line in f:
      try:
        row = json.loads(line)
        text = words(row.get("problem", row.get("question", "")))
      except (ValueError, AttributeError):
        continue  # a malformed line is the method's own one-line error when it loads the file
      if text in gold:
        hits.append(gold[text])
  if hits:
    raise ValueError(f"opensir.initial_pool.file={path!r} holds {len(hits)} held-out gold "
                     f"questions of world {config.world.seed} (world:{hits[0]}): OpenSIR would "
                     "train on what it is evaluated on; use other problems, or 'world' (the "
                     "world's training problems).")
