"""scope_jax: self-play reinforcement learning for language models, in JAX."""

from scope_jax import platforms as _platforms

_platforms.exclude_absent_tpu()  # before JAX starts a backend: a CPU run never loads libtpu

__version__ = "0.1.0"
