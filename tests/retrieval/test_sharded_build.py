"""Index building over shard files: two local processes (one part each, merged by process 0)
build the index one process builds: the same passages in the same order, the same vectors, the
same search results. Parts resume, and a part built under other settings is refused."""

import json
import os
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest

from scope_jax import sharding as shd
from scope_jax.retrieval import sharded_build, tf_pipeline
from scope_jax.retrieval.corpus import load_corpus
from scope_jax.retrieval.encoder import TextEncoder
from scope_jax.retrieval.index import DenseIndex

needs_tf = pytest.mark.skipif(not sharded_build.has_tensorflow_text(),
                              reason="the streaming pipeline needs the 'tf' extra "
                                     "(pip install 'scope_jax[tf]')")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORDS = ("ankara paris berlin capital river mountain city museum bridge tower king queen war "
         "peace music art science river's old new north south east west lake forest").split()
SHARD_SIZES = (9, 4, 6, 1, 5)  # chunk_size 4: full, short and empty last chunks
CHUNK, BATCH = 4, 2


def tiny_bert(path):
  """A random 2-layer BERT checkpoint over a small WordPiece vocabulary."""
  import safetensors.numpy
  import tokenizers
  path.mkdir()
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "'", "s"]
  vocab += WORDS + [chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab += ["##" + chr(c) for c in range(ord("a"), ord("z") + 1)]
  vocab = list(dict.fromkeys(vocab))
  (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
  tokenizers.BertWordPieceTokenizer(str(path / "vocab.txt"), lowercase=True).save(
      str(path / "tokenizer.json"))
  v, d, f, layers, positions = len(vocab), 32, 64, 2, 64
  (path / "config.json").write_text(json.dumps({
      "model_type": "bert", "vocab_size": v, "hidden_size": d, "intermediate_size": f,
      "num_hidden_layers": layers, "num_attention_heads": 4, "max_position_embeddings": positions,
      "type_vocab_size": 2, "hidden_act": "gelu"}))
  rng = np.random.default_rng(0)
  shapes = {"embeddings.word_embeddings.weight": (v, d),
            "embeddings.position_embeddings.weight": (positions, d),
            "embeddings.token_type_embeddings.weight": (2, d),
            "embeddings.LayerNorm.weight": (d,), "embeddings.LayerNorm.bias": (d,)}
  for i in range(layers):
    pre = f"encoder.layer.{i}."
    for name in ("query", "key", "value"):
      shapes |= {pre + f"attention.self.{name}.weight": (d, d),
                 pre + f"attention.self.{name}.bias": (d,)}
    shapes |= {pre + "attention.output.dense.weight": (d, d),
               pre + "attention.output.dense.bias": (d,),
               pre + "attention.output.LayerNorm.weight": (d,),
               pre + "attention.output.LayerNorm.bias": (d,),
               pre + "intermediate.dense.weight": (f, d), pre + "intermediate.dense.bias": (f,),
               pre + "output.dense.weight": (d, f), pre + "output.dense.bias": (d,),
               pre + "output.LayerNorm.weight": (d,), pre + "output.LayerNorm.bias": (d,)}
  tensors = {k: (1.0 if k.endswith("LayerNorm.weight") else 0.0)
             + 0.2 * rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
  safetensors.numpy.save_file({k: np.asarray(t, np.float32) for k, t in tensors.items()},
                              str(path / "model.safetensors"))
  return path


def write_shards(directory):
  """Shard files of random passages; shard 1 in Search-R1's {id, contents} form."""
  rng = np.random.default_rng(1)
  directory.mkdir()
  n = 0
  for s, size in enumerate(SHARD_SIZES):
    with open(directory / f"shard-{s:02d}.jsonl", "w") as f:
      for _ in range(size):
        title = " ".join(rng.choice(WORDS, rng.integers(1, 3))).title()
        text = " ".join(rng.choice(WORDS, rng.integers(3, 40))) + "."
        rec = ({"id": f"p{n}", "contents": f'"{title}"\n{text}'} if s == 1
               else {"id": f"p{n}", "title": title, "text": text})
        f.write(json.dumps(rec) + "\n")
        n += 1
  return str(directory / "shard-*.jsonl")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("sharded")
  return tiny_bert(root / "bert"), write_shards(root / "shards"), root


def launch(processes, devices, encoder_dir, corpus, out) -> subprocess.Popen:
  """`build_index` as `processes` local processes of `devices` CPU devices each."""
  command = [sys.executable, os.path.join(ROOT, "launch", "local.py"),
             f"--num_processes={processes}", f"--devices_per_process={devices}", "--",
             sys.executable, "-m", "scope_jax.retrieval.build_index", f"--corpus={corpus}",
             f"--encoder={encoder_dir}", f"--out={out}", f"--batch_size={BATCH}",
             f"--chunk_size={CHUNK}", "--pipeline=stream"]
  return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=ROOT)


def finish(proc: subprocess.Popen) -> str:
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0, out[-4000:]
  return out


def vectors(index: DenseIndex) -> np.ndarray:
  return index.index.reconstruct_n(0, index.index.ntotal)


@needs_tf
def test_two_processes_build_the_single_process_index(setup):
  """One process on 2 devices and two processes on 1 device each (gloo, a coordinator)."""
  encoder_dir, corpus, root = setup
  runs = [launch(1, 2, encoder_dir, corpus, root / "one"),
          launch(2, 1, encoder_dir, corpus, root / "two")]
  one, two = [finish(r) for r in runs]
  assert "Indexed 25 passages (flat, dim 32, stream pipeline, 1 process)" in one
  assert "Indexed 25 passages (flat, dim 32, stream pipeline, 2 processes)" in two
  encoder = TextEncoder(encoder_dir)
  single = DenseIndex.load(root / "one", encoder.identity)
  multi = DenseIndex.load(root / "two", encoder.identity)
  files = sorted((root / "shards").glob("shard-*.jsonl"))
  expected = [p for f in files for p in load_corpus(f)]  # sorted file order, file order within
  assert single.passages == expected and multi.passages == expected
  chex.assert_trees_all_equal(vectors(multi), vectors(single))
  chex.assert_shape(vectors(single), (sum(SHARD_SIZES), 32))
  # The vectors are the encoder's (the HF tokenizer and length buckets give the same ids).
  texts = [f"{p.title}. {p.text}" if p.title else p.text for p in expected]
  chex.assert_trees_all_close(vectors(single), encoder.encode(texts), atol=2e-6, rtol=0)
  queries = encoder.encode(["capital city river", "old museum", "king queen war peace"], "query")
  chex.assert_trees_all_equal(multi.search(queries, 5), single.search(queries, 5))
  # Each process embedded only its round-robin share of the files.
  for p in range(2):
    part = sharded_build.part_dir(root / "two", p, 2)
    manifest = json.loads((part / "manifest.json").read_text())
    assert [i for i, _ in manifest["files"]] == list(range(p, len(files), 2))
    assert manifest["complete"] and dict(manifest["counts"]) == {
        i: SHARD_SIZES[i] for i in range(p, len(files), 2)}


@needs_tf
def test_parts_resume_merge_and_refuse_other_settings(setup, tmp_path, monkeypatch):
  encoder_dir, corpus, _ = setup
  mesh = shd.make_mesh((-1, 1, 1), devices=jax.local_devices()[:2])
  encoder = TextEncoder(encoder_dir, mesh=mesh)
  files = tf_pipeline.host_files([corpus], 0, 1)
  out = tmp_path / "idx"
  sharded_build.build_part(files, 1, 2, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
  with pytest.raises(FileNotFoundError, match="part-00000-of-00002 is missing: process 0"):
    sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK)
  # Part 0 stops after one chunk of its first file; the rerun embeds only what is left.
  part0 = sharded_build.part_dir(out, 0, 2)
  real = tf_pipeline.embed_passages
  embedded = []

  def counting(dataset, enc):
    for passages, vecs in real(dataset, enc):
      embedded.extend(p.id for p in passages)
      yield passages, vecs
  monkeypatch.setattr(tf_pipeline, "embed_passages", counting)
  sharded_build.build_part(files, 0, 2, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
  assert len(embedded) == 9 + 6 + 5
  for name in ("f00000-c00001.npy", "f00000-c00002.npy", "f00002-c00000.npy", "manifest.json"):
    (part0 / name).unlink()
  (part0 / "f00004-c00000.npy").unlink()
  embedded.clear()
  sharded_build.build_part(files, 0, 2, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
  assert len(embedded) == (9 - CHUNK) + 6 + 5  # file 0 resumed after its first chunk
  embedded.clear()
  sharded_build.build_part(files, 0, 2, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
  assert not embedded  # a complete part is not rebuilt
  merged = sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK)
  whole = sharded_build.merge_parts(files, 1, _single_part(files, encoder, tmp_path / "one"),
                                    encoder, chunk_size=CHUNK)
  assert merged.passages == whole.passages
  chex.assert_trees_all_equal(vectors(merged), vectors(whole))
  hnsw = sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK, kind="hnsw")
  assert hnsw.kind == "hnsw" and hnsw.passages == whole.passages
  chex.assert_trees_all_equal(vectors(hnsw), vectors(whole))  # flat is added chunk by chunk
  # Another encoder, chunk size or process count is refused with the setting it differs in.
  other = TextEncoder(encoder_dir, mesh=mesh, passage_prefix="passage: ")
  with pytest.raises(ValueError, match="part-00000-of-00002 was built with a different encoder "
                                       r'\(passage_prefix: "" in the part, "passage: " now\)'):
    sharded_build.build_part(files, 0, 2, other, out, batch_size=BATCH, chunk_size=CHUNK)
  with pytest.raises(ValueError, match="different chunk size .4 in the part, 8 now.: remove it"):
    sharded_build.build_part(files, 0, 2, encoder, out, batch_size=BATCH, chunk_size=8)
  with pytest.raises(ValueError, match="different pipeline"):
    sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK, file_format="tfrecord")
  (part0 / "f00002-c00001.npy").unlink()
  with pytest.raises(FileNotFoundError, match="f00002-c00001.npy is missing .4 of file 2's 6"):
    sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK)


def _single_part(files, encoder, out):
  sharded_build.build_part(files, 0, 1, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
  return out


def test_pipeline_choice(setup, monkeypatch):
  """Streaming wherever tensorflow-text is installed; without it one process still builds."""
  encoder = TextEncoder(setup[0])
  monkeypatch.setattr(sharded_build, "has_tensorflow_text", lambda: False)
  assert sharded_build.choose_pipeline("auto", encoder, 1, "jsonl") == "memory"
  with pytest.raises(ValueError, match="--pipeline=stream needs tensorflow-text: pip install"):
    sharded_build.choose_pipeline("auto", encoder, 2, "jsonl")
  with pytest.raises(ValueError, match="--pipeline=memory builds in one process, but this run "
                                       "has 2"):
    sharded_build.choose_pipeline("memory", encoder, 2, "jsonl")
  with pytest.raises(ValueError, match="--format=tfrecord needs --pipeline=stream"):
    sharded_build.choose_pipeline("auto", encoder, 1, "tfrecord")
  monkeypatch.setattr(sharded_build, "has_tensorflow_text", lambda: True)
  assert sharded_build.choose_pipeline("auto", encoder, 1, "jsonl") == "stream"


@needs_tf
def test_parts_and_index_on_gcs(setup, tmp_path):
  """--out on gs:// (a local GCS emulator): parts, merge, save and load go through epath."""
  pytest.importorskip("gcsfs")
  from tests.gcs import BUCKET, fake_gcs
  encoder_dir, corpus, _ = setup
  encoder = TextEncoder(encoder_dir)
  files = tf_pipeline.host_files([corpus], 0, 1)
  local = sharded_build.merge_parts(files, 1, _single_part(files, encoder, tmp_path / "one"),
                                    encoder, chunk_size=CHUNK)
  with fake_gcs(tmp_path / "gcs"):
    out = f"gs://{BUCKET}/idx"
    for p in range(2):
      sharded_build.build_part(files, p, 2, encoder, out, batch_size=BATCH, chunk_size=CHUNK)
    sharded_build.merge_parts(files, 2, out, encoder, chunk_size=CHUNK).save(out)
    loaded = DenseIndex.load(out, encoder.identity)
  assert loaded.passages == local.passages
  chex.assert_trees_all_equal(vectors(loaded), vectors(local))
