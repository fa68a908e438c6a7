"""The ranges of π-Play's own numeric settings (`Method.bounds`, matched before the shared rules
of `core/bounds.py`); every other field of `piplay.*` is a size, at least 1."""

from scope_jax.core.bounds import COUNT, NONNEGATIVE, SHARE, SIZE, Bound, Rules

RULES: Rules = (
    ("piplay.teacher_eval_samples", COUNT), ("piplay.data.size", COUNT),
    ("piplay.lambdas", Bound(0, why="distillation weights, none negative")),
    ("piplay.tau", Bound(0, 1, open_low=True, why="the EMA teacher's rate, in (0, 1]")),
    ("piplay.hop_ratio", NONNEGATIVE),
    ("piplay.warmup.right_share", SHARE),
)
SECTION = SIZE  # the rest of `piplay.*`: iterations, steps, batches, attempts, rounds
