import scope_jax  # noqa: F401  (first: no TPU runtime on a machine without a TPU)
