"""Fits the bundled world models (reader, solver, counter, searcher, judge, grader, verifier;
their recipes are in `scope_jax/data/__init__.py`) and measures how fast a model learns to read
the bundled world's documents when it is simply shown the right answers: supervised doc QA on
other worlds, scored on a held-out world's `doc` questions.

Self-play can only reward an answer the model sometimes writes: a method whose responder never
copies the right name from its document has nothing to learn from. This probe measures that
precondition by supervision (the upper bound for what self-play reaches in as many steps): it
fits the model on one-hop document questions of `--worlds` other worlds (seeds from 1000, right
answers) and prints, every `--every` steps, the token NLL and the greedy exact match on world
`--world`'s questions (teacher-forced argmax over the answer's tokens, the same as greedy
decoding for an answer that is right; the learning-rate schedule restarts each block).
`--skill=attr` asks only the closed-class facts (profession, industry, language);
`--skill=search` copies a closed-class question's entity name into a search query, and
`--skill=ask` writes that question from the entity's document (the name copying every searching
role needs first); several skills, comma-separated, train on all of them together and score
each. `--format=piplay` asks `search` and `ask` in π-Play's own chat prompts instead (the
student's prompt and <tool_call> search, the examiner's prompt and <question>): whether a copy
learned in one format carries to another. `--skill=arith` works the world's word problems out
(`world.render.ARITHMETIC`: the sums, then the answer), scored on world `--world`'s `arith` gold
problems: the arithmetic OpenSIR's student needs before its majority vote has anything to find;
`--format=opensir` asks it in OpenSIR's student prompt and ends with its boxed-answer sentence.
`--skill=play --format=piplay` fits π-Play's three roles on other worlds' closed-class questions,
whole turns with one search result as π-Play's world warm-up shows them (`--right_share` of the
student's answers right; the teacher's always are), and scores each role and each copy on world
`--world`'s `attr_search` gold questions: how π-Play's `learn` start, the searcher model, is fitted.
`--skill=play --format=scope` does the same for SCOPE's roles (`methods/scope/demos.py`: the
Challenger, the Solver, and the Judge's gates, rubric and grades, `--grades` of each answer kind
per question, `--grader_reasoning` before each score): how SCOPE's `learn` start, the judge model,
is fitted. `--skill=play --format=asl`
fits ASL's roles (`methods/asl/demos.py`: the PG asks about the entity it is given as a topic,
the PM answers, the GRM says what the page states and judges `--grades` right and as many wrong
answers), scoring each role's whole turns and, as `pm:last` and `grm:last`, the answer and the
verdict alone: how ASL's `learn` start, the verifier model, is fitted.
`--vote=K` (with `--format=opensir`) then samples K solutions of each held-out problem at
temperature 1 (`--vote_temperature`) and prints what OpenSIR's pseudo-label is worth: greedy and
sampled pass@1, maj@K, and how often the majority is right at each level of agreement (the
student is trained toward it).
`--out` saves the fitted model.

    python -m tools.world_reading                       # the bundled demo model, 2,000 steps
    python -m tools.world_reading --size=4x256 --steps=1000 --skill=attr
    python -m tools.world_reading --size=reader --skill=search,ask --worlds=200 --steps=3000 \
        --every=1000 --out=<dir>
    python -m tools.world_reading --size=<dir> --format=piplay --skill=search,ask --worlds=200 \
        --steps=500 --every=250
    python -m tools.world_reading --size=<dir> --skill=play --format=piplay --worlds=200 \
        --per_world=40 --steps=600 --every=300 --right_share=0.3 --out=<dir>
    python -m tools.world_reading --skill=arith --steps=2000 --every=500
    python -m tools.world_reading --skill=arith --format=opensir --steps=2500 --every=500 \
        --out=<dir>
    python -m tools.world_reading --size=solver --skill=arith --format=opensir --steps=0 --vote=8
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from scope_jax import prompts as prompts_lib  # noqa: E402
from scope_jax import sampling  # noqa: E402
from scope_jax.data import DEMO_MODEL, READER_MODEL, SOLVER_MODEL  # noqa: E402
from scope_jax.methods.asl import demos as asl_demos  # noqa: E402
from scope_jax.methods.asl import prompts as asl_prompts  # noqa: E402
from scope_jax.methods.opensir import demos as opensir_demos  # noqa: E402
from scope_jax.methods.piplay import prompts as piplay_prompts  # noqa: E402
from scope_jax.methods.piplay import rewards as piplay_rewards  # noqa: E402
from scope_jax.methods.scope import demos as scope_demos  # noqa: E402
from scope_jax.methods.scope import prompts as scope_prompts  # noqa: E402
from scope_jax.models import hf_io, transformer  # noqa: E402
from scope_jax.models.config import tiny_config  # noqa: E402
from scope_jax.rewards.mathcheck import final_answer  # noqa: E402
from scope_jax.rl import sft  # noqa: E402
from scope_jax.rollout.agent import render_chat  # noqa: E402
from scope_jax.rollout.search_agent import observation_ids, search_action  # noqa: E402
from scope_jax.tokenizer import load_tokenizer  # noqa: E402
from scope_jax.world import World  # noqa: E402
from scope_jax.world import entities as E  # noqa: E402
from scope_jax.world import render as R  # noqa: E402

ATTR = (("person", "What is the profession of {n}?", ("profession",)),
        ("organisation", "Which industry is {n} in?", ("industry",)),
        ("country", "What language do people in {n} speak?", ("language",)))


TRAIN_SEED = 1000  # the training worlds are seeds TRAIN_SEED, TRAIN_SEED + 1, …
SKILLS = ("doc", "attr", "search", "ask", "arith", "play")
PLAY_ROLES = ("examiner", "student", "teacher")


def model(size: str, seed: int):
  """A bundled model (`demo`, `reader` or `solver`), a saved model's directory (to fit on), or
  a random Qwen2-shaped model `<layers>x<width>` over the demo tokenizer."""
  bundled = {"demo": DEMO_MODEL, "reader": READER_MODEL, "solver": SOLVER_MODEL}
  if size in bundled or os.path.isdir(size):
    path = bundled.get(size, size)
    return hf_io.load_hf(path, dtype=jnp.float32)
  if not re.fullmatch(r"\d+x\d+", size):
    raise ValueError(f"--size={size}: use demo, reader, solver, an existing model directory, or "
                     "<layers>x<width> such as 4x256.")
  layers, width = map(int, size.split("x"))
  config = tiny_config("qwen2", vocab_size=2048, hidden_size=width, intermediate_size=2 * width,
                       num_layers=layers, num_heads=width // 32, num_kv_heads=max(width // 64, 1),
                       head_dim=32, rope_theta=10000.0, qkv_bias=True,
                       max_position_embeddings=8192)
  return config, transformer.init_params(config, jax.random.key(seed))


def questions(world: World, skill: str, count: int, seed: int, held_out: bool = False):
  """`count` questions of `world` for `skill`; arithmetic comes worked, from the world's gold
  problems when `held_out`, else from its training problems (which share no (operands, answer)
  pair with any world's gold problems: `render.operands_half`)."""
  if skill == "arith":
    if held_out:  # the gold set's own draw, with its sums
      return R.arithmetic(world.entities, np.random.default_rng([world.seed, 0xA7]), count,
                          "arith", worked=True, half="heldout")
    return world.training_problems(count, worked=True)
  templates = R.HOP1 if skill == "doc" else ATTR
  return R.hop_questions(world.entities, templates, seed, count, skill)


def example(skill: str, doc, q: dict) -> tuple[str, str]:
  """(prompt, target) of one question: `doc`/`attr` answer it from the document; `search`
  copies its entity's name out of the question (what a searching student does first); `ask`
  writes the question from the document (what an examiner does: copy the title into it); `arith`
  works a word problem out."""
  if skill == "arith":
    return f"Problem: {q['question']}\nSolution:", f" {q['steps']}\nAnswer: {q['gold'][0]}\n"
  if skill == "search":
    return f"Question: {q['question']}\nSearch:", f" {doc.title}\n"
  if skill == "ask":
    return f"Document: {doc.title}\n{doc.text}\nQuestion:", f" {q['question']}\n"
  return (f"Document: {doc.title}\n{doc.text}\nQuestion: {q['question']}\nAnswer:",
          f" {q['gold'][0]}\n")


def piplay_example(skill: str, doc, q: dict) -> tuple[list[dict], str]:
  """(chat messages, target) of `search` or `ask` in π-Play's compact prompts and the qwen
  <tool_call> syntax, as its warm-up demonstrates them."""
  prompts = piplay_prompts.Prompts(style="compact", syntax="qwen")
  if skill == "search":
    return ([{"role": "user", "content": prompts.student(q["question"]).text()}],
            f"<think>Search.</think>\n{search_action(doc.title, 'qwen')}")
  if skill == "ask":
    return ([{"role": "user", "content": prompts.examiner(doc, 1).text()}],
            f"<think>Ask about it.</think>\n<question>{q['question']}</question>")
  raise ValueError(f"--format=piplay asks search or ask, not {skill!r}.")


def play_examples(tokenizer, world: World, qs: list[dict], right_share: float = 1.0,
                  seed: int = 0, max_obs: int = 160) -> dict[str, list]:
  """π-Play's three roles on each closed-class question, whole turns as its warm-up shows them
  (`methods/piplay/demos.py`) with one search result: the examiner asks the question about the
  entity's document and answers it; the student searches the entity's name, reads the page and
  answers (right in `right_share` of them, else another member of the fact's class); the teacher,
  shown the examiner's path, does the same and answers right. Keyed by role."""
  prompts = piplay_prompts.Prompts(style="compact", syntax="qwen", max_doc_chars=400)
  eos, rng = "<|im_end|>", np.random.default_rng(seed)
  by_id = {d.id: d for d in world.documents}
  chat = lambda prompt: render_chat(tokenizer, [{"role": "user", "content": prompt.text()}])
  out = {role: [] for role in PLAY_ROLES}
  for q in qs:
    doc, gold = by_id[q["support"][0]], q["gold"][0]
    exam = f"<think>Ask about it.</think>\n<question>{q['question']}</question>\n" \
           f"<answer>{gold}</answer>{eos}"
    wrong = E.other_members(gold)
    reply = gold if not wrong or rng.random() < right_share else wrong[rng.integers(len(wrong))]
    search = ("generated", f"<think>Search.</think>\n{search_action(doc.title, 'qwen')}")
    seen = ("observation", observation_ids(tokenizer, [doc], "qwen", max_obs))
    answer = lambda a: ("generated", f"<think>Answer.</think>\n<answer>{a}</answer>{eos}")
    qcp = [prompts.qcp_header(doc, 1) + "\n", exam]
    teacher = prompts.teacher(piplay_rewards.privileged_text("qcp", qcp, gold, 1), q["question"])
    out["examiner"].append(sft.demonstration(chat(prompts.examiner(doc, 1)),
                                             [("generated", exam)], tokenizer))
    out["student"].append(sft.demonstration(chat(prompts.student(q["question"])),
                                            [search, seen, answer(reply)], tokenizer))
    out["teacher"].append(sft.demonstration(chat(teacher), [search, seen, answer(gold)],
                                            tokenizer))
  return out


def scope_examples(tokenizer, world: World, qs: list[dict], right_share: float = 1.0,
                   seed: int = 0, grades: int = 1, near_copies: bool = False,
                   reasoning: str = "none") -> dict[str, list]:
  """SCOPE's roles on each closed-class question in the `learn` preset's compact prompts and
  <tool_call> syntax (`methods/scope/demos.world_demonstrations`), keyed by role."""
  prompts = scope_prompts.Prompts(style="compact", syntax="qwen", max_doc_chars=400,
                                  task_form="plain", max_criteria=1)
  return scope_demos.world_demonstrations(tokenizer, prompts, world, qs, right_share, seed,
                                          grades=grades, near_copies=near_copies,
                                          grader_reasoning=reasoning)


def asl_examples(tokenizer, world: World, qs: list[dict], right_share: float = 1.0,
                 seed: int = 0, grades: int = 1, reasoning: str = "both") -> dict[str, list]:
  """ASL's roles on each closed-class question in the `learn` preset's compact prompts and
  <tool_call> syntax (`methods/asl/demos.world_demonstrations`), keyed by role."""
  prompts = asl_prompts.Prompts(style="compact", syntax="qwen")
  return asl_demos.world_demonstrations(tokenizer, prompts, world, qs, right_share, seed,
                                        grades=grades, reasoning=reasoning)


def opensir_example(skill: str, q: dict) -> tuple[list[dict], str]:
  """(chat messages, target) of `arith` in OpenSIR's student prompt: the worked sums, then the
  boxed answer in the sentence its student reward looks for, and the end of the turn (so a
  model saved with --out stops there)."""
  if skill != "arith":
    raise ValueError(f"--format=opensir asks arith, not {skill!r}.")
  text = prompts_lib.render(prompts_lib.load("opensir", "student"), problem=q["question"])
  return ([{"role": "user", "content": text}],
          opensir_demos.student_text(q["steps"], q["gold"][0]) + "<|im_end|>")


def examples(tokenizer, world: World, qs: list[dict], skill: str = "doc", fmt: str = "plain"):
  """Each question's prompt and its target (`example`, or `piplay_example` / `opensir_example`
  for fmt='piplay' / 'opensir'), the target trained on."""
  by_id = {d.id: d for d in world.documents}
  out = []
  for q in qs:
    doc = by_id[q["support"][0]] if q["support"] else None
    if fmt in ("piplay", "opensir"):
      messages, target = (piplay_example(skill, doc, q) if fmt == "piplay" else
                          opensir_example(skill, q))
      prompt_ids = render_chat(tokenizer, messages)
    else:
      prompt, target = example(skill, doc, q)
      prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    out.append(sft.demonstration(prompt_ids, [("generated", target)], tokenizer))
  return out


def last_turn(demo):
  """`demo` scored on its last generated turn alone (the answer or verdict, not the search)."""
  start = next(s.start for s in reversed(demo.spans) if s.kind == "generated")
  mask = demo.loss_mask.copy()
  mask[:start] = 0
  return dataclasses.replace(demo, loss_mask=mask)


def exact_match(config, params, demos) -> float:
  """The share of demos whose every answer token is the model's argmax (greedy EM)."""
  batch = sft.pack(demos, -(-max(len(d.tokens) for d in demos) // 128) * 128)
  logits_BTV = transformer.forward_jit(config, params, jnp.asarray(batch.tokens),
                                       jnp.asarray(batch.mask))
  pred_BT = np.asarray(jnp.argmax(logits_BTV[:, :-1], -1))
  mask_BT = batch.loss_mask[:, 1:] > 0
  return float(np.mean(np.where(mask_BT, pred_BT == batch.tokens[:, 1:], True).all(-1)))


def vote(config, params, tokenizer, qs: list[dict], k: int, seed: int = 1,
         temperature: float = 1.0) -> dict[str, float]:
  """Greedy and sampled pass@1, maj@k and the majority's accuracy by agreement (the share of
  the k answers that give it) on OpenSIR-format problems: the label OpenSIR's student chases."""
  prompts = [render_chat(tokenizer, opensir_example("arith", q)[0]) for q in qs]
  run = lambda **kw: [final_answer(r.text) for r in sampling.generate(
      config, params, prompts, max_new_tokens=64, tokenizer=tokenizer, stop=("<|im_end|>",),
      **kw)]
  greedy, sampled = run(), run(temperature=temperature, num_samples=k, seed=seed)
  gold = [q["gold"][0] for q in qs]
  out = {"greedy": np.mean([a == g for a, g in zip(greedy, gold)]),
         "sampled": np.mean([a == gold[i // k] for i, a in enumerate(sampled)])}
  votes = []  # (agreement, majority right)
  for i, g in enumerate(gold):
    given = [a for a in sampled[i * k:(i + 1) * k] if a is not None]
    top, count = max(((a, given.count(a)) for a in given), key=lambda t: t[1], default=(None, 0))
    votes.append((count / k, top == g))
  out[f"maj@{k}"] = np.mean([right for _, right in votes])
  for lo, hi in ((0.0, 0.5), (0.5, 0.75), (0.75, 1.01)):
    inside = [right for agree, right in votes if lo <= agree < hi]
    out[f"agree {lo:.2f}-{min(hi, 1):.2f}: n"] = len(inside)
    out[f"agree {lo:.2f}-{min(hi, 1):.2f}: right"] = np.mean(inside) if inside else 0.0
  return out


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="demo", help="demo, reader, solver, a saved model's "
                 "directory, or <layers>x<width> initialised at random")
  p.add_argument("--skill", default="doc",
                 help="doc, attr, search, ask or arith; several, comma-separated, train together")
  p.add_argument("--format", default="plain",
                 choices=("plain", "piplay", "opensir", "scope", "asl"),
                 help="plain 'Question: … Search:' text, π-Play's chat prompts (search, ask, "
                 "play), OpenSIR's student prompt (arith), or SCOPE's or ASL's roles (play)")
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--every", type=int, default=500)
  p.add_argument("--lr", type=float, default=3e-3)
  p.add_argument("--batch_rows", type=int, default=16)
  p.add_argument("--worlds", type=int, default=20, help="training worlds (seeds 1000, 1001, …)")
  p.add_argument("--world", type=int, default=0, help="the held-out world")
  p.add_argument("--limit", type=int, default=200, help="held-out questions")
  p.add_argument("--out", default="", help="save the fitted model here (Hugging Face layout)")
  p.add_argument("--vote", type=int, default=0, help="with --format=opensir: sample this many "
                 "solutions per held-out problem and report maj@K and the majority's accuracy")
  p.add_argument("--vote_temperature", type=float, default=1.0, help="with --vote: the "
                 "sampling temperature of the K solutions")
  p.add_argument("--right_share", type=float, default=1.0, help="with --skill=play: the share of "
                 "the student's demonstrated answers that are right (the rest are wrong)")
  p.add_argument("--per_world", type=int, default=400, help="training questions per world")
  p.add_argument("--grades", type=int, default=1, help="with --format=scope or asl: right and "
                 "wrong answers the Judge (GRM) grades per question (each)")
  p.add_argument("--near_copies", action="store_true", help="with --format=scope: the source "
                 "gate also fails tasks that garble the entity's name")
  p.add_argument("--grm_reasoning", default="both", choices=asl_demos.GRM_REASONING,
                 help="with --format=asl: what the GRM says before its verdict (the page's fact "
                 "and the answer, the fact alone, or nothing)")
  p.add_argument("--grader_reasoning", default="none", choices=scope_demos.GRADER_REASONING,
                 help="with --format=scope: the grader's reason before its score, a word (none) or "
                 "the criterion's fact and the answer side by side (both)")
  p.add_argument("--roles", default="", help="with --format=scope or asl: train only these "
                 "roles (comma-separated; all of them when empty)")
  args = p.parse_args()
  skills = args.skill.split(",")
  if unknown := set(skills) - set(SKILLS):
    p.error(f"unknown skill {sorted(unknown)}; use one or more of {', '.join(SKILLS)}")
  if args.format == "piplay" and set(skills) - {"search", "ask", "play"}:
    p.error("--format=piplay asks the copies or the roles: use --skill=search, ask, search,ask "
            "or play")
  if args.format == "opensir" and skills != ["arith"]:
    p.error("--format=opensir asks only the word problems: use --skill=arith")
  if "play" in skills and (skills != ["play"] or args.format not in ("piplay", "scope", "asl")):
    p.error("--skill=play is a method's roles on their own: use it alone, with --format=piplay, "
            "scope or asl")
  if args.format in ("scope", "asl") and skills != ["play"]:
    p.error(f"--format={args.format} asks the method's roles: use --skill=play")
  if args.format not in ("scope", "asl") and (args.roles or args.grades != 1):
    p.error("--roles and --grades choose SCOPE's or ASL's demonstrations: use them with "
            "--skill=play --format=scope or asl")
  if args.format != "asl" and args.grm_reasoning != "both":
    p.error("--grm_reasoning chooses ASL's GRM demonstrations: use it with --skill=play "
            "--format=asl")
  if args.format != "scope" and args.grader_reasoning != "none":
    p.error("--grader_reasoning chooses SCOPE's grader demonstrations: use it with --skill=play "
            "--format=scope")
  if args.format != "scope" and args.near_copies:
    p.error("--near_copies chooses SCOPE's gate demonstrations: use it with --skill=play "
            "--format=scope")
  world_roles = asl_demos.WORLD_ROLES if args.format == "asl" else scope_demos.WORLD_ROLES
  if unknown := set(filter(None, args.roles.split(","))) - set(world_roles):
    p.error(f"--roles: unknown role {sorted(unknown)}; use {', '.join(world_roles)}")
  if args.vote and (args.format != "opensir" or args.vote < 2):
    p.error(f"--vote={args.vote}: the vote needs --format=opensir and at least 2 samples")
  if not 0.0 < args.vote_temperature <= 2.0:
    p.error(f"--vote_temperature={args.vote_temperature}: use a temperature in (0, 2]")
  for name in ("every", "limit", "worlds", "per_world", "batch_rows"):
    if getattr(args, name) < 1:
      p.error(f"--{name}={getattr(args, name)}: use a positive number")
  if args.steps < 0 or args.steps % args.every:
    p.error(f"--steps={args.steps}: use 0 (measure only) or a multiple of --every={args.every} "
            "(the model is fitted and measured every --every steps)")
  if TRAIN_SEED <= args.world < TRAIN_SEED + args.worlds:
    p.error(f"--world={args.world} is one of the training worlds (seeds {TRAIN_SEED} to "
            f"{TRAIN_SEED + args.worlds - 1}): its held-out questions would be trained on; use a "
            f"seed below {TRAIN_SEED} or from {TRAIN_SEED + args.worlds}")
  if args.world < 0:
    p.error(f"--world={args.world}: use a non-negative seed")
  tokenizer = load_tokenizer("demo")
  config, params = model(args.size, 0)
  held = World(args.world)
  roles = set(args.roles.split(",")) if args.roles else None
  if skills == ["play"] and args.format == "scope":
    seeds = range(TRAIN_SEED, TRAIN_SEED + args.worlds)
    train = [d for s in seeds for role, demos in scope_examples(
        tokenizer, World(s), World(s).questions(args.per_world, np.random.default_rng(s), "attr"),
        args.right_share, seed=s, grades=args.grades, near_copies=args.near_copies,
        reasoning=args.grader_reasoning).items() if roles is None or role in roles for d in demos]
    held_out = scope_examples(tokenizer, held, held.gold["attr_search"][:args.limit],
                              reasoning=args.grader_reasoning)
  elif skills == ["play"] and args.format == "asl":
    train = [d for s in range(TRAIN_SEED, TRAIN_SEED + args.worlds) for role, demos in asl_examples(
        tokenizer, World(s), World(s).questions(args.per_world, np.random.default_rng(s), "attr"),
        args.right_share, seed=s, grades=args.grades, reasoning=args.grm_reasoning).items()
        if roles is None or role in roles for d in demos]
    held_out = asl_examples(tokenizer, held, held.gold["attr_search"][:args.limit], grades=2,
                            reasoning=args.grm_reasoning)
    held_out.update({f"{role}:last": [last_turn(d) for d in held_out[role]]
                     for role in ("pm", "grm")})  # the answer or verdict alone
  elif skills == ["play"]:
    train = [d for s in range(TRAIN_SEED, TRAIN_SEED + args.worlds) for demos in play_examples(
        tokenizer, World(s), World(s).questions(args.per_world, np.random.default_rng(s), "attr"),
        args.right_share, seed=s).values() for d in demos]
    gold = held.gold["attr_search"][:args.limit]
    held_out = {**play_examples(tokenizer, held, gold),  # and each role's copy on its own
                **{f"{k}:copy": examples(tokenizer, held, gold, k, "piplay")
                   for k in ("search", "ask")}}
  else:
    train = [d for skill in skills for s in range(TRAIN_SEED, TRAIN_SEED + args.worlds)
             for d in examples(tokenizer, World(s), questions(World(s), skill, args.per_world, s),
                               skill, args.format)]
    held_out = {skill: examples(tokenizer, held, questions(held, skill, args.limit,
                                                           args.world + 1, held_out=True),
                                skill, args.format)
                for skill in skills}
  print(f"{args.size} ({transformer.count_params(params):,} parameters), skill {args.skill}: "
        f"{len(train)} training examples from {args.worlds} worlds, "
        f"{len(next(iter(held_out.values())))} held out per skill")
  score = lambda: "  ".join(f"{k} {exact_match(config, params, d):.3f}"
                            for k, d in held_out.items())
  print(f"step {0:5d}  greedy EM {score()}", flush=True)
  start = time.perf_counter()
  for k in range(args.steps // args.every):
    params, losses = sft.fit(config, params, train, steps=args.every, lr=args.lr,
                             batch_rows=args.batch_rows, seed=k)
    print(f"step {(k + 1) * args.every:5d}  greedy EM {score()}"
          f"  nll {np.mean(losses[-50:]):.3f}  {time.perf_counter() - start:.0f}s", flush=True)
  if args.vote:
    qs = questions(held, "arith", args.limit, args.world + 1, held_out=True)
    print("vote  " + "  ".join(f"{key} {value:.3f}" if isinstance(value, float) else
                               f"{key} {value}"
                               for key, value in vote(config, params, tokenizer, qs, args.vote,
                                                      temperature=args.vote_temperature
                                                      ).items()), flush=True)
  if args.out:
    hf_io.save_hf(config, params, args.out)


if __name__ == "__main__":
  main()
