"""ASL: a Prompt Generator, a Policy Model and a Generative Reward Model co-evolve on one policy
with the search tool (ALGORITHMS §4, ASL.txt §3).

    python -m scope_jax.main --config=configs/asl.py --workdir=runs/asl             # CPU demo
    python -m scope_jax.main --config=configs/asl.py:paper --workdir=gs://bucket/asl \
        --config.model.source=hf:/ckpt/Qwen2.5-7B-Instruct --config.model.tokenizer=/ckpt/Qwen2.5-7B-Instruct \
        --config.retrieval.encoder=/ckpt/e5-base-v2 --config.retrieval.index=gs://bucket/wiki18_e5 \
        --config.retrieval.corpus=/data/wiki-18.jsonl

Presets:
  demo   (default) the small demo model, format-warmed on ASL's demonstrations, compact prompts,
         the bundled corpus and its MiniLM index, topics from the corpus's categories, small
         phase targets: every phase runs within the demo's steps.
  learn  ASL's loop at CPU scale on the synthetic world (docs/learning.md): the trained half of
         the world's entities as topics, one search result, the GRM co-trained (PG, GRM and PM
         phases, as in the paper), held-out pass@1 of the PM on 300 `world:attr_search`
         questions every 10 updates, each entity half apart.
  learn_frozen_grm  an ablation, not the method as published: `learn` with the frozen start as
         the GRM (no GRM phase; the paper's frozen-GRM ablation), the preset that met the bar on
         seeds 0-1 (docs/learning.md).
  paper  App. D for Qwen2.5-7B-Instruct: N = 128, K = 5, C = 0.8, M = 10, seed 37, |D_PM|
         targets 2,000 (iteration 0) and 4,000, E5 over the 2018 Wikipedia dump (paths from you).

Phases are open-ended: one runner step is one update of the current phase, and the method decides
when a phase ends (PG: |D_PM| reaches its target; GRM and PM: the slope rule). `total_steps` only
caps the run; a resumed run continues in the phase it was in.
"""

import ml_collections

from scope_jax import configs_base as base
from scope_jax.data import VERIFIER_MODEL

def phase_limits(min_steps: int, max_steps: int) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(min_steps=min_steps, max_steps=max_steps))


