"""The tf.data pipeline: in-graph WordPiece ids equal the HF tokenizer's; embeddings equal ours."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorflow_text")

from scope_jax.retrieval import tf_pipeline  # noqa: E402
from scope_jax.retrieval.realdata import wiki_lead_passages  # noqa: E402
from tests.retrieval.test_encoder import minilm_dir  # noqa: E402


def test_wordpiece_ids_equal_hf_tokenizer_on_real_text():
  import tokenizers
  path = minilm_dir()
  hf = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
  hf.no_padding()
  hf.enable_truncation(64)
  texts = [p.text for p in wiki_lead_passages()[::50]]
  texts += ["Café Müller — naïve façade, 東京タワー and Zürich!", "tab\there\u200bzero-width",
            "A " * 100, "e.g. U.S.A.'s $5,000 (approx.)"]
  ids, mask = tf_pipeline.WordpieceTokenizer(path / "vocab.txt", max_length=64)(tf.constant(texts))
  ids, mask = ids.numpy(), mask.numpy()
  mismatches = []
  for i, text in enumerate(texts):
    ref = hf.encode(text).ids
    got = ids[i, :mask[i].sum()].tolist()
    if got != ref:
      mismatches.append((text[:60], got[:12], ref[:12]))
  assert not mismatches, mismatches[:3]


def test_stream_shards_per_host_and_matches_encoder(tmp_path, minilm):
  passages = wiki_lead_passages()[:10]
  for s in range(2):
    with open(tmp_path / f"shard-{s}.jsonl", "w") as f:
      for p in passages[s::2]:
        f.write(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n")
  vocab = minilm_dir() / "vocab.txt"
  got = {}
  for host in range(2):
    ds = tf_pipeline.passage_dataset([str(tmp_path / "shard-*.jsonl")], vocab, batch_size=4,
                                     max_length=256, process_index=host, process_count=2)
    seen = []
    for ids, vecs in tf_pipeline.embed_stream(ds, minilm):
      seen += ids
      got.update(zip(ids, vecs))
    assert set(seen) == {p.id for p in passages[host::2]}  # each host reads only its shard
  ref = minilm.encode([f"{p.title}. {p.text}" for p in passages])
  for p, r in zip(passages, ref):
    assert float(np.dot(got[p.id], r)) >= 0.99999
