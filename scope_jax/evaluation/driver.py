"""What `python -m scope_jax.evaluate` does: evaluates a run's checkpoints (once each; finished
steps are read back, not redone), optionally a base model, on a list of benchmarks; follows a
training run with `watch`; writes results under `<run>/eval` (or `out`) and prints a table.

    <out>/<benchmark>/step_<N>/{results.json, predictions.jsonl}   a run's checkpoint
    <out>/<benchmark>/base/{…}                                     the base model (--model)
    <out>/tb/                                                      TensorBoard: eval/<benchmark>/<metric>
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from scope_jax import checkpoint as ckpt_lib
from scope_jax import events, run_record
from scope_jax import sharding as shd
from scope_jax import world as world_lib
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import evaluator as eval_lib
from scope_jax.evaluation import models, scoring
from scope_jax.retrieval import search
from scope_jax.world import search as world_search

MAX_BROADCAST_STEPS = 4096


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
  """The pieces an evaluation shares across steps: mesh, benchmarks, tool, judge, output root.
  Everything a mistake in the flags can break is checked here, before any model loads."""

  def __init__(self, opts: Options):
    if not opts.run and not opts.model:
      raise ValueError("Nothing to evaluate: pass --run=<workdir> (with --role) or "
                       f"--model={models.SPEC_HELP}.")
    if opts.run and not opts.role:
      raise ValueError("--run needs --role: the trained role (or policy) to evaluate.")
    self.opts = opts
    self.record = self._read_record() if opts.run else None
    self.policy = run_record.policy_for(self.record, opts.role) if self.record else None
    self.specs = bench_lib.parse_specs(self._world_files(opts.benchmarks))
    self.benches = [bench_lib.load(s, limit=opts.limit) for s in self.specs]
    if opts.model:
      models.check_spec(opts.model, record=self.record, tokenizer=opts.tokenizer)
    if opts.judge and any(b.type == "judge" for b in self.benches):
      models.check_spec(opts.judge, record=self.record)
    cfg = self.record.config if self.record is not None else None
    shape = opts.mesh_shape or (tuple(cfg.mesh.shape) if cfg is not None else (1, -1, 1))
    self.mesh = shd.make_mesh(shape)
    self.rules = shd.config_rules(cfg)[1] if cfg is not None else shd.SAMPLING_RULES
    self.dtype = jnp.dtype(opts.dtype or (cfg.model.param_dtype if cfg is not None else "float32"))
    self.settings = _run_settings(opts.settings, cfg)
    if self.settings.num_samples > 1 and self.settings.temperature == 0:
      logging.warning("num_samples=%d with temperature 0: greedy samples are identical; set "
                      "--temperature for pass@k.", self.settings.num_samples)
    self.root = epath.Path(opts.out or (f"{self.record.path}/eval" if self.record else
                                        f"eval/{_spec_name(opts.model)}"))
    if self.record is not None and len(self.record.policies) > 1:
      self.root = self.root / self.policy  # two policies' results never collide
    if self.root.exists() and not self.root.is_dir():
      raise ValueError(f"--out={self.root} is a file; results need a directory there.")
    self.steps = None
    if self.record is not None:
      run_record.check_tokenizer(self.record)
    if self.record is not None and not opts.watch:
      available = run_record.committed_steps(self.record)
      if not available:
        raise ValueError(f"The run {self.record.path} has no committed checkpoint yet; use "
                         "--watch to wait for one.")
      self.steps = [s for s in run_record.select_steps(available, opts.step) if self._readable(s)]
    self._tool = None
    self._judge = None
    self._run_tokenizer = None
    self._finished: set[str] = set()  # labels evaluated (or found done) in this session
    self.skipped: set[int] = set()  # unreadable steps --watch passed over, as training does

  def _world_files(self, spec: str) -> str:
    """`world:<set>` items as the run's own world's gold files (written under `<run>/world` if
    missing, as training does); without --run there is no world to name."""
    if not any(i.strip().startswith("world:") for i in str(spec).split(",")):
      return spec
    if self.record is None:
      raise ValueError(f"--benchmarks={spec!r}: world:<set> names a run's world; pass --run, or "
                       "file:<dir>/gold/<set>.jsonl:<type> of a written world.")
    seed = self.record.config.get("world", {}).get("seed", 0)
    return world_lib.world_specs(spec, seed, f"{self.record.path}/world")

  def _readable(self, step: int) -> bool:
    """Checks `step`'s metadata before any model loads (a corrupt step or another model: one
    line); False when the running training deleted the step meanwhile (`keep_checkpoints`)."""
    try:
      run_record.check_checkpoint(self.record, step, self.policy)
    except run_record.UnreadableCheckpoint:
      if step in run_record.committed_steps(self.record):
        raise
      logging.warning("Checkpoint step %d was deleted before it could be read (the run keeps "
                      "only its newest checkpoints); skipping it.", step)
      return False
    return True

  def _read_record(self):
    """The run's record; under --watch, waits for a run that has not written it yet."""
    start = time.monotonic()
    while True:
      try:
        return run_record.read(self.opts.run)
      except FileNotFoundError:
        waited = time.monotonic() - start
        if not self.opts.watch or (self.opts.watch_timeout and waited > self.opts.watch_timeout):
          raise
        logging.info("Waiting for the run to start writing %s/run.json", self.opts.run)
        time.sleep(self.opts.poll_seconds)

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
      world = self.record.config.get("world", {}).get("seed", 0) if self.record is not None else 0
      _, self._tool = world_search.from_config(section, world)
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

  def identity(self, label: str, bench) -> dict:
    """What results must have been computed with to count as this evaluation's: settings, model
    or policy, the run, the benchmark (its type and a digest of its examples; its name is the
    results' folder), and the judge or retrieval a benchmark of that type uses."""
    o = self.opts
    search = bench.type == "qa_search"
    return {"settings": dataclasses.asdict(self.settings),
            "model": o.model if label == "base" else None,
            "policy": None if label == "base" else self.policy,
            "run": ckpt_lib.absolute(o.run) if o.run else None,
            "type": bench.type, "examples_sha256": digest(bench),  # the name is the folder's
            "judge": (o.judge or o.model or "initial") if bench.type == "judge" else None,
            "retrieval": {"url": o.retrieval_url, "index": o.index, "encoder": o.encoder,
                          "topk": o.topk} if search else None}

  def done(self, label: str) -> bool:
    """True when every benchmark has results for `label` from this same evaluation (model,
    settings and number of examples); results of another evaluation, on any benchmark, are an
    error (--overwrite replaces them)."""
    if label in self._finished:
      return True
    for bench in self.benches:  # even --overwrite keeps what training wrote (and reported)
      path = self.result_dir(bench, label) / "results.json"
      if "updates" in (read_results(path) or {}):
        raise ValueError(f"{path} is the run's own evaluation during training (its numbers are "
                         "in metrics.jsonl); evaluate into another folder with --out=<dir>.")
    if self.opts.overwrite:
      return False
    complete = True
    for bench in self.benches:
      path = self.result_dir(bench, label) / "results.json"
      have = read_results(path)
      if have is None:
        complete = False  # the others are still checked: a benchmark with results is skipped
        continue
      want = json.loads(json.dumps({**self.identity(label, bench),
                                    "num_examples": len(bench.examples)}))
      diff = [k for k in want if have.get(k) != want[k]]
      if diff:
        raise ValueError(f"{path} holds results of another evaluation (its {', '.join(diff)} "
                         "differ from this one); pass --overwrite to replace them, or --out.")
    if complete:
      self._finished.add(label)
    return complete

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
      if not self.opts.overwrite and read_results(target / "results.json") is not None:
        continue
      metrics, records = ev.evaluate(sampler, bench, desc=f"{bench.name} {model.label}")
      if jax.process_index() != 0:  # every host evaluates (the mesh spans them); one writes
        continue
      eval_lib.write_results(target, bench, metrics, records, step=model.step, label=model.label,
                             extra={**self.identity(model.label, bench),
                                    "role": self.opts.role})
      logging.info("%s %s: %s", bench.name, model.label, _headline(bench.type, metrics))
      scalars.update({f"eval/{bench.name}/{k}": v for k, v in metrics.items()})
    self._finished.add(model.label)
    if model.step is not None and scalars and jax.process_index() == 0:
      write_tensorboard(self.root)

  def evaluate_base(self) -> None:
    if self.opts.model and not self.done("base"):
      self.evaluate_model(models.load_spec(self.opts.model, self.mesh, self.rules, self.dtype,
                                           record=self.record, tokenizer=self.opts.tokenizer))

  def evaluate_steps(self, steps) -> list[int]:
    """Evaluates the steps not done yet; returns the ones it evaluated. A step that training
    deleted (keep_checkpoints) before it could be read is skipped with a warning."""
    evaluated = []
    for step in steps:
      if self.done(f"step_{step}"):
        logging.info("Step %d is already evaluated in %s; skipping it.", step, self.root)
        continue
      if step in self.skipped:
        continue
      if self._run_tokenizer is None:
        self._run_tokenizer = run_record.load_tokenizer(self.record)
      try:
        run_record.check_checkpoint(self.record, step, self.policy)
        model = models.load_step(self.record, step, self.policy, self.mesh, self.rules,
                                 self.dtype, tokenizer=self._run_tokenizer)
      except Exception as e:  # noqa: BLE001 — re-raised unless the step is gone or corrupt
        if step not in agreed_steps(self.record):
          logging.warning("Checkpoint step %d was deleted before it could be read (the run keeps "
                          "only its newest checkpoints); skipping it.", step)
          continue
        if type(e) is ValueError:  # another model than run.json's: no step will do
          raise
        if not isinstance(e, run_record.UnreadableCheckpoint):
          e = run_record.UnreadableCheckpoint(
              f"Checkpoint step {step} of {self.record.path} cannot be read ({type(e).__name__}: "
              f"{str(e).splitlines()[0][:200] if str(e) else ''})")
        if not self.opts.watch:
          raise e from None
        logging.warning("%s; skipping it, as training does with a corrupt step.", e)
        self.skipped.add(step)
        continue
      self.evaluate_model(model)
      evaluated.append(step)
    return evaluated


