"""scope_jax: self-play reinforcement learning for language models, in JAX."""

__version__ = "0.1.0"
