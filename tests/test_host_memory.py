"""The host allocator setting: opt-out and bad values (the setting itself changes the process's
malloc, so it is applied here only where it is a no-op by request)."""

import pytest

from scope_jax import host_memory


def test_system_keeps_the_c_library_defaults():
  assert host_memory.reuse_freed_memory({"SCOPE_JAX_MALLOC": "system"}) is False


def test_unknown_setting_is_an_error_that_names_the_choices():
  with pytest.raises(ValueError, match="SCOPE_JAX_MALLOC='fast'.*'reuse'.*'system'"):
    host_memory.reuse_freed_memory({"SCOPE_JAX_MALLOC": "fast"})
