"""The ranges of OpenSIR's own numeric settings (`Method.bounds`, matched before the shared rules
of `core/bounds.py`); every other field of `opensir.*` is a size, at least 1."""

from scope_jax.core.bounds import COUNT, NONNEGATIVE, POSITIVE, SHARE, SIZE, Rules

RULES: Rules = (
    ("opensir.*solve_rate_band", SHARE),  # its own and the starting pool's
    ("opensir.teacher_weights.*", NONNEGATIVE), ("opensir.selection_weights.*", NONNEGATIVE),
    ("opensir.student_format_weight", NONNEGATIVE),
    ("opensir.initial_pool.size", COUNT), ("opensir.initial_pool.min_chars", COUNT),
    ("opensir.length_baseline", POSITIVE), ("opensir.length_cap", POSITIVE),
    ("opensir.warmup.right_share", SHARE), ("opensir.warmup.guess_share", SHARE),
)
SECTION = SIZE  # the rest of `opensir.*`: units, groups, solutions, rounds, worked ways
