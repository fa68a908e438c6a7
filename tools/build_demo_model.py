"""Builds the bundled demo model: the tiny demo model fitted once on every method's format
demonstrations, so each method's CPU demo starts from it without a warm-up of its own.

    python tools/build_demo_model.py    # from a checkout; writes data/bundled/demo_model

Every method's `demo` preset shares one warm-up setting (`scope_jax/configs_base.py: demo_warmup`); the
result records that setting's key and each method's demonstration digest (`warmup.json`), and a
run uses it only when both match (else it warms up on its own and caches the result).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import tempfile

from absl import app, flags, logging

from scope_jax import configs_base
from scope_jax.core import runner, warmup

ROOT = pathlib.Path(__file__).resolve().parents[1]
_METHODS = flags.DEFINE_list("methods", ["spell", "scope", "opensir", "asl", "piplay"],
                                  "Methods whose demonstrations to fit.")


def main(argv):
  del argv
  demos, digests, keys, first = [], {}, set(), None
  with tempfile.TemporaryDirectory() as tmp:
    for name in _METHODS.value:
      config = configs_base.load_file(ROOT / "configs" / f"{name}.py", "demo")
      config.progress = False
      rt, method = runner.build(config, f"{tmp}/{name}", warm_start=False)
      own = warmup.demonstrations(method, config)
      digests[name] = warmup.demos_digest(own)
      keys.add(warmup.settings_key(config, rt.model_config))
      demos += own
      first = first or rt
      logging.info("%s: %d demonstrations (digest %s)", name, len(own), digests[name])
  if len(keys) != 1:
    raise ValueError("The demo presets disagree on the model or warm-up settings; give them the "
                     "same scope_jax/configs_base.py demo_warmup and model.")
  params, seconds = warmup.fit(first, demos)
  out = warmup.BUNDLED
  if out.exists():
    shutil.rmtree(out)
  warmup.save(first.model_config, params, out)
  meta = {"settings": keys.pop(), "demos": digests, "demonstrations": len(demos),
          "steps": first.config.warmup.steps, "seconds": round(seconds, 1)}
  (out / "warmup.json").write_text(json.dumps(meta, indent=1) + "\n")
  print(f"wrote {out}: {meta}")


if __name__ == "__main__":
  app.run(main)
