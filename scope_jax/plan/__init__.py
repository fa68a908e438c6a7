"""`python -m scope_jax.plan`: a run's programs compiled ahead of time for a TPU slice that is not
there (libtpu's compile-only devices), with per-chip memory, fits or not, and roofline estimates."""
