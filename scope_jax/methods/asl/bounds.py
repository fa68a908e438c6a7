"""The ranges of ASL's own numeric settings (`Method.bounds`, matched before the shared rules of
`core/bounds.py`); every other field of `asl.*` is a size, at least 1."""

from scope_jax.core.bounds import COUNT, NONNEGATIVE, SHARE, SIZE, Bound, Rules

RULES: Rules = (
    ("asl.slope_ema", Bound(0, 1, why="an EMA weight in [0, 1]")),
    ("asl.slope_threshold", NONNEGATIVE), ("asl.validity_threshold", SHARE),
    ("asl.verification_share", SHARE), ("asl.verification_from_iteration", COUNT),
    ("asl.slope_window", Bound(2, integer=True, why="a slope needs a window of 2 steps or more")),
    ("asl.plateau_window.*", Bound(4, integer=True, why="halves and quarters of it are compared")),
    ("asl.plateau_tolerance", NONNEGATIVE),
)
SECTION = SIZE  # the rest of `asl.*`: batches, phase steps, store sizes
