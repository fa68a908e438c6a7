"""Settings shared by every method's config (each method file adds its own section).

Each field has a one-line comment; override any of them on the command line, e.g.
    --config.optim.lr=1e-6 --config.mesh.shape='(1,-1,1)'
"""

import os
import pathlib
import re

import ml_collections

from scope_jax import sharding
from scope_jax.data import DEMO_MODEL

DEMO_TINY_MODEL = dict(  # a random-init Qwen2-shaped model over the bundled demo tokenizer
    model_type="qwen2", vocab_size=2048, hidden_size=128, intermediate_size=256, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=32, rope_theta=10000.0, qkv_bias=True,
    max_position_embeddings=8192)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.method = ""  # a package under scope_jax/methods (also the name of the method's section)
  c.method_module = ""  # a method outside the package: the module defining METHOD (adding_a_method.md)
  c.preset = "demo"  # which preset of the method config built this
  c.seed = 0  # seeds model init, data sampling and every sampler call
  c.total_steps = 2  # self-play steps to run (a restart resumes until this many are done)
  c.checkpoint_every = 1  # save a checkpoint every this many steps (and at the end)
  c.keep_checkpoints = 3  # newest checkpoints kept on disk
  c.async_checkpoint = True  # save in the background while the next step runs
  c.progress = True  # progress bars for steps and rollouts (only when stderr is a terminal)
  c.overwrite = False  # start over in a workdir that holds metrics but no checkpoint
  c.smoke = False  # a paper preset, smallest sizes, one machine, a real model (core/smoke.py)
  c.smoke_warmup = 0  # with smoke: steps of a format warm-up of the real model (0 = off)

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (1, -1, 1)  # ('data', 'fsdp', 'tensor'); -1 takes the remaining devices
  c.mesh.rules = ml_collections.ConfigDict()  # logical axis -> mesh axes: 'fsdp', 'data,fsdp', ''
  c.mesh.rules.train = sharding.rules_to_config(sharding.TRAIN_RULES)  # e.g. .train.mlp=fsdp
  c.mesh.rules.sampling = sharding.rules_to_config(sharding.SAMPLING_RULES)  # weights whole on fsdp

  c.model = ml_collections.ConfigDict()
  c.model.source = "tiny"  # 'tiny' | 'preset:<name>' | 'hf:<dir or gs://>' | 'gguf:<file or asset>'
  c.model.tiny = ml_collections.ConfigDict(DEMO_TINY_MODEL)  # architecture when source == 'tiny'
  c.model.tie_embeddings = "auto"  # 'yes': one input/output matrix where the source stores two
  c.model.tokenizer = "demo"  # 'demo' | 'byte' | HF tokenizer dir | 'gguf:<file or asset>'
  c.model.dtype = "float32"  # compute dtype: float32 | bfloat16
  c.model.param_dtype = "float32"  # master weight dtype
  c.model.remat = "none"  # none | full | dots | dots_no_batch
  # Mixture of experts on an `expert` mesh axis: each shard receives at most this many times the
  # balanced load of (token, expert) pairs in training, the rest dropped (0: dropless, worst-case
  # buffers; models/moe.py)
  c.model.moe_capacity_factor = 0.0

  c.optim = ml_collections.ConfigDict()
  c.optim.lr = 2e-6  # peak learning rate
  c.optim.warmup_steps = 0  # linear warmup steps
  c.optim.total_steps = 1000  # schedule length (cosine)
  c.optim.schedule = "constant"  # constant | cosine (after warmup)
  c.optim.weight_decay = 0.0  # AdamW decoupled weight decay
  c.optim.grad_clip = 1.0  # global-norm clip (0 = off)

  c.lora = ml_collections.ConfigDict()  # LoRA adapters on a shared frozen base (models/lora.py)
  c.lora.rank = 0  # adapter rank R (0 = off: every policy trains all weights)
  c.lora.alpha = 0.0  # scale = alpha / rank (0: alpha = rank, scale 1)
  c.lora.targets = "q,k,v,o,gate,up,down"  # projections adapted (MoE models: attention only)
  c.lora.dropout = 0.0  # adapter-input dropout: not supported, must be 0

  c.loss = ml_collections.ConfigDict()
  c.loss.agg_mode = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  c.loss.eps_low = 0.2  # PPO clip ε below 1
  c.loss.eps_high = 0.2  # PPO clip ε above 1
  c.loss.dual_clip = 0.0  # dual-clip c for negative advantages (0 = off)
  c.loss.kl_beta = 0.0  # β of the KL penalty (0 skips the reference forward)
  c.loss.kl_kind = "k3"  # k1 | k2 | k3 | k3+
  c.loss.entropy_coef = 0.0  # entropy bonus: loss −= coef · entropy (verl's entropy_coeff)
  c.loss.temperature = 1.0  # logits / T in the trainer (match the sampling temperature)
  c.loss.chunk = 256  # sequence chunk for log-probs (never [B, T, V] at once)
  c.loss.norm_length = 0  # Dr.GRPO's constant length (0 = max_context − max_prompt_tokens)
  c.loss.router_aux_coef = 0.0  # MoE load-balancing loss added to the RL loss (HF: 1e-3; 0 = off)
  # Rollout correction (verl's): w = π_trainer/π_sampler per token (or per sequence: the product);
  # truncate multiplies each token's policy loss by min(w, C), mask drops the tokens (sequences)
  # with w outside [1/C, C] from the loss and its normaliser. 'auto' is truncate when the sampler
  # computes in bfloat16/float16 (rollout.dtype), off when in float32.
  c.loss.rollout_correction = ml_collections.ConfigDict(dict(
      mode="auto",  # auto | off | truncate | mask
      level="token",  # token | sequence
      threshold=2.0))  # C > 1

  c.learner = ml_collections.ConfigDict()  # how an update runs (rl/learner.py), not what it computes
  # Rows per micro-batch (gradient accumulation; memory only), rounded up to a multiple of the
  # mesh's batch shards.
  c.learner.micro_batch_rows = 8
  c.learner.recompute_old_logp = False  # π_old from a trainer forward instead of the sampler

  c.warmup = ml_collections.ConfigDict()  # format warm-up of the demo model (core/warmup.py)
  c.warmup.steps = 0  # SFT steps on the method's format demonstrations (0 = off)
  c.warmup.lr = 5e-3  # Adam learning rate of the warm-up
  c.warmup.batch_rows = 8  # demonstrations per warm-up step
  c.warmup.documents = 48  # corpus documents the demonstrations are built from
  c.warmup.max_tokens = 0  # > 0: each demonstration cut to this many tokens (one without a
  # trained token left is dropped): bounds the fit's attention memory (0 = whole demonstrations)
  c.warmup.world_seed = -1  # ≥ 0: demonstrate on this world's questions instead (the `learn`
  # presets: other worlds than world.seed, so formats are right and facts unknown); a method's
  # own knobs of those demonstrations are in its section (`<method>.warmup`)
  c.warmup.worlds = 1  # ... from this many worlds (seeds world_seed, world_seed + 1, …)

  c.world = ml_collections.ConfigDict()  # the synthetic world (scope_jax.world)
  c.world.seed = 0  # which world: retrieval.corpus='world' and 'world:<set>' benchmarks read it
  c.world.corpus_seeds = ()  # other worlds whose documents join world.seed's in the 'world'
  # corpus: more pages to write tasks from and to search among (the gold sets stay world.seed's)
  c.world.heldout_entities = False  # True: training reads only the trained half of the world's
  # entities (documents, search index, topics, names in problems); evaluation scores each half
  # apart (eval/<set>/trained_half/pass@1, .../heldout_half/pass@1): reading vs remembering

  c.eval = ml_collections.ConfigDict()  # held-out evaluation during training (core/evals.py)
  c.eval.every = 0  # evaluate at step 0, every this many steps and at the end (0 = never)
  c.eval.benchmarks = ""  # as `scope_jax.evaluate --benchmarks`, or 'world:<set>' (doc, attr,
  # hop1, attr_search, hop2, arith: the held-out gold sets of world `world.seed`)
  c.eval.role = ""  # the trained role that answers ('' = the method's: see core/evals.py)
  c.eval.limit = 0  # the first N questions of each benchmark (0 = all)
  c.eval.max_new_tokens = 256  # per generated turn
  c.eval.temperature = 0.0  # 0 = greedy; > 0 samples (mean@n/<score> is then the expected score)
  c.eval.num_samples = 1  # samples per question
  c.eval.max_turns = 4  # searches before the final turn (qa_search)
  c.eval.batch_size = 64  # questions per rollout call
  c.eval.prompt = "benchmark"  # the evaluator's prompt per benchmark type, or 'role': the
  # answering role's own training prompt (a small model knows no other)

  c.control = ""  # 'shuffled_rewards': each update's advantages permuted across its rows (no
  # signal, the same distribution; the same rows and inputs), the control a learning claim is
  # measured against; 'shuffled_rewards_and_teacher' also permutes a distilling update's teacher
  # inputs (its log-probs act as a per-token reward): a wider control, reported beside it

  c.rollout = ml_collections.ConfigDict()
  c.rollout.dtype = ""  # the samplers' compute dtype: '' = model.dtype | float32 | bfloat16
  c.rollout.max_context = 8192  # prompt + response tokens per sequence
  c.rollout.max_prompt_tokens = 6144  # longer prompts keep their last tokens
  # The slot engine keeps each row's KV cache across turns and refills free slots as rows end
  # (sampling/engine.py); False runs every turn through the sampler, prefilled from scratch.
  c.rollout.engine = True
  # Rows decoded together (rounded up to a multiple of data × fsdp); the KV cache holds
  # slots × max_context positions from a step's first rollout until its training (then freed).
  c.rollout.slots = 64
  c.rollout.chunk = 16  # decode steps per device call between host checks (stops, tools, slots)
  c.rollout.prefill_rows = 4  # slots prefilled together, per data-parallel shard
  c.rollout.prefill_chunk = 512  # tokens per prefill call; longer inputs take several
  c.rollout.min_window = 256  # cache positions every engine program covers at least
  return c


