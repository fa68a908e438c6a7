"""The multi-process setup read from the environment, and the helpers that place host data on a
mesh and read global arrays back (on the 8-device test platform; across real processes in
tests/test_multihost.py)."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from scope_jax import distributed
from scope_jax import sharding as shd

TRIO = {"JAX_COORDINATOR_ADDRESS": "10.0.0.2:1234", "JAX_NUM_PROCESSES": "4",
        "JAX_PROCESS_ID": "3"}


def test_explicit_environment_is_passed_as_is():
  assert distributed.init_args(TRIO) == {"coordinator_address": "10.0.0.2:1234",
                                         "num_processes": 4, "process_id": 3}
  assert distributed.init_args({**TRIO, "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}) is None
  assert distributed.init_args({}) is None


@pytest.mark.parametrize("env, message", [
    ({"JAX_NUM_PROCESSES": "2"}, "JAX_COORDINATOR_ADDRESS, JAX_PROCESS_ID missing"),
    ({**TRIO, "JAX_PROCESS_ID": "four"}, "must be integers"),
    ({**TRIO, "JAX_PROCESS_ID": "4"}, r"JAX_PROCESS_ID=4 must be in \[0, JAX_NUM_PROCESSES=4\)"),
    ({"SCOPE_JAX_DISTRIBUTED": "yes"}, "use 'auto'"),
])
def test_bad_environment_says_what_to_set(env, message):
  with pytest.raises(ValueError, match=message):
    distributed.init_args(env)


def test_cluster_detection_is_left_to_jax_when_asked_or_on_a_tpu_slice():
  assert distributed.init_args({"SCOPE_JAX_DISTRIBUTED": "auto"}) == {}
  two_hosts = {"TPU_WORKER_HOSTNAMES": "t1k-w-0,t1k-w-1"}
  assert distributed.init_args(two_hosts) == {}
  assert distributed.init_args({**two_hosts, "SCOPE_JAX_DISTRIBUTED": "off"}) is None
  assert distributed.init_args({"TPU_WORKER_HOSTNAMES": "localhost"}) is None
  assert distributed.init_args({**TRIO, "SCOPE_JAX_DISTRIBUTED": "auto"})["process_id"] == 3


def test_single_process_helpers_are_identities():
  assert distributed.is_primary()
  assert distributed.broadcast_int(7) == 7 and distributed.on_every_host(True)
  distributed.check_agree("anything", {"a": [1, 2]})
  distributed.barrier("nothing to wait for")
  assert distributed.digest({"b": 1, "a": 2}) == distributed.digest({"a": 2, "b": 1})
  assert distributed.digest({"a": 1}) != distributed.digest({"a": 2})


@dataclasses.dataclass
class _FakeDevice:
  process_index: int


def test_device_count_names_the_processes():
  assert shd.describe_devices([_FakeDevice(0)] * 8) == "8 devices"
  devices = [_FakeDevice(0)] * 4 + [_FakeDevice(1)] * 4
  assert shd.describe_devices(devices) == "8 devices (2 processes × 4 devices)"
  with pytest.raises(ValueError, match=r"needs 3 devices, but 8 devices are available"):
    shd.make_mesh((1, 3, 1))


def test_global_array_and_to_host_round_trip():
  mesh = shd.make_mesh((2, 2, 2))
  x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
  placed = shd.global_array(x, shd.batch_sharding(mesh, x.shape))
  assert placed.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None)
  chex.assert_trees_all_equal(shd.to_host(placed), x)
  batch = shd.shard_batch({"a": x, "b": x[:, 0].astype(np.int32)}, mesh)
  chex.assert_trees_all_equal(shd.to_host(batch["b"]), x[:, 0].astype(np.int32))
  key = shd.global_array(jax.random.key(5), shd.replicated(mesh))  # a local key, replicated
  assert key.sharding == shd.replicated(mesh)
  chex.assert_trees_all_equal(jax.random.key_data(key), jax.random.key_data(jax.random.key(5)))
  again = shd.global_array(placed, shd.replicated(mesh))  # a global array is resharded
  chex.assert_trees_all_equal(shd.to_host(again), x)