def write_tensorboard(root) -> None:
  """`<root>/tb`: eval/<benchmark>/<metric> of every step with results under `root`, rewritten
  whole from them, so a step evaluated again (--overwrite) appears once, with its new values."""
  root = epath.Path(root)
  scalars: dict[int, dict[str, float]] = {}
  for path in root.glob("*/step_*/results.json"):
    results = read_results(path)
    if results is not None and results.get("step") is not None:
      scalars.setdefault(int(results["step"]), {}).update(
          {f"eval/{path.parent.parent.name}/{k}": v for k, v in results["metrics"].items()})
  tb = root / "tb"
  if tb.exists():
    for old in tb.glob("events.out.tfevents.*"):
      old.unlink()
  writer = events.EventsWriter(tb)
  for step in sorted(scalars):
    writer.scalars(step, scalars[step])
  writer.close()


def read_results(path) -> dict | None:
  """A results.json, or None when there is none or it cannot be read (a write cut short): that
  benchmark is evaluated again, with a warning."""
  if not path.exists():
    return None
  try:
    out = json.loads(path.read_text())
    if not isinstance(out, dict) or "metrics" not in out:
      raise ValueError("no metrics")
    return out
  except (ValueError, UnicodeDecodeError) as e:
    logging.warning("%s cannot be read (%s); evaluating it again.", path, e)
    return None


