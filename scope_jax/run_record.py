"""What a run leaves for its later readers (the evaluator, the exporter), so a workdir alone,
local or gs://, is enough to load any trained role at any step.

    <workdir>/run.json       method, preset, the whole config, the architecture (HF config.json
                             form), the trained policies and which policy plays each role
    <workdir>/tokenizer/     the tokenizer's files (HF tokenizers; 'demo'/'byte' are named only)
    <workdir>/checkpoints/   orbax steps: {policy: TrainState} + the method's host state (with
                             LoRA, adapters only: the base is model.source or warm_start/)
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import tempfile

import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from scope_jax import checkpoint as ckpt_lib
from scope_jax import events
from scope_jax import sharding as shd
from scope_jax import tokenizer as tok_lib
from scope_jax.models import ModelConfig, transformer
from scope_jax.models import lora as lora_lib

RUN_FILE = "run.json"
TOKENIZER_DIR = "tokenizer"
SAVED_TOKENIZER = "run:tokenizer"  # run.json's tokenizer entry when the files are in the run
VERSION = 1


@dataclasses.dataclass(frozen=True)
class RunRecord:
  path: str  # the workdir
  method: str
  preset: str
  config: ml_collections.ConfigDict
  model_config: ModelConfig
  policies: tuple[str, ...]
  roles: dict[str, str | None]  # role -> the policy that plays it (None: frozen params)
  tokenizer: str  # 'demo' | 'byte' | SAVED_TOKENIZER

  @property
  def checkpoints(self) -> str:
    return f"{self.path}/checkpoints"


def write(rt, workdir: str) -> None:
  """Writes run.json (and the tokenizer files) for the runtime `rt` of a run; process 0 only."""
  if jax.process_index() != 0:
    return
  root = epath.Path(workdir)
  spec = rt.config.model.tokenizer
  if spec not in ("demo", "byte"):
    _save_tokenizer(rt.tokenizer, root / TOKENIZER_DIR)
    spec = SAVED_TOKENIZER
  record = {
      "version": VERSION, "method": rt.config.method, "preset": rt.config.preset,
      "model": rt.model_config.to_hf_config(rt.config.model.param_dtype),
      "policies": rt.checkpointed(),  # every params tree a checkpoint holds
      "roles": {name: _played_by(rt, role) for name, role in rt.roles.items()},
      "tokenizer": spec, "config": json.loads(rt.config.to_json_best_effort())}
  events.write_whole(root / RUN_FILE, json.dumps(record, indent=2).encode())


def _played_by(rt, role) -> str | None:
  """The checkpointed params a role plays (a policy or tracked params); None: frozen, unsaved."""
  if role.policy is not None:
    return role.policy.name
  return role.frozen if role.frozen in rt.tracked else None


def _save_tokenizer(tokenizer, target: epath.Path) -> None:
  """`save_pretrained` into a local temporary directory, then copied (target may be gs://)."""
  target.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    tokenizer.save_pretrained(tmp)
    for name in sorted(os.listdir(tmp)):
      (target / name).write_bytes(epath.Path(tmp, name).read_bytes())


def read(run: str) -> RunRecord:
  """The record of the run in `run` (local or gs://), with errors that name the path."""
  root = epath.Path(ckpt_lib.absolute(run))
  path = root / RUN_FILE
  try:
    exists = path.exists()
  except Exception as e:  # noqa: BLE001 — a missing bucket, no credentials, a bad URL
    raise FileNotFoundError(f"Cannot read the run {root} ({type(e).__name__}: {e}); check the "
                            "path and the bucket name.") from e
  if not exists:
    bucket = _bucket(os.fspath(root))
    if bucket is not None and not epath.Path(bucket).exists():
      raise FileNotFoundError(f"The bucket {bucket} of {root} does not exist (or cannot be read "
                              "with these credentials); check the bucket name.")
    hint = (" It holds checkpoints but no run record: it was written by an older version; "
            "evaluate its exported model with --model=hf:<dir> instead."
            if (root / "checkpoints").exists() else
            " Is it the --workdir of a scope_jax run?")
    raise FileNotFoundError(f"No {RUN_FILE} in {root}.{hint}")
  try:
    data = json.loads(path.read_text())
    return RunRecord(
        path=os.fspath(root), method=data["method"], preset=data["preset"],
        config=ml_collections.ConfigDict(data["config"]),
        model_config=ModelConfig.from_hf_config(data["model"]),
        policies=tuple(data["policies"]), roles=dict(data["roles"]), tokenizer=data["tokenizer"])
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f"{path} is not a valid run record ({type(e).__name__}: {e}).") from e


