"""Can a model open a search call in each syntax? The log-probability, at the first position of
its answer, of each syntax's opening tag (`<search>`, `<tool_call>`, `<function_calls>`), read
with one forward per question on the evaluator's own `qa_search` prompt for that syntax.

A preset's searching roles can only search if the model writes its syntax's tag; a tag the model
gives a log-probability near −20 is never sampled, whatever the rewards. Run it on a checkpoint
before a smoke run or a pod booking:

    python -m bench.syntax_probe                                   # the real 0.5B, 16 questions
    python -m bench.syntax_probe --model=hf:/ckpt/Qwen3-8B --limit=32

Sampled searches per rollout come from `scope_jax.evaluate` (the `searches` field of
predictions.jsonl): `--benchmarks=fanoutqa_search --syntax=<s> --num_samples=4 --temperature=1`.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from scope_jax import sharding as shd  # noqa: E402
from scope_jax.evaluation import benchmarks  # noqa: E402
from scope_jax.evaluation.evaluator import Evaluator, Settings  # noqa: E402
from scope_jax.evaluation.models import check_spec, load_spec  # noqa: E402
from scope_jax.models import transformer  # noqa: E402
from scope_jax.rollout.agent import encode  # noqa: E402
from scope_jax.rollout.parsers import SYNTAXES  # noqa: E402

OPENING_TAGS = {"xml": "<search>", "qwen": "<tool_call>", "function_calls": "<function_calls>"}


def tag_logprob(config, params, prompt_ids, tag_ids) -> tuple[float, int]:
  """log p(tag | prompt) teacher-forced over the tag's tokens, and the rank of its first token
  among the whole vocabulary at the answer's first position."""
  tokens_1T = jnp.asarray([list(prompt_ids) + list(tag_ids)])
  logits_1TV = transformer.forward_jit(config, params, tokens_1T)
  logp_TV = jax.nn.log_softmax(logits_1TV[0].astype(jnp.float32), axis=-1)
  start = len(prompt_ids) - 1
  steps = [float(logp_TV[start + i, t]) for i, t in enumerate(tag_ids)]
  first_V = np.asarray(logp_TV[start])
  return sum(steps), int((first_V > first_V[tag_ids[0]]).sum())


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="gguf:qwen2.5-0.5b-gguf")
  p.add_argument("--limit", type=int, default=16, help="FanOutQA questions")
  p.add_argument("--syntaxes", default=",".join(SYNTAXES))
  args = p.parse_args()
  if unknown := set(args.syntaxes.split(",")) - set(OPENING_TAGS):
    p.error(f"--syntaxes: unknown {sorted(unknown)}; use one or more of {', '.join(OPENING_TAGS)}")
  if args.limit < 1:
    p.error(f"--limit={args.limit}: use a positive number of questions")
  try:  # a model spec that cannot load is the user's to fix: one line, not a traceback
    check_spec(args.model)
    mesh = shd.make_mesh((1, -1, 1))
    model = load_spec(args.model, mesh, shd.SAMPLING_RULES, jnp.float32)
  except (OSError, ValueError, KeyError) as e:
    text = str(e.args[0] if e.args else e).strip()  # a KeyError's str() adds quotes
    p.error(f"--model={args.model}: {text.splitlines()[0] if text else type(e).__name__}")
  questions = [e.question for e in benchmarks.builtin("fanoutqa_search", limit=args.limit).examples]
  print(f"{args.model}, {len(questions)} FanOutQA questions, the evaluator's qa_search prompt")
  print(f"{'syntax':16} {'tag':18} {'tag tokens':>10} {'mean log p(tag)':>16} "
        f"{'max':>8} {'median rank of first token':>27}")
  for syntax in args.syntaxes.split(","):
    ev = Evaluator(model.tokenizer, Settings(syntax=syntax), progress=False)
    tag_ids = encode(model.tokenizer, OPENING_TAGS[syntax])
    scores = [tag_logprob(model.config, model.params, ev.prompt(ev.template("qa_search"),
                                                               question=q), tag_ids)
              for q in questions]
    logps, ranks = zip(*scores)
    print(f"{syntax:16} {OPENING_TAGS[syntax]:18} {len(tag_ids):>10} {np.mean(logps):>16.2f} "
          f"{max(logps):>8.2f} {int(np.median(ranks)):>27,}")


if __name__ == "__main__":
  main()
