"""The synthetic world: the same seed gives the same world, every gold answer can be read off the
documents by following the question's chain, and no gold question is a training input."""

import json
import re

import numpy as np
import pytest

from scope_jax.evaluation import benchmarks as bench_lib
from scope_jax.methods.piplay import rewards as piplay_rewards
from scope_jax.rollout import parsers
from scope_jax.world import GOLD_SETS, World, corpus
from scope_jax.world import entities as E
from scope_jax.world import render as R


@pytest.fixture(scope="module")
def world():
  return World(0)


def test_a_seed_is_a_world(world):
  again = World(0)
  assert again.documents == world.documents and again.gold == world.gold
  other = World(1)
  assert {d.title for d in other.documents}.isdisjoint({d.title for d in world.documents}) or \
      other.documents != world.documents
  assert other.gold["hop1"] != world.gold["hop1"]


def test_gold_sets_are_large_and_unique(world):
  assert set(world.gold) == set(GOLD_SETS)
  for name, records in world.gold.items():
    assert len(records) >= 300, name
    assert len({r["question"] for r in records}) == len(records), name
    assert all(r["gold"] and r["gold"][0] for r in records), name


def _doc_of(world, name):
  return next(d for d in world.documents if d.title == name)


def test_gold_answers_are_derivable_from_the_documents(world):
  by_id = {d.id: d for d in world.documents}
  for name in ("hop1", "hop2", "doc", "attr", "attr_search"):
    for r in world.gold[name]:
      chain = [by_id[i] for i in r["support"]]
      assert len(chain) == (2 if name == "hop2" else 1)
      assert chain[0].title in r["question"]  # the question names where to start
      for here, nxt in zip(chain, chain[1:]):
        assert nxt.title in here.text  # the first document names the bridge entity
      assert re.search(rf"\b{re.escape(r['gold'][0])}\b", chain[-1].text), (r, chain[-1].text)
  for r in world.gold["doc"] + world.gold["attr"]:
    d = by_id[r["support"][0]]  # the document is given, titled, as a reader is shown it
    assert r["question"].startswith(f"Document: {d.title}\n{d.text}\nQuestion: ")


def test_arithmetic_answers_by_hand():
  text, f, _ = R.ARITHMETIC[0]
  assert f(4, 6, 5) == 19  # 4 crates × 6 bottles − 5 sold
  assert R.ARITHMETIC[3][1](7, 3, 1) == 7  # 21 coins shared by 3
  w = World(2, gold_size=50)
  for r in w.gold["arith"]:
    assert int(r["gold"][0]) >= 0 and r["gold"][0].isdigit()


