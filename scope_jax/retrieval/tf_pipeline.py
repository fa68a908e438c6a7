"""Streaming corpus embedding at pod scale: tf.data over sharded JSONL / TFRecord files.

Each host reads only its own shard files (local or gs://), tokenises in-graph with
tensorflow-text's `FastWordpieceTokenizer` built from the encoder's `vocab.txt` (BERT-uncased
normalisation: clean control characters, space out CJK, strip accents, lower-case), and yields
fixed-shape [batch, max_length] batches for the JAX encoder. TensorFlow is the optional `tf`
extra and is imported only here.
"""

from __future__ import annotations

import json
from typing import Iterator, Sequence

import numpy as np

from scope_jax import sharding as shd
from scope_jax.retrieval.corpus import Passage
from scope_jax.retrieval.encoder import embed

_CJK = (r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}"
        r"\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]")


def _tf():
  try:
    import tensorflow as tf
    import tensorflow_text as tf_text
  except ImportError as e:
    raise ImportError("The streaming pipeline needs TensorFlow: pip install 'scope_jax[tf]'.") from e
  tf.config.set_visible_devices([], "GPU")  # keep accelerators for JAX
  return tf, tf_text


class WordpieceTokenizer:
  """In-graph BERT-uncased tokenizer whose ids equal the Hugging Face tokenizer's."""

  def __init__(self, vocab_path, *, max_length: int = 256, lower_case: bool = True):
    tf, tf_text = _tf()
    vocab = [line.rstrip("\n") for line in open(vocab_path, encoding="utf-8")]
    self.cls_id, self.sep_id = vocab.index("[CLS]"), vocab.index("[SEP]")
    self.max_length, self.lower_case = max_length, lower_case
    self._tok = tf_text.FastWordpieceTokenizer(vocab=vocab, suffix_indicator="##",
                                               unknown_token="[UNK]", no_pretokenization=False,
                                               support_detokenization=False,
                                               token_out_type=tf.int32)
    self._tf, self._tf_text = tf, tf_text

  def normalize(self, texts):
    tf, tf_text = self._tf, self._tf_text
    texts = tf.strings.regex_replace(texts, r"[\s\p{Zs}]", " ")  # tabs, newlines, NBSP → spaces
    texts = tf.strings.regex_replace(texts, r"[\x{0}\x{FFFD}\p{Cc}\p{Cf}]", "")
    texts = tf.strings.regex_replace(texts, f"({_CJK})", r" \1 ")
    if self.lower_case:
      texts = tf_text.normalize_utf8(texts, "NFD")
      texts = tf.strings.regex_replace(texts, r"\p{Mn}", "")
      texts = tf.strings.lower(texts, encoding="utf-8")
    return texts

  def __call__(self, texts):
    """Strings [B] → (ids [B, max_length] int32, mask [B, max_length] int32), with [CLS]/[SEP]."""
    tf = self._tf
    pieces = self._tok.tokenize(self.normalize(texts))
    pieces = pieces[:, :self.max_length - 2]
    b = tf.shape(texts)[0]
    cls = tf.fill([b, 1], self.cls_id)
    sep = tf.fill([b, 1], self.sep_id)
    ids = tf.concat([cls, pieces, sep], axis=1)
    dense = ids.to_tensor(default_value=0, shape=[None, self.max_length])
    mask = tf.ones_like(ids).to_tensor(default_value=0, shape=[None, self.max_length])
    return dense, mask


def host_files(patterns: Sequence[str], process_index: int, process_count: int) -> list[str]:
  """This host's share of the shard files (round-robin over the sorted list)."""
  tf, _ = _tf()
  files = sorted({f for p in patterns for f in tf.io.gfile.glob(p)})
  if not files:
    raise FileNotFoundError(f"No corpus shards match {list(patterns)}.")
  return files[process_index::process_count]


def _jsonl_records(files):
  def gen():
    for f in files:
      with open(f, encoding="utf-8") if "://" not in f else _gfile(f) as fh:
        for line in fh:
          if not line.strip():
            continue
          rec = json.loads(line)
          if "contents" in rec:
            title, _, text = str(rec["contents"]).partition("\n")
            title = title.strip().strip('"')
          else:
            title, text = str(rec.get("title", "")), str(rec.get("text", ""))
          yield str(rec.get("id", "")), title.strip(), text.strip()
  return gen


