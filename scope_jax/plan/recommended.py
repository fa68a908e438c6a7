"""The TPU slice and mesh each paper preset is planned on (launch/README.md's table,
`tools/plan_presets.py`, and the slow test that every preset fits its slice)."""

# preset → (slice, mesh.shape): a slice each fits on with room for its KV cache.
SLICES = {
    "spell:paper": ("v5p-8", "(1,-1,1)"),
    "spell:paper_qwen3_moe": ("v5p-64", "(1,4,1,8)"),  # 8-way expert parallelism; a v5p-32 is
    # 0.2 GiB short
    "scope:paper": ("v5p-16", "(1,2,4)"),  # tensor 4: three sampler copies split four ways
    "scope:paper_qwen3": ("v5p-16", "(1,2,4)"),
    "scope:paper_olmo3": ("v5p-32", "(1,4,4)"),  # 32 KV heads: the cache needs 16 chips
    "opensir:paper": ("v5p-8", "(1,-1,1)"),
    "opensir:paper_gemma2": ("v5p-8", "(1,-1,1)"),
    "asl:paper": ("v5p-8", "(1,-1,1)"),
    "piplay:paper": ("v5p-8", "(1,2,2)"),
    "piplay:paper_instruct": ("v5p-8", "(1,2,2)"),
}

# With LoRA adapters (`--config.lora.rank=64`): preset → (slice, mesh.shape, overrides), the
# smallest slice each was planned to fit on (`tools/plan_presets.py --lora`). Every policy shares one
# frozen base, so the 7B presets move from v5p slices to a v6e-8; the KV cache, which adapters do
# not shrink, sets the rest.
LORA_RANK = 64
LORA_SLICES = {
    "spell:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "spell:paper_qwen3_moe": ("v5p-32", "(1,2,1,8)", {}),
    "scope:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "scope:paper_qwen3": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "scope:paper_olmo3": ("v5p-16", "(1,2,4)", {}),
    "opensir:paper": ("v5e-8", "(1,8,1)", {}),
    "opensir:paper_gemma2": ("v5e-8", "(1,8,1)", {}),
    "asl:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "piplay:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "piplay:paper_instruct": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
}