def digest(bench) -> str:
  """sha256 of a benchmark's examples: a changed file under the same name is another benchmark."""
  blob = json.dumps([dataclasses.asdict(e) for e in bench.examples], sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()


def _run_settings(settings: eval_lib.Settings, cfg) -> eval_lib.Settings:
  """`settings` with the run's context budget and search syntax where the flags kept their
  defaults; validated."""
  default = eval_lib.Settings()
  if cfg is not None and settings.max_context == default.max_context:
    settings = dataclasses.replace(settings, max_context=int(cfg.rollout.max_context))
    if settings.max_prompt_tokens == default.max_prompt_tokens:
      settings = dataclasses.replace(settings, max_prompt_tokens=int(cfg.rollout.max_prompt_tokens))
  if cfg is not None and not settings.syntax:
    settings = dataclasses.replace(settings, syntax=cfg.get(cfg.method, {}).get("syntax", "xml"))
  settings = dataclasses.replace(settings, syntax=settings.syntax or "xml")
  settings.validate()
  return settings


def _spec_name(spec: str) -> str:
  """A directory name for a model spec: 'hf:/ckpt/Qwen2.5-7B/' → 'Qwen2.5-7B'."""
  tail = spec.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1] or spec
  return "".join(c if c.isalnum() or c in "._-" else "_" for c in tail)