def _bucket(path: str) -> str | None:
  """'gs://bucket' of a gs:// path (None for local paths)."""
  if not path.startswith("gs://"):
    return None
  return "gs://" + path[len("gs://"):].split("/", 1)[0]


def policy_for(record: RunRecord, role: str) -> str:
  """The trained policy behind `role` (a policy name or a role name)."""
  if role in record.policies:
    return role
  if record.roles.get(role):
    return record.roles[role]
  trained = sorted(set(record.policies) | {r for r, p in record.roles.items() if p})
  if role in record.roles:
    raise ValueError(f"Role {role!r} of {record.path} plays frozen params, which are never "
                     f"trained or saved; choose a trained role: {', '.join(trained)}.")
  raise ValueError(f"The {record.method} run {record.path} has no role {role!r}; choose one of: "
                   f"{', '.join(trained)}.")


def load_tokenizer(record: RunRecord):
  """The run's tokenizer: its saved files (copied to a local temporary directory) or by name."""
  if record.tokenizer != SAVED_TOKENIZER:
    return tok_lib.load_tokenizer(record.tokenizer)
  src = epath.Path(record.path) / TOKENIZER_DIR
  local = tempfile.mkdtemp(prefix="scope_jax_tokenizer_")
  atexit.register(shutil.rmtree, local, ignore_errors=True)
  for f in src.iterdir():
    epath.Path(local, f.name).write_bytes(f.read_bytes())
  return tok_lib.load_tokenizer(local)


class UnreadableCheckpoint(ValueError):
  """A committed checkpoint step whose files cannot be read (corrupt or partial)."""


def check_tokenizer(record: RunRecord) -> None:
  """A one-line error when run.json says the tokenizer's files are in the run and they are not."""
  if record.tokenizer != SAVED_TOKENIZER:
    return
  src = epath.Path(record.path) / TOKENIZER_DIR
  if not src.is_dir() or not any(src.iterdir()):
    raise ValueError(f"{record.path}/{RUN_FILE} says the tokenizer is saved in {src}, which is "
                     "missing or empty; copy the run's tokenizer/ folder back, or pass --tokenizer "
                     "with --model=initial.")


def _check_json_metadata(path: epath.Path) -> None:
  """The checkpoint's JSON metadata files parse (`_METADATA` must exist): a truncated copy fails
  here, in one line."""
  files = [path / "_METADATA", path / "_sharding"]
  if (path / "array_metadatas").exists():
    files += sorted((path / "array_metadatas").iterdir())
  for f in files:
    if f.name == "_METADATA" or f.exists():
      json.loads(f.read_text())


def check_checkpoint(record: RunRecord, step: int, policy: str) -> None:
  """Reads only the metadata of `policy`'s params at `step` and compares every shape with what
  run.json's model has: UnreadableCheckpoint when the files cannot be read, ValueError (one line,
  the first difference) when they hold another model."""
  path = epath.Path(record.checkpoints) / str(step) / "state"
  reader = ocp.PyTreeCheckpointer()
  try:
    _check_json_metadata(path)  # before orbax, whose threads print tracebacks on broken files
    saved = reader.metadata(path).item_metadata[policy]["params"]
    saved = {jax.tree_util.keystr(k): tuple(v.shape) for k, v in
             jax.tree_util.tree_flatten_with_path(saved)[0]}
  except Exception as e:  # noqa: BLE001 — any failure to read is a corrupt step
    detail = str(e).splitlines()[0][:200] if str(e) else ""
    raise UnreadableCheckpoint(f"Checkpoint step {step} of {record.path} cannot be read "
                               f"({type(e).__name__}: {detail})") from None
  finally:
    reader.close()  # its background thread must not outlive the error (a traceback at exit)
  want = {jax.tree_util.keystr(k): tuple(v) for k, v in jax.tree_util.tree_flatten_with_path(
      trained_shapes(record), is_leaf=lambda x: isinstance(x, tuple))[0]}
  for key in sorted(set(want) | set(saved)):
    if want.get(key) != saved.get(key):
      raise ValueError(f"Checkpoint step {step} of {record.path} does not hold the model its "
                       f"{RUN_FILE} describes: params{key} is {saved.get(key, 'missing')} in the "
                       f"checkpoint and {want.get(key, 'absent')} by {RUN_FILE} (was it edited, "
                       "or copied from another run?).")


