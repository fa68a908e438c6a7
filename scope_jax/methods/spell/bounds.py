"""The ranges of SPELL's own numeric settings (`Method.bounds`, matched before the shared rules
of `core/bounds.py`); every other field of `spell.*` is a size, at least 1."""

from scope_jax.core.bounds import COUNT, NONNEGATIVE, SHARE, SIZE, Bound, Rules

RULES: Rules = (
    # The corpus its clusters are drawn from (the run's `data` section).
    ("data.max_cluster_size", COUNT), ("data.max_passages", COUNT), ("data.num_clusters", COUNT),
    ("data.cluster_size", COUNT), ("data.min_cluster_size", COUNT), ("data.*", SIZE),
    ("spell.verifier_agreement", Bound(0, 1, why="a share of verifier votes")),
    ("spell.questioner_negative_ratio", NONNEGATIVE), ("spell.history_size", COUNT),
    ("spell.verifier_update_ratio", SHARE), ("spell.generation_batch", COUNT),
    ("spell.warmup.right_share", SHARE),
)
SECTION = SIZE  # the rest of `spell.*`: questions, rounds, documents per question
