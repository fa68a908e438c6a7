"""The five self-play methods, one package each (`algorithm.py` reads like the paper's Algorithm 1;
`rewards.py`, `prompts.py`, `demos.py` and `bounds.py` beside it). No method imports another; what
they share lives in `scope_jax.core` and `scope_jax.rollout`. The runner finds a method by its
name, one of `NAMES` (`core.runner.METHODS`)."""

NAMES = ("spell", "scope", "opensir", "asl", "piplay")
