"""Supervised warm-up: demonstration masks, chunked vs full NLL, and that fitting memorises."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.models import tiny_config, transformer
from scope_jax.rl import sft
from tests.rollout.fakes import CharTokenizer


def test_demonstration_masks_only_generated_pieces():
  tok = CharTokenizer()
  d = sft.demonstration([1, 2, 3], [("generated", "ab"), ("observation", [9, 9]),
                                    ("generated", "c")], tok)
  chex.assert_trees_all_equal(np.asarray(d.tokens).astype(np.int64),
                              np.array([1, 2, 3, 97, 98, 9, 9, 99]))
  chex.assert_trees_all_equal(np.asarray(d.loss_mask).astype(np.int64),
                              np.array([0, 0, 0, 1, 1, 0, 0, 1]))
  assert [s.kind for s in d.spans] == ["prompt", "generated", "observation", "generated"]
  with pytest.raises(ValueError, match="Unknown piece kind"):
    sft.demonstration([1], [("tool", "x")], tok)


def test_cut_keeps_each_demonstrations_opening_and_drops_one_with_nothing_trained():
  tok = CharTokenizer()
  d = sft.demonstration([1, 2, 3], [("generated", "ab"), ("observation", [9, 9]),
                                    ("generated", "c")], tok)
  long_prompt = sft.demonstration([1] * 6, [("generated", "xy")], tok)
  assert sft.cut([d, long_prompt], 0) == [d, long_prompt]  # 0: whole demonstrations
  kept = sft.cut([d, long_prompt], 6)
  assert len(kept) == 1  # the long prompt's 6 tokens hold no trained token
  chex.assert_trees_all_equal(np.asarray(kept[0].tokens).astype(np.int64),
                              np.array([1, 2, 3, 97, 98, 9]))
  chex.assert_trees_all_equal(np.asarray(kept[0].loss_mask).astype(np.int64),
                              np.array([0, 0, 0, 1, 1, 0]))
  assert [(s.kind, s.start, s.end) for s in kept[0].spans] == [
      ("prompt", 0, 3), ("generated", 3, 5), ("observation", 5, 6)]
  assert len(d.tokens) == 8  # the input is not changed


def _setup(vocab=256):
  config = tiny_config("qwen2", vocab_size=vocab)
  mesh = shd.make_mesh((1, -1, 1))
  params = transformer.init_sharded_params(config, jax.random.key(0), mesh)
  return config, mesh, params


def test_chunked_and_full_nll_agree():
  config, _, params = _setup()
  tok = CharTokenizer()
  demos = [sft.demonstration([5] * n, [("generated", "hello world"[:n + 3])], tok) for n in (4, 7)]
  batch = jax.tree.map(jnp.asarray, sft.pack(demos, 32))
  full = sft.nll_loss(config, params, batch, dtype=jnp.float32, chunk=0)
  chunked = sft.nll_loss(config, params, batch, dtype=jnp.float32, chunk=8)
  # by hand: mean −log softmax(logits)[next token] over the generated tokens
  logits, _ = transformer.forward(config, params, batch.tokens, attention_mask=batch.mask)
  x = np.asarray(logits, np.float64)
  x = x - x.max(-1, keepdims=True)
  logp = x - np.log(np.exp(x).sum(-1, keepdims=True))
  m = np.asarray(batch.loss_mask)[:, 1:]
  nll = -(np.take_along_axis(logp[:, :-1], np.asarray(batch.tokens)[:, 1:, None], -1)[..., 0] * m)
  chex.assert_trees_all_close(float(full), float(nll.sum() / m.sum()), rtol=1e-5, atol=0)
  chex.assert_trees_all_close(float(chunked), float(full), rtol=1e-5, atol=0)


def test_fit_memorises_a_demonstration():
  config, mesh, params = _setup()
  tok = CharTokenizer()
  demos = [sft.demonstration([7, 8, 9], [("generated", "<search>x</search>")], tok)] * 4
  params, losses = sft.fit(config, params, demos, steps=40, lr=1e-2, batch_rows=2, mesh=mesh)
  assert losses[-1] < 0.1 * losses[0]
