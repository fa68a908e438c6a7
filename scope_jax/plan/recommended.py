"""The TPU slice and mesh each paper preset is planned on (launch/README.md's table,
`tools/plan_presets.py`, and the slow test that every preset fits its slice)."""

from scope_jax.plan import topology

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
# smallest slice each was planned to fit on (`tools/plan_presets.py --lora`; docs/models.md).
# Every policy shares one frozen base, so the 7B presets move from v5p slices to a v6e-8; the KV
# cache, which adapters do not shrink, sets the rest.
LORA_RANK = 64
LORA_SLICES = {
    "spell:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "spell:paper_qwen3_moe": ("v5p-32", "(1,2,1,8)", {}),
    "scope:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "scope:paper_qwen3": ("v5p-8", "(1,2,2)", {}),  # on a v6e-8 its 18 GiB KV cache: 4.6 over
    "scope:paper_olmo3": ("v5p-16", "(1,2,4)", {}),
    "opensir:paper": ("v6e-8", "(1,8,1)", {}),  # a v5e-8 is 2.4 GiB short (its 7B embedder)
    "opensir:paper_gemma2": ("v6e-8", "(1,8,1)", {}),  # a smaller policy than opensir:paper's
    "asl:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    "piplay:paper": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
    # piplay:paper's programs (only λ and the prompt variant differ)
    "piplay:paper_instruct": ("v6e-8", "(1,2,4)", {"learner.micro_batch_rows": 2}),
}


def _resolved(shape, chips: int) -> tuple[int, ...]:
  """A mesh shape with its one -1 filled in for `chips` devices."""
  shape = tuple(int(x) for x in shape)
  known = 1
  for x in shape:
    known *= x if x > 0 else 1
  return tuple(x if x > 0 else chips // known for x in shape)


def mesh_advice(spec: str, target, shape, lora: bool) -> str | None:
  """A one-line note when `spec` is planned on the slice `target` (a `topology.Slice`) that
  launch/README.md (with LoRA: docs/models.md) names for it, but on another mesh than the one
  named there, whose figures the table shows; None otherwise."""
  table = LORA_SLICES if lora else SLICES
  if spec not in table:
    return None
  name, mesh = table[spec][:2]
  named = topology.parse(name)
  if (named.chip.generation, named.total_chips) != (target.chip.generation, target.total_chips):
    return None
  ours = _resolved(shape, target.total_chips)
  if ours == _resolved(mesh.strip("()").split(","), target.total_chips):
    return None
  where = "docs/models.md plans" if lora else "launch/README.md plans"
  extra = " with LoRA" if lora else ""
  return (f"Note: {where} {spec}{extra} on {name} with --config.mesh.shape='{mesh}'; "
          f"this plan uses {ours}.")