def retrieval() -> ml_collections.ConfigDict:
  """The search tool of the methods whose roles search: the bundled demo index by
  default; a prebuilt index directory or a running Search-R1 server for real corpora."""
  r = ml_collections.ConfigDict()
  r.corpus = "demo"  # source documents: 'demo' (bundled), 'world' (the synthetic world
  # `world.seed`, scope_jax.world) or the JSONL corpus the index holds
  r.index = ""  # prebuilt index dir (scope_jax.retrieval.build_index); '' = demo index
  r.encoder = "minilm"  # query encoder: asset name or checkpoint dir (E5-base-v2 in the papers)
  r.url = ""  # use a running Search-R1 retrieval server instead of an in-process index
  r.topk = 3  # documents per query
  r.max_documents = 0  # sample source documents (topics) from the first N passages (0 = all)
  return r


def role(max_new_tokens: int, temperature: float = 0.7, top_p: float = 0.95, top_k: int = 0,
         max_prompt_tokens: int = 0, **extra) -> ml_collections.ConfigDict:
  """Sampling settings and prompt limit of one role (max_prompt_tokens 0 = the run's
  rollout.max_prompt_tokens); inserted content is cut to fit, never the instructions."""
  return ml_collections.ConfigDict(dict(max_new_tokens=max_new_tokens, temperature=temperature,
                                        top_p=top_p, top_k=top_k,
                                        max_prompt_tokens=max_prompt_tokens, **extra))


