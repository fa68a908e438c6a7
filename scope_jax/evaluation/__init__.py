"""Checkpoint evaluation: benchmark loading and scoring (`python -m scope_jax.evaluate`)."""
