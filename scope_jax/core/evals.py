"""Held-out evaluation during training (`config.eval`): the trained role that answers is scored
on held-out benchmarks before the first update, every `eval.every` updates and after the last.

It reuses the evaluate CLI's machinery (`evaluation.evaluator`): the same prompts (or, with
`eval.prompt='role'`, the answering role's own where it has one), rollouts and scoring,
greedy (or sampled: `eval.temperature`, `eval.num_samples`), with the run's search syntax and
tool. Results go where the CLI puts them, `<workdir>/eval/<benchmark>/{base,step_<N>}/` (N: the
training step the params come from), and into metrics.jsonl and TensorBoard as
`eval/<benchmark>/<metric>` in a row whose step is the number of updates done, with
`eval/updates` set in it.

    --config.eval.every=10 --config.eval.benchmarks=world:hop1,file:/data/nq.jsonl:qa_search
"""

from __future__ import annotations

import ml_collections
from absl import logging
from etils import epath

from scope_jax import console
from scope_jax import distributed
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import driver
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.world import GOLD_SETS, WORLD_PREFIX, World, half_scores, question_halves
from scope_jax.world import world_specs
from scope_jax.world import search



def due(updates: int, config: ml_collections.ConfigDict) -> bool:
  """Evaluate after `updates` updates: at 0, every `eval.every` and at the last step."""
  every = config.eval.every
  return bool(every) and bool(config.eval.benchmarks) and (
      updates % every == 0 or updates == config.total_steps)


def done(rows, updates: int) -> bool:
  """Whether metrics `rows` hold the evaluation after `updates` updates (its row is written
  only once every benchmark is scored)."""
  return any(r.get("eval/updates") == updates for r in rows)


def searches_own_world(config: ml_collections.ConfigDict) -> bool:
  """Whether the run searches world `world.seed`'s documents alone, so that its world questions
  can use the run's own tool (no other corpus, no other worlds' pages, not its trained half
  alone: a held-out entity's page must be found)."""
  w = config.get("world", {})
  return (config.get("retrieval", {}).get("corpus") == "world"
          and not tuple(w.get("corpus_seeds", ())) and not w.get("heldout_entities", False))


def validate(config: ml_collections.ConfigDict, method_cls) -> None:
  """One-line errors for an eval section that cannot run, before any model loads."""
  e = config.eval
  if not e.every:
    return
  if not e.benchmarks:
    raise ValueError(f"eval.every={e.every} needs eval.benchmarks (built-ins, "
                     "file:<path>:<type> or world:<set>).")
  items, seen = [s.strip() for s in str(e.benchmarks).split(",") if s.strip()], {}
  for n in items:
    if n.startswith(WORLD_PREFIX):
      if n[len(WORLD_PREFIX):] not in GOLD_SETS:
        raise ValueError(f"eval.benchmarks: {n!r} is not a world gold set; choose from "
                         f"{', '.join(WORLD_PREFIX + s for s in GOLD_SETS)}.")
      name, path = n[len(WORLD_PREFIX):], None
    else:
      name, _, path = bench_lib.parse_specs(n)[0]
    if name in seen:  # results and metrics go by name: a second one would overwrite the first
      raise ValueError(f"eval.benchmarks: {seen[name]!r} and {n!r} are both named {name!r}; name "
                       "each benchmark once (a file benchmark is named by its file stem).")
    seen[name] = n
    if path is not None and "://" not in path and not epath.Path(path).exists():
      raise ValueError(f"eval.benchmarks: {n!r}: the file {path} does not exist.")
  if e.get("num_samples", 1) < 1:
    raise ValueError(f"eval.num_samples={e.num_samples}: it must be at least 1.")
  if not e.get("temperature", 0.0) >= 0:  # NaN fails too
    raise ValueError(f"eval.temperature={e.temperature}: use 0 (greedy) or a positive number.")
  prompt = e.get("prompt", "benchmark")
  if prompt not in ("benchmark", "role"):
    raise ValueError(f"eval.prompt={prompt!r}: choose 'benchmark' (the evaluator's prompts) or "
                     "'role' (the answering role's own).")
  if prompt == "role" and not method_cls.has_answer_prompt():
    raise ValueError(f"eval.prompt='role': {method_cls.name} has no answering prompt of its own; "
                     "use eval.prompt='benchmark'.")
  if prompt == "role" and e.role not in ("", method_cls.answering_role):
    raise ValueError(f"eval.prompt='role' asks in the {method_cls.answering_role}'s prompt; "
                     f"evaluate eval.role={e.role!r} with eval.prompt='benchmark'.")
  role = e.role or method_cls.answering_role
  roles = method_cls.role_names(config)
  if role not in roles:
    raise ValueError(f"eval.role={role!r} is not a role of {method_cls.name}; choose one of "
                     f"{', '.join(roles)}.")
  frozen = frozen_roles(method_cls, config)
  if role in frozen:
    trained = [r for r in roles if r not in frozen]
    raise ValueError(f"eval.role={role!r} is played by frozen params, which training never "
                     f"changes: evaluate a trained role ({', '.join(trained)}).")


def frozen_roles(method_cls, config: ml_collections.ConfigDict) -> set[str]:
  """The roles of `method_cls` that frozen or tracked params play, as its players declare."""
  players = method_cls.players(config)
  return {r for r, plan in players.roles.items() if plan.by not in players.policies}