def demo_warmup(c: ml_collections.ConfigDict) -> None:
  """The warm-up every demo preset shares, so the bundled demo model (fitted once on every
  method's demonstrations with these settings) serves each of them."""
  c.warmup.steps = 3000
  c.warmup.lr = 5e-3
  c.warmup.batch_rows = 8
  c.warmup.documents = 48


def demo_rollout(c: ml_collections.ConfigDict) -> None:
  """The tiny demo model's attention is cheap and its compiles are not: one 1024-position window
  serves every engine program of a demo's short contexts."""
  c.rollout.min_window = 1024


def demo_sizes(c: ml_collections.ConfigDict) -> None:
  """The rows and contexts every demo preset runs with on one CPU."""
  c.learner.micro_batch_rows = 8
  c.rollout.max_context = 2048
  c.rollout.max_prompt_tokens = 1536


def paper_model(c: ml_collections.ConfigDict, source: str, *, retrieval: bool = True) -> None:
  """What every paper preset sets for its model: `source` (a random-init `preset:` until
  `hf:<path>` names the real weights), the tokenizer left to the user, bfloat16 compute with full
  remat, π_old from the trainer (as verl and TRL do: ratio 1 at the first update) and 4 rows per
  micro-batch; with `retrieval`, the corpus and encoder (E5) left to the user too."""
  c.model.source = source
  c.model.tokenizer = ""  # required: the checkpoint's local (or gs://) directory
  c.model.dtype = "bfloat16"
  c.model.remat = "full"
  c.learner.recompute_old_logp = True
  c.learner.micro_batch_rows = 4
  if retrieval:
    c.retrieval.corpus = ""  # required with retrieval.index (or retrieval.url)
    c.retrieval.encoder = ""  # required: the E5-base-v2 checkpoint directory