def lora_of(record: RunRecord) -> lora_lib.LoraConfig:
  """The run's LoRA settings (rank 0: it trained every weight)."""
  return lora_lib.from_config(record.config.get("lora"))


def trained_shapes(record: RunRecord) -> dict:
  """The shapes of what a checkpoint holds per policy as `params`: the model's params, or with
  LoRA its adapters ({"weights": {target: {"a", "b"}}})."""
  lora = lora_of(record)
  if lora.rank:
    return {"weights": lora_lib.adapter_shapes(record.model_config, lora)}
  return transformer.param_shapes(record.model_config)


def committed_steps(record: RunRecord) -> list[int]:
  """Checkpoint steps whose save committed (a save in progress is never listed)."""
  directory = epath.Path(record.checkpoints)
  if not directory.exists():
    return []
  manager = ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def select_steps(available: list[int], spec: str) -> list[int]:
  """`latest`, `all` or `N[,M…]` against the committed steps, with errors that list them."""
  spec = str(spec).strip()
  if spec in ("latest", "all"):
    return available[-1:] if spec == "latest" else list(available)
  try:
    wanted = [int(s) for s in spec.split(",") if s.strip()]
  except ValueError:
    wanted = []
  if not wanted:
    raise ValueError(f"--step={spec!r}: use latest, all, or step numbers such as 3,7.")
  missing = [s for s in wanted if s not in available]
  if missing:
    raise ValueError(f"No committed checkpoint for step(s) {missing}; the run has steps "
                     f"{available or 'none yet'}.")
  return wanted


def restore_params(record: RunRecord, step: int, policy: str, mesh, rules: shd.Rules, dtype):
  """The params of `policy` at `step`, restored alone (no optimizer state is read), placed on
  `mesh` under `rules` (the run's sampling rules, for evaluation). A LoRA run's are its
  adapters (`lora.Adapters`, float32): `lora.view` them on the run's base."""
  lora = lora_of(record)
  if lora.rank:
    shapes = {"weights": lora_lib.adapter_shapes(record.model_config, lora)}
    shardings = {"weights": lora_lib.adapter_shardings(record.model_config, lora, mesh,
                                                       rules).weights}
    dtype = jax.numpy.float32
  else:
    shapes = transformer.param_shapes(record.model_config)
    shardings = transformer.param_shardings(record.model_config, mesh, rules)
  abstract = {policy: {"params": jax.tree.map(  # shardings first: each shape is a tuple
      lambda sh, shape: jax.ShapeDtypeStruct(shape, dtype, sharding=sh), shardings, shapes)}}
  manager = ocp.CheckpointManager(epath.Path(record.checkpoints),
                                  options=ocp.CheckpointManagerOptions(read_only=True))
  try:
    out = manager.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
        partial_restore=True)))
  finally:
    manager.close()
  params = out["state"][policy]["params"]
  return lora_lib.Adapters(params["weights"], lora.scale) if lora.rank else params


def worlds(config) -> dict:
  """The synthetic worlds a run's params saw: its own (`world.seed`, whose gold sets are held
  out only from a model that never trained on it), the other worlds its corpus adds, and those
  its warm-up demonstrated on: a model loaded from the export knows their facts."""
  w, warm = config.get("world", {}), config.get("warmup", {})
  first, count = warm.get("world_seed", -1), warm.get("worlds", 0)
  reads = [k for k, v in _flat(config) if v == "world" and k.endswith(("corpus", "topics", "file"))]
  return {"seed": w.get("seed", 0) if reads else None,  # None: it never read its world
          "corpus_seeds": list(w.get("corpus_seeds", ())),
          "warmup_seeds": list(range(first, first + count))
          if warm.get("steps", 0) and first is not None and first >= 0 else []}


def _flat(config, prefix=""):
  for k, v in config.items():
    if hasattr(v, "items"):
      yield from _flat(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v

