"""Mesh construction and logical-axis sharding rules, declared as data.

One mesh with named axes ('data', 'fsdp', 'tensor', 'expert'; 'expert' is 1 unless a
mixture-of-experts run asks for it). Parameters carry logical axis names (`vocab`, `embed`,
`heads`, `kv_heads`, `head_dim`, `mlp`, `layers`, `norm`, `expert`, `router`); a rules table maps
each logical name to a mesh axis (or None = replicated). Training shards weights over fsdp and
tensor; sampling keeps weights whole along fsdp (`SAMPLING_RULES`) so decode does no gathers.
A dimension that a mesh axis does not divide is replicated instead (logged once), e.g. 2 kv heads
on tensor=4.

Activations carry logical names too (`activation_batch`, `activation_length`, `activation_embed`,
...; MaxText's convention), mapped by the same rules tables: a program traced inside
`activation_sharding(mesh, rules)` pins its activations with `constrain` (rows on the batch axes
at the embedding output and at every layer boundary), so GSPMD runs FSDP (weights gathered,
gradients reduce-scattered) instead of propagating the embedding's `embed` sharding into
tensor parallelism with the rows replicated. Outside that context `constrain` does nothing.

Multi-host: the mesh spans every process's devices. Host data is the same on every host, so a
batch becomes a global array from each process's own shards (`global_array`), and a global array
is read back on every host through `to_host`, which gathers the shards other hosts hold.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor", "expert")
Rules = Mapping[str, Any]  # logical name -> mesh axis name, tuple of names, or None

# Activations: rows over the batch axes, features whole except where a weight's tensor-parallel
# dimension splits them (heads, mlp, vocab). A config missing these keys gets these defaults.
# Rows split over 'expert' too: attention and the KV cache divide over the expert axis (the MoE
# layer's tokens are split over the same devices, `models/moe.py`); a size-1 axis is ignored.
ACTIVATION_RULES: Rules = {
    "activation_batch": ("data", "fsdp", "expert"), "activation_length": None,
    "activation_embed": None,
    "activation_heads": "tensor", "activation_kv_heads": "tensor", "activation_head_dim": None,
    "activation_mlp": "tensor", "activation_vocab": "tensor",
}
TRAIN_RULES: Rules = {
    "batch": ("data", "fsdp", "expert"), "vocab": "tensor", "embed": "fsdp", "heads": "tensor",
    "kv_heads": "tensor", "head_dim": None, "mlp": "tensor", "layers": None, "norm": None,
    "length": None, "cache": None, "expert": "expert", "router": None, **ACTIVATION_RULES,
}
SAMPLING_RULES: Rules = {**TRAIN_RULES, "embed": None}

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
  # Configs written before activations had rules: the defaults, rows where the batch goes.
  for name, target in {**ACTIVATION_RULES, "activation_batch": rules.get("batch")}.items():
    rules.setdefault(name, target)
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
      raise ValueError(f"Mesh {shape} does not divide the {describe_devices(devices)}.")
    shape[shape.index(-1)] = len(devices) // known
  if math.prod(shape) != len(devices):
    raise ValueError(f"Mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices, "
                     f"but {describe_devices(devices)} are available; make the product of "
                     "mesh.shape equal that count, or use -1 for one axis to take the rest.")
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # non-TPU topologies or uneven host layouts
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES)


def config_rules(config) -> tuple[Rules, Rules]:
  """(training rules, sampling rules) from a run config's `mesh.rules`."""
  return (rules_from_config(config.mesh.rules.train, what="mesh.rules.train"),
          rules_from_config(config.mesh.rules.sampling, what="mesh.rules.sampling"))


def describe_devices(devices: Sequence[jax.Device]) -> str:
  """'8 devices (2 processes × 4 devices)': the count a mesh must match, and where it comes from."""
  per_process: dict[int, int] = {}
  for d in devices:
    per_process[d.process_index] = per_process.get(d.process_index, 0) + 1
  text = f"{len(devices)} devices"
  if len(per_process) > 1:
    counts = sorted(set(per_process.values()))
    each = str(counts[0]) if len(counts) == 1 else "/".join(map(str, per_process.values()))
    text += f" ({len(per_process)} processes × {each} devices)"
  return text


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


# ------------------------------------------------------------------------ activation constraints

