"""Slice names as users write them → chips, torus shapes and libtpu's compile-only devices."""

import pytest

from scope_jax.plan import topology


@pytest.mark.parametrize("name, chips, slices, topo", [
    ("v5p-8", 4, 1, "v5p:2x2x1"), ("v4-8", 4, 1, "v4:2x2x1"), ("v5p-128", 64, 1, "v5p:4x4x4"),
    ("v5litepod-16", 16, 1, "v5e:4x4"), ("v5e-1", 1, 1, "v5e:1x1"), ("v6e-64", 64, 1, "v6e:8x8"),
    ("v6e-8", 8, 1, "v6e:2x4"), ("2xv5e-16", 16, 2, "v5e:4x4")])
def test_names_as_cloud_tpu_writes_them(name, chips, slices, topo):
  s = topology.parse(name)
  assert (s.chips, s.slices, s.topology_name) == (chips, slices, topo)


def test_torus_shapes_double_the_smallest_axis():
  assert [topology.torus_shape(n, 3) for n in (4, 8, 16, 32, 64, 128)] == [
      (2, 2, 1), (2, 2, 2), (2, 2, 4), (2, 4, 4), (4, 4, 4), (4, 4, 8)]
  assert [topology.torus_shape(n, 2) for n in (1, 4, 8, 16, 32, 256)] == [
      (1, 1), (2, 2), (2, 4), (4, 4), (4, 8), (16, 16)]


@pytest.mark.parametrize("name, message", [
    ("v7-8", "Unknown TPU topology 'v7-8'"), ("v5p-7", "count TensorCores"),
    ("v5e-2", "not a TPU slice shape"), ("v5p", "Unknown TPU topology")])
def test_bad_names_are_one_line(name, message):
  with pytest.raises(ValueError, match=message):
    topology.parse(name)


@pytest.mark.parametrize("name, kind", [("v5p-8", "TPU v5"), ("v5e-4", "TPU v5 lite"),
                                        ("2xv6e-8", "TPU v6 lite"), ("v4-8", "TPU v4")])
def test_compile_only_devices_come_from_libtpu(name, kind):
  s = topology.parse(name)
  devices = topology.devices(s)
  assert len(devices) == s.total_chips and devices[0].device_kind == kind
