"""Index building over sharded corpus files: one part per process, merged into one index.

Process p of N takes the shard files whose place in the sorted file list is p mod N (round robin:
a host's share is known without reading any file, and shards of similar size spread evenly even
when the last ones are short), streams them through the tf.data / tensorflow-text pipeline
(`tf_pipeline`), embeds them on its own devices and writes `<out>/part-<p>-of-<N>/`: for each of
its files, chunks of `chunk_size` passages (`f<file>-c<chunk>.jsonl`, then `.npy`) and a
`manifest.json` naming the encoder, the pipeline and the files. After a barrier, process 0 reads
the chunks back in sorted file order, the order one process reads the files in, so the merged
index (vectors, passages, search results) is the one a single-process build writes.

The parts are kept, as the in-memory build keeps its embedding chunks: a rerun skips the files a
part has finished, resumes a file at its last whole chunk, and merges again (with another --kind,
say). A part built with another encoder, pipeline, file list or chunk size is refused, not mixed in.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import jax
import numpy as np
from absl import logging
from etils import epath

from scope_jax import distributed
from scope_jax.retrieval import tf_pipeline
from scope_jax.retrieval.corpus import Passage, iter_corpus, write_corpus
from scope_jax.retrieval.encoder import file_sha256
from scope_jax.retrieval.index import DenseIndex, make_faiss_index

PART_FORMAT = 1
MANIFEST = "manifest.json"
BARRIER_TIMEOUT_S = 24 * 3600.0  # a host may embed for hours while the others wait for it
_CHECKED = {"parts": "number of processes", "encoder": "encoder", "pipeline": "pipeline",
            "chunk_size": "chunk size", "files": "shard file list"}


def part_dir(out, process_index: int, process_count: int) -> epath.Path:
  return epath.Path(out) / f"part-{process_index:05d}-of-{process_count:05d}"


def host_share(files: Sequence[str], process_index: int, process_count: int) -> list[list]:
  """[[place in the sorted list, file], ...] of the files process `process_index` embeds."""
  return [[i, f] for i, f in enumerate(files) if i % process_count == process_index]


def pipeline_spec(encoder, file_format: str) -> dict:
  """What decides the token ids the encoder sees; a part built under another spec is not reused."""
  vocab = encoder.path / "vocab.txt"
  if not vocab.exists():
    raise FileNotFoundError(f"Encoder directory {encoder.path} has no vocab.txt, which the "
                            "streaming pipeline's WordPiece tokenizer reads; build with "
                            "--pipeline=memory instead.")
  return {"format": PART_FORMAT, "tokenizer": "wordpiece", "vocab_sha256": file_sha256(vocab),
          "lower_case": encoder.lower_case, "max_length": encoder.max_length,
          "prefix": encoder.passage_prefix, "file_format": file_format}


def part_manifest(files, process_index, process_count, encoder_identity, spec, chunk_size) -> dict:
  """The manifest a part must carry to be reused (and merged) in this build."""
  return {"part": process_index, "parts": process_count,
          "encoder": {k: v for k, v in encoder_identity.items() if k != "name"},
          "pipeline": spec, "chunk_size": chunk_size,
          "files": host_share(files, process_index, process_count)}


def _short(value: Any) -> str:
  text = json.dumps(value, sort_keys=True)
  return text if len(text) <= 80 else text[:77] + "..."


def check_manifest(found: dict, expected: dict, where) -> None:
  """One-line error naming the first setting in which a part differs from this build."""
  for key, what in _CHECKED.items():
    a, b = found.get(key), expected[key]
    if a == b:
      continue
    if isinstance(a, dict) and isinstance(b, dict):
      detail = "; ".join(f"{k}: {_short(a.get(k))} in the part, {_short(b.get(k))} now"
                         for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))
    else:
      detail = f"{_short(a)} in the part, {_short(b)} now"
    raise ValueError(f"{where} was built with a different {what} ({detail}): remove it to "
                     "rebuild it, or rerun with the settings it was built with.")


def read_manifest(part: epath.Path) -> dict | None:
  file = part / MANIFEST
  if not file.exists():
    return None
  try:
    return json.loads(file.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{file} is not valid JSON ({e}): remove {part} to rebuild it.") from None


def _write_atomic(path: epath.Path, write) -> None:
  tmp = path.parent / (path.name + ".tmp")
  with tmp.open("wb") as f:
    write(f)
  tmp.replace(path)


def _write_manifest(part: epath.Path, manifest: dict) -> None:
  _write_atomic(part / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))


def _chunk(part: epath.Path, file_index: int, chunk: int, suffix: str) -> epath.Path:
  return part / f"f{file_index:05d}-c{chunk:05d}.{suffix}"


def _npy_rows(path: epath.Path) -> int:
  with path.open("rb") as f:
    version = np.lib.format.read_magic(f)
    read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
            else np.lib.format.read_array_header_2_0)
    return read(f)[0][0]


def _write_chunk(part, file_index, chunk, passages: list[Passage], vecs_ND: np.ndarray) -> None:
  """The passages, then their vectors: a chunk whose .npy exists is whole."""
  jsonl = _chunk(part, file_index, chunk, "jsonl")
  write_corpus(passages, jsonl.parent / (jsonl.name + ".tmp"))
  (jsonl.parent / (jsonl.name + ".tmp")).replace(jsonl)
  _write_atomic(_chunk(part, file_index, chunk, "npy"),
                lambda f: np.save(f, np.ascontiguousarray(vecs_ND, np.float32)))


def embed_file(file_index: int, path: str, part: epath.Path, encoder, spec: dict, *,
               batch_size: int, chunk_size: int) -> int:
  """Embeds one shard file into chunks of `part`, after the whole chunks already there; returns
  its passage count."""
  chunk, done = 0, 0
  while _chunk(part, file_index, chunk, "npy").exists():
    rows = _npy_rows(_chunk(part, file_index, chunk, "npy"))
    chunk, done = chunk + 1, done + rows
    if rows < chunk_size:  # a short chunk is a file's last
      return done
  dataset = tf_pipeline.file_dataset(
      [path], encoder.path / "vocab.txt", batch_size=batch_size, max_length=spec["max_length"],
      prefix=spec["prefix"], file_format=spec["file_format"], lower_case=spec["lower_case"],
      skip=done)
  passages: list[Passage] = []
  vecs: list[np.ndarray] = []
  for batch_passages, batch_vecs in tf_pipeline.embed_passages(dataset, encoder):
    passages += batch_passages
    vecs.append(batch_vecs)
    while len(passages) >= chunk_size:
      rows_ND = np.concatenate(vecs)
      _write_chunk(part, file_index, chunk, passages[:chunk_size], rows_ND[:chunk_size])
      passages, vecs = passages[chunk_size:], [rows_ND[chunk_size:]]
      chunk, done = chunk + 1, done + chunk_size
  if passages or done % chunk_size == 0:  # the last chunk is short (possibly empty)
    _write_chunk(part, file_index, chunk, passages,
                 np.concatenate(vecs) if vecs else np.zeros((0, encoder.dim), np.float32))
    done += len(passages)
  return done


def build_part(files: Sequence[str], process_index: int, process_count: int, encoder, out, *,
               batch_size: int = 64, chunk_size: int = 4096, file_format: str = "jsonl") -> dict:
  """Embeds process `process_index`'s shard files into its part, resuming a previous run's;
  `batch_size` rows per device of the encoder's mesh. Returns the part's manifest."""
  spec = pipeline_spec(encoder, file_format)
  expected = part_manifest(files, process_index, process_count, encoder.identity, spec, chunk_size)
  part = part_dir(out, process_index, process_count)
  found = read_manifest(part)
  if found is not None:
    check_manifest(found, expected, part)
    if found.get("complete"):
      logging.info("%s is complete: not rebuilt.", part)
      return found
  part.mkdir(parents=True, exist_ok=True)
  counts = dict(found.get("counts", [])) if found else {}
  host_rows = batch_size * (1 if encoder.mesh is None else encoder.mesh.devices.size)
  for i, path in expected["files"]:
    if i not in counts:
      counts[i] = embed_file(i, path, part, encoder, spec, batch_size=host_rows,
                             chunk_size=chunk_size)
      logging.info("%s: file %d (%s) holds %d passages.", part, i, path, counts[i])
    _write_manifest(part, expected | {"counts": sorted(counts.items()), "complete": False})
  manifest = expected | {"counts": sorted(counts.items()), "complete": True, "dim": encoder.dim}
  _write_manifest(part, manifest)
  return manifest


def merge_parts(files: Sequence[str], process_count: int, out, encoder, *, chunk_size: int = 4096,
                file_format: str = "jsonl", kind: str = "flat",
                nlist: int | None = None) -> DenseIndex:
  """The index over every part's chunks, in sorted file order (a single process's order)."""
  spec = pipeline_spec(encoder, file_format)
  counts: dict[int, int] = {}
  for p in range(process_count):
    part = part_dir(out, p, process_count)
    found = read_manifest(part)
    if found is None or not found.get("complete"):
      raise FileNotFoundError(
          f"{part} is {'missing' if found is None else 'incomplete'}: process {p} has not "
          "finished it (on a multi-host run --out must be a directory every host shares, such as "
          "gs://... or a shared file system).")
    check_manifest(found, part_manifest(files, p, process_count, encoder.identity, spec,
                                        chunk_size), part)
    counts.update(dict(found["counts"]))
  passages: list[Passage] = []
  vecs: list[np.ndarray] = []  # ivf and hnsw take them all at once; a flat index chunk by chunk
  flat = make_faiss_index(encoder.dim, "flat") if kind == "flat" else None
  for i in range(len(files)):
    part = part_dir(out, i % process_count, process_count)
    got, chunk = 0, 0
    while True:  # every file ends with a short (possibly empty) chunk
      npy = _chunk(part, i, chunk, "npy")
      if not npy.exists():
        raise FileNotFoundError(f"{npy} is missing ({got} of file {i}'s {counts[i]} passages "
                                f"found): remove {part} to rebuild it.")
      with npy.open("rb") as f:
        rows_ND = np.load(f, allow_pickle=False)
      chunk_passages = list(iter_corpus(_chunk(part, i, chunk, "jsonl")))
      if len(chunk_passages) != len(rows_ND) or rows_ND.shape[1:] != (encoder.dim,):
        raise ValueError(f"{npy} holds vectors {rows_ND.shape} for {len(chunk_passages)} "
                         f"passages of dimension {encoder.dim}: remove {part} to rebuild it.")
      passages += chunk_passages
      if flat is None:
        vecs.append(rows_ND)
      else:
        flat.add(np.ascontiguousarray(rows_ND, np.float32))
      got, chunk = got + len(rows_ND), chunk + 1
      if len(rows_ND) < chunk_size:
        break
    if got != counts[i]:
      raise ValueError(f"{part} holds {got} passages of file {i} ({files[i]}) but its manifest "
                       f"says {counts[i]}: remove {part} to rebuild it.")
  if not passages:
    raise ValueError(f"The corpus shards {list(files)[:3]} hold no passages.")
  if flat is not None:
    return DenseIndex(passages, flat, dict(encoder.identity), kind)
  return DenseIndex.from_vectors(passages, np.concatenate(vecs), encoder.identity, kind=kind,
                                 nlist=nlist)


def build(patterns: Sequence[str], encoder, out, *, kind: str = "flat", nlist: int | None = None,
          batch_size: int = 64, chunk_size: int = 4096,
          file_format: str = "jsonl") -> DenseIndex | None:
  """Run by every process of a run: embeds this host's part, waits for every part, and process 0
  merges and saves the index to `out`; it returns the index there and None on the others."""
  pid, count = jax.process_index(), jax.process_count()
  files = tf_pipeline.host_files(patterns, 0, 1)
  distributed.check_agree("the corpus shard files", files)
  distributed.check_agree("the encoder", encoder.identity)
  if len(files) < count:
    raise ValueError(f"--corpus matches {len(files)} shard files but the run has {count} "
                     f"processes: split the corpus into at least {count} files (e.g. `split -n "
                     f"l/{count} -d --additional-suffix=.jsonl corpus.jsonl shard-`).")
  build_part(files, pid, count, encoder, out, batch_size=batch_size, chunk_size=chunk_size,
             file_format=file_format)
  distributed.wait_all("build_index:parts", BARRIER_TIMEOUT_S)
  index = None
  if pid == 0:
    index = merge_parts(files, count, out, encoder, chunk_size=chunk_size,
                        file_format=file_format, kind=kind, nlist=nlist)
    index.save(out)
  distributed.wait_all("build_index:merged", BARRIER_TIMEOUT_S)
  return index


def has_tensorflow_text() -> bool:
  try:
    import tensorflow  # noqa: F401
    import tensorflow_text  # noqa: F401
  except ImportError:
    return False
  return True


def choose_pipeline(choice: str, encoder, process_count: int, file_format: str) -> str:
  """'stream' or 'memory' for --pipeline=`choice`; a choice that cannot run is a one-line error."""
  streams = hasattr(encoder, "lower_case") and (encoder.path / "vocab.txt").exists()
  if choice == "auto":
    choice = "stream" if (streams and has_tensorflow_text()) or process_count > 1 else "memory"
  if choice == "memory" and process_count > 1:
    raise ValueError(f"--pipeline=memory builds in one process, but this run has {process_count}; "
                     "use --pipeline=stream (pip install 'scope_jax[tf]') or run one process.")
  if choice == "memory" and file_format != "jsonl":
    raise ValueError("--format=tfrecord needs --pipeline=stream (pip install 'scope_jax[tf]').")
  if choice == "stream" and not streams:
    raise ValueError(f"--pipeline=stream needs a BERT encoder with a vocab.txt (E5, MiniLM); "
                     f"{encoder.identity.get('name')!r} is not one: use --pipeline=memory on one "
                     "process.")
  if choice == "stream" and not has_tensorflow_text():
    raise ValueError("--pipeline=stream needs tensorflow-text: pip install 'scope_jax[tf]' (or "
                     "use --pipeline=memory on one process).")
  return choice
