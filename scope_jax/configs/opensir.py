"""OpenSIR: one policy as teacher and student, from one seed problem (ALGORITHMS §3, OpenSIR.txt).

    python -m scope_jax.main --config=configs/opensir.py --workdir=runs/opensir          # CPU demo
    python -m scope_jax.main --config=configs/opensir.py:paper --workdir=gs://bucket/opensir \
        --config.model.source=hf:/ckpt/Llama-3.2-3B-Instruct \
        --config.model.tokenizer=/ckpt/Llama-3.2-3B-Instruct \
        --config.opensir.encoder=/ckpt/Linq-Embed-Mistral

Presets: 'demo' (default; the bundled demo model, warmed on both roles' formats with small
arithmetic, MiniLM embeddings for diversity: a few minutes on a laptop CPU), 'learn' (OpenSIR on
the synthetic world's word problems at CPU scale from a start that works every problem out, no
planted guess; held-out `world:arith` accuracy every 10 steps, on problems whose operands and
answer no training input holds: docs/learning.md), 'learn_planted_guess' (an ablation, not a
fair start: the warmed student's greedy first choice is a wrong guess, which a majority reward
removes by construction) and 'paper' (the released settings for Llama-3.2-3B-Instruct and
Qwen-2.5-3B-Instruct), 'paper_gemma2' (the same for Gemma-2-2B-Instruct, the paper's largest
gain).
"""

import ml_collections

from scope_jax import configs_base as base
from scope_jax.data import COUNTER_MODEL

def paper_base() -> ml_collections.ConfigDict:
  """OpenSIR's paper recipe (the released config) on the default tiny model: every preset starts
  here."""
  c = base.base_config()
  c.method = "opensir"

  c.opensir = ml_collections.ConfigDict()
  c.opensir.seed_problem = "What is 1+1?"  # the pool starts from this one problem
  c.opensir.units_per_step = 16  # (teacher group, student problem) pairs per step: 16·(8+8) = 256
  c.opensir.groups_per_unit = 4  # groups generated per unit; the most varied one is trained
  c.opensir.group_size = 8  # g: problems per group, all from one reference problem
  c.opensir.num_solutions = 8  # student solutions per legal problem
  c.opensir.solve_rate_band = (0.5, 0.9)  # solvability band (released yaml; its dataclass: 0.6)
  c.opensir.length_cap = 1000.0  # tokens: length score = min(mean, cap) / baseline
  c.opensir.length_baseline = 1000.0
  c.opensir.diversity_top_k = 5  # mean of the k most similar (pool and same-step problems)
  # Diversity embedder: an asset name, a BERT/E5 checkpoint (mean pooling) or a decoder embedder
  # checkpoint such as Linq-Embed-Mistral (last-token pooling, the paper's), no instruction
  # prefix (the released run embeds problems as passages).
  c.opensir.encoder = "minilm"
  c.opensir.teacher_weights = ml_collections.ConfigDict(dict(
      solvability=1.0, diversity=1.0, length=1.0, format=0.1))
  # c = w_solv·solv + w_div·div picks the trained teacher group and student problem (the
  # released difficulty/diversity_score_weight); an ablation without diversity sets both
  # teacher_weights.diversity and selection_weights.diversity to 0.
  c.opensir.selection_weights = ml_collections.ConfigDict(dict(solvability=1.0, diversity=1.0))
  c.opensir.student_format_weight = 0.1  # R_student = 1[majority] + 0.1·format
  c.opensir.adv_eps = 1e-4  # group z-score epsilon (unbiased std)
  c.opensir.mask_concepts = True  # <concepts> tokens out of the teacher's loss
  # The starting pool (the released generate_initial_problems.py): `size` problems the policy
  # writes from the seed and solves at a rate within the band, before step 0 (0: the seed alone),
  # or the problems of a JSONL `file` (`world`: world `world.seed`'s training problems).
  c.opensir.initial_pool = ml_collections.ConfigDict(dict(
      size=0, file="", candidates=160, max_rounds=100, solve_rate_band=(0.5, 0.9), min_chars=30))
  # Seconds per math-verify parse: the released code passes none, and its pinned math-verify
  # 0.5.2 defaults to 3 (its docstring says 5; 0.9's default is 5).
  c.opensir.math_timeout = 3
  # What a loss token-mean runs over: 'step' (one token-mean over the whole update) or 'unit'
  # (TRL's: a token-mean per micro-batch, one unit's 8 + 8 rows, averaged over the units; on
  # the policy term, exact at ratio 1, while the small k3 KL stays a token-mean over the step)
  c.opensir.loss_unit = "step"
  # Prompts are one user turn (the released code's form for Gemma; for Llama and Qwen it puts
  # the instructions in a system message). The pool grows after each whole step, and diversity
  # compares against this step's problems (the released code: after each micro-batch of 32).
  # The warm-up's demonstrations from other worlds (`warmup.world_seed`): the share of the
  # student's worked solutions whose result is right, the share of its demonstrations that state
  # a (wrong) guess without working the sums out, and how many openings the worked sums take.
  c.opensir.warmup = ml_collections.ConfigDict(dict(right_share=0.0, guess_share=0.0,
                                                    worked_ways=1))
  c.opensir.roles = ml_collections.ConfigDict(dict(
      teacher=base.role(2048, temperature=1.0, top_p=1.0),  # max_completion_length: both roles
      student=base.role(2048, temperature=1.0, top_p=1.0)))

  # The released config: lr 3e-7 constant after 25 warm-up steps (the paper's text says 10
  # warm-up steps in §3.1 and 20 in App. D.1), β = 1e-4 (k3), grad clip 0.5, T = 1.0, no clip
  # needed on-policy, teacher and student tokens pooled in one token-mean loss.
  c.optim.lr = 3e-7
  c.optim.warmup_steps = 25
  c.optim.schedule = "constant"
  c.optim.grad_clip = 0.5
  c.loss.agg_mode = "token-mean"
  c.loss.kl_beta = 1e-4
  c.loss.kl_kind = "k3"
  c.loss.temperature = 1.0
  c.rollout.max_context = 3072  # prompt (max 1024) + completion (max 2048)
  c.rollout.max_prompt_tokens = 1024
  c.total_steps = 200

  return c


