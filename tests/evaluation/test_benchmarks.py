"""Evaluation benchmarks: every upstream schema normalised exactly, every error naming its file
and line, the built-in sets, and the --benchmarks spec."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from scope_jax.evaluation import benchmarks
from scope_jax.evaluation.benchmarks import Benchmark, Example


def _jsonl(path, records, blank_lines=False):
  sep = "\n\n" if blank_lines else "\n"
  path.write_text(sep.join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
  return str(path)


def test_search_r1_jsonl(tmp_path):
  path = _jsonl(tmp_path / "nq_test.jsonl", [
      {"id": "test_0", "question": "who got the first nobel prize in physics?",
       "golden_answers": ["Wilhelm Conrad Röntgen"], "data_source": "nq"},
      {"question": "how many episodes in season 1? ", "golden_answers": ["10", "ten"]},
  ], blank_lines=True)
  got = benchmarks.load_file(path, "qa_search")
  assert got == Benchmark("nq_test", "qa_search", (
      Example("test_0", "who got the first nobel prize in physics?", ("Wilhelm Conrad Röntgen",)),
      Example("nq_test-1", "how many episodes in season 1?", ("10", "ten"))))
  assert benchmarks.load_file(path, "qa", name="nq", limit=1).examples == got.examples[:1]


def test_search_r1_parquet_with_reward_model_fallback(tmp_path):
  rows = [
      {"id": "train_0", "question": "total number of death row inmates in the us?",
       "golden_answers": ["2,718"], "reward_model": None},
      # The processed Search-R1 rows: no golden_answers, gold under reward_model.
      {"id": None, "question": "big little lies season 2 how many episodes?",
       "golden_answers": None,
       "reward_model": {"style": "rule", "ground_truth": {"target": ["seven", "7"]}}},
  ]
  path = tmp_path / "hotpot.parquet"
  pq.write_table(pa.Table.from_pylist(rows), path)
  got = benchmarks.load_file(str(path), "qa")
  assert got == Benchmark("hotpot", "qa", (
      Example("train_0", "total number of death row inmates in the us?", ("2,718",)),
      Example("hotpot-1", "big little lies season 2 how many episodes?", ("seven", "7"))))


def test_gsm8k_and_math_styles(tmp_path):
  path = _jsonl(tmp_path / "gsm.jsonl", [
      {"question": "How many?", "answer": "He has 1,000 + 234 = <<1000+234=1234>>1,234\n#### 1,234"},
  ])
  assert benchmarks.load_file(path, "math").examples == (
      Example("gsm-0", "How many?", ("1234",)),)
  path = tmp_path / "math.json"
  path.write_text(json.dumps([
      {"problem": "Half of one?", "solution": "It is $\\boxed{\\frac{1}{2}}$.", "level": "1"},
      {"problem": "Nested?", "solution": "So $\\boxed{\\frac{\\sqrt{2}}{2}}$ and not \\boxed{3}x"
       " wait: $\\boxed{{a}^{2}}$"},
      {"problem": "Given?", "answer": "\\frac{1}{2}", "solution": "long work", "unique_id": 7},
      {"problem": "A number?", "answer": 42},
  ]), encoding="utf-8")
  got = benchmarks.load_file(str(path), "math")
  assert got.examples == (
      Example("math-0", "Half of one?", ("\\frac{1}{2}",)),
      Example("math-1", "Nested?", ("{a}^{2}",)),
      Example("math-2", "Given?", ("\\frac{1}{2}",)),
      Example("math-3", "A number?", ("42",)))


def test_our_own_schema(tmp_path):
  path = _jsonl(tmp_path / "own.jsonl", [
      {"qid": 5, "question": "Q1", "gold": "Paris"},
      {"question_id": "b", "question": "Q2", "gold": ["Paris", "Paris", "paris"]},
      {"idx": 0, "question": "Q3", "answers": ["x", ""]},
      {"question": "Q4", "answer": 2.0},
      {"question": "Q5", "answer": True},
  ])
  assert benchmarks.load_file(path, "judge").examples == (
      Example("5", "Q1", ("Paris",)), Example("b", "Q2", ("Paris", "paris")),
      Example("0", "Q3", ("x",)), Example("own-3", "Q4", ("2", "2.0")),
      Example("own-4", "Q5", ("yes",)))


def test_multiple_choice(tmp_path):
  path = _jsonl(tmp_path / "mc.jsonl", [
      {"question": "Capital of France?", "choices": ["Lyon", "Paris", "Nice"], "answer": 1},
      {"question": "Two?", "options": ["one", "two"], "answer": "b"},
      {"question": "Red?", "choices": ["Blue", "Red"], "answer": "red"},
      {"question": "Pick.\nA. x\nB. y", "answer": "B"},
      {"question": "ARC?", "choices": {"text": ["p", "q"], "label": ["1", "2"]}, "answerKey": "2"},
  ])
  assert benchmarks.load_file(path, "mc").examples == (
      Example("mc-0", "Capital of France?\nA. Lyon\nB. Paris\nC. Nice", ("B",)),
      Example("mc-1", "Two?\nA. one\nB. two", ("B",)),
      Example("mc-2", "Red?\nA. Blue\nB. Red", ("B",)),
      Example("mc-3", "Pick.\nA. x\nB. y", ("B",)),
      Example("mc-4", "ARC?\nA. p\nB. q", ("B",)))


def test_non_finite_golds_are_dropped_and_the_rest_kept(tmp_path):
  path = tmp_path / "mixed.jsonl"
  path.write_text('{"question": "q", "gold": [NaN, 2.5, "x"]}\n', encoding="utf-8")
  assert benchmarks.load_file(str(path), "math").examples[0].gold == ("2.5", "x")
  record = {"question": "q", "answer": np.float64("nan")}  # an empty parquet float cell
  with pytest.raises(ValueError, match="no gold answer"):
    benchmarks.example_from_record(record, "math", default_id="x")


def test_numpy_values_from_a_reader():
  record = {"question": np.str_("Q"), "golden_answers": np.array(["a", "b"]),
            "reward_model": {"ground_truth": {"target": np.array(["c"])}}, "id": np.int64(3)}
  assert benchmarks.example_from_record(record, "qa", default_id="x") == Example("3", "Q",
                                                                                  ("a", "b"))
  record = {"question": "Q", "choices": np.array(["u", "v"]), "answer": np.int64(1)}
  assert benchmarks.example_from_record(record, "mc", default_id="x").gold == ("B",)


@pytest.mark.parametrize("answer, gold", [
    ("Paris", ("Paris",)), (680000, ("680000",)), (61.6, ("61.6",)), (6.0, ("6", "6.0")),
    (True, ("yes",)), ([False], ("no",)), (["Jisoo", "Jennie"], ("Jisoo, Jennie",)),
    ([2012, 2018], ("2012, 2018",)), ({"Apple": 161000}, ("161000",)),
    ({"2022": "Argentina", "2018": "France"}, ("2022: Argentina, 2018: France",)), ("", ())])
def test_fanoutqa_gold(answer, gold):
  assert benchmarks.fanoutqa_gold(answer) == gold


def test_missing_files_name_the_path(tmp_path, monkeypatch):
  missing = str(tmp_path / "nope.jsonl")
  with pytest.raises(FileNotFoundError, match=f"Benchmark file {re.escape(missing)} does not exist"):
    benchmarks.load_file(missing, "qa")

  class NoBucket:  # what epath does for a gs:// bucket that does not exist (or no network)
    def __init__(self, path):
      self.path = path

    def exists(self):
      raise RuntimeError("FAILED_PRECONDITION: could not resolve host")

  monkeypatch.setattr(benchmarks.epath, "Path", NoBucket)
  with pytest.raises(FileNotFoundError,
                     match="Benchmark file gs://b/x.jsonl could not be read: RuntimeError"):
    benchmarks.load_file("gs://b/x.jsonl", "qa")


@pytest.mark.parametrize("name, content, match", [
    ("bad.jsonl", '{"question": "q", "gold": "a"}\n\n{"question": \n', r"line 3 is not valid JSON"),
    ("noq.jsonl", '{"question": "q", "gold": "a"}\n{"query": "q", "gold": "a"}\n',
     r"line 2: no question field: it has keys \['gold', 'query'\]; accepted: question, problem"),
    ("nogold.json", '[{"question": "q", "gold": "a"}, {"question": "q", "label": 1}]',
     r"record 2: no gold answer: it has keys \['label', 'question'\]; accepted: gold, "
     r"golden_answers, answers, answer, solution"),
    ("noboxed.json", '[{"problem": "q", "solution": "no box"}]', r"record 1: no gold answer"),
    # A JSON NaN or Infinity is no gold (math-verify would read 'nan' as n·a·n: 'ann' correct).
    ("nanboxed.jsonl", '{"problem": "q", "answer": NaN}\n', r"line 1: no gold answer"),
    ("inf.jsonl", '{"question": "q", "gold": [Infinity, -Infinity]}\n', r"line 1: no gold answer"),
    ("list.json", '[["q", "a"]]', r"record 1: expected a JSON object, got list"),
    ("dict.json", '{"question": "q"}', r"must hold a JSON list of objects, not a dict"),
    ("broken.json", '[{"question": ', r"is not valid JSON"),
    ("empty.jsonl", "\n\n", r"is empty"),
    ("empty.json", "[]", r"is empty"),
    ("x.csv", "question,gold\n", r"has an unknown extension; expected one of .jsonl, .json"),
    ("junk.parquet", "not parquet", r"is not a readable parquet file"),
])
def test_bad_files_name_the_path_and_record(tmp_path, name, content, match):
  path = tmp_path / name
  path.write_text(content, encoding="utf-8")
  with pytest.raises(ValueError, match=f"Benchmark file {re.escape(str(path))}.*{match}"):
    benchmarks.load_file(str(path), "math" if "boxed" in name else "qa")


@pytest.mark.parametrize("record, match", [
    ({"question": "q", "choices": ["a", "b"], "answer": 2}, "answer index 2 is out of range for 2 choices"),
    ({"question": "q", "choices": ["a", "b"], "answer": "c"}, "answer 'c' is neither a letter"),
    ({"question": "q", "choices": ["a", "b"]}, r"no gold answer.*accepted: gold, answer, answerKey"),
    ({"question": "q", "choices": "a b", "answer": "A"}, "choices must be a list"),
])
def test_bad_multiple_choice_records(tmp_path, record, match):
  path = _jsonl(tmp_path / "mc.jsonl", [record])
  with pytest.raises(ValueError, match=f"Benchmark file {re.escape(path)}, line 1: {match}"):
    benchmarks.load_file(path, "mc")


def test_bad_type_and_limit(tmp_path):
  path = _jsonl(tmp_path / "a.jsonl", [{"question": "q", "gold": "a"}])
  with pytest.raises(ValueError, match="Unknown benchmark type 'open'; valid types: qa, qa_search"):
    benchmarks.load_file(path, "open")
  with pytest.raises(ValueError, match="limit=0 must be at least 1"):
    benchmarks.load_file(path, "qa", limit=0)


def test_parse_specs():
  assert benchmarks.parse_specs("gsm8k,file:gs://bkt/dir/my.set.jsonl:qa") == [
      ("gsm8k", "math", None), ("my.set", "qa", "gs://bkt/dir/my.set.jsonl")]
  assert benchmarks.parse_specs(" fanoutqa , fanoutqa_search,file:/d/t.parquet:mc ") == [
      ("fanoutqa", "qa", None), ("fanoutqa_search", "qa_search", None),
      ("t", "mc", "/d/t.parquet")]
  with pytest.raises(ValueError, match="Unknown benchmark 'nq'; built-in benchmarks: gsm8k, "
                                       "fanoutqa, fanoutqa_search"):
    benchmarks.parse_specs("gsm8k,nq")
  for bad in ("file:gs://bkt/x.jsonl", "file:x.jsonl:open", "file::qa"):
    with pytest.raises(ValueError, match="expected file:<path>:<type> with a type in qa, "):
      benchmarks.parse_specs(bad)
  with pytest.raises(ValueError, match="each once"):
    benchmarks.parse_specs("gsm8k,gsm8k")
  with pytest.raises(ValueError, match="at least one benchmark"):
    benchmarks.parse_specs(" , ")
  with pytest.raises(ValueError, match="Unknown benchmark 'nq'"):
    benchmarks.builtin("nq")


def test_load_dispatches(tmp_path):
  path = _jsonl(tmp_path / "own.jsonl", [{"question": "q", "gold": "a"}] * 3)
  (item,) = benchmarks.parse_specs(f"file:{path}:judge")
  assert benchmarks.load(item, limit=2) == Benchmark(
      "own", "judge", (Example("own-0", "q", ("a",)), Example("own-1", "q", ("a",))))
  assert benchmarks.load("gsm8k", limit=2).examples[1].gold == ("3",)


def test_builtin_gsm8k():
  got = benchmarks.builtin("gsm8k")
  assert (got.name, got.type, len(got.examples)) == ("gsm8k", "math", 1319)
  assert got.examples[0].gold == ("18",) and got.examples[0].id == "gsm8k-0"
  assert got.examples[0].question.startswith("Janet’s ducks lay 16 eggs per day.")


def test_builtin_fanoutqa():
  # 2,142 sub-questions name an evidence page; 16 repeat an id (same question and answer under
  # two top-level questions) and one has an empty answer: 2,125 remain.
  got = benchmarks.builtin("fanoutqa")
  assert (got.type, len(got.examples)) == ("qa", 2125)
  assert len({e.id for e in got.examples}) == 2125
  first = got.examples[0]
  assert first == Example("bca4ab7d1f4df703", "Who were the first 5 picks in the 1998 MLB Draft?",
                          ("Pat Burrell, Mark Mulder, Corey Patterson, Jeff Austin, JD Drew",))
  assert all(e.gold and all(e.gold) for e in got.examples)
  assert len(benchmarks.builtin("fanoutqa", limit=3).examples) == 3


def test_builtin_fanoutqa_search():
  from scope_jax.retrieval.demo_corpus import demo_passages
  from scope_jax.retrieval.realdata import fanoutqa_subquestions
  got = benchmarks.builtin("fanoutqa_search")
  assert got.type == "qa_search" and len(got.examples) == 131
  titles = {p.title for p in demo_passages()}
  page = {q["id"]: q["evidence"]["title"] for q in fanoutqa_subquestions()}
  assert all(page[e.id] in titles for e in got.examples)
  assert got.examples[0] == Example("0c01398f995f8732", "What is the population of Singapore?",
                                    ("5917000",))
