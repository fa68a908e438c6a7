"""Serve a dense index over HTTP with the Search-R1 API.

    python -m scope_jax.retrieval.server --index=runs/demo_index --encoder=minilm --port=8000

Binds 127.0.0.1 by default; pass --host=0.0.0.0 deliberately to expose it.
"""

from absl import app, flags, logging

from scope_jax.retrieval.index import DenseIndex, SearchTool
from scope_jax.retrieval.service import load_encoder, make_server

_INDEX = flags.DEFINE_string("index", None, "Index directory (from build_index).")
_ENCODER = flags.DEFINE_string("encoder", "minilm", "Encoder checkpoint dir or asset name.")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Bind address (loopback unless told otherwise).")
_PORT = flags.DEFINE_integer("port", 8000, "Port.")
_TOPK = flags.DEFINE_integer("topk", 3, "Default top-k.")


def main(argv):
  del argv
  encoder = load_encoder(_ENCODER.value)
  index = DenseIndex.load(_INDEX.value, encoder.identity)
  server = make_server(SearchTool(index, encoder, _TOPK.value), _HOST.value, _PORT.value)
  logging.info("Serving %d passages on http://%s:%d/retrieve", len(index.passages), _HOST.value,
               _PORT.value)
  server.serve_forever()


if __name__ == "__main__":
  flags.mark_flags_as_required(["index"])
  app.run(main)