def demo(c: ml_collections.ConfigDict) -> None:
  """The `demo` preset: the demo model, warmed on both roles' formats with small arithmetic."""
  c.total_steps = 4
  c.opensir.units_per_step = 2
  c.opensir.groups_per_unit = 2
  c.opensir.group_size = 4
  c.opensir.num_solutions = 4
  c.opensir.roles = ml_collections.ConfigDict(dict(
      teacher=base.role(128, temperature=1.0, top_p=1.0),
      student=base.role(64, temperature=1.0, top_p=1.0)))
  base.demo_warmup(c)
  base.demo_rollout(c)
  c.optim.lr = 1e-4
  c.optim.warmup_steps = 0
  c.optim.grad_clip = 1.0
  c.loss.kl_beta = 0.0  # the demo skips the reference forward
  base.demo_sizes(c)


def paper(c: ml_collections.ConfigDict, model: str = "preset:llama3.2-3b") -> None:
  """The `paper` preset: the released settings for Llama-3.2-3B-Instruct (and Qwen-2.5-3B)."""
  base.paper_model(c, model, retrieval=False)  # hf:<path> for the real weights
  c.opensir.encoder = ""  # required: the Linq-Embed-Mistral checkpoint directory (the paper's)
  c.opensir.initial_pool.size = 512  # the released run's starting pool
  c.opensir.loss_unit = "unit"  # TRL's micro-batch token-mean (with recompute_old_logp)
  c.mesh.shape = (1, -1, 1)


def paper_gemma2(c: ml_collections.ConfigDict) -> None:
  """The `paper_gemma2` preset: `paper` for Gemma-2-2B-Instruct, the paper's largest gain."""
  paper(c, model="preset:gemma2-2b")


def learn(c: ml_collections.ConfigDict) -> None:
  """The `learn` preset, the headline: OpenSIR's own loop at CPU scale on the synthetic world's
  problems, from a start whose greedy answers are worked out (right or wrong as its arithmetic
  goes), never a planted guess. Departures that stay: the pool starts from 64 of the world's
  training problems, not the policy's own from "1+1", and one group per unit."""
  o = c.opensir
  o.units_per_step = 8
  o.groups_per_unit = 1
  o.group_size = 4
  o.num_solutions = 8
  o.initial_pool.file = "world"  # the world's training problems (never a gold one), no answers
  o.roles = ml_collections.ConfigDict(dict(
      teacher=base.role(192, temperature=1.0, top_p=1.0),  # a world problem is ~100 tokens
      student=base.role(64, temperature=1.0, top_p=1.0)))
  base.world_learn(c, "arith", max_new_tokens=64)
  # From the counter model, which works other worlds' problems out in the student's prompt,
  # re-warmed on both roles' formats: the teacher's is new to it (300 steps at 1e-3 left 3–9% of
  # its problems legal; these settings, 58–68%). The student is shown worked solutions only,
  # one way, 90% of them right: it is wrong where its arithmetic is.
  c.model.source = f"hf:{COUNTER_MODEL}"
  c.total_steps = 50
  c.warmup.steps = 900
  c.warmup.lr = 2e-3
  c.warmup.documents = 1200  # of each role, from 4 other worlds' problems
  c.opensir.warmup.right_share = 0.9  # of the worked solutions; the rest end one sum off by 1–10
  c.opensir.warmup.guess_share = 0.0  # no planted guess (`learn_planted_guess` plants one)
  c.opensir.warmup.worked_ways = 1
  c.loss.kl_beta = 0.0


def learn_planted_guess(c: ml_collections.ConfigDict) -> None:
  """The `learn_planted_guess` preset, an ablation (not a fair start): `learn` with the warmed
  student guessing (a uniformly drawn wrong number, boxed with no sums) in 0.4 of its
  demonstrations against 0.15 for each of four worked openings, so its greedy answer is a guess,
  never right, while its samples work the sums out and agree: a majority reward removes the
  guess by construction (the preset that met the bar on seeds 0-2; docs/learning.md)."""
  learn(c)
  c.opensir.warmup.guess_share = 0.4
  c.opensir.warmup.worked_ways = 4


PRESETS = {"demo": demo, "learn": learn, "learn_planted_guess": learn_planted_guess,
           "paper": paper, "paper_gemma2": paper_gemma2}


def get_config(arg=None) -> ml_collections.ConfigDict:
  return base.build(arg, paper_base, PRESETS)
