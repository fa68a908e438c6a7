"""The ranges of SCOPE's own numeric settings (`Method.bounds`, matched before the shared rules
of `core/bounds.py`); every other field of `scope.*` is a size, at least 1."""

from scope_jax.core.bounds import COUNT, NONNEGATIVE, SHARE, SIZE, Rules

RULES: Rules = (
    ("scope.task_set.size", COUNT), ("scope.task_set.max_per_rubric", COUNT),
    ("scope.task_set.window", SHARE), ("scope.task_set.solver_sampling", NONNEGATIVE),
    ("scope.search_ratio", NONNEGATIVE), ("scope.search_choices", COUNT),
    ("scope.stage1_grader_temperature", NONNEGATIVE), ("scope.stage1_solver_sampling", NONNEGATIVE),
)
SECTION = SIZE  # the rest of `scope.*`: iterations, steps, batches, characters