def test_worked_problems_show_sums_that_end_at_the_answer():
  w = World(2, gold_size=50)
  worked = w.training_problems(40, worked=True)
  assert [q["question"] for q in worked] == [q["question"] for q in w.training_problems(40)]
  for q in worked:
    sums = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", q["steps"])
    assert sums and sums[-1][3] == q["gold"][0]
    for x, op, y, z in sums:  # every step's arithmetic holds
      x, y, z = int(x), int(y), int(z)
      assert {"+": x + y, "-": x - y, "*": x * y, "/": x // y}[op] == z
      assert op != "/" or x % y == 0
    numbers = re.findall(r"\d+", q["question"])
    assert sums[0][0] in numbers and sums[0][2] in numbers  # the first step reads the problem
  assert "steps" not in w.gold["arith"][0] and "form" not in w.gold["arith"][0]


def test_no_gold_question_is_a_training_input(world):
  train = world.training_problems(500)
  assert len(train) == 500 and len({t["question"] for t in train}) == 500
  gold = {r["question"] for records in world.gold.values() for r in records}
  assert not gold & {t["question"] for t in train}
  corpus = " ".join(d.text for d in world.documents)
  assert not any(r["question"] in corpus
                 for r in world.gold["hop1"] + world.gold["hop2"] + world.gold["attr_search"])


def test_questions_to_demonstrate_are_never_gold_and_answer_from_their_document(world):
  every = world.questions(10 ** 4, np.random.default_rng(0))
  gold = {r["question"] for r in world.gold["hop1"]}
  assert len(every) >= 300 and not gold & {q["question"] for q in every}
  again = world.questions(20, np.random.default_rng(0))
  assert again == world.questions(20, np.random.default_rng(0)) and len(again) == 20
  docs = {d.id: d.text for d in world.documents}
  for q in every:
    assert re.search(rf"\b{re.escape(q['gold'][0])}\b", docs[q["support"][0]]), q


def test_closed_class_questions_to_demonstrate_are_never_gold(world):
  """`skill='attr'`: profession, industry and language questions, none of them asked by the
  world's `attr` gold set (which gives the document with the question)."""
  every = world.questions(10 ** 4, np.random.default_rng(0), "attr")
  gold = {r["question"].rsplit("\nQuestion: ", 1)[-1] for r in world.gold["attr"]}
  assert every and not gold & {q["question"] for q in every}
  assert len(every) + len(gold) == 2 * (160 + 60 + 8)  # two phrasings of each entity's fact
  classes = set(E.PROFESSIONS) | set(E.INDUSTRIES) | set(E.LANGUAGES)
  assert all(q["gold"][0] in classes for q in every + world.gold["attr"])
  with pytest.raises(ValueError, match="Unknown question skill 'hop3'"):
    world.questions(1, np.random.default_rng(0), "hop3")


def test_written_sets_load_as_file_benchmarks(world, tmp_path):
  world.write(tmp_path)
  lines = (tmp_path / "corpus.jsonl").read_text().splitlines()
  assert len(lines) == len(world.documents) and json.loads(lines[0])["contents"]
  for name, kind in GOLD_SETS.items():
    spec = world.benchmark(tmp_path, name)
    (item,) = bench_lib.parse_specs(spec)
    bench = bench_lib.load(item)
    assert bench.type == kind and len(bench.examples) == len(world.gold[name])
    assert bench.examples[0].gold == tuple(world.gold[name][0]["gold"])
  with pytest.raises(ValueError, match="Unknown world gold set 'hop3'"):
    world.benchmark(tmp_path, "hop3")
  with pytest.raises(ValueError, match="world.seed=-1"):
    World(-1)


def test_the_world_index_finds_the_document_a_question_names(tmp_path, monkeypatch):
  """retrieval.corpus='world': the world's documents indexed with the bundled MiniLM; a 1-hop
  question's own entity document is among the top 3 for most questions."""
  import ml_collections
  from scope_jax import assets
  from scope_jax.configs_base import retrieval
  from scope_jax.retrieval import search
  from scope_jax.world import search as world_search
  monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
  r = retrieval()
  r.corpus = "world"
  search.validate(r)
  passages, tool = world_search.from_config(ml_collections.ConfigDict(r), world_seed=4)
  w = World(4, gold_size=60)
  assert passages == w.documents and (tmp_path / "world_4_index" / "meta.json").exists()
  hop1 = w.gold["hop1"]
  found = tool([q["question"] for q in hop1])
  hits = [q["support"][0].split(":", 1)[1] in text for q, text in zip(hop1, found)]
  assert sum(hits) / len(hits) >= 0.8, sum(hits) / len(hits)


def test_retrieval_alone_cannot_build_a_world_corpus():
  """retrieval sits under world: its `from_config` builds corpus='world' only from the index
  builder the world hands it, and says where to get one otherwise."""
  import ml_collections
  from scope_jax.configs_base import retrieval
  from scope_jax.retrieval import search
  r = retrieval()
  r.corpus = "world"
  with pytest.raises(ValueError, match="world.search.from_config"):
    search.from_config(ml_collections.ConfigDict(r))


def test_a_corpus_of_several_worlds_keeps_the_worlds_own_pages_first():
  """world.corpus_seeds: world 0's documents as they are, then every other world's page whose id
  is new (a repeated name keeps world 0's page, so no world-0 fact is contradicted)."""
  own = World(0).documents
  docs = corpus(0, (500, 501))
  assert docs[:len(own)] == own
  ids = [d.id for d in docs]
  assert len(ids) == len(set(ids))
  for seed in (500, 501):
    assert {d.id for d in World(seed).documents} <= set(ids)
  taken = {d.id for d in own}
  new_500 = [d for d in World(500).documents if d.id not in taken]
  assert docs[len(own):len(own) + len(new_500)] == new_500
  assert corpus(0) == own
  for bad in ((0, 500), (500, 500)):
    with pytest.raises(ValueError, match="corpus_seeds"):
      corpus(0, bad)


def test_a_world_index_over_several_worlds_is_cached_under_all_their_seeds(tmp_path,
                                                                          monkeypatch):
  import ml_collections
  from scope_jax import assets
  from scope_jax.configs_base import retrieval
  from scope_jax.world import search
  monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
  r = retrieval()
  r.corpus = "world"
  passages, tool = search.from_config(ml_collections.ConfigDict(r), world_seed=4,
                                      corpus_seeds=(9,))
  assert passages == corpus(4, (9,)) and (tmp_path / "world_4+9_index" / "meta.json").exists()
  assert not (tmp_path / "world_4_index").exists()
  page = World(9).documents[3]
  assert page.text in tool([page.title])[0]  # another world's page is found by its name


def test_corpus_seeds_need_a_world_corpus():
  from configs import scope as scope_config
  from scope_jax.core import runner
  c = scope_config.get_config("learn")
  c.world.corpus_seeds = (500, 501)
  runner.check_world(c)
  c.world.corpus_seeds = (0, 501)
  with pytest.raises(ValueError, match="other than world.seed=0"):
    runner.check_world(c)
  c = scope_config.get_config("demo")
  c.world.corpus_seeds = (500,)
  with pytest.raises(ValueError, match="retrieval.corpus=world"):
    runner.check_world(c)


def test_methods_read_the_world():
  """SPELL's clusters (data.corpus='world') hold the world's documents; OpenSIR's starting pool
  (initial_pool.file='world') is its training problems, no gold question among them."""
  import ml_collections
  from configs import spell as spell_config
  from scope_jax.methods.opensir import bootstrap
  from scope_jax.methods.spell import clusters
  data = ml_collections.ConfigDict(spell_config.get_config("demo").data)
  data.corpus, data.max_passages = "world", 0
  passages, groups = clusters.from_config(data, seed=0, world_seed=5)
  assert passages == World(5).documents
  assert sorted(i for g in groups for i in g) == sorted(set(i for g in groups for i in g))
  problems = bootstrap.from_world(5, 40)
  gold = {q["question"] for q in World(5).gold["arith"]}
  assert len(problems) == 40 and not gold & {p.text for p in problems}


def test_the_copying_probes_copy_a_name_that_is_in_their_prompt():
  """`tools/world_reading.py --skill=search|ask` measure copying alone: the entity's name they
  must write is in their prompt, and the rest of the target is fixed by the question's kind."""
  from tools import world_reading
  world = World(3)
  by_id = {d.id: d for d in world.documents}
  for q in world_reading.questions(world, "search", 30, 4):
    doc = by_id[q["support"][0]]
    prompt, target = world_reading.example("search", doc, q)
    assert target == f" {doc.title}\n" and doc.title in q["question"] and q["question"] in prompt
    prompt, target = world_reading.example("ask", doc, q)
    assert target == f" {q['question']}\n" and prompt.startswith(f"Document: {doc.title}\n")
    assert q["question"].replace(doc.title, "{n}") in {t for _, t, _ in world_reading.ATTR}
    prompt, target = world_reading.example("attr", doc, q)
    assert target == f" {q['gold'][0]}\n" and q["gold"][0] in doc.text
    # --format=piplay: the same copies in π-Play's prompts, in the calls its parsers read.
    messages, target = world_reading.piplay_example("search", doc, q)
    assert q["question"] in messages[-1]["content"]
    action = parsers.parse_action(target, syntax="qwen")
    assert action.kind == "search" and action.queries == (doc.title,)
    messages, target = world_reading.piplay_example("ask", doc, q)
    assert f'(Title: "{doc.title}")' in messages[-1]["content"]
    assert piplay_rewards.parse_examiner(target + "<answer>x</answer>").question == q["question"]
