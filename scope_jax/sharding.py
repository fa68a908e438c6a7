"""Mesh construction and logical-axis sharding rules, declared as data.

One mesh with named axes ('data', 'fsdp', 'tensor', 'expert'; 'expert' is 1 unless a
mixture-of-experts run asks for it). Parameters carry logical axis names (`vocab`, `embed`,
`heads`, `kv_heads`, `head_dim`, `mlp`, `layers`, `norm`, `expert`, `router`); a rules table maps
each logical name to a mesh axis (or None = replicated). Training shards weights over fsdp and
tensor; sampling keeps weights whole along fsdp (`SAMPLING_RULES`) so decode does no gathers.
A dimension that a mesh axis does not divide is replicated instead (logged once), e.g. 2 kv heads
on tensor=4.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor", "expert")
Rules = Mapping[str, Any]  # logical name -> mesh axis name, tuple of names, or None

TRAIN_RULES: Rules = {
    "batch": ("data", "fsdp"), "vocab": "tensor", "embed": "fsdp", "heads": "tensor",
    "kv_heads": "tensor", "head_dim": None, "mlp": "tensor", "layers": None, "norm": None,
    "length": None, "cache": None, "expert": "expert", "router": None,
}
SAMPLING_RULES: Rules = {**TRAIN_RULES, "embed": None, "batch": ("data", "fsdp")}

_warned: set[tuple] = set()


def rules_to_config(rules: Rules) -> dict[str, str]:
  """Rules as flat strings for a config: a mesh axis, 'data,fsdp' for several, '' for none."""
  return {name: ",".join((target,) if isinstance(target, str) else tuple(target or ()))
          for name, target in rules.items()}


def rules_from_config(values: Mapping[str, Any], *, what: str = "mesh.rules") -> Rules:
  """Parses `rules_to_config`'s strings back into rules, refusing mesh axes the mesh lacks."""
  rules: dict[str, Any] = {}
  for name, value in values.items():
    if value is None or isinstance(value, str):
      axes = tuple(a.strip() for a in (value or "").split(",") if a.strip())
    else:  # already a tuple of axis names
      axes = tuple(value)
    unknown = [a for a in axes if a not in MESH_AXES]
    if unknown:
      raise ValueError(f"{what}.{name}={value!r} names mesh axes {unknown} that the mesh lacks; "
                       f"use any of {', '.join(MESH_AXES)} (comma-separated), or '' to replicate.")
    rules[name] = axes[0] if len(axes) == 1 else (axes or None)
  missing = sorted(set(TRAIN_RULES) - set(rules))
  if missing:
    raise ValueError(f"{what} has no rule for logical axes {missing}.")
  return rules


def make_mesh(shape: Sequence[int] | Mapping[str, int] = (1, -1, 1),
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor', 'expert') mesh from 3 entries (expert = 1) or 4; one entry may
  be -1 for "all remaining devices"."""
  if isinstance(shape, Mapping):
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
      raise ValueError(f"Unknown mesh axes {sorted(unknown)}; valid: {', '.join(MESH_AXES)}.")
    shape = [shape.get(a, 1) for a in MESH_AXES]
  shape = list(shape)
  if len(shape) == 3:
    shape.append(1)
  if len(shape) != 4:
    raise ValueError(f"Mesh shape must have 3 entries for (data, fsdp, tensor) or 4 for "
                     f"{MESH_AXES}, got {shape}.")
  devices = list(devices if devices is not None else jax.devices())
  if shape.count(-1) > 1:
    raise ValueError(f"At most one mesh axis may be -1, got {shape}.")
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if len(devices) % known:
      raise ValueError(f"Mesh {shape} does not divide {len(devices)} devices.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"Mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices, "
                     f"but {len(devices)} are available; use -1 for one axis to take the rest.")
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # non-TPU topologies or uneven host layouts
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int] | None, mesh: Mesh,
                    rules: Rules) -> P:
  """PartitionSpec for an array with logical `axes`, replicating dims a mesh axis cannot divide."""
  spec, used = [], set()
  for i, name in enumerate(axes):
    target = rules.get(name) if name is not None else None
    if name is not None and name not in rules:
      raise KeyError(f"Logical axis {name!r} has no sharding rule; known: {sorted(rules)}.")
    names = (target,) if isinstance(target, str) else tuple(target or ())
    names = tuple(a for a in names if mesh.shape.get(a, 1) > 1 and a not in used)
    if names and shape is not None:
      size = math.prod(mesh.shape[a] for a in names)
      if shape[i] % size:
        key = (name, shape[i], names)
        if key not in _warned:
          _warned.add(key)
          logging.info("Replicating logical axis %r (size %d): mesh axes %s (size %d) do not "
                       "divide it.", name, shape[i], names, size)
        names = ()
    used.update(names)
    spec.append(names[0] if len(names) == 1 else (names or None))
  return P(*spec)


def tree_shardings(logical_tree: Any, shape_tree: Any, mesh: Mesh, rules: Rules) -> Any:
  """NamedShardings for a pytree, from matching trees of logical axes and shapes."""
  is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)
  return jax.tree.map(
      lambda axes, s: NamedSharding(mesh, logical_to_spec(axes, _shape(s), mesh, rules)),
      logical_tree, shape_tree, is_leaf=is_axes)


def _shape(x) -> tuple[int, ...]:
  return tuple(x.shape) if hasattr(x, "shape") else tuple(x)


def batch_sharding(mesh: Mesh, shape: Sequence[int], rules: Rules = TRAIN_RULES) -> NamedSharding:
  """Sharding of a [B, ...] batch: rows over the batch axes (if they divide B), rest replicated."""
  axes = ("batch",) + (None,) * (len(shape) - 1)
  return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def shard_batch(x: Any, mesh: Mesh, rules: Rules = TRAIN_RULES) -> Any:
  """Places each [B, ...] array of a pytree with rows split over ('data', 'fsdp')."""
  return jax.tree.map(lambda a: jax.device_put(a, batch_sharding(mesh, np.shape(a), rules)), x)
