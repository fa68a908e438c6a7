"""Evaluates a run's checkpoints (local or gs://) or a base model on benchmarks.

    python -m scope_jax.evaluate --run=gs://bucket/runs/scope --role=solver \
        --benchmarks=fanoutqa_search,gsm8k
    python -m scope_jax.evaluate --model=hf:/ckpt/Qwen2.5-7B-Instruct --benchmarks=gsm8k \
        --num_samples=8 --temperature=0.6 --out=/tmp/eval
    python -m scope_jax.evaluate --run=runs/spell --role=policy --watch --model=initial \
        --benchmarks=file:gs://bucket/nq_test.parquet:qa,gsm8k

Benchmarks: built in (gsm8k, fanoutqa, fanoutqa_search) or `file:<path>:<type>` with type qa,
qa_search, math, mc or judge. Results go to `<run>/eval/<benchmark>/step_<N>/` (or --out; a run
with several trained policies adds the policy: `<run>/eval/<policy>/<benchmark>/…`).
"""

from absl import app, flags

from scope_jax import cli_errors, console, run_record
from scope_jax.evaluation import driver
from scope_jax.evaluation import evaluator as eval_lib

_RUN = flags.DEFINE_string("run", None, "A run's workdir (local or gs://).")
_STEP = flags.DEFINE_string("step", "latest", "latest | all | N[,M...] (with --run; --watch "
                             "evaluates every committed step and each new one).")
_ROLE = flags.DEFINE_string("role", None, "The trained role (or policy) of the run to evaluate.")
_MODEL = flags.DEFINE_string("model", None, "A base model: hf:<dir> | gguf:<file or asset> | demo "
                             "| preset:<name> | initial (the run's own start). With --run: the "
                             "baseline row of the table.")
_BENCHMARKS = flags.DEFINE_string("benchmarks", None, "Comma-separated: gsm8k, fanoutqa, "
                                  "fanoutqa_search, file:<path>:<qa|qa_search|math|mc|judge>, "
                                  "world:<set> (with --run: the run's world's gold set).")
_OUT = flags.DEFINE_string("out", None, "Results root (local or gs://); default <run>/eval, or "
                           "eval/<model name> for --model alone. A run's own evaluations during "
                           "training are kept: evaluate with other settings into another --out.")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Tokenizer of --model when its directory "
                                 "has none: a HF dir, 'demo' or 'byte'.")
_JUDGE = flags.DEFINE_string("judge", None, "Judge model for `judge` benchmarks (same forms as "
                             "--model); default: the base model.")
_JUDGE_STYLE = flags.DEFINE_enum("judge_style", "answer_match", list(eval_lib.JUDGE_STYLES),
                                 "answer_match: do the answer and the reference agree "
                                 "([[YES]]/[[NO]], SPELL's verifier prompt); criterion_grade: "
                                 "the answer graded against the reference (<score>1</score>, "
                                 "SCOPE's grader prompt).")
_LIMIT = flags.DEFINE_integer("limit", None, "Evaluate only the first N examples of each set.")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", 1, "Samples per question (n of pass@k).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0 = greedy).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling threshold.")
_MAX_NEW_TOKENS = flags.DEFINE_integer("max_new_tokens", 512, "New tokens per generated turn.")
_MAX_TURNS = flags.DEFINE_integer("max_turns", 4, "Searches per question (qa_search).")
_MAX_PROMPT = flags.DEFINE_integer("max_prompt_tokens", 2048, "Prompt limit (content is cut).")
_MAX_CONTEXT = flags.DEFINE_integer("max_context", 4096, "Prompt + answer tokens (a run's "
                                    "rollout.max_context when left at 4096).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Questions per batched rollout.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_SYNTAX = flags.DEFINE_string("syntax", "", "Search-call syntax, xml (<search>), qwen "
                               "(<tool_call>) or function_calls (OLMo-3's); default: the run's, "
                               "else xml.")
_KS = flags.DEFINE_list("ks", None, "k of pass@k and maj@k (default 1,2,4,... <= n, and n).")
_INDEX = flags.DEFINE_string("index", None, "Local faiss index directory (qa_search).")
_ENCODER = flags.DEFINE_string("encoder", "minilm", "Query encoder of --index.")
_URL = flags.DEFINE_string("retrieval_url", None, "A Search-R1-compatible retrieval server.")
_TOPK = flags.DEFINE_integer("topk", 3, "Documents per search.")
_WATCH = flags.DEFINE_bool("watch", False, "Follow the run: evaluate each new checkpoint once.")
_POLL = flags.DEFINE_float("poll_seconds", 60.0, "Seconds between checks for new checkpoints.")
_WATCH_TIMEOUT = flags.DEFINE_float("watch_timeout", 0.0, "Stop watching after this many seconds "
                                    "without a new checkpoint (0 = until the run's last step).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Evaluate again steps that have results.")
_MESH = flags.DEFINE_list("mesh_shape", None, "Mesh (data,fsdp,tensor[,expert]); default: the "
                          "run's mesh.shape, else 1,-1,1.")
_DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Param dtype (default: the "
                           "run's model.param_dtype, else float32).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Progress bars (shown only when stderr is a "
                               "terminal).")


def options() -> driver.Options:
  """The flags as driver options (a malformed number is a ValueError, reported in one line)."""
  settings = eval_lib.Settings(
      num_samples=_NUM_SAMPLES.value, temperature=_TEMPERATURE.value, top_p=_TOP_P.value,
      max_new_tokens=_MAX_NEW_TOKENS.value, max_turns=_MAX_TURNS.value,
      max_prompt_tokens=_MAX_PROMPT.value, max_context=_MAX_CONTEXT.value,
      batch_size=_BATCH.value, seed=_SEED.value, syntax=_SYNTAX.value,
      judge_style=_JUDGE_STYLE.value, ks=tuple(int(k) for k in _KS.value or ()))
  return driver.Options(
      benchmarks=_BENCHMARKS.value, run=_RUN.value, step=_STEP.value, role=_ROLE.value,
      model=_MODEL.value, out=_OUT.value, tokenizer=_TOKENIZER.value, judge=_JUDGE.value,
      limit=_LIMIT.value, watch=_WATCH.value, poll_seconds=_POLL.value,
      watch_timeout=_WATCH_TIMEOUT.value, overwrite=_OVERWRITE.value, index=_INDEX.value,
      encoder=_ENCODER.value, retrieval_url=_URL.value, topk=_TOPK.value,
      mesh_shape=tuple(int(x) for x in _MESH.value) if _MESH.value else None,
      dtype=_DTYPE.value, progress=console.progress_on(_PROGRESS.value), settings=settings)


def main(argv):
  del argv
  cli_errors.quiet_chatty_libraries()
  try:  # bad flags, paths, runs, roles or benchmark files: one line, before any model loads
    session = driver.Session(options())
  except (OSError, ValueError, KeyError) as e:
    cli_errors.fail(e)
  try:  # what only loading shows (a corrupt step, a tokenizer too large): one line too
    driver.run(session)
  except (run_record.UnreadableCheckpoint, FileNotFoundError) as e:
    cli_errors.fail(e)
  except ValueError as e:
    if not cli_errors.raised_here(e):  # a library's error keeps its traceback
      raise
    cli_errors.fail(e)


if __name__ == "__main__":
  flags.mark_flags_as_required(["benchmarks"])
  app.run(main)
