"""Evaluates one model on one benchmark: batched rollouts (every example's n samples in one
prefill-and-fork, many examples per call, the search tool for `qa_search`), answer extraction and
scoring per type, an LLM judge for `judge`, then the metrics of `scoring.aggregate`.

Rows are written as they are scored: `predictions.jsonl` has one line per example (its samples,
answers and scores) and `results.json` the metrics; `write_results` puts both in a directory
(local or gs://).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any, Sequence

from absl import logging
from etils import epath
from tqdm import tqdm

from scope_jax import prompts as prompts_lib
from scope_jax import rollout
from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.evaluation import scoring
from scope_jax.rewards import judges, mathcheck
from scope_jax.rollout import RolloutConfig, render_chat, run_rollout
from scope_jax.sampling import Sampler

JUDGE_STYLES = judges.FORMATS  # answer_match: [[YES]]/[[NO]]; criterion_grade: <score>0|1</score>
FINAL_TAGS = {"qa": ("answer",), "qa_search": ("answer",), "judge": ("answer",), "math": (),
              "mc": ()}
JUDGE_ANSWER_CHARS = 2000  # a sample without an extracted answer is judged on its last chars


@dataclasses.dataclass(frozen=True)
class Settings:
  """Sampling settings of an evaluation (flags of `scope_jax.evaluate`)."""

  num_samples: int = 1
  temperature: float = 0.0  # 0 = greedy
  top_p: float = 1.0
  max_new_tokens: int = 512  # per generated turn
  max_turns: int = 4  # searches before the final, search-free turn (qa_search)
  max_obs_tokens: int = 500
  max_prompt_tokens: int = 2048
  max_context: int = 4096
  batch_size: int = 16  # examples per rollout call (each with num_samples rows)
  seed: int = 0
  syntax: str = ""  # search syntax: 'xml' (<search>), 'qwen' (<tool_call>), 'function_calls'
  # (OLMo-3's); '' = a run's, or xml
  judge_style: str = judges.ANSWER_MATCH  # do answer and reference agree, or does the answer
  # meet the reference as a criterion (`rewards.judges`)
  judge_max_tokens: int = 512
  ks: tuple[int, ...] = ()  # k of pass@k and maj@k (default 1, 2, 4, … ≤ n, and n)

  def validate(self) -> None:
    """Every setting a run would otherwise trip over late (or never notice), in one line."""
    for name in ("num_samples", "batch_size", "max_new_tokens", "max_obs_tokens",
                 "max_prompt_tokens", "max_context", "judge_max_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"--{name}={getattr(self, name)}: it must be at least 1.")
    if not math.isfinite(self.temperature) or self.temperature < 0:
      raise ValueError(f"--temperature={self.temperature}: use 0 (greedy) or a positive number.")
    if not 0 < self.top_p <= 1:  # NaN fails too
      raise ValueError(f"--top_p={self.top_p}: it must be in (0, 1]; 1 keeps every token.")
    if self.max_turns < 0:
      raise ValueError(f"--max_turns={self.max_turns}: use 0 (no search) or more searches.")
    if self.max_prompt_tokens >= self.max_context:
      raise ValueError(f"max_prompt_tokens={self.max_prompt_tokens} leaves no room for an answer "
                       f"within max_context={self.max_context}.")
    if self.judge_style not in JUDGE_STYLES:
      raise ValueError(f"judge_style={self.judge_style!r}: choose one of {JUDGE_STYLES} "
                       "(answer_match asks whether the answer and the reference agree, "
                       "criterion_grade grades the answer against the reference).")
    if self.syntax not in ("", "xml", "qwen", "function_calls"):
      raise ValueError(f"syntax={self.syntax!r}: choose 'xml', 'qwen' or 'function_calls'.")
    if any(not 1 <= k <= self.num_samples for k in self.ks):
      raise ValueError(f"ks={list(self.ks)}: every k of pass@k / maj@k must be between 1 and "
                       f"num_samples={self.num_samples}.")


def make_sampler(model, *, mesh, rules, dtype, max_context: int) -> Sampler:
  """A sampler over `model` (evaluation.models.Model) under the sampling rules."""
  tok = model.tokenizer
  eos = getattr(tok, "eos_token_id", None)
  eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else ((int(eos),) if eos is not None
                                                                else model.config.eos_ids)
  pad = getattr(tok, "pad_token_id", None)
  return Sampler(model.config, model.params, dtype=dtype, mesh=mesh, rules=rules,
                 decode=lambda ids: tok.decode(list(ids), skip_special_tokens=False),
                 max_context=max_context, pad_id=int(pad) if pad is not None else 0,
                 eos_ids=eos_ids)


class Evaluator:
  """Evaluates samplers on benchmarks with one tokenizer, settings, tool and judge."""

  def __init__(self, tokenizer, settings: Settings, *, tool=None, judge: Sampler | None = None,
               judge_tokenizer=None, checker=None, templates: dict[str, str] | None = None,
               role_prompt=None, progress: bool = True):
    settings.validate()
    self.tokenizer, self.settings, self.tool, self.judge = tokenizer, settings, tool, judge
    self.judge_tokenizer = judge_tokenizer or tokenizer
    self._checker = checker
    self.templates = dict(templates or {})
    # (benchmark type, question) → prompt ids in a trained role's own prompt, or None where the
    # role has none for that type (the evaluator's template asks it).
    self.role_prompt = role_prompt
    self.progress = progress

  @property
  def syntax(self) -> str:
    return self.settings.syntax or "xml"

  @property
  def checker(self):
    if self._checker is None:
      self._checker = mathcheck.default_checker()
    return self._checker

  # ------------------------------------------------------------------------------- prompts
  def template(self, kind: str) -> str:
    """The answer prompt of a benchmark type (qa_search's names the search syntax)."""
    if kind == "qa_search" and self.syntax != "xml":
      kind = f"qa_search_{self.syntax}"
    return self.templates.get(kind) or prompts_lib.load("eval", kind)

  def prompt(self, template: str, tokenizer=None, **fields) -> list[int]:
    """Chat-templated ids; the inserted fields are cut (never the template) to the limit."""
    tokenizer = tokenizer or self.tokenizer
    chat = lambda text: render_chat(tokenizer, [{"role": "user", "content": text}],
                                    plain_contents=True)  # questions are untrusted text
    prompt = prompts_lib.Prompt(template, fields, tuple(fields))
    text, _ = prompts_lib.fit_prompt(prompt, self.settings.max_prompt_tokens,
                                     lambda t: len(chat(t)), role="the evaluation prompt")
    return chat(text)

  # ------------------------------------------------------------------------------- running
  def rollout_config(self, kind: str, max_turns: int, max_new_tokens: int,
                     temperature: float) -> RolloutConfig:
    s = self.settings
    return RolloutConfig(syntax=self.syntax, final_tags=FINAL_TAGS[kind], max_turns=max_turns,
                         max_turn_tokens=max_new_tokens, max_obs_tokens=s.max_obs_tokens,
                         max_total_tokens=s.max_context, temperature=temperature,
                         top_p=s.top_p if temperature > 0 else 1.0)

  def evaluate(self, sampler: Sampler, bench: bench_lib.Benchmark, *, desc: str = ""
               ) -> tuple[dict[str, float], list[dict]]:
    """(metrics, one prediction record per example) of `sampler` on `bench`."""
    if bench.type == "qa_search" and self.tool is None:
      raise ValueError(f"Benchmark {bench.name} (qa_search) needs a search tool: pass --index "
                       "or --retrieval_url (or evaluate a run that has a retrieval section).")
    s = self.settings
    turns = s.max_turns if bench.type == "qa_search" else 0
    config = self.rollout_config(bench.type, turns, s.max_new_tokens, s.temperature)
    template = self.template(bench.type)
    records: list[dict] = []
    start = time.perf_counter()
    chunks = range(0, len(bench.examples), s.batch_size)
    for first in tqdm(chunks, desc=desc or bench.name, unit="batch", disable=not self.progress):
      examples = bench.examples[first:first + s.batch_size]
      prompt_ids = [self.role_prompt(bench.type, e.question) if self.role_prompt else None
                    for e in examples]
      prompt_ids = [ids if ids is not None else self.prompt(template, question=e.question)
                    for ids, e in zip(prompt_ids, examples)]
      trajs = run_rollout(sampler, self.tokenizer, prompt_ids,
                          self.tool if turns else None, config, num_samples=s.num_samples,
                          seed=s.seed + first)
      for i, example in enumerate(examples):
        records.append(self._record(example, trajs[i * s.num_samples:(i + 1) * s.num_samples],
                                    bench.type))
    if bench.type == "judge":
      self._judge(bench, records)
    per_example = [dict(scores=r["details"], answers=r["canonical"], lengths=r["lengths"],
                        searches=r["searches"], type=bench.type) for r in records]
    metrics = scoring.aggregate(per_example, ks=self.settings.ks or None)
    metrics["time/seconds"] = time.perf_counter() - start
    if bench.type == "math":  # answers that could not be checked (too large, or out of time)
      metrics["math/unchecked"] = float(sum(
          self.checker.is_unchecked(scoring.math_answer(a)) for r in records for a in r["answers"]))
      if metrics["math/unchecked"]:
        logging.warning("%s: %d answers could not be checked (too large to parse, or past the "
                        "math checker's timeout); each scored 0.", bench.name,
                        metrics["math/unchecked"])
    if bench.type == "judge":
      verdicts = [v for r in records for v in r["verdicts"]]
      metrics["judge/invalid"] = sum(v is None for v in verdicts) / max(len(verdicts), 1)
    for r in records:
      r["scores"] = [float(d[scoring.PRIMARY[bench.type]]) for d in r["details"]]
      r.pop("canonical")
    return metrics, records

  def _record(self, example, trajs, kind: str) -> dict:
    texts = [rollout.plain_response(self.tokenizer, t) for t in trajs]  # no end-of-turn marker
    answers = [t.answer if t.answer is not None else scoring.extract_answer(x, kind)
               for t, x in zip(trajs, texts)]
    details = [self._score(ans, example.gold, kind) for ans in answers]
    checker = self.checker if kind == "math" else None
    canonical = [scoring.canonical_answer(ans, kind, checker) for ans in answers]
    return {"id": example.id, "question": example.question, "gold": list(example.gold),
            "samples": [t.response_text() for t in trajs], "answers": answers,
            "details": details, "canonical": canonical,
            "lengths": [float(t.loss_mask.sum()) for t in trajs],
            "searches": [float(t.num_searches) for t in trajs],
            "finish": [t.finish_reason for t in trajs]}

  def _score(self, answer: str | None, gold, kind: str) -> dict:
    if kind in ("qa", "qa_search"):
      return scoring.score_qa(answer, gold)
    if kind == "math":
      return scoring.score_math(answer, gold, self.checker)
    if kind == "mc":
      return scoring.score_mc(answer, gold)
    return {}  # judge: scored once every sample is in

  # ------------------------------------------------------------------------------- judge
  def _judge_prompt(self, question: str, answer: str, reference: str) -> list[int]:
    if self.settings.judge_style == judges.ANSWER_MATCH:
      return self.prompt(judges.template(judges.ANSWER_MATCH), self.judge_tokenizer,
                         problem=question, answer_1=answer, answer_2=reference)
    criterion = prompts_lib.render(self.template("judge_criterion"), reference=reference)
    return self.prompt(judges.template(judges.CRITERION_GRADE), self.judge_tokenizer,
                       task=question, criterion=criterion, response=answer)

  def _judge(self, bench, records: list[dict]) -> None:
    """Scores every sample of a `judge` benchmark with the judge model (greedy, one call per
    batch): acc = 1 when the judge says the answer matches the reference (the first gold)."""
    if self.judge is None:
      raise ValueError(f"Benchmark {bench.name} (judge) needs a judge model: pass --judge or "
                       "--model (the base model judges by default).")
    parse = judges.PARSERS[self.settings.judge_style]
    jobs = [(r, j) for r in records for j in range(len(r["answers"]))]
    prompts = [self._judge_prompt(r["question"], _judged_text(r, j), r["gold"][0])
               for r, j in jobs]
    config = RolloutConfig(final_tags=(), max_turns=0, max_turn_tokens=self.settings.judge_max_tokens,
                           max_total_tokens=self.settings.max_context, temperature=0.0)
    for r in records:
      r["verdicts"] = [None] * len(r["answers"])
    step = self.settings.batch_size * self.settings.num_samples
    for first in range(0, len(prompts), step):
      trajs = run_rollout(self.judge, self.judge_tokenizer, prompts[first:first + step],
                          None, config)
      for (r, j), t in zip(jobs[first:first + step], trajs):
        r["verdicts"][j] = parse(t.response_text())
    for r in records:
      r["details"] = [{"acc": float(v == 1)} for v in r["verdicts"]]


def _judged_text(record: dict, j: int) -> str:
  answer = record["answers"][j]
  return answer if answer else record["samples"][j][-JUDGE_ANSWER_CHARS:]


def write_results(directory, bench: bench_lib.Benchmark, metrics: dict[str, float],
                  records: Sequence[dict], *, step: int | None, label: str,
                  extra: dict[str, Any] | None = None) -> epath.Path:
  """`predictions.jsonl`, then `results.json` (written last: its presence marks the step done)."""
  out = epath.Path(directory)
  out.mkdir(parents=True, exist_ok=True)
  (out / "predictions.jsonl").write_text(
      "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
  results = {"benchmark": bench.name, "type": bench.type, "step": step, "label": label,
             "num_examples": len(records), "metrics": metrics, **(extra or {})}
  tmp = out / "results.json.tmp"  # renamed into place: a cut-short write never looks done
  tmp.write_text(json.dumps(results, indent=2))
  tmp.replace(out / "results.json")
  return out
