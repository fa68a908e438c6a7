"""Build a dense index over a JSONL corpus.

    python -m scope_jax.retrieval.build_index --corpus=corpus.jsonl --encoder=minilm --out=index/
    python -m scope_jax.retrieval.build_index --corpus=wiki-18.jsonl --encoder=/ckpt/e5-base-v2 \
        --query_prefix="query: " --passage_prefix="passage: " --kind=ivf --out=gs://bucket/e5_ivf

`--encoder` is a checkpoint directory or the name of a fetched asset ('minilm'). Interrupted
builds resume from the embedding chunks already written under --out.
"""

from absl import app, flags

from scope_jax.retrieval import corpus as corpus_lib
from scope_jax.retrieval.index import INDEX_KINDS, DenseIndex
from scope_jax.retrieval.service import load_encoder

_CORPUS = flags.DEFINE_string("corpus", None, "JSONL corpus ({id,title,text} or Search-R1 form).")
_ENCODER = flags.DEFINE_string("encoder", "minilm", "Encoder checkpoint dir or asset name.")
_OUT = flags.DEFINE_string("out", None, "Output directory for the index.")
_KIND = flags.DEFINE_enum("kind", "flat", INDEX_KINDS, "faiss index kind.")
_QP = flags.DEFINE_string("query_prefix", None, "Query prefix (E5: 'query: ').")
_PP = flags.DEFINE_string("passage_prefix", None, "Passage prefix (E5: 'passage: ').")
_CHUNK = flags.DEFINE_integer("chunk_size", 4096, "Passages per resumable embedding chunk.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Encoder batch size.")


def main(argv):
  del argv
  encoder = load_encoder(_ENCODER.value, query_prefix=_QP.value, passage_prefix=_PP.value,
                         batch_size=_BATCH.value)
  passages = corpus_lib.load_corpus(_CORPUS.value)
  index = DenseIndex.build(passages, encoder, _OUT.value, kind=_KIND.value,
                           chunk_size=_CHUNK.value)
  print(f"Indexed {len(index.passages)} passages ({index.kind}, dim {index.index.d}) → {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["corpus", "out"])
  app.run(main)
