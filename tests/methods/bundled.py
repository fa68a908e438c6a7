"""What every `learn` preset's bundled start must be: shipped with the package and shaped like
the demo model (so the demo tokenizer fits it), and started from as it is."""

import pathlib

import chex

from scope_jax.data import DEMO_MODEL
from scope_jax.models import hf_io

ROOT = pathlib.Path(__file__).resolve().parents[2]


def assert_learn_starts_from(config, model_dir: pathlib.Path) -> None:
  """`config` starts from `model_dir` with no warm-up on top; the model is a few MB, listed in
  setup.py's package data, and has the demo model's config and parameter shapes."""
  assert config.model.source == f"hf:{model_dir}" and config.warmup.steps == 0
  assert (model_dir / "model.safetensors").stat().st_size < 8 * 2**20
  assert f"data/bundled/{model_dir.name}/*" in (ROOT / "setup.py").read_text()
  shape, params = hf_io.load_hf(model_dir)
  demo_shape, demo_params = hf_io.load_hf(DEMO_MODEL)
  assert shape == demo_shape
  chex.assert_trees_all_equal_shapes(params, demo_params)
