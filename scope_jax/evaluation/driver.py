"""What `python -m scope_jax.evaluate` does: evaluates a run's checkpoints (once each; finished
steps are read back, not redone), optionally a base model, on a list of benchmarks; follows a
training run with `watch`; writes results under `<run>/eval` (or `out`) and prints a table.

    <out>/<benchmark>/step_<N>/{results.json, predictions.jsonl}   a run's checkpoint
    <out>/<benchmark>/base/{…}                                     the base model (--model)
    <out>/tb/                                                      TensorBoard: eval/<benchmark>/<metric>
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from etils import epath

from scope_jax import events, run_record
from scope_jax import sharding as shd
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.evaluation import models, scoring
from scope_jax.methods import runtime
from scope_jax.retrieval import search


@dataclasses.dataclass(frozen=True)
class Options:
  benchmarks: str
  run: str | None = None
  step: str = "latest"
  role: str | None = None
  model: str | None = None
  out: str | None = None
  tokenizer: str | None = None
  judge: str | None = None
  limit: int | None = None
  watch: bool = False
  poll_seconds: float = 60.0
  watch_timeout: float = 0.0  # give up after this long without a new checkpoint (0 = never)
  overwrite: bool = False
  index: str | None = None
  encoder: str = "minilm"
  retrieval_url: str | None = None
  topk: int = 3
  mesh_shape: tuple[int, ...] | None = None
  dtype: str | None = None
  progress: bool = True
  settings: eval_lib.Settings = eval_lib.Settings()


class Session:
  """The pieces an evaluation shares across steps: mesh, benchmarks, tool, judge, output root."""

  def __init__(self, opts: Options):
    if not opts.run and not opts.model:
      raise ValueError("Nothing to evaluate: pass --run=<workdir> (with --role) or "
                       f"--model={models.SPEC_HELP}.")
    if opts.run and not opts.role:
      raise ValueError("--run needs --role: the trained role (or policy) to evaluate.")
    if not opts.run and not opts.out:
      raise ValueError("--model without --run needs --out=<dir or gs://…> for the results.")
    self.opts = opts
    self.record = run_record.read(opts.run) if opts.run else None
    if self.record is not None:
      run_record.policy_for(self.record, opts.role)  # a wrong role fails before anything loads
    self.specs = bench_lib.parse_specs(opts.benchmarks)
    self.benches = [bench_lib.load(s, limit=opts.limit) for s in self.specs]
    cfg = self.record.config if self.record is not None else None
    shape = opts.mesh_shape or (tuple(cfg.mesh.shape) if cfg is not None else (1, -1, 1))
    self.mesh = shd.make_mesh(shape)
    self.rules = runtime.mesh_rules(cfg)[1] if cfg is not None else shd.SAMPLING_RULES
    self.dtype = jnp.dtype(opts.dtype or (cfg.model.param_dtype if cfg is not None else "float32"))
    settings, default = opts.settings, eval_lib.Settings()
    if cfg is not None and settings.max_context == default.max_context:  # the run's budget
      settings = dataclasses.replace(settings, max_context=int(cfg.rollout.max_context))
      if settings.max_prompt_tokens == default.max_prompt_tokens:
        settings = dataclasses.replace(
            settings, max_prompt_tokens=int(cfg.rollout.max_prompt_tokens))
    settings.validate()
    self.settings = settings
    self.root = epath.Path(opts.out or f"{self.record.path}/eval")
    self._tool = None
    self._judge = None
    self._run_tokenizer = None

  # ------------------------------------------------------------------------------- pieces
  def tool(self):
    """The search tool, built once, when a qa_search benchmark is evaluated."""
    if self._tool is None and any(b.type == "qa_search" for b in self.benches):
      o = self.opts
      section = ml_collections.ConfigDict(dict(
          url=o.retrieval_url or "", encoder=o.encoder, index=o.index or "",
          corpus="" if o.index else "demo", topk=o.topk, max_documents=0))
      run_retrieval = self.record.config.get("retrieval") if self.record is not None else None
      if run_retrieval is not None and not (o.index or o.retrieval_url):
        section = run_retrieval  # the run searched this index; evaluate against the same one
      search.validate(section)
      _, self._tool = search.from_config(section)
    return self._tool

  def judge(self):
    """(sampler, tokenizer) of the judge: --judge, else the base model, else the run's initial
    model; loaded once, when a `judge` benchmark is evaluated."""
    if self._judge is None and any(b.type == "judge" for b in self.benches):
      spec = self.opts.judge or self.opts.model or "initial"
      model = models.load_spec(spec, self.mesh, self.rules, self.dtype, record=self.record,
                               label="judge")
      self._judge = (self.sampler(model), model.tokenizer)
    return self._judge or (None, None)

  def sampler(self, model):
    return eval_lib.make_sampler(model, mesh=self.mesh, rules=self.rules, dtype=self.dtype,
                                 max_context=self.settings.max_context)

  def result_dir(self, bench, label: str) -> epath.Path:
    return self.root / bench.name / label

  def done(self, label: str) -> bool:
    return not self.opts.overwrite and all(
        (self.result_dir(b, label) / "results.json").exists() for b in self.benches)

  # ------------------------------------------------------------------------------- running
  def evaluate_model(self, model) -> None:
    """Every benchmark on `model`; writes results (and TensorBoard scalars for a step)."""
    judge, judge_tok = self.judge()
    ev = eval_lib.Evaluator(model.tokenizer, self.settings, tool=self.tool(), judge=judge,
                            judge_tokenizer=judge_tok, progress=self.opts.progress)
    sampler = self.sampler(model)
    scalars = {}
    for bench in self.benches:
      target = self.result_dir(bench, model.label)
      if not self.opts.overwrite and (target / "results.json").exists():
        continue
      metrics, records = ev.evaluate(sampler, bench, desc=f"{bench.name} {model.label}")
      if jax.process_index() != 0:  # every host evaluates (the mesh spans them); one writes
        continue
      eval_lib.write_results(target, bench, metrics, records, step=model.step, label=model.label,
                             extra={"settings": dataclasses.asdict(self.settings),
                                    "run": self.opts.run, "role": self.opts.role,
                                    "model": self.opts.model if model.step is None else None})
      logging.info("%s %s: %s", bench.name, model.label, _headline(bench.type, metrics))
      scalars.update({f"eval/{bench.name}/{k}": v for k, v in metrics.items()})
    if model.step is not None and scalars and jax.process_index() == 0:
      writer = events.EventsWriter(self.root / "tb")
      writer.scalars(model.step, scalars)
      writer.close()

  def evaluate_base(self) -> None:
    if self.opts.model and not self.done("base"):
      self.evaluate_model(models.load_spec(self.opts.model, self.mesh, self.rules, self.dtype,
                                           record=self.record, tokenizer=self.opts.tokenizer))

  def evaluate_steps(self, steps) -> list[int]:
    """Evaluates the steps not done yet; returns the ones it evaluated."""
    evaluated = []
    for step in steps:
      if self.done(f"step_{step}"):
        logging.info("Step %d is already evaluated in %s; skipping it.", step, self.root)
        continue
      if self._run_tokenizer is None:
        self._run_tokenizer = run_record.load_tokenizer(self.record)
      self.evaluate_model(models.load_step(self.record, step, self.opts.role, self.mesh,
                                           self.rules, self.dtype, tokenizer=self._run_tokenizer))
      evaluated.append(step)
    return evaluated


def run(opts: Options | Session) -> list[dict]:
  """Evaluates what `opts` names; returns the rows of the final table (one per model)."""
  session = opts if isinstance(opts, Session) else Session(opts)
  opts = session.opts
  session.evaluate_base()
  if session.record is not None:
    available = run_record.committed_steps(session.record)
    if not opts.watch:
      if not available:
        raise ValueError(f"The run {session.record.path} has no committed checkpoint yet; "
                         "use --watch to wait for one.")
      session.evaluate_steps(run_record.select_steps(available, opts.step))
    else:
      watch(session)
  rows = table_rows(session)
  print(format_table(rows, session))
  return rows


def watch(session: Session) -> None:
  """Evaluates each new committed checkpoint once, polling, until the run's last step
  (`total_steps − 1`) is evaluated, `watch_timeout` passes without a new one, or Ctrl-C."""
  opts, record = session.opts, session.record
  last_step = int(record.config.total_steps) - 1
  idle_since = time.monotonic()
  try:
    while True:
      available = run_record.committed_steps(record)
      if session.evaluate_steps(available):
        idle_since = time.monotonic()
      if last_step in available and session.done(f"step_{last_step}"):
        logging.info("The run's last step %d is evaluated; done watching.", last_step)
        return
      if opts.watch_timeout and time.monotonic() - idle_since > opts.watch_timeout:
        logging.info("No new checkpoint for %.0f s; done watching.", opts.watch_timeout)
        return
      time.sleep(opts.poll_seconds)
  except KeyboardInterrupt:
    logging.info("Stopped watching; finished steps are saved and will be skipped next time.")


def _headline(kind: str, metrics: dict) -> str:
  primary = scoring.PRIMARY[kind]
  keys = [k for k in metrics if k == f"mean@n/{primary}" or k.startswith(("pass@", "maj@"))]
  return ", ".join(f"{k}={metrics[k]:.3f}" for k in keys)


def table_rows(session: Session) -> list[dict]:
  """Every model evaluated under the output root (base first, then steps), read from disk."""
  labels: set[str] = set()
  for bench in session.benches:
    d = session.root / bench.name
    if d.exists():
      labels |= {p.name for p in d.iterdir() if (p / "results.json").exists()}
  order = sorted(labels, key=lambda l: (l != "base", int(l[5:]) if l.startswith("step_") else -1))
  rows = []
  for label in order:
    row = {"model": label}
    for bench in session.benches:
      path = session.result_dir(bench, label) / "results.json"
      if path.exists():
        row[bench.name] = json.loads(path.read_text())["metrics"]
    rows.append(row)
  return rows


def format_table(rows: list[dict], session: Session) -> str:
  """One line per model: each benchmark's mean@n, the largest pass@k and maj@k."""
  cols = []
  for bench in session.benches:
    primary = scoring.PRIMARY[bench.type]
    ks = scoring.ks(session.settings.num_samples)
    cols += [(bench.name, f"mean@n/{primary}"), (bench.name, f"pass@{ks[-1]}"),
             (bench.name, f"maj@{ks[-1]}")]
  head = ["model"] + [f"{b} {m}" for b, m in cols]
  lines = [head] + [[r["model"]] + [f"{r[b][m]:.3f}" if m in r.get(b, {}) else "-"
                                    for b, m in cols] for r in rows]
  widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)