@dataclasses.dataclass(frozen=True)
class Activations:
  """Where a traced program's activations go: a mesh and its rules (hashable, so it can be a
  jitted function's static argument)."""
  mesh: Mesh
  rules: tuple[tuple[str, Any], ...]

  @property
  def rules_dict(self) -> dict[str, Any]:
    return dict(self.rules)


def activations(mesh: Mesh | None, rules: Rules = TRAIN_RULES) -> Activations | None:
  """`Activations` for `mesh` and `rules`; None without a mesh or on a single device."""
  if mesh is None or mesh.size == 1:
    return None
  rules = {**ACTIVATION_RULES, **rules}
  return Activations(mesh, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                        for k, v in rules.items())))


_ACTIVE: list[Activations | None] = []


@contextlib.contextmanager
def activation_sharding(mesh_or_activations: Mesh | Activations | None,
                        rules: Rules = TRAIN_RULES) -> Iterator[None]:
  """Within it, `constrain` pins activations to `mesh` under `rules`. Enter it inside the
  function being traced (the jitted step's own body, or from a static argument), so the trace
  and jit's cache agree on the layout."""
  act = mesh_or_activations
  if not isinstance(act, Activations):
    act = activations(act, rules)
  _ACTIVE.append(act)
  try:
    yield
  finally:
    _ACTIVE.pop()


def active() -> Activations | None:
  """The innermost `activation_sharding`'s mesh and rules, or None."""
  return _ACTIVE[-1] if _ACTIVE else None


def activation_spec(axes: Sequence[str | None], shape: Sequence[int]) -> NamedSharding | None:
  """The NamedSharding the active rules give an activation with logical `axes`, or None."""
  act = active()
  if act is None:
    return None
  if len(axes) != len(shape):
    raise ValueError(f"Logical axes {tuple(axes)} do not match an activation of shape "
                     f"{tuple(shape)}.")
  return NamedSharding(act.mesh, logical_to_spec(axes, shape, act.mesh, act.rules_dict))


def splits(axis: str, size: int) -> bool:
  """Whether the active rules split a `size`-long logical `axis` over any mesh axis (False
  without active rules, or where the axes it maps to do not divide `size`)."""
  sharding = activation_spec((axis,), (size,))
  return sharding is not None and sharding.spec[0] is not None


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
  """`with_sharding_constraint` of `x` to its logical `axes` under the active rules; `x` itself
  when no `activation_sharding` is active (single device, CPU tests, unsharded calls)."""
  sharding = activation_spec(axes, x.shape)
  return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


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


def batch_shards(mesh: Mesh | None, rules: Rules = TRAIN_RULES) -> int:
  """How many ways the rules split a batch's rows on `mesh` (the product of the mesh axes the
  logical axis 'batch' maps to): row counts are padded to a multiple of it."""
  if mesh is None:
    return 1
  target = rules.get("batch")
  names = (target,) if isinstance(target, str) else tuple(target or ())
  return math.prod(mesh.shape.get(a, 1) for a in names)


def shard_batch(x: Any, mesh: Mesh, rules: Rules = TRAIN_RULES) -> Any:
  """Places each [B, ...] array of a pytree with rows split over the rules' batch axes."""
  return jax.tree.map(lambda a: global_array(a, batch_sharding(mesh, np.shape(a), rules)), x)


def replicated(mesh: Mesh) -> NamedSharding:
  """Every device of `mesh` holds the whole array."""
  return NamedSharding(mesh, P())


def global_array(x: Any, sharding: jax.sharding.Sharding) -> jax.Array:
  """A global array from a host array that every process holds whole (the same on every host:
  host-side decisions are identical); each process places only the shards its devices hold.
  A global array is resharded; a local one (on this host's devices) goes through the host, as
  `device_put` cannot place a local array on another host's devices."""
  if isinstance(x, jax.Array):
    if not x.is_fully_addressable or sharding.is_fully_addressable:
      return jax.device_put(x, sharding)
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # a PRNG key: its raw data, wrapped again
      return jax.random.wrap_key_data(global_array(jax.random.key_data(x), sharding),
                                      impl=jax.random.key_impl(x))
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def to_host(x: Any) -> np.ndarray:
  """A global array read back whole on every host: shards held by other processes are gathered
  first (a collective: every process must call it), a local or replicated array is copied."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)
