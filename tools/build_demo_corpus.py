"""Re-samples the bundled demo corpus and rebuilds its cached MiniLM index.

    python tools/build_demo_corpus.py --rebuild_corpus --rebuild_index
"""

from absl import app, flags

from scope_jax import data
from scope_jax.retrieval import demo_corpus
from scope_jax.retrieval.service import load_encoder

_CORPUS = flags.DEFINE_bool("rebuild_corpus", False, "Re-sample the bundled corpus.")
_INDEX = flags.DEFINE_bool("rebuild_index", True, "Rebuild the cached demo index.")


def main(argv):
  del argv
  if _CORPUS.value:
    print(f"wrote {len(demo_corpus.build_demo_corpus())} passages to {data.CORPUS}")
  if _INDEX.value:
    index = demo_corpus.demo_index(load_encoder("minilm"), rebuild=True)
    print(f"demo index: {len(index.passages)} passages in {demo_corpus.demo_index_dir()}")


if __name__ == "__main__":
  app.run(main)