def agreed_steps(record) -> list[int]:
  """Committed steps as process 0 sees them, on every host (a checkpoint that commits between
  two hosts' listings must not make them evaluate different steps)."""
  steps = run_record.committed_steps(record)
  if jax.process_count() == 1:
    return steps
  steps = steps[-MAX_BROADCAST_STEPS:]
  buf = np.full(MAX_BROADCAST_STEPS + 1, -1, np.int64)
  buf[0], buf[1:1 + len(steps)] = len(steps), steps
  buf = multihost_utils.broadcast_one_to_all(buf)
  return [int(s) for s in buf[1:1 + int(buf[0])]]


def run(opts: Options | Session) -> list[dict]:
  """Evaluates what `opts` names; returns the rows of the final table (one per model)."""
  session = opts if isinstance(opts, Session) else Session(opts)
  session.evaluate_base()
  if session.record is not None:
    if session.opts.watch:
      watch(session)
    else:
      session.evaluate_steps(session.steps)
  rows = table_rows(session)
  print(format_table(rows, session))
  return rows


def watch(session: Session) -> None:
  """Evaluates every committed checkpoint once, polling for new ones, until the run's last step
  (`total_steps − 1`, re-read each time: a resumed run may raise it) is evaluated,
  `watch_timeout` passes without a new checkpoint, or Ctrl-C."""
  opts = session.opts
  idle_since = time.monotonic()
  try:
    while True:
      available = agreed_steps(session.record)
      if session.evaluate_steps(available):
        idle_since = time.monotonic()
      last_step = int(run_record.read(opts.run).config.total_steps) - 1
      if last_step in available and (last_step in session.skipped
                                     or session.done(f"step_{last_step}")):
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
      labels |= {p.name for p in d.iterdir() if read_results(p / "results.json") is not None}
  order = sorted(labels, key=lambda l: (l != "base", int(l[5:]) if l.startswith("step_") else -1))
  rows = []
  for label in order:
    row = {"model": label}
    for bench in session.benches:
      results = read_results(session.result_dir(bench, label) / "results.json")
      if results is not None:
        row[bench.name] = results["metrics"]
    rows.append(row)
  return rows


def format_table(rows: list[dict], session: Session) -> str:
  """One line per model: each benchmark's mean@n, the largest pass@k and maj@k."""
  cols = []
  for bench in session.benches:
    primary = scoring.PRIMARY[bench.type]
    k = max(session.settings.ks or scoring.ks(session.settings.num_samples))
    cols += [(bench.name, f"mean@n/{primary}"), (bench.name, f"pass@{k}"), (bench.name, f"maj@{k}")]
  head = ["model"] + [f"{b} {m}" for b, m in cols]
  lines = [head] + [[r["model"]] + [f"{r[b][m]:.3f}" if m in r.get(b, {}) else "-"
                                    for b, m in cols] for r in rows]
  widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
  return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)