def world_learn(c: ml_collections.ConfigDict, gold_set: str, max_new_tokens: int) -> None:
  """What every `learn` preset shares: the bundled demo model re-warmed on four other worlds
  (formats right, this world's facts unknown), a constant rate with no warm-up or decay, and
  held-out evaluation on 300 questions of the world's `gold_set` in the answering role's own
  prompt, before the first update, every 10 updates and after the last."""
  demo_warmup(c)
  c.model.source = f"hf:{DEMO_MODEL}"
  c.warmup.world_seed = c.world.get_ref("seed") + 1000
  c.warmup.worlds = 4
  c.world.heldout_entities = True  # half the world's entities are never trained on
  c.warmup.steps = 1500
  demo_rollout(c)
  c.optim.lr = 3e-4
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0
  c.loss.temperature = 1.0
  c.learner.micro_batch_rows = 16
  c.rollout.max_context = 1024
  c.rollout.max_prompt_tokens = 768
  c.eval.every = 10
  c.eval.benchmarks = f"world:{gold_set}"
  c.eval.limit = 300
  c.eval.prompt = "role"
  c.eval.max_new_tokens = max_new_tokens
  c.eval.max_turns = 1
  c.checkpoint_every = 10  # a kill loses at most 10 steps (each checkpoint is small: 0.8M params)
  c.keep_checkpoints = 1


MOVED = {  # settings that moved: old path -> new path (the old one is refused, naming the new)
    "loss.micro_batch_rows": "learner.micro_batch_rows",
    "loss.recompute_old_logp": "learner.recompute_old_logp",
}


def moved_message(old: str) -> str:
  return f"{old} moved to {MOVED[old]}: set --config.{MOVED[old]} instead."


def check_moved(config: ml_collections.ConfigDict) -> None:
  """A one-line error when a config (a script's, an old file's) still sets a moved setting."""
  for old in MOVED:
    section, _, key = old.rpartition(".")
    if key in config.get(section, {}):
      raise ValueError(moved_message(old))


def parse_preset(arg, presets) -> str:
  preset = arg or "demo"
  if preset not in presets:
    raise ValueError(f"Unknown preset {preset!r}; valid presets: {', '.join(presets)}.")
  return preset


def build(arg, method_base, presets) -> ml_collections.ConfigDict:
  """A method file's `get_config(arg)`: the method's paper base (`method_base()`), then the
  overrides of preset `arg` (default 'demo'; `presets` maps each name to a function that edits
  the config in place). One base, one small function per preset: no chain of `if`s."""
  preset = parse_preset(arg, tuple(presets))
  c = method_base()
  c.preset = preset
  presets[preset](c)
  return c


PACKAGED = pathlib.Path(__file__).parent / "configs"  # the method files, installed with the package
_CONFIG_ARG = re.compile(r"^(?P<file>.*?\.py)(?P<preset>:.*)?$")


def config_path(arg: str) -> str:
  """`--config`'s file: `arg` itself when it exists here; otherwise `configs/<name>.py[:preset]`
  (the layout a checkout has) names the file installed with the package, so the same command
  runs from any directory and from an installed package."""
  m = _CONFIG_ARG.match(str(arg))
  if m is None or os.path.exists(m["file"]):
    return str(arg)
  file = pathlib.PurePath(os.path.normpath(m["file"]))
  packaged = PACKAGED / file.name
  if file.parts[:-1] == ("configs",) and packaged.is_file():
    return f"{packaged}{m['preset'] or ''}"
  return str(arg)


def resolve_config_flag(argv):
  """`argv` with its `--config=configs/<name>.py[:preset]` (or `--config configs/…`) resolved by
  `config_path`; every other argument as given."""
  out = list(argv)
  for i, a in enumerate(out):
    if a.startswith("--config="):
      out[i] = "--config=" + config_path(a[len("--config="):])
    elif a == "--config" and i + 1 < len(out):
      out[i + 1] = config_path(out[i + 1])
  return out


def load_file(path, preset: str | None = None) -> ml_collections.ConfigDict:
  """`get_config(preset)` of the config file at `path` (what `--config=path:preset` reads;
  `configs/<name>.py` is found in the package from any directory), for scripts and tools that
  take a config without absl's flag."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  path = pathlib.Path(config_path(str(path)))
  spec = importlib.util.spec_from_file_location(f"scope_jax_config_{path.stem}", path)
  if spec is None or not path.exists():
    raise ValueError(f"No config file at {path}; pass a method's file such as configs/<method>.py.")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)