def paper_base() -> ml_collections.ConfigDict:
  """ASL's paper recipe (App. D, the released run's details) on the default tiny model: every
  preset starts here."""
  c = base.base_config()
  c.method = "asl"

  c.retrieval = base.retrieval()

  a = c.asl = ml_collections.ConfigDict()
  a.topics = ""  # iteration-0 topics: '' = the shipped list, 'corpus' = the demo corpus's categories, or a file
  a.syntax = "qwen"  # search action: 'qwen' (<tool_call> to `retrieve`, the paper's) or 'xml' (<search>)
  a.prompt_style = "paper"  # 'paper' (App. A prompts) or 'compact' (the same in a few lines)
  # N = 128 (x, a) pairs per update: the released run's 32 prompts × 4 rollouts.
  a.pg_batch = 32  # meta prompts per PG update
  a.grm_batch = 32  # (x, y, s) per GRM update
  a.pm_batch = 32  # questions per PM update
  a.group_size = 4  # G rollouts per prompt in every phase (the released rollout.n)
  a.validity_samples = 5  # K GRM judgments of each (x, a)
  a.validity_threshold = 0.8  # C: keep (x, a) iff the mean judgment s̄ ≥ C (4 of 5) ...
  a.validity_inclusive = True  # ... as released; False: s̄ > C, the paper's text
  a.filter_pm = True  # D_PM keeps r_PG > 0 and questions of > 20 characters ending in '?'
  a.balance_grm = True  # D_GRM per question: the minority score's answers + as many others
  a.format_reward = True  # + (share of turns opening with <think> + 1[searched]) / 4, every role
  # GRM verdict → score: 'released' (the text after the last "conclusion" scores 1 when it says
  # "correct" and not "incorrect"; the GRM phase rewards the stored label's word inside the last
  # <answer>) or 'paper' (a strict "conclusion: correct/wrong" in <answer>, r_GRM = 1[ŝ = s])
  a.verdict_rule = "released"
  a.harder_at_half = True  # the PM flag at s̄ = 0.5: HARDER as released (≥ 0.5); False: > 0.5
  a.pm_samples = 10  # M PM answers per valid question (the PG's reward)
  a.pg_reward = "entropy"  # 'entropy' (binary entropy of {s_m}, the paper) or 'azr' (1 − p̄)
  a.gate_reward = True  # a question failing the validity gate gets r_PG = 0 (else: its entropy)
  a.grm_mode = "co_trained"  # 'co_trained' | 'no_grm_phase' (the paper's ablation) | 'frozen' (M0 judges)
  a.pm_target_first = 2000  # the PG phase ends when |D_PM| reaches this in iteration 0 ...
  a.pm_target = 4000  # ... and this in later iterations
  a.stores = ml_collections.ConfigDict(dict(  # bounds of the stores (oldest entries dropped first)
      pg=8000, pm=8000, grm=80000))
  # How GRM and PM phases end. 'plateau' (released): after more than plateau_window[phase]
  # steps, when the task reward's relative gain of the newest half-window over the one before,
  # and of the newest quarter over the one before, are both below plateau_tolerance (0.5%).
  a.phase_end = "plateau"
  a.plateau_window = ml_collections.ConfigDict(dict(grm=200, pm=400))
  a.plateau_tolerance = 0.005
  # 'slope': the least-squares slope, in reward per step, of the last
  # `slope_window` points of the phase's mean training reward after an exponential moving
  # average y_t = ema·y_{t−1} + (1 − ema)·x_t; the phase ends when it is below the threshold
  # (the paper's 0.05; its unit and smoothing are not given), never before min_steps or before
  # the window is full, and always at max_steps.
  a.slope_window = 10
  a.slope_threshold = 0.05
  a.slope_ema = 0.5
  a.phases = ml_collections.ConfigDict(dict(  # (the released run has no cap: total_steps is one)
      pg=phase_limits(1, 1000), grm=phase_limits(10, 2000), pm=phase_limits(10, 2000)))
  a.verification_data = ""  # JSONL of real (question, response, score) for the GRM phase
  a.verification_share = 0.0  # share of each GRM batch drawn from it (the paper's late-stage boost)
  a.verification_from_iteration = 2  # ... from this iteration on (the paper: the third, §4.3)
  a.adv_std = "population"  # group z-score std: population | unbiased | none (centred only)
  a.adv_eps = 1e-6
  # The released search budget: 9 assistant turns (8 searches and a search-free last turn here),
  # 2,048 new tokens per turn, 10,240 response tokens; prompts up to 2,048 (the GRM's).
  a.roles = ml_collections.ConfigDict(dict(  # sampling settings and prompt limits per role
      pg=base.role(2048, temperature=1.0, top_p=1.0, max_turns=8, max_obs_tokens=500),
      pm=base.role(2048, temperature=1.0, top_p=1.0, max_turns=8, max_obs_tokens=500),
      grm=base.role(2048, temperature=1.0, top_p=1.0, max_turns=8, max_obs_tokens=500)))

  # Advantages: GRPO (group z-score over G). The released code trains with PPO + GAE (λ = γ = 1)
  # and a critic initialised from the policy; no critic is built here, so there is no option
  # for it (docs/methods/asl.md). As released: lr 1e-6 constant, no KL, entropy bonus 0.001,
  # weight decay 0.01, grad clip 1.0.
  c.seed = 37
  c.total_steps = 2000  # a cap: phases end on data size and reward slope, not on a step count
  c.optim.lr = 1e-6
  c.optim.warmup_steps = 0
  c.optim.schedule = "constant"
  c.optim.grad_clip = 1.0
  c.optim.weight_decay = 0.01
  # The released actor's micro-batches hold one sequence each, so its token-mean per micro-batch
  # is a mean over sequences of each sequence's token mean.
  c.loss.agg_mode = "seq-mean-token-mean"
  c.loss.kl_beta = 0.0
  c.loss.entropy_coef = 1e-3
  c.loss.temperature = 1.0
  c.rollout.max_context = 2048 + 10240
  c.rollout.max_prompt_tokens = 2048

  return c


def as_measured(c: ml_collections.ConfigDict) -> None:
  """What `demo` and `learn` share: the paper's verdict rule and flag, as they were measured
  (docs/learning.md)."""
  a = c.asl
  a.verdict_rule = "paper"
  a.harder_at_half = False
  c.loss.agg_mode = "token-mean"