def check_same_questions(root, sha256: str) -> None:
  """A warning when earlier evaluations of this run under `root` scored other questions (a
  `file:` benchmark changed between a run's restarts): one curve would mix two question sets."""
  for path in sorted(epath.Path(root).glob("*/results.json")):
    have = driver.read_results(path) or {}
    if have.get("examples_sha256") not in (None, sha256):
      logging.warning("%s scored other questions than this process's %s: the benchmark changed, "
                      "so its learning curve mixes two question sets.", path, epath.Path(root).name)
      return


class Evaluations:
  """The benchmarks, evaluators and role of a run's held-out evaluations. A world question
  searches the world (the run's own corpus when it trains on the world); any other search
  question searches the run's tool."""

  def __init__(self, rt, method):
    config = rt.config
    self.rt, self.config = rt, config
    e = config.eval
    self.role = rt.roles[e.role or type(method).answering_role]
    if self.role.frozen is not None:
      raise ValueError(f"eval.role={self.role.name!r} is played by frozen params, which training "
                       "never changes: evaluate a trained role.")
    spec = world_specs(e.benchmarks, config.world.seed, f"{rt.workdir}/world")
    self.benches = [bench_lib.load(s, limit=e.limit or None) for s in bench_lib.parse_specs(spec)]
    self.digests = {b.name: driver.digest(b) for b in self.benches}
    for b in self.benches:
      check_same_questions(f"{rt.workdir}/eval/{b.name}", self.digests[b.name])
    items = [i.strip() for i in str(e.benchmarks).split(",")]
    world_names = {i[len(WORLD_PREFIX):] for i in items if i.startswith(WORLD_PREFIX)}
    # With world.heldout_entities, each world question's entity half: scored apart as well.
    world = World(config.world.seed) if config.world.get("heldout_entities", False) else None
    self.halves = {n: question_halves(world, n) for n in world_names} if world else {}
    own = self.role.tool or getattr(method, "tool", None)
    settings = eval_lib.Settings(
        max_new_tokens=e.max_new_tokens, max_turns=e.max_turns, batch_size=e.batch_size,
        max_prompt_tokens=self.role.max_prompt_tokens, max_context=self.role.max_context,
        max_obs_tokens=self.role.settings.get("max_obs_tokens", 500), syntax=rt.syntax,
        temperature=e.get("temperature", 0.0), num_samples=e.get("num_samples", 1),
        seed=config.seed)
    tools = {}  # a world question searches its world's documents alone, whatever corpus the run
    # trains on (other worlds' documents included)

    def tool_for(bench):
      if bench.type != "qa_search":
        return None
      if bench.name in world_names and not searches_own_world(config):
        if "world" not in tools:
          world = ml_collections.ConfigDict(dict(url="", index="", corpus="world", max_documents=0,
                                                 encoder=config.get("retrieval", {}).get(
                                                     "encoder", "minilm") or "minilm",
                                                 topk=config.get("retrieval", {}).get("topk", 3)))
          tools["world"] = search.from_config(world, config.world.seed)[1]
        return tools["world"]
      if own is not None:
        return own
      if "retrieval" not in config:
        raise ValueError(f"eval.benchmarks: {bench.name} (qa_search) needs a search tool and the "
                         "run has none: add a retrieval section or evaluate without search.")
      if "run" not in tools:
        tools["run"] = search.from_config(config.retrieval, config.world.seed,
                                          config.world.get("corpus_seeds", ()))[1]
      return tools["run"]

    # eval.prompt='role': a question is asked as the role is asked in training (its template,
    # system prompt and chat encoding) where the method has a prompt for the question's type;
    # other types keep the evaluator's prompts.
    def ask(kind: str, question: str):
      prompt = method.answer_prompt(question, kind)
      if prompt is None or isinstance(prompt, list):  # none, or already the role's token ids
        return prompt
      return self.role.prompt(prompt)
    self.evaluators = {b.name: eval_lib.Evaluator(rt.tokenizer, settings, tool=tool_for(b),
                                                  role_prompt=ask if e.prompt == "role" else None,
                                                  progress=False)
                       for b in self.benches}

  def run(self, updates: int) -> dict[str, float]:
    """Scores the role's current params; returns `eval/<benchmark>/<metric>` metrics."""
    label = "base" if updates == 0 else f"step_{updates - 1}"
    out: dict[str, float] = {"eval/updates": float(updates)}
    for bench in self.benches:
      metrics, records = self.evaluators[bench.name].evaluate(self.role.sampler, bench,
                                                              desc=f"eval {bench.name}")
      if self.halves.get(bench.name):  # e.g. trained_half/pass@1 and heldout_half/pass@1
        metrics.update(half_scores(records, self.halves[bench.name]))
      if distributed.is_primary():  # every host ran the rollouts; one writes
        eval_lib.write_results(f"{self.rt.workdir}/eval/{bench.name}/{label}", bench, metrics,
                               records, step=None if updates == 0 else updates - 1, label=label,
                               extra={"role": self.role.name, "updates": updates,
                                      "examples_sha256": self.digests[bench.name]})
      out.update({f"eval/{bench.name}/{k}": v for k, v in metrics.items()})
      logging.info("%s", console.eval_line(updates, bench.name, metrics, len(bench.examples)))
    return out
