"""Untrained vocabulary rows (a released checkpoint's fill vector) found exactly, and seeded from
their spelling's rows before a warm-up; trained rows never move."""

import types

import chex
import jax.numpy as jnp
import numpy as np

from scope_jax.core import vocab_rows
from scope_jax.tokenizer import encode_plain, load_tokenizer


def _table(V: int, fill_rows, seed: int = 0) -> np.ndarray:
  E_VD = np.random.default_rng(seed).normal(size=(V, 8)).astype(np.float32)
  E_VD[list(fill_rows)] = np.linspace(-0.1, 0.1, 8, dtype=np.float32)  # one shared fill vector
  return E_VD


def test_a_row_with_at_least_eight_copies_is_untrained():
  E_VD = _table(40, range(20, 29))  # 9 equal rows: each equals 8 others
  chex.assert_equal(vocab_rows.untrained(E_VD, [0, 19, 20, 24, 28, 29]), [20, 24, 28])
  E_VD = _table(40, range(20, 28))  # 8 equal rows: each equals only 7 others
  chex.assert_equal(vocab_rows.untrained(E_VD, range(40)), [])


def test_a_quantised_copy_is_a_copy_and_a_trained_row_of_the_same_norm_is_not():
  E_VD = _table(40, range(20, 30))
  E_VD[25] *= 1 + 1e-6  # rounded differently: still the fill (cosine 1, norm within 1e-6)
  E_VD[26, 0] += 1e-5
  rng = np.random.default_rng(3)
  for i in range(10):  # trained rows of the fill's norm in other directions
    v = rng.normal(size=8).astype(np.float32)
    E_VD[i] = v / np.linalg.norm(v) * np.linalg.norm(E_VD[20])
  chex.assert_equal(vocab_rows.untrained(E_VD, range(40)), list(range(20, 30)))
  E_VD[26, 0] += 0.05  # a row that moved in training
  chex.assert_equal(vocab_rows.untrained(E_VD, [26]), [])


def _tokenizer_with_a_tag():
  tok = load_tokenizer("demo")
  tok._tok.add_tokens(["<tool_call>"])  # an added, non-special token, as in Qwen's vocabulary
  tag = tok.encode("<tool_call>")
  assert len(tag) == 1 and tag[0] >= 2048, tag
  return tok, tag[0]


def test_spelling_is_the_plain_text_of_the_token():
  tok, tag = _tokenizer_with_a_tag()
  spelled = vocab_rows.spelling(tok, tag)
  chex.assert_equal(spelled, encode_plain(tok, "<") + encode_plain(tok, "tool_call>"))
  assert tag not in spelled and len(spelled) > 1
  chex.assert_equal(tok.decode(spelled), "<tool_call>")


def test_untrained_rows_start_from_their_spelling_and_nothing_else_moves():
  tok, tag = _tokenizer_with_a_tag()
  V = tag + 12  # the tag and 11 padding rows share the fill vector
  E_VD, H_VD = _table(V, range(tag, V)), _table(V, range(tag, V), seed=1)
  spelled = vocab_rows.spelling(tok, tag)
  ids = [3, 17, tag] + spelled
  for tied in (False, True):
    params = {"embed": jnp.asarray(E_VD)}
    if not tied:
      params["lm_head"] = jnp.asarray(H_VD)
    config = types.SimpleNamespace(tie_embeddings=tied)
    out, seeded = vocab_rows.seed_untrained(params, config, tok, ids)
    chex.assert_equal(seeded, [tag])
    want_E = E_VD.copy()
    want_E[tag] = E_VD[spelled].mean(0)
    chex.assert_trees_all_close(np.asarray(out["embed"]), want_E, atol=0, rtol=0)
    if not tied:
      want_H = H_VD.copy()
      want_H[tag] = H_VD[spelled].mean(0)
      chex.assert_trees_all_close(np.asarray(out["lm_head"]), want_H, atol=0, rtol=0)
    assert "lm_head" not in out or not tied
  params = {"embed": jnp.asarray(E_VD)}
  config = types.SimpleNamespace(tie_embeddings=True)
  same, seeded = vocab_rows.seed_untrained(params, config, tok, [3, 17] + spelled)
  assert same is params and seeded == []  # no untrained row demonstrated: nothing changes
