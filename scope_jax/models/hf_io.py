"""Hugging Face checkpoints ⇄ params: `load_hf` places every shard directly, `save_hf` writes
safetensors + config.json that `transformers.AutoModelForCausalLM.from_pretrained` loads.

Each parameter leaf is described once (HF tensor name, whether HF stores it transposed, and how
HF's 2-D layout splits into our head dims); loading builds every leaf with
`jax.make_array_from_callback`, so each device reads only the rows its shard needs.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from etils import epath

from scope_jax import sharding as shd
from scope_jax.models import safetensors_io, transformer
from scope_jax.models.config import ModelConfig

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class TensorSource(Protocol):
  """Where tensors come from: a safetensors checkpoint, a dequantised GGUF, a dict."""

  def names(self) -> Sequence[str]: ...

  def shape(self, name: str) -> tuple[int, ...]: ...

  def read(self, name: str, index: Sequence[slice]) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class _Leaf:
  """How one (per-layer) parameter is stored in HF form.

  Our array = reshape(transpose?(hf_tensor)). `groups[i]` lists which of our dims make up dim i of
  the (transposed) HF tensor, e.g. q: HF [N*H, D] → transposed [D, N*H] → ours [D, N, H] has
  groups ((0,), (1, 2)).
  """

  hf_name: str
  transpose: bool
  groups: tuple[tuple[int, ...], ...]


_ID2 = ((0,), (1,))
_NORMS = {  # our norm → HF name, per `norm_layout`
    "pre": {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"},
    "sandwich": {"attn_norm": "input_layernorm", "attn_post_norm": "post_attention_layernorm",
                 "mlp_norm": "pre_feedforward_layernorm",
                 "mlp_post_norm": "post_feedforward_layernorm"},
    "post": {"attn_post_norm": "post_attention_layernorm",
             "mlp_post_norm": "post_feedforward_layernorm"},
}
_LAYER_LEAVES = {
    "q": _Leaf("self_attn.q_proj.weight", True, ((0,), (1, 2))),
    "k": _Leaf("self_attn.k_proj.weight", True, ((0,), (1, 2))),
    "v": _Leaf("self_attn.v_proj.weight", True, ((0,), (1, 2))),
    "o": _Leaf("self_attn.o_proj.weight", True, ((0, 1), (2,))),
    "q_bias": _Leaf("self_attn.q_proj.bias", False, ((0, 1),)),
    "k_bias": _Leaf("self_attn.k_proj.bias", False, ((0, 1),)),
    "v_bias": _Leaf("self_attn.v_proj.bias", False, ((0, 1),)),
    "q_norm": _Leaf("self_attn.q_norm.weight", False, ((0,),)),
    "k_norm": _Leaf("self_attn.k_norm.weight", False, ((0,),)),
    "router": _Leaf("mlp.gate.weight", True, _ID2),  # HF [E, D]
    # Experts: one HF tensor per expert ("{e}"), stacked on our leading E axis.
    "expert_gate": _Leaf("mlp.experts.{e}.gate_proj.weight", True, _ID2),
    "expert_up": _Leaf("mlp.experts.{e}.up_proj.weight", True, _ID2),
    "expert_down": _Leaf("mlp.experts.{e}.down_proj.weight", True, _ID2),
    "gate": _Leaf("mlp.gate_proj.weight", True, _ID2),
    "up": _Leaf("mlp.up_proj.weight", True, _ID2),
    "down": _Leaf("mlp.down_proj.weight", True, _ID2),
}
_TOP_LEAVES = {
    "embed": _Leaf("model.embed_tokens.weight", False, _ID2),
    "lm_head": _Leaf("lm_head.weight", False, _ID2),
    "final_norm": _Leaf("model.norm.weight", False, ((0,),)),
}


def _hf_shape(leaf: _Leaf, our_shape: Sequence[int]) -> tuple[int, ...]:
  dims = tuple(math.prod(our_shape[d] for d in g) for g in leaf.groups)
  return dims[::-1] if leaf.transpose else dims


def _read_leaf(source: TensorSource, name: str, leaf: _Leaf, our_shape: Sequence[int],
               index: Sequence[slice]) -> np.ndarray:
  """Reads our_array[index] for one (per-layer) leaf from its HF tensor, reading only rows needed."""
  index = [s if isinstance(s, slice) else slice(s, s + 1) for s in index]
  index = [slice(*s.indices(n)[:2]) for s, n in zip(index, our_shape)]
  hf_index, inner, shape = [], [], []
  for group in leaf.groups:
    first, rest = group[0], group[1:]
    inner_size = math.prod(our_shape[d] for d in rest)
    hf_index.append(slice(index[first].start * inner_size, index[first].stop * inner_size))
    shape += [index[first].stop - index[first].start] + [our_shape[d] for d in rest]
    inner += [slice(None)] + [index[d] for d in rest]
  if leaf.transpose:
    hf_index = hf_index[::-1]
  arr = source.read(name, tuple(hf_index))
  if leaf.transpose:
    arr = arr.T
  return arr.reshape(shape)[tuple(inner)]


def layer_leaves(config: ModelConfig) -> dict[str, _Leaf]:
  """How each per-layer parameter of this family is named and laid out in HF checkpoints."""
  leaves = dict(_LAYER_LEAVES)
  leaves.update({ours: _Leaf(f"{hf}.weight", False, ((0,),))
                 for ours, hf in _NORMS[config.norm_layout].items()})
  if config.qk_norm_full:  # OLMo: HF [N·H] → ours [N, H]
    leaves["q_norm"] = _Leaf("self_attn.q_norm.weight", False, ((0, 1),))
    leaves["k_norm"] = _Leaf("self_attn.k_norm.weight", False, ((0, 1),))
  return leaves


def _leaf_table(config: ModelConfig) -> dict[tuple[str, ...], tuple[_Leaf, tuple[int, ...]]]:
  """(path in params) → (storage description, our shape)."""
  shapes = transformer.param_shapes(config)
  leaves = layer_leaves(config)
  table = {}
  for name, shape in shapes.items():
    if name == "layers":
      for lname, lshape in shape.items():
        table[("layers", lname)] = (leaves[lname], lshape)
    else:
      table[(name,)] = (_TOP_LEAVES[name], shape)
  return table


def _per_expert(leaf: _Leaf) -> bool:
  return "{e}" in leaf.hf_name


def _names_for(path: tuple[str, ...], leaf: _Leaf, num_layers: int,
               num_experts: int = 0) -> list[str]:
  if path[0] == "layers":
    names = [f"model.layers.{i}.{leaf.hf_name}" for i in range(num_layers)]
    if _per_expert(leaf):
      names = [n.format(e=e) for n in names for e in range(num_experts)]
    return names
  return [leaf.hf_name]


def _read_layer(source, i: int, leaf: _Leaf, shape, index) -> np.ndarray:
  """Layer i of a stacked leaf (`shape` without L), experts read one by one and stacked."""
  if not _per_expert(leaf):
    return _read_leaf(source, f"model.layers.{i}.{leaf.hf_name}", leaf, shape, index)
  experts = range(*index[0].indices(shape[0])[:2]) if isinstance(index[0], slice) else [index[0]]
  name = f"model.layers.{i}.{leaf.hf_name}"
  return np.stack([_read_leaf(source, name.format(e=e), leaf, shape[1:], index[1:])
                   for e in experts])


def check_source(config: ModelConfig, source: TensorSource) -> None:
  """Raises one ValueError listing every missing tensor and every shape mismatch."""
  available = set(source.names())
  problems, expected_names = [], set()
  for path, (leaf, shape) in _leaf_table(config).items():
    per = shape[1:] if path[0] == "layers" else shape
    per = per[1:] if _per_expert(leaf) else per
    want = _hf_shape(leaf, per)
    for hf_name in _names_for(path, leaf, config.num_layers, config.num_experts):
      expected_names.add(hf_name)
      if hf_name not in available:
        problems.append(f"missing tensor {hf_name!r} (expected shape {want})")
      elif tuple(source.shape(hf_name)) != want:
        problems.append(f"tensor {hf_name!r} has shape {tuple(source.shape(hf_name))}, but the "
                        f"config expects {want}")
  if problems:
    head = "; ".join(problems[:8]) + (f"; ... and {len(problems) - 8} more" if len(problems) > 8
                                      else "")
    raise ValueError(f"Checkpoint does not match the config ({config.model_type}, "
                     f"{config.num_layers} layers, D={config.hidden_size}): {head}.")
  extra = sorted(n for n in available - expected_names
                 if not n.endswith(_IGNORED_SUFFIXES) and not (config.tie_embeddings and
                                                                n == "lm_head.weight"))
  if extra:
    logging.warning("Ignoring %d checkpoint tensors the model does not use, e.g. %s.", len(extra),
                    extra[:3])


def params_from_source(config: ModelConfig, source: TensorSource, mesh=None,
                       rules: shd.Rules = shd.TRAIN_RULES, dtype=jnp.float32) -> transformer.Params:
  """Builds params from a tensor source, each shard read on its own and placed on its device."""
  check_source(config, source)
  if mesh is None:
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    shardings = jax.tree.map(lambda _: device, transformer.param_shapes(config),
                             is_leaf=lambda x: isinstance(x, tuple))
  else:
    shardings = transformer.param_shardings(config, mesh, rules)
  out: dict[str, Any] = {"layers": {}}
  for path, (leaf, shape) in _leaf_table(config).items():
    sharding = shardings[path[0]] if len(path) == 1 else shardings["layers"][path[1]]

    def callback(index, path=path, leaf=leaf, shape=shape):
      if path[0] != "layers":
        return _read_leaf(source, leaf.hf_name, leaf, shape, index).astype(dtype)
      layers = range(*index[0].indices(shape[0])[:2])
      parts = [_read_layer(source, i, leaf, shape[1:], index[1:]) for i in layers]
      return np.stack(parts).astype(dtype)

    arr = jax.make_array_from_callback(shape, sharding, callback)
    if len(path) == 1:
      out[path[0]] = arr
    else:
      out["layers"][path[1]] = arr
  return out


class SafetensorsSource:
  """All tensors of a checkpoint directory (single file or sharded with an index)."""

  def __init__(self, path):
    path = epath.Path(path)
    index = path / "model.safetensors.index.json"
    if index.exists():
      weight_map = _read_json(index).get("weight_map")
      if not isinstance(weight_map, dict):
        raise ValueError(f"{index} has no 'weight_map' object; the index is corrupt.")
      files = {f: safetensors_io.SafetensorsFile(path / f) for f in sorted(set(weight_map.values()))}
      self._where = {name: files[f] for name, f in weight_map.items()}
    else:
      files = sorted(path.glob("*.safetensors"))
      if not files:
        raise FileNotFoundError(
            f"No model.safetensors or model.safetensors.index.json in {path}. load_hf reads "
            "safetensors checkpoints only; convert PyTorch .bin files with transformers "
            "(from_pretrained(...).save_pretrained(..., safe_serialization=True)).")
      self._where = {}
      for f in files:
        st = safetensors_io.SafetensorsFile(f)
        self._where.update({name: st for name in st.names()})

  def names(self):
    return list(self._where)

  def shape(self, name):
    return self._where[name].shape(name)

  def read(self, name, index):
    return self._where[name].read(name, index)


class DictSource:
  """Tensors held in memory (numpy), e.g. dequantised from GGUF."""

  def __init__(self, tensors: Mapping[str, np.ndarray]):
    self._tensors = dict(tensors)

  def names(self):
    return list(self._tensors)

  def shape(self, name):
    return tuple(self._tensors[name].shape)

  def read(self, name, index):
    return np.asarray(self._tensors[name][tuple(index)])


def read_hf_config(path) -> ModelConfig:
  path = epath.Path(path)
  cfg_path = path / "config.json"
  if not cfg_path.exists():
    raise FileNotFoundError(
        f"No config.json in {path}: expected a Hugging Face checkpoint directory with config.json "
        "and *.safetensors files.")
  return ModelConfig.from_hf_config(_read_json(cfg_path))


def _read_json(path) -> dict:
  try:
    data = json.loads(epath.Path(path).read_text())
  except (ValueError, RecursionError) as e:
    raise ValueError(f"{path} is not valid JSON ({e}); the checkpoint file is corrupt.") from None
  if not isinstance(data, dict):
    raise ValueError(f"{path} holds no JSON object; the checkpoint file is corrupt.")
  return data


def load_hf(path, mesh=None, dtype=jnp.float32, rules: shd.Rules = shd.TRAIN_RULES
            ) -> tuple[ModelConfig, transformer.Params]:
  """Loads a HF checkpoint directory into (config, params), sharded on `mesh` when given."""
  config = read_hf_config(path)
  return config, params_from_source(config, SafetensorsSource(path), mesh, rules, dtype)


# ----------------------------------------------------------------------------------- saving

def to_hf_tensors(config: ModelConfig, params: transformer.Params) -> dict[str, np.ndarray]:
  """Params → HF-named host arrays (multi-host arrays are gathered first)."""
  out = {}
  for path, (leaf, shape) in _leaf_table(config).items():
    arr = params[path[0]] if len(path) == 1 else params["layers"][path[1]]
    host = _to_host(arr)
    if path[0] == "layers" and _per_expert(leaf):
      for i in range(config.num_layers):
        for e in range(config.num_experts):
          out[f"model.layers.{i}.{leaf.hf_name.format(e=e)}"] = _to_hf_layout(leaf, host[i, e])
    elif path[0] == "layers":
      for i in range(config.num_layers):
        out[f"model.layers.{i}.{leaf.hf_name}"] = _to_hf_layout(leaf, host[i])
    else:
      out[leaf.hf_name] = _to_hf_layout(leaf, host)
  return out


def _to_host(arr) -> np.ndarray:
  if isinstance(arr, jax.Array) and not arr.is_fully_addressable:
    from jax.experimental import multihost_utils
    arr = multihost_utils.process_allgather(arr, tiled=True)
  return np.asarray(jax.device_get(arr))


def _to_hf_layout(leaf: _Leaf, ours: np.ndarray) -> np.ndarray:
  dims = [math.prod(ours.shape[d] for d in g) for g in leaf.groups]
  arr = ours.reshape(dims)
  return np.ascontiguousarray(arr.T if leaf.transpose else arr)


def save_hf(config: ModelConfig, params: transformer.Params, path, *, dtype=None,
            max_shard_bytes: int = 5 * 2**30) -> None:
  """Writes config.json + safetensors (sharded with an index when over `max_shard_bytes`)."""
  path = epath.Path(path)
  tensors = to_hf_tensors(config, params)
  if dtype is not None:
    tensors = {k: v.astype(dtype) for k, v in tensors.items()}
  if jax.process_index() != 0:
    return
  path.mkdir(parents=True, exist_ok=True)
  dtype_name = {np.dtype(np.float32): "float32", np.dtype(jnp.bfloat16): "bfloat16",
                np.dtype(np.float16): "float16"}.get(next(iter(tensors.values())).dtype, "float32")
  (path / "config.json").write_text(json.dumps(config.to_hf_config(dtype_name), indent=2))
  shards, current, size = [], {}, 0
  for name, arr in tensors.items():
    if current and size + arr.nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[name] = arr
    size += arr.nbytes
  shards.append(current)
  meta = {"format": "pt"}
  if len(shards) == 1:
    safetensors_io.save_file(shards[0], path / "model.safetensors", meta)
    return
  weight_map = {}
  for i, shard in enumerate(shards):
    fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
    safetensors_io.save_file(shard, path / fname, meta)
    weight_map.update({name: fname for name in shard})
  total = sum(a.nbytes for a in tensors.values())
  (path / "model.safetensors.index.json").write_text(
      json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))


HF_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads")  # what every supported config.json gives
HF_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim")  # absent or null: derived from the above


def check_hf_config(source: str) -> None:
  """The sizes in a local `hf:` checkpoint's config.json are positive integers (a head count of
  0, a null or negative width, a fractional one would otherwise fail deep in model building, or be
  truncated); a missing or unreadable file is left to the loader's own one-line error."""
  if not str(source).startswith("hf:") or "://" in source:
    return
  path = epath.Path(source[len("hf:"):]) / "config.json"
  try:
    hf = json.loads(path.read_text())
  except (OSError, ValueError, RecursionError):
    return
  if not isinstance(hf, dict):
    return
  for key in HF_SIZES + HF_OPTIONAL_SIZES:
    if key not in hf or (key in HF_OPTIONAL_SIZES and hf[key] is None):
      continue
    value = hf[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{path}: {key}={value!r} must be a positive integer; the checkpoint's "
                       "config.json is damaged, or not a supported model's.")
  heads = hf.get("num_attention_heads")
  if hf.get("head_dim") is None and isinstance(heads, int) and hf["hidden_size"] % heads:
    raise ValueError(f"{path}: hidden_size={hf['hidden_size']} is not a multiple of "
                     f"num_attention_heads={heads}, and no head_dim is given.")