def demo(c: ml_collections.ConfigDict) -> None:
  """The `demo` preset: the format-warmed demo model, compact prompts, small phase targets."""
  as_measured(c)
  a = c.asl
  c.seed = 0
  c.total_steps = 12
  a.topics = "corpus"
  a.syntax = "xml"
  a.prompt_style = "compact"
  a.pg_batch = 4
  a.grm_batch = 4
  a.pm_batch = 4
  a.group_size = 2
  a.validity_samples = 3
  a.pm_samples = 4
  a.pm_target_first = 6
  a.pm_target = 6
  a.stores = ml_collections.ConfigDict(dict(pg=64, pm=64, grm=256))
  a.phase_end = "slope"  # phases of 2–3 steps
  a.format_reward = False  # the compact prompts ask for no <think>
  a.filter_pm = False  # the small model's answers seldom split (r_PG > 0): valid pairs suffice
  a.slope_window = 2
  a.slope_ema = 0.0
  a.phases = ml_collections.ConfigDict(dict(
      pg=phase_limits(1, 4), grm=phase_limits(2, 3), pm=phase_limits(2, 3)))
  a.roles = ml_collections.ConfigDict(dict(
      pg=base.role(64, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=64),
      pm=base.role(48, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=64),
      grm=base.role(32, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=64)))
  base.demo_warmup(c)
  base.demo_rollout(c)
  c.optim.lr = 1e-4
  c.optim.weight_decay = 0.0
  c.loss.entropy_coef = 0.0
  c.loss.temperature = 1.0  # the roles' sampling temperature
  base.demo_sizes(c)


def paper(c: ml_collections.ConfigDict) -> None:
  """The `paper` preset: App. D for Qwen2.5-7B-Instruct."""
  base.paper_model(c, "preset:qwen2.5-7b")  # replace with hf:<path> for the real weights


def learn(c: ml_collections.ConfigDict) -> None:
  """The `learn` preset, the headline: ASL's PG, GRM and PM phases at CPU scale on the synthetic
  world's closed-class facts, asked through one search and judged by the GRM, which searches too
  and is co-trained on the PM's answers as in the paper."""
  as_measured(c)
  a = c.asl
  a.topics = "world"  # the world's people, organisations and countries, by name
  a.syntax = "qwen"  # the paper's <tool_call> to `retrieve`
  a.prompt_style = "compact"
  a.grm_mode = "co_trained"  # as in the paper (`learn_frozen_grm`: the frozen start judges)
  a.pg_batch = 16
  a.grm_batch = 16
  a.pm_batch = 16
  a.group_size = 4
  a.validity_samples = 5  # K, as in the paper: a pair is valid with 4 of 5 verdicts correct
  a.pm_samples = 4  # M answers per valid question; D_PM keeps the ones the GRM splits
  a.format_reward = False  # the compact prompts ask for no <think>
  a.pm_target_first = 64
  a.phase_end = "slope"  # with min = max below: fixed phase lengths
  a.phases = ml_collections.ConfigDict(dict(
      pg=phase_limits(4, 4), grm=phase_limits(4, 4), pm=phase_limits(26, 26)))
  a.roles = ml_collections.ConfigDict(dict(
      pg=base.role(112, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=160),
      pm=base.role(112, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=160),
      grm=base.role(112, temperature=1.0, top_p=1.0, max_turns=1, max_obs_tokens=160)))
  c.total_steps = 34  # one iteration: 4 PG, 4 GRM, then 26 PM updates
  c.retrieval.corpus = "world"
  c.retrieval.topk = 1  # the page the query names: one result, as the start model was shown
  base.world_learn(c, "attr_search", max_new_tokens=112)
  # The verifier model already plays the three roles on other worlds: no warm-up on top of it,
  # which would overwrite its copying with a few worlds' names (docs/learning.md).
  c.model.source = f"hf:{VERIFIER_MODEL}"
  c.warmup.steps = 0
  c.warmup.world_seed = -1


def learn_frozen_grm(c: ml_collections.ConfigDict) -> None:
  """The `learn_frozen_grm` preset, an ablation (not the method as published): `learn` with the
  frozen start as the GRM (`asl.grm_mode='frozen'`, the paper's frozen-GRM ablation): a judge
  fitted on other worlds' truth, 98% exact, so the PM's reward is close to an oracle check
  against its page; no GRM phase (4 PG, then 30 PM updates)."""
  learn(c)
  a = c.asl
  a.grm_mode = "frozen"
  a.phases = ml_collections.ConfigDict(dict(
      pg=phase_limits(4, 4), grm=phase_limits(1, 1), pm=phase_limits(30, 30)))
  a.roles.grm.temperature = 0.5  # the frozen judge is never trained: it samples near greedy


PRESETS = {"demo": demo, "learn": learn, "learn_frozen_grm": learn_frozen_grm, "paper": paper}


def get_config(arg=None) -> ml_collections.ConfigDict:
  return base.build(arg, paper_base, PRESETS)