def _gfile(path):
  tf, _ = _tf()
  return tf.io.gfile.GFile(path, "r")


def passage_dataset(patterns: Sequence[str], vocab_path, *, batch_size: int = 256,
                    max_length: int = 256, prefix: str = "", file_format: str = "jsonl",
                    process_index: int = 0, process_count: int = 1, lower_case: bool = True):
  """A tf.data.Dataset of this host's passages (`host_files`) in fixed-shape batches; see
  `file_dataset`."""
  files = host_files(patterns, process_index, process_count)
  return file_dataset(files, vocab_path, batch_size=batch_size, max_length=max_length,
                      prefix=prefix, file_format=file_format, lower_case=lower_case)


def file_dataset(files: Sequence[str], vocab_path, *, batch_size: int = 256,
                 max_length: int = 256, prefix: str = "", file_format: str = "jsonl",
                 lower_case: bool = True, skip: int = 0):
  """A tf.data.Dataset of {'id', 'title', 'text', 'ids', 'mask', 'valid'} batches with fixed
  shapes over `files` read in order, after the first `skip` passages (a resumed build).

  JSONL lines are {id, title, text} or {id, contents}; TFRecords hold tf.train.Examples with
  bytes features 'id', 'title', 'text'. The last batch is padded with valid = 0 rows.
  """
  tf, _ = _tf()
  files = list(files)
  spec = (tf.TensorSpec([], tf.string),) * 3
  if file_format == "jsonl":
    ds = tf.data.Dataset.from_generator(_jsonl_records(files), output_signature=spec)
  elif file_format == "tfrecord":
    feats = {k: tf.io.FixedLenFeature([], tf.string, default_value="")
             for k in ("id", "title", "text")}
    ds = tf.data.TFRecordDataset(files).map(
        lambda x: (lambda e: (e["id"], e["title"], e["text"]))(tf.io.parse_single_example(x, feats)))
  else:
    raise ValueError(f"file_format must be 'jsonl' or 'tfrecord', got {file_format!r}.")
  if skip:
    ds = ds.skip(skip)
  tokenizer = WordpieceTokenizer(vocab_path, max_length=max_length, lower_case=lower_case)

  def tokenize(pid, title, text):
    joined = prefix + tf.where(tf.strings.length(title) > 0, title + ". " + text, text)
    ids, mask = tokenizer(joined)
    n = tf.shape(pid)[0]
    pad = batch_size - n
    return {"id": tf.pad(pid, [[0, pad]]), "title": tf.pad(title, [[0, pad]]),
            "text": tf.pad(text, [[0, pad]]), "ids": tf.pad(ids, [[0, pad], [0, 0]]),
            "mask": tf.pad(mask, [[0, pad], [0, 0]]),
            "valid": tf.pad(tf.ones([n], tf.int32), [[0, pad]])}

  ds = ds.batch(batch_size).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
  return ds.prefetch(tf.data.AUTOTUNE)


def embed_passages(dataset, encoder) -> Iterator[tuple[list[Passage], np.ndarray]]:
  """Runs the JAX encoder over a passage dataset; yields (passages, embeddings [n, D] float32)
  per batch. On an encoder with a mesh (this host's devices) the rows are split over it."""
  for batch in dataset.as_numpy_iterator():
    valid = batch["valid"].astype(bool)
    tokens, mask = batch["ids"], batch["mask"]
    if encoder.mesh is not None:
      tokens, mask = shd.shard_batch((tokens, mask), encoder.mesh)
    vecs = shd.to_host(embed(encoder.config, encoder.params, tokens, mask)).astype(np.float32)
    passages = [Passage(i.decode(), t.decode(), x.decode())
                for i, t, x in zip(batch["id"][valid], batch["title"][valid],
                                   batch["text"][valid])]
    yield passages, vecs[valid]


def embed_stream(dataset, encoder) -> Iterator[tuple[list[str], np.ndarray]]:
  """Runs the JAX encoder over a passage dataset; yields (ids, embeddings [n, D]) per batch."""
  for passages, vecs in embed_passages(dataset, encoder):
    yield [p.id for p in passages], vecs
