"""The files that ship with the package, by path: nothing here but paths (no code imports from
here but paths, so every layer may name a bundled file without importing anything above it)."""

import pathlib

BUNDLED = pathlib.Path(__file__).parent / "bundled"
DEMO_MODEL = BUNDLED / "demo_model"  # the tiny model warmed up on every method's formats
READER_MODEL = BUNDLED / "reader_model"  # the demo model taught to read closed-class facts of
# other worlds' documents (right answers, worlds 1000-1019): `python -m tools.world_reading
# --skill=attr --steps=1000 --every=250 --out=<dir>` rebuilds it
SOLVER_MODEL = BUNDLED / "solver_model"  # the demo model taught to work out other worlds' word
# problems in OpenSIR's student prompt (right answers, worlds 1000-1019, the training half of the
# arithmetic by its numbers, `world.render.operands_half`; 5.0% of world 1100's held-out problems
# right): `python -m tools.world_reading --skill=arith --format=opensir --steps=2500 --every=500
# --world=1100 --out=<dir>` rebuilds it (18 min on a 2-core CPU)
COUNTER_MODEL = BUNDLED / "counter_model"  # the solver model fitted further on 60 other worlds'
# problems (worlds 1000-1059, right answers, the training half; 31.5% of world 1100's held-out
# problems right): `python -m tools.world_reading --size=<solver_model> --skill=arith
# --format=opensir --worlds=60 --steps=3000 --every=1000 --lr=2e-3 --world=1100 --out=<dir>`
# rebuilds it (21 min)
DEMO_TOKENIZER = BUNDLED / "demo_tokenizer.json"
CORPUS = BUNDLED / "wiki_leads_2k.jsonl"  # 2,000 Wikipedia lead paragraphs (CC BY-SA 4.0)
EMBEDDINGS = BUNDLED / "wiki_leads_2k.minilm.f16.npy"  # MiniLM passage vectors (float16)
EMBEDDINGS_ENCODER = BUNDLED / "wiki_leads_2k.minilm.json"  # the encoder that made them
CATEGORIES = BUNDLED / "wiki_leads_2k.categories.json"  # passage id → vital-article category
ASL_TOPICS = BUNDLED / "asl_topics.txt"
SEARCHER_MODEL = BUNDLED / "searcher_model"  # the reader model taught to copy names into
# searches and questions, then to play π-Play's three roles on other worlds' closed-class facts
# (worlds 1000-1199; every teacher answer right, the student's right in 30%, then in none):
# `python -m tools.world_reading --size=reader --skill=search,ask --worlds=200 --per_world=100
# --steps=1500 --every=750 --out=<a>`, `python -m tools.world_reading --size=<a> --skill=play
# --format=piplay --worlds=200 --per_world=40 --steps=600 --every=300 --right_share=0.3
# --out=<b>`, the same from <b> with --steps=900 --lr=2e-3 --out=<c>, then from <c> with
# --steps=300 --right_share=0 --lr=1e-3 --out=<dir> rebuild it
JUDGE_MODEL = BUNDLED / "judge_model"  # the searcher model taught to play SCOPE's roles on other
# worlds' closed-class facts (worlds 1000-1199; the Judge's rubrics and grades right, the
# Solver's answers right in 30%, then in none): `python -m tools.world_reading
# --size=<searcher_model> --skill=play --format=scope --worlds=200 --per_world=40 --steps=1200
# --every=400 --right_share=0.3 --out=<a>`, the same from <a> with --grades=4 --out=<b>, from <b>
# with --steps=1000 --every=250 --grades=2 --roles=grader --out=<c>, then from <c> on every role
# with --steps=800 --every=400 --right_share=0 --grades=4 --lr=2e-3 --out=<dir> rebuild it
GRADER_MODEL = BUNDLED / "grader_model"  # the judge model taught to grade SCOPE's answers side
# by side with the criterion ("The criterion asks for economist. The answer is engineer.") on
# other worlds' closed-class facts (worlds 1000-1199; the Solver's answers right in 10%, 20%,
# then 40%), in five `python -m tools.world_reading --skill=play --format=scope --worlds=200
# --per_world=40 --grader_reasoning=both --grades=2` fits: from <judge_model> with
# --roles=grader --steps=600 --every=200 --out=<a>; from <a> with --right_share=0.1 --steps=400
# --every=400 --lr=1e-3 --out=<b>; from <b> with --roles=grader --steps=600 --every=600
# --lr=1e-3 --out=<c>; from <c> with --right_share=0.2 --steps=400 --every=400 --lr=1e-3
# --out=<d>; then from <d> with --right_share=0.4 --steps=600 --every=600 --lr=1e-3 --out=<dir>
VERIFIER_MODEL = BUNDLED / "verifier_model"  # the judge model taught to play ASL's roles on other
# worlds' closed-class facts (worlds 1000-1199; the PG's questions and the GRM's verdicts right,
# the PM's answers right in 30%, none, then 10%), in six `python -m tools.world_reading
# --skill=play --format=asl --worlds=200 --per_world=40 --lr=2e-3` fits: from <judge_model> with
# --steps=1200 --every=400 --right_share=0.3 --grades=2 --grm_reasoning=none --out=<a>; from <a>
# with --steps=600 --every=200 --right_share=0.3 --grades=2 --roles=grm --grm_reasoning=page
# --out=<b>; from <b> with --steps=600 --every=200 --right_share=0 --grades=2 --out=<c>; from <c>
# with --steps=800 --every=400 --right_share=0.1 --grades=4 --out=<d>; from <d> with
# --steps=600 --every=300 --right_share=0.1 --grades=2 --roles=grm --lr=1e-3 --out=<e>; then
# from <e> on every role with --steps=400 --every=400 --right_share=0.1 --grades=1 --lr=1e-3
# --out=<dir>
