"""Build a dense index over a JSONL corpus, on one host or on every host of a pod.

    python -m scope_jax.retrieval.build_index --corpus=corpus.jsonl --encoder=minilm --out=index/
    python -m scope_jax.retrieval.build_index --corpus='gs://bucket/wiki-18/shard-*.jsonl' \
        --encoder=/ckpt/e5-base-v2 --query_prefix="query: " --passage_prefix="passage: " \
        --kind=ivf --out=gs://bucket/e5_ivf
    python launch/local.py --num_processes=2 --devices_per_process=4 -- \
        python -m scope_jax.retrieval.build_index --corpus='shards/*.jsonl' --out=/tmp/idx

`--encoder` is a checkpoint directory or the name of a fetched asset ('minilm'). `--corpus` is a
file, a glob or a comma-separated list of them. `--pipeline=stream` (the default wherever
tensorflow-text is installed and the encoder is a BERT checkpoint) streams the shard files through
tf.data: on a multi-process run each process embeds its share of the files on its own devices and
writes a part, and process 0 merges the parts into the index a single process would build
(`sharded_build`). `--pipeline=memory` tokenizes the whole corpus in one process instead. Both
resume an interrupted build from the chunks already written under --out.
"""

import os

import jax
from absl import app, flags

from scope_jax import distributed
from scope_jax import sharding as shd
from scope_jax.retrieval import corpus as corpus_lib
from scope_jax.retrieval import sharded_build
from scope_jax.retrieval.index import INDEX_KINDS, DenseIndex
from scope_jax.retrieval.service import load_encoder
from scope_jax.retrieval.sharded_build import choose_pipeline

_CORPUS = flags.DEFINE_string("corpus", None, "JSONL corpus ({id,title,text} or Search-R1 form): "
                              "a file, a glob or a comma-separated list of them.")
_ENCODER = flags.DEFINE_string("encoder", "minilm", "Encoder checkpoint dir or asset name.")
_OUT = flags.DEFINE_string("out", None, "Output directory for the index.")
_KIND = flags.DEFINE_enum("kind", "flat", INDEX_KINDS, "faiss index kind.")
_QP = flags.DEFINE_string("query_prefix", None, "Query prefix (E5: 'query: ').")
_PP = flags.DEFINE_string("passage_prefix", None, "Passage prefix (E5: 'passage: ').")
_CHUNK = flags.DEFINE_integer("chunk_size", 4096, "Passages per resumable embedding chunk.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Passages per device per encoder step.")
_PIPELINE = flags.DEFINE_enum("pipeline", "auto", ("auto", "stream", "memory"),
                              "stream: tf.data over the shard files, one part per process; "
                              "memory: the whole corpus in one process; auto: stream where "
                              "tensorflow-text is installed and the encoder is a BERT checkpoint.")
_FORMAT = flags.DEFINE_enum("format", "jsonl", ("jsonl", "tfrecord"),
                            "Shard file format (tfrecord: the streaming pipeline only).")


def load_passages(patterns: list[str]) -> list[corpus_lib.Passage]:
  """Every passage of the files the patterns match, in sorted file order (the streaming order)."""
  files = sorted({str(f) for p in patterns for f in _glob(p)})
  if not files:
    raise FileNotFoundError(f"No corpus file matches {patterns}.")
  return [p for f in files for p in corpus_lib.load_corpus(f)]


def _glob(pattern: str):
  from etils import epath
  if not any(c in pattern for c in "*?["):
    return [epath.Path(pattern)]
  path = epath.Path(pattern)
  return path.parent.glob(path.name)


def main(argv):
  del argv
  distributed.initialize(os.environ)  # multi-host: one process per host
  mesh = shd.make_mesh((-1, 1, 1), devices=jax.local_devices())  # this host's devices only
  encoder = load_encoder(_ENCODER.value, query_prefix=_QP.value, passage_prefix=_PP.value,
                         batch_size=_BATCH.value * mesh.devices.size, mesh=mesh)
  patterns = [p.strip() for p in _CORPUS.value.split(",") if p.strip()]
  pipeline = choose_pipeline(_PIPELINE.value, encoder, jax.process_count(), _FORMAT.value)
  if pipeline == "memory":
    index = DenseIndex.build(load_passages(patterns), encoder, _OUT.value, kind=_KIND.value,
                             chunk_size=_CHUNK.value)
  else:
    index = sharded_build.build(patterns, encoder, _OUT.value, kind=_KIND.value,
                                batch_size=_BATCH.value, chunk_size=_CHUNK.value,
                                file_format=_FORMAT.value)
  if index is not None:
    print(f"Indexed {len(index.passages)} passages ({index.kind}, dim {index.index.d}, "
          f"{pipeline} pipeline, {jax.process_count()} process"
          f"{'es' if jax.process_count() > 1 else ''}) → {_OUT.value}")


if __name__ == "__main__":
  flags.mark_flags_as_required(["corpus", "out"])
  app.run(main)
