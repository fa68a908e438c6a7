"""`model` sections → (config, params): tied embeddings on request, one-line errors otherwise."""

import ml_collections
import pytest

from scope_jax import sharding as shd
from scope_jax.configs_base import DEMO_TINY_MODEL
from scope_jax.models import load

MESH = shd.make_mesh((1, -1, 1))


def _section(**kw):
  return ml_collections.ConfigDict(dict(source="tiny", tiny=dict(DEMO_TINY_MODEL, tie_embeddings=False),
                                        param_dtype="float32", tie_embeddings="auto") | kw)


def test_tie_embeddings_yes_ties_a_random_architecture():
  untied, params = load.load_model(_section(), MESH, 0)
  assert not untied.tie_embeddings and "lm_head" in params
  tied, params = load.load_model(_section(tie_embeddings="yes"), MESH, 0)
  assert tied.tie_embeddings and "lm_head" not in params
  assert tied.num_params() == untied.num_params() - untied.vocab_size * untied.hidden_size


def test_an_unknown_tie_choice_is_one_line():
  with pytest.raises(ValueError, match=r"model.tie_embeddings='maybe'; use 'auto'"):
    load.load_model(_section(tie_embeddings="maybe"), MESH, 0)
