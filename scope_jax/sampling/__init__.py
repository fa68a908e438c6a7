"""Batched sampling with exact per-token log-probs, stop strings and forked samples."""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp

from scope_jax.sampling.engine import Completion, Engine, Request
from scope_jax.sampling.sampler import (FINISH_REASONS, Sampler, SampleResult, SamplingSpec,
                                        compile_counts, select_tokens,
                                        truncate_logits)


def decode_fn(tokenizer):
  """A `tokens -> text` function from a Hugging Face tokenizer (special tokens kept)."""
  if tokenizer is None:
    return None
  return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False)


def generate(config, params, prompts: Sequence[Sequence[int]], *, max_new_tokens: int,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             stop: Sequence[str] = (), seed: int = 0, tokenizer=None, num_samples: int = 1,
             dtype=jnp.float32, mesh=None) -> list[SampleResult]:
  """Samples completions of token-id prompts; one result per prompt (× num_samples).

  Each result has `.tokens`, `.logprobs` (float32, log softmax(logits / T) of the full
  vocabulary), `.finish_reason` ('eos', 'stop' or 'length') and `.text` when a tokenizer is given.
  """
  sampler = Sampler(config, params, dtype=dtype, mesh=mesh, decode=decode_fn(tokenizer))
  return sampler.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                          top_p=top_p, top_k=top_k, stop=stop, num_samples=num_samples, seed=seed)


__all__ = ["Completion", "Engine", "FINISH_REASONS", "Request", "Sampler", "SampleResult", "SamplingSpec", "compile_counts",
           "decode_fn", "generate", "select_tokens", "truncate_logits"]
